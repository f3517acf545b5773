"""deepspeed.accelerator's get_accelerator(), as DeepSpeed's tutorials and
accelerate call it: the device zinf trains on in this process (CUDA where
torch sees a GPU, else the CPU), answered from torch."""
import torch

__all__ = ["get_accelerator", "ZinfAccelerator"]


class ZinfAccelerator:
    """DeepSpeed's accelerator interface over torch's CUDA or the CPU."""

    def __init__(self, kind=None):
        self._name = kind or ("cuda" if torch.cuda.is_available() else "cpu")
        self._cuda = self._name == "cuda"

    # device
    def device_name(self, device_index=None):
        return self._name if device_index is None or not self._cuda else "cuda:%d" % device_index

    def current_device_name(self):
        return "cuda:%d" % torch.cuda.current_device() if self._cuda else "cpu"

    def current_device(self):
        return torch.cuda.current_device() if self._cuda else 0

    def device(self, device_index=None):
        return torch.device(self.device_name(device_index))

    def set_device(self, device_index):
        if self._cuda:
            torch.cuda.set_device(device_index)

    def device_count(self):
        return torch.cuda.device_count() if self._cuda else 1

    def is_available(self):
        return True

    def is_synchronized_device(self):
        return not self._cuda  # the CPU runs each op before returning

    def use_host_timers(self):
        return self.is_synchronized_device()

    def synchronize(self, device_index=None):
        if self._cuda:
            torch.cuda.synchronize(device_index)

    # communication and data types
    def communication_backend_name(self):
        return "nccl" if self._cuda else "gloo"

    def is_bf16_supported(self):
        return torch.cuda.is_bf16_supported() if self._cuda else True

    def is_fp16_supported(self):
        return True

    def supported_dtypes(self):
        return [torch.float32, torch.float16, torch.bfloat16]

    # random numbers
    def manual_seed(self, seed):
        if self._cuda:
            torch.cuda.manual_seed(seed)
        else:
            torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        if self._cuda:
            torch.cuda.manual_seed_all(seed)
        else:
            torch.manual_seed(seed)

    # memory
    def empty_cache(self):
        if self._cuda:
            torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index) if self._cuda else 0

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index) if self._cuda else 0

    def reset_peak_memory_stats(self, device_index=None):
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(device_index)

    def pin_memory(self, tensor, align_bytes=1):
        return tensor.pin_memory() if self._cuda else tensor

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def on_accelerator(self, tensor):
        return tensor.device.type == self._name

    def Stream(self, *args, **kwargs):  # noqa: N802 (DeepSpeed's name)
        if not self._cuda:
            raise RuntimeError("zinf: get_accelerator().Stream: the CPU accelerator has no streams")
        return torch.cuda.Stream(*args, **kwargs)

    def __repr__(self):
        return "ZinfAccelerator(%s)" % self._name


_ACCELERATOR = None


def get_accelerator():
    """The accelerator of this process (made once, as DeepSpeed's)."""
    global _ACCELERATOR
    if _ACCELERATOR is None:
        _ACCELERATOR = ZinfAccelerator()
    return _ACCELERATOR


def set_accelerator(accel):
    global _ACCELERATOR
    _ACCELERATOR = accel
