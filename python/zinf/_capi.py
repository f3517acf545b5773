"""ctypes bindings of the parts of zinf's C ABI (include/zinf/zinf.h) the
Python front-end uses: communicators, the engine, streams, checkpoints.

The library is found through $ZINF_LIBRARY (a path to libzinf.so), else in
this package's folder (where `pip install .` puts it), else on the dynamic
loader's search path ("libzinf.so.0", "libzinf.so": `cmake --install`). Every call that
returns a status raises ZinfError with zinf_last_error()'s text on failure.
"""
import ctypes
import importlib.util
import os

c_int, c_i64, c_size, c_double, c_void_p, c_char_p, c_float = (
    ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_double, ctypes.c_void_p, ctypes.c_char_p,
    ctypes.c_float)

OK = 0
DTYPE_FP32, DTYPE_BF16, DTYPE_FP16 = 0, 1, 2
STATE_MASTER, STATE_EXP_AVG, STATE_EXP_AVG_SQ, STATE_COMPUTE_PARAMS = 0, 1, 2, 3
UNIT_FROZEN = 1


class ParamSpec(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("shape", ctypes.POINTER(c_i64)), ("ndim", c_size), ("dtype", c_int),
                ("init", c_void_p)]


class UnitPointers(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_int), ("num_elems", c_i64), ("tensors", ctypes.POINTER(c_void_p)),
                ("num_tensors", c_size)]


class EngineInfo(ctypes.Structure):
    _fields_ = [("rank", c_int), ("world_size", c_int), ("zero_stage", c_int), ("num_units", c_int),
                ("compute_dtype", c_int), ("gradient_accumulation_steps", c_i64)]


class ZinfError(RuntimeError):
    """A zinf call failed: `code` is the status name (e.g. ZINF_ERR_IO)."""

    def __init__(self, code, what, message):
        super().__init__("%s: %s: %s" % (what, code, message))
        self.code = code


_SIGNATURES = {
    "zinf_last_error": (c_char_p, []),
    "zinf_status_name": (c_char_p, [c_int]),
    "zinf_string_free": (None, [c_void_p]),
    "zinf_call_cpu_accounting": (None, [c_int]),
    "zinf_thread_call_cpu_seconds": (c_double, []),
    "zinf_comm_create_mpi": (c_int, [c_double, ctypes.POINTER(c_void_p)]),
    "zinf_comm_destroy": (None, [c_void_p]),
    "zinf_engine_create": (c_int, [c_char_p, c_void_p, ctypes.POINTER(c_void_p)]),
    "zinf_engine_destroy": (None, [c_void_p]),
    "zinf_engine_get_info": (c_int, [c_void_p, ctypes.POINTER(EngineInfo)]),
    "zinf_engine_host_memory": (c_int, [c_void_p, ctypes.POINTER(c_void_p), ctypes.POINTER(ctypes.c_uint64)]),
    "zinf_engine_add_unit": (c_int, [c_void_p, c_char_p, ctypes.POINTER(ParamSpec), c_size, ctypes.POINTER(c_int)]),
    "zinf_engine_add_unit_ex": (c_int, [c_void_p, c_char_p, ctypes.POINTER(ParamSpec), c_size, ctypes.POINTER(c_int),
                                        c_int, ctypes.POINTER(c_int)]),
    "zinf_engine_add_param_group": (c_int, [c_void_p, c_double, c_double, ctypes.POINTER(c_int)]),
    "zinf_engine_set_group_lr": (c_int, [c_void_p, c_int, c_double]),
    "zinf_engine_scheduled_lr": (c_int, [c_void_p, ctypes.c_int64, ctypes.POINTER(c_double)]),
    "zinf_engine_write_state": (c_int, [c_void_p, c_int, c_int, c_void_p, c_size]),
    "zinf_engine_broadcast": (c_int, [c_void_p, c_void_p, c_size, c_int]),
    "zinf_engine_config_json": (c_int, [c_void_p, ctypes.POINTER(c_void_p)]),
    "zinf_config_resolve_auto": (c_int, [c_char_p, c_char_p, ctypes.POINTER(c_void_p), ctypes.POINTER(c_void_p)]),
    "zinf_engine_fetch": (c_int, [c_void_p, c_int, c_void_p, ctypes.POINTER(UnitPointers)]),
    "zinf_engine_grad_buffers": (c_int, [c_void_p, c_int, ctypes.POINTER(UnitPointers)]),
    "zinf_engine_grads_ready": (c_int, [c_void_p, c_int, c_void_p]),
    "zinf_engine_release": (c_int, [c_void_p, c_int, c_void_p]),
    "zinf_engine_step": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
    "zinf_engine_loss_scale": (c_int, [c_void_p, ctypes.POINTER(c_float)]),
    "zinf_engine_report_loss": (c_int, [c_void_p, c_double]),
    "zinf_engine_trace_begin": (c_int, [c_void_p, c_void_p, ctypes.POINTER(ctypes.c_int64)]),
    "zinf_engine_trace_end": (c_int, [c_void_p, c_void_p, ctypes.c_int64, c_char_p, c_char_p]),
    "zinf_engine_synchronize": (c_int, [c_void_p]),
    "zinf_engine_stats_json": (c_int, [c_void_p, ctypes.POINTER(c_void_p)]),
    "zinf_engine_read_state": (c_int, [c_void_p, c_int, c_int, c_void_p, c_size]),
    "zinf_engine_save": (c_int, [c_void_p, c_char_p, c_char_p, ctypes.POINTER(c_void_p)]),
    "zinf_engine_load": (c_int, [c_void_p, c_char_p, ctypes.POINTER(c_void_p)]),
    "zinf_stream_create": (c_int, [c_void_p, ctypes.POINTER(c_void_p)]),
    "zinf_stream_adopt": (c_int, [c_void_p, c_void_p, ctypes.POINTER(c_void_p)]),
    "zinf_stream_destroy": (None, [c_void_p]),
    "zinf_stream_synchronize": (c_int, [c_void_p]),
}

_lib = None


def _packaged_library():
    """[the libzinf.so.0 installed with the package], or []: beside this
    file (a wheel), else in another folder of the package's path (an
    editable install keeps the native files in its build tree's install
    folder and the Python files in the source tree)."""
    import zinf
    folders = [os.path.dirname(os.path.abspath(__file__))] + list(getattr(zinf, "__path__", []))
    for folder in folders:
        path = os.path.join(folder, "libzinf.so.0")
        if os.path.isfile(path):
            return [path]
    return []


def lib():
    """The loaded library (loaded on first use)."""
    global _lib
    if _lib is None:
        if os.environ.get("ZINF_LIBRARY"):
            names = [os.environ["ZINF_LIBRARY"]]
        else:
            # An editable install made with editable.rebuild=true rebuilds
            # what changed when its native module is looked up (scikit-build-
            # core's finder); for any other install this only finds a file.
            importlib.util.find_spec("zinf._zinf_torch")
            names = _packaged_library() + ["libzinf.so.0", "libzinf.so"]
        errors = []
        for name in names:
            try:
                loaded = ctypes.CDLL(name)
                break
            except OSError as e:
                errors.append(str(e))
        else:
            raise OSError("zinf: cannot load the C library (%s); install zinf with `pip install .` from its "
                          "source tree, or set ZINF_LIBRARY to the path of libzinf.so"
                          % "; ".join(errors))
        for fn_name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(loaded, fn_name)
            fn.restype, fn.argtypes = restype, argtypes
        _lib = loaded
    return _lib


def check(rc, what):
    """Raises ZinfError naming `what` unless rc is OK."""
    if rc != OK:
        L = lib()
        raise ZinfError(L.zinf_status_name(rc).decode(), what, (L.zinf_last_error() or b"").decode())


def take_string(ptr):
    """A zinf-allocated string as Python text, freed."""
    if not ptr.value:
        return ""
    text = ctypes.string_at(ptr.value).decode()
    lib().zinf_string_free(ptr)
    return text
