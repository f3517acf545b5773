#!/usr/bin/env python3
"""A training script written the way DeepSpeedExamples' CIFAR tutorial
(training/cifar/cifar10_deepspeed.py) writes it, run with the real deepspeed
package or with zinf.deepspeed (the import is the one line that differs):
its own --local_rank flag beside deepspeed.add_config_arguments,
deepspeed.init_distributed() then torch.distributed's rank and barriers,
the dataloader deepspeed.initialize returns from a config that gives only
train_batch_size, get_accelerator() for the device, the engine's
bfloat16_enabled()/fp16_enabled() for the input dtype, the config's Adam and
WarmupLR. Random images stand in for CIFAR-10. Writes each step's loss and
batch size as JSON.

  ds_tutorial_script.py --engine deepspeed|zinf --out OUT.json [--stage N] [--epochs N]
"""
import argparse
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def add_argument(deepspeed):
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("--engine", choices=["deepspeed", "zinf"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stage", type=int, default=0)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def main():
    engine = sys.argv[sys.argv.index("--engine") + 1] if "--engine" in sys.argv else "deepspeed"
    if engine == "deepspeed":
        import deepspeed
        from deepspeed.accelerator import get_accelerator
    else:
        import zinf.deepspeed as deepspeed
        from zinf.deepspeed.accelerator import get_accelerator
    import torch.distributed as dist

    args = add_argument(deepspeed)
    torch.set_num_threads(1)
    deepspeed.init_distributed()
    torch.manual_seed(0)
    if dist.get_rank() != 0:
        dist.barrier()  # rank 0 "downloads" the data first
    g = torch.Generator().manual_seed(1)
    trainset = torch.utils.data.TensorDataset(torch.randn(96, 3, 32, 32, generator=g),
                                              torch.randint(0, 10, (96,), generator=g))
    if dist.get_rank() == 0:
        dist.barrier()
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    ds_config = {
        "train_batch_size": 16,
        "steps_per_print": 2000,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                                 "weight_decay": 3e-7}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                     "warmup_num_steps": 10}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": args.stage},
    }
    model_engine, optimizer, trainloader, __ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset, config=ds_config)
    local_device = get_accelerator().device_name(model_engine.local_rank)
    target_dtype = None
    if model_engine.bfloat16_enabled():
        target_dtype = torch.bfloat16
    elif model_engine.fp16_enabled():
        target_dtype = torch.half
    criterion = nn.CrossEntropyLoss()
    rows = []
    for epoch in range(args.epochs):
        for i, data in enumerate(trainloader):
            inputs, labels = data[0].to(local_device), data[1].to(local_device)
            if target_dtype is not None:
                inputs = inputs.to(target_dtype)
            outputs = model_engine(inputs)
            loss = criterion(outputs, labels)
            model_engine.backward(loss)
            model_engine.step()
            rows.append({"loss": loss.item(), "batch": int(inputs.shape[0])})
    with open(args.out, "w") as f:
        json.dump({"steps": rows, "train_batch_size": model_engine.train_batch_size(),
                   "micro_batch": model_engine.train_micro_batch_size_per_gpu(),
                   "stage": model_engine.zero_optimization_stage(), "rank": dist.get_rank()}, f)
    print("%s: %d steps of batch %s, last loss %.6f" % (args.engine, len(rows), rows[0]["batch"], rows[-1]["loss"]))


if __name__ == "__main__":
    sys.exit(main())
