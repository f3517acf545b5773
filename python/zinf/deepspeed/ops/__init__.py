"""deepspeed.ops names scripts import: the Adam classes, which zinf takes as
Adam/AdamW descriptions (its own kernels run the update)."""
from . import adam  # noqa: F401
