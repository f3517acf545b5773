"""zinf from Python: the C library's engine through ctypes (zinf._capi) and
the PyTorch front-end (zinf.torch)."""

__version__ = "0.1.0"
