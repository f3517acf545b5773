"""Hugging Face's Trainer with zinf as the engine: an HF fine-tuning script
that used DeepSpeed runs on zinf by changing one import,

    from zinf.transformers import Trainer, TrainingArguments
    args = TrainingArguments(output_dir="out", deepspeed="ds_config.json", ...)
    Trainer(model=model, args=args, train_dataset=data).train()

TrainingArguments(deepspeed=...) is read as HF's DeepSpeed integration reads
it, by HF's own code (HfTrainerDeepSpeedConfig): "auto" values come from the
arguments (batch sizes, accumulation, max_grad_norm, learning rate, betas,
eps, weight decay, bf16/fp16, warmup and total steps) and from the model
(hidden size), and a value that contradicts an argument is HF's error. Then,
as HF does for DeepSpeed: with an "optimizer" block the config's optimizer
trains every parameter that requires grad; without one, HF's AdamW with its
parameter groups (no decay on biases and norm weights); with a "scheduler"
block the config's schedule, without one HF's scheduler. zinf runs the step
(its Adam on the configured tiers, clipping at max_grad_norm), checkpoints
(save_steps, resume_from_checkpoint) go through zinf's engine, save_model
writes an HF folder from the whole tensors, and a peft model trains with its
frozen base on the configured tier. On several ranks (mpirun, torchrun, the
deepspeed launcher, accelerate launch, srun) the engine joins the launcher's
world (zinf._world); HF shards the data, and rank 0 writes the checkpoints
and save_model's folder from what every rank reads.

Any Trainer subclass (TRL's SFTTrainer and DPOTrainer, LLaMA-Factory's,
Axolotl's) runs on zinf the same way after one line, before its arguments
are made:

    import zinf.transformers
    zinf.transformers.enable()
    args = SFTConfig(output_dir="out", deepspeed="ds_config.json", ...)
    SFTTrainer(model=model, args=args, train_dataset=data).train()

enable() makes zinf the engine of transformers.Trainer itself, so every
subclass's own losses and metrics stay its own: every TrainingArguments
(and subclass) made afterwards keeps its deepspeed= config for zinf (HF's
DeepSpeed set-up never starts; to_dict() still reports it, so a trainer that
rebuilds its arguments from it keeps the config), and every Trainer given
such arguments trains on zinf. zinf's TrainingArguments and Trainer call it
when constructed, so handing zinf's TrainingArguments to any subclass works
too. transformers.TrainingArguments made before enable() with deepspeed= is
taken over as well, as long as HF's DeepSpeed set-up has not started
(nothing has asked for args.device yet); otherwise the Trainer refuses it.

At stage 3, a model whose forward was replaced by a wrapper (TRL's fused LM
head reads lm_head.weight inside the model's forward without calling
lm_head) keeps its output embeddings fetched through the whole forward, so
that wrapper reads the real weight.
"""
import dataclasses
import os

import torch
import transformers

from . import _config, _world
from . import torch as _zt

__all__ = ["Trainer", "TrainingArguments", "enable"]

# The functions of transformers' own classes that enable() replaced: name -> original.
_HF_ARGS = {}
_HF_TRAINER = {}


def _detach_deepspeed(args):
    """(args without deepspeed, HF's processed DeepSpeed config or None)."""
    ds = getattr(args, "deepspeed", None)
    if not ds:
        return args, None
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config
    hf_config = getattr(args, "hf_deepspeed_config", None)
    if hf_config is None:
        hf_config = HfTrainerDeepSpeedConfig(ds)
        hf_config.trainer_config_process(args)
    unset_hf_deepspeed_config()  # HF's other code paths must not think DeepSpeed runs
    if "_setup_devices" in args.__dict__ and getattr(args, "distributed_state", None) is not None:
        if str(getattr(args.distributed_state, "distributed_type", "")).endswith("DEEPSPEED"):
            raise RuntimeError("zinf.transformers: these TrainingArguments already set up DeepSpeed's devices; "
                               "create them after zinf.transformers.enable() (or with zinf.transformers."
                               "TrainingArguments), or before anything reads args.device")
    fields = {f.name for f in dataclasses.fields(args) if f.init}
    values = {name: getattr(args, name) for name in fields}
    values["deepspeed"] = None
    plain = type(args)(**values) if type(args) is not TrainingArguments else transformers.TrainingArguments(**values)
    unset_hf_deepspeed_config()
    return plain, hf_config


def _args_post_init(self):
    """TrainingArguments.__post_init__ once enabled: the deepspeed= config is
    kept for zinf (zinf_deepspeed, and HF's processed form zinf_hf_config);
    HF's DeepSpeed set-up (accelerate's DeepSpeed plugin, torch.distributed
    for DeepSpeed) never starts."""
    ds = self.deepspeed or _accelerate_plugin_config()
    if ds:
        _join_world()  # before HF sets up devices
    self.deepspeed = None
    _HF_ARGS["__post_init__"](self)
    self.zinf_deepspeed = ds
    self.zinf_hf_config = None
    if ds:
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config
        self.zinf_hf_config = HfTrainerDeepSpeedConfig(ds)
        self.zinf_hf_config.trainer_config_process(self)
        unset_hf_deepspeed_config()


# What `accelerate launch --use_deepspeed` sets beside its config file; each
# would change the run, and zinf reads the file alone.
_ACCELERATE_DS_FIELDS = ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                         "ACCELERATE_GRADIENT_CLIPPING", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
                         "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE")


def _accelerate_plugin_config():
    """The DeepSpeed config of `accelerate launch --use_deepspeed
    --deepspeed_config_file F` (F), for arguments made without deepspeed=
    once zinf is enabled; accelerate's DeepSpeed set-up is then switched off
    for this process, so that zinf, not DeepSpeed, trains. Without a config
    file (the plugin made from accelerate's own fields), or with fields that
    would change the run beside it, refused naming the fix; None when
    accelerate's plugin is not on."""
    env = os.environ
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return None
    path = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    fields = ["%s=%s" % (k, env[k]) for k in _ACCELERATE_DS_FIELDS if env.get(k) not in (None, "", "none")]
    if path == "none" or fields:
        raise RuntimeError(
            "zinf.transformers: accelerate launch --use_deepspeed %s; zinf reads the DeepSpeed config from "
            "a file alone. Write the settings into a DeepSpeed config file and launch with --use_deepspeed "
            "--deepspeed_config_file FILE (and nothing else of accelerate's DeepSpeed flags), or pass "
            "TrainingArguments(deepspeed=FILE) and launch without --use_deepspeed"
            % ("sets %s" % ", ".join(fields) if fields else "gave no --deepspeed_config_file"))
    if not os.path.isfile(path):
        raise FileNotFoundError("zinf.transformers: accelerate's --deepspeed_config_file %s does not exist" % path)
    env["ACCELERATE_USE_DEEPSPEED"] = "false"  # accelerate must not set up DeepSpeed for these arguments
    return path


def _join_world():
    """Before HF sets up its devices for a world of several processes: a
    torch launcher's world without zinf's C++ core is refused (see
    _world.check_core), and under mpirun torch.distributed is initialized
    as DeepSpeed does there (accelerate would ask for MASTER_ADDR, which
    mpirun does not set)."""
    rank, world, launcher = _config.launcher_world()
    if world <= 1:
        return
    _world.check_core()
    if launcher == "mpirun":
        _world.init_torch_distributed()


def _args_to_dict(self):
    """HF's to_dict, with the deepspeed= config zinf keeps (a trainer that
    rebuilds its arguments from to_dict(), as TRL's do, keeps it)."""
    out = _HF_ARGS["to_dict"](self)
    if getattr(self, "zinf_deepspeed", None):
        out["deepspeed"] = self.zinf_deepspeed
    return out


def enable():
    """Makes zinf the engine of transformers.Trainer and of every subclass,
    for arguments with a deepspeed= config; see the module comment.
    Idempotent."""
    if _HF_TRAINER:
        return
    base = transformers.TrainingArguments
    _HF_ARGS["__post_init__"] = base.__post_init__
    _HF_ARGS["to_dict"] = base.to_dict
    base.__post_init__ = _args_post_init
    base.to_dict = _args_to_dict
    for name, fn in vars(_ZinfTrainer).items():
        if callable(fn) and (not name.startswith("__") or name == "__init__"):
            _HF_TRAINER[name] = vars(transformers.Trainer).get(name)
            setattr(transformers.Trainer, name, fn)
    # The Trainer's log counts parameters with numel(); zinf's carry their
    # whole size in ds_numel (at stage 3 the tensor itself is a placeholder).
    import transformers.trainer as hf_trainer
    if hasattr(hf_trainer, "get_model_param_count"):
        hf_trainer.get_model_param_count = _param_count


def _param_count(model, trainable_only=False):
    return sum(getattr(p, "ds_numel", None) or p.numel() for p in model.parameters()
               if not trainable_only or p.requires_grad)


def _hf(name):
    """transformers.Trainer's own method `name` (before enable())."""
    fn = _HF_TRAINER.get(name)
    if fn is None:
        raise AttributeError("transformers.Trainer has no method %s" % name)
    return fn


@dataclasses.dataclass
class TrainingArguments(transformers.TrainingArguments):
    """transformers.TrainingArguments whose deepspeed= config zinf runs (with
    zinf enabled: see enable()). `zinf_hf_config` keeps HF's processed
    config for the Trainer."""

    def __post_init__(self):
        enable()
        super().__post_init__()


class _ZinfTrainer:
    """The methods enable() puts on transformers.Trainer: with a DeepSpeed
    config zinf runs the step, else each is transformers' own."""

    def __init__(self, model=None, args=None, *pargs, **kwargs):
        hf_config = None
        if args is not None and getattr(args, "zinf_hf_config", None) is not None:
            hf_config = args.zinf_hf_config
        elif args is not None and getattr(args, "deepspeed", None):
            args, hf_config = _detach_deepspeed(args)
        if hf_config is not None:
            _join_world()  # before HF builds anything
        self.zinf_hf_config = hf_config
        self._zinf_auto_keys = _config.auto_keys(_config.load(hf_config.config)) if hf_config is not None else []
        self.zinf_engine = None
        _hf("__init__")(self, model, args, *pargs, **kwargs)

    def _zinf_config(self, num_training_steps):
        hf = self.zinf_hf_config
        hf.trainer_config_finalize(self.args, self.model, num_training_steps)
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config
        unset_hf_deepspeed_config()
        config = dict(hf.config)
        # HF's mixed precision (bf16=True, TRL's default) goes into the config
        # as accelerate's DeepSpeed plugin puts it there: a block the config
        # lacks is added, enabled.
        precision = getattr(self.args, "mixed_precision", "no")
        if precision in ("fp16", "bf16") and precision not in config:
            config[precision] = {"enabled": True}
        # HF's hidden_size^2 for an "auto" reduce bucket can be below the
        # engine's smallest (one 64 Ki-element norm block): raised to it, as
        # zinf's own resolution does.
        zero = config.get("zero_optimization")
        if isinstance(zero, dict) and "zero_optimization.reduce_bucket_size" in self._zinf_auto_keys:
            zero["reduce_bucket_size"] = max(int(zero.get("reduce_bucket_size", 0)), 65536)
        # HF's Trainer scales each micro-step's loss for the accumulation
        # itself (and tells DeepSpeed so: scale_wrt_gas=False).
        config["zinf"] = dict(config.get("zinf") or {}, gradient_accumulation="sum")
        return config

    def set_initial_training_values(self, args, dataloader):
        values = _hf("set_initial_training_values")(self, args, dataloader)
        self._zinf_max_steps = values[-1]  # the trainer's num_training_steps: total_num_steps for "auto"
        return values

    def create_optimizer(self, model=None):
        """With a DeepSpeed config: the zinf engine, created here (HF creates
        the optimizer once it knows the training steps), and its optimizer."""
        if getattr(self, "zinf_hf_config", None) is None:
            return _hf("create_optimizer")(self, model)
        if self.zinf_engine is not None:
            return self.optimizer
        config = self._zinf_config(getattr(self, "_zinf_max_steps", self.args.max_steps))
        optimizer, params = None, None
        if "optimizer" in config:
            params = [p for p in self.model.parameters() if p.requires_grad]
        else:
            self.optimizer = None
            optimizer = _hf("create_optimizer")(self, model)  # HF's AdamW with its parameter groups
        engine = _zt.Engine(self.model, config, optimizer=optimizer, model_parameters=params,
                            auto_context={"hidden_size": _zt._hidden_size(self.model)},
                            held_modules=_read_in_wrapped_forward(self.model))
        self.zinf_engine = engine
        self._zinf_has_config_scheduler = "scheduler" in config
        self.optimizer = engine.optimizer
        return self.optimizer

    def _wrap_model(self, model, training=True, dataloader=None):
        """The zinf engine, once it exists, instead of the model: no DDP wrap
        (zinf reduces the gradients itself; a launcher's world of one, as
        torchrun --nproc_per_node 1 makes, would otherwise get one) and no
        second preparation by accelerate."""
        if getattr(self, "zinf_engine", None) is not None:
            return self.zinf_engine
        return _hf("_wrap_model")(self, model, training, dataloader)

    def create_scheduler(self, num_training_steps, optimizer=None):
        if getattr(self, "zinf_engine", None) is not None and self._zinf_has_config_scheduler:
            self.lr_scheduler = self.zinf_engine.lr_scheduler  # the config's schedule, run by the engine
            return self.lr_scheduler
        return _hf("create_scheduler")(self, num_training_steps, optimizer)

    def training_step(self, model, inputs, num_items_in_batch=None):
        if getattr(self, "zinf_engine", None) is None:
            return _hf("training_step")(self, model, inputs, num_items_in_batch)
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        if self.args.n_gpu > 1:
            loss = loss.mean()
        scaled = self.loss_is_scaled_for_ga if self.loss_is_scaled_for_ga is not None else (
            (self.model_accepts_loss_kwargs and num_items_in_batch is not None) or self.compute_loss_func is not None)
        if not scaled:
            loss = loss / self.current_gradient_accumulation_steps
        self.zinf_engine.backward(loss)
        self.zinf_engine.step()
        return loss.detach()

    def _clip_grad_norm(self, model):
        if getattr(self, "zinf_engine", None) is None:
            return _hf("_clip_grad_norm")(self, model)
        return self._zinf_grad_norm()  # the engine clipped at gradient_clipping = max_grad_norm

    def _get_grad_norm(self, model, grad_norm=None):
        if getattr(self, "zinf_engine", None) is None:
            return _hf("_get_grad_norm")(self, model, grad_norm)
        return grad_norm if grad_norm is not None else self._zinf_grad_norm()

    def _zinf_grad_norm(self):
        norm = self.zinf_engine.stats().get("grad_norm")
        return torch.tensor(float(norm)) if norm is not None else None

    def save_model(self, output_dir=None, _internal_call=False):
        """The HF folder from the whole tensors, written by rank 0 (as HF
        does); every rank reads them from zinf's shards, which is
        collective, so every rank calls it (HF's Trainer does)."""
        if getattr(self, "zinf_engine", None) is None:
            return _hf("save_model")(self, output_dir, _internal_call)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        state = self.zinf_engine._module_state()
        self._save(output_dir, state_dict=state)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save_optimizer_and_scheduler(self, output_dir):
        if getattr(self, "zinf_engine", None) is None:
            return _hf("_save_optimizer_and_scheduler")(self, output_dir)
        self.zinf_engine.save_checkpoint(output_dir, tag="global_step%d" % self.state.global_step)
        if self.args.should_save and self.lr_scheduler is not None and not isinstance(
                self.lr_scheduler, type(self.zinf_engine.lr_scheduler)):
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, "scheduler.pt"))

    def _load_optimizer_and_scheduler(self, checkpoint):
        if getattr(self, "zinf_engine", None) is None or checkpoint is None:
            return _hf("_load_optimizer_and_scheduler")(self, checkpoint)
        path, _ = self.zinf_engine.load_checkpoint(checkpoint)
        if path is None:
            raise ValueError("zinf.transformers: %s holds no zinf checkpoint (no 'latest')" % checkpoint)
        sched = os.path.join(checkpoint, "scheduler.pt")
        if os.path.isfile(sched) and self.lr_scheduler is not None and not isinstance(
                self.lr_scheduler, type(self.zinf_engine.lr_scheduler)):
            self.lr_scheduler.load_state_dict(torch.load(sched, weights_only=True))


def _read_in_wrapped_forward(model):
    """The modules whose parameters a replaced forward may read without
    calling them: the output embeddings of a model whose forward is an
    instance attribute (TRL's fused LM head); none otherwise."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    if "forward" not in vars(target) or not hasattr(target, "get_output_embeddings"):
        return []
    head = target.get_output_embeddings()
    return [head] if head is not None else []


class Trainer(transformers.Trainer):
    """transformers.Trainer with zinf as the engine (enable() applied); see
    the module comment. `self.zinf_engine` is the engine once training has
    started."""

    def __init__(self, *args, **kwargs):
        enable()
        super().__init__(*args, **kwargs)
