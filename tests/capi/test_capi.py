#!/usr/bin/env python3
"""The C ABI from Python (ctypes + numpy), as a trainer written in Python
would use it: the aio handle writes and reads numpy arrays (buffered, O_DIRECT
where the filesystem allows it, from several requests at once) and the CPU
Adam updates numpy arrays in place, checked bit for bit against the
documented operation sequence (src/math/adam_math.h) computed with numpy in
float32, including the bf16 and fp16 parameter copies.

usage: test_capi.py <path of libzinf.so> <scratch directory>
Exits 77 (ctest: skipped) when numpy is missing, 0 when every check passed."""
import ctypes
import os
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed for %s (scripts/setup makes the Python environment)" % sys.executable)
    sys.exit(77)

c_int, c_uint, c_u64, c_i64, c_size, c_double, c_void_p, c_char_p = (
    ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t, ctypes.c_double,
    ctypes.c_void_p, ctypes.c_char_p)

ZINF_OK, ZINF_ERR_INVALID_ARGUMENT, ZINF_ERR_FAILED_PRECONDITION, ZINF_ERR_DATA_LOSS = 0, 1, 4, 8
ZINF_DTYPE_FP32, ZINF_DTYPE_BF16, ZINF_DTYPE_FP16 = 0, 1, 2
ZINF_AIO_POSIX = 2
ZINF_FILE_READ, ZINF_FILE_WRITE, ZINF_FILE_CREATE, ZINF_FILE_TRUNCATE, ZINF_FILE_DIRECT = 0, 1, 2, 4, 8


class AdamOptions(ctypes.Structure):
    _fields_ = [("lr", c_double), ("beta1", c_double), ("beta2", c_double), ("eps", c_double),
                ("weight_decay", c_double), ("adamw_mode", c_int), ("bias_correction", c_int)]


class ParamSpec(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("shape", ctypes.POINTER(c_i64)), ("ndim", c_size), ("dtype", c_int),
                ("init", c_void_p)]


class UnitPointers(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_int), ("num_elems", c_i64), ("tensors", ctypes.POINTER(c_void_p)),
                ("num_tensors", c_size)]


# zinf_host_fn: int fn(void* user_data), run in the stream's order.
HOST_FN = ctypes.CFUNCTYPE(c_int, c_void_p)


class ZinfError(RuntimeError):
    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = code


def load(path):
    lib = ctypes.CDLL(path)
    sig = {
        "zinf_last_error": (c_char_p, []),
        "zinf_status_name": (c_char_p, [c_int]),
        "zinf_version": (c_char_p, []),
        "zinf_abi_version": (c_int, []),
        "zinf_set_log_level": (c_int, [c_char_p]),
        "zinf_call_cpu_accounting": (None, [c_int]),
        "zinf_thread_call_cpu_seconds": (c_double, []),
        "zinf_aio_create": (c_int, [c_u64, c_uint, c_uint, c_uint, ctypes.POINTER(c_void_p)]),
        "zinf_aio_destroy": (None, [c_void_p]),
        "zinf_aio_backend": (c_char_p, [c_void_p]),
        "zinf_aio_open": (c_int, [c_void_p, c_char_p, c_uint, ctypes.POINTER(c_void_p)]),
        "zinf_file_size": (c_int, [c_void_p, ctypes.POINTER(c_u64)]),
        "zinf_file_close": (None, [c_void_p]),
        "zinf_aio_pread": (c_int, [c_void_p, c_void_p, c_void_p, c_u64, c_u64, ctypes.POINTER(c_void_p)]),
        "zinf_aio_pwrite": (c_int, [c_void_p, c_void_p, c_void_p, c_u64, c_u64, ctypes.POINTER(c_void_p)]),
        "zinf_aio_request_wait": (c_int, [c_void_p, ctypes.POINTER(c_u64)]),
        "zinf_aio_request_free": (None, [c_void_p]),
        "zinf_aio_wait_all": (c_int, [c_void_p, ctypes.POINTER(c_u64)]),
        "zinf_adam_options_default": (None, [ctypes.POINTER(AdamOptions)]),
        "zinf_adam_create": (c_int, [c_int, ctypes.POINTER(c_void_p)]),
        "zinf_adam_destroy": (None, [c_void_p]),
        "zinf_adam_step": (c_int, [c_void_p, ctypes.POINTER(AdamOptions), c_i64, c_double, c_void_p, c_void_p,
                                   c_void_p, c_void_p, c_int, c_void_p, c_int, c_size]),
        "zinf_engine_create": (c_int, [c_char_p, c_void_p, ctypes.POINTER(c_void_p)]),
        "zinf_engine_destroy": (None, [c_void_p]),
        "zinf_engine_add_unit": (c_int, [c_void_p, c_char_p, ctypes.POINTER(ParamSpec), c_size, ctypes.POINTER(c_int)]),
        "zinf_engine_fetch": (c_int, [c_void_p, c_int, c_void_p, ctypes.POINTER(UnitPointers)]),
        "zinf_engine_host_memory": (c_int, [c_void_p, ctypes.POINTER(c_void_p), ctypes.POINTER(c_u64)]),
        "zinf_engine_grad_buffers": (c_int, [c_void_p, c_int, ctypes.POINTER(UnitPointers)]),
        "zinf_engine_grads_ready": (c_int, [c_void_p, c_int, c_void_p]),
        "zinf_engine_release": (c_int, [c_void_p, c_int, c_void_p]),
        "zinf_engine_step": (c_int, [c_void_p, ctypes.POINTER(c_int)]),
        "zinf_engine_report_loss": (c_int, [c_void_p, c_double]),
        "zinf_engine_trace_begin": (c_int, [c_void_p, c_void_p, ctypes.POINTER(c_i64)]),
        "zinf_engine_trace_end": (c_int, [c_void_p, c_void_p, c_i64, c_char_p, c_char_p]),
        "zinf_engine_synchronize": (c_int, [c_void_p]),
        "zinf_engine_stats_json": (c_int, [c_void_p, ctypes.POINTER(c_void_p)]),
        "zinf_string_free": (None, [c_void_p]),
        "zinf_stream_enqueue_host": (c_int, [c_void_p, HOST_FN, c_void_p]),
        "zinf_stream_create": (c_int, [c_void_p, ctypes.POINTER(c_void_p)]),
        "zinf_stream_adopt": (c_int, [c_void_p, c_void_p, ctypes.POINTER(c_void_p)]),
        "zinf_stream_destroy": (None, [c_void_p]),
        "zinf_stream_synchronize": (c_int, [c_void_p]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


LIB = None


def check(rc, expected=ZINF_OK):
    """Raises ZinfError unless the call returned `expected`; returns the last error text."""
    message = LIB.zinf_last_error().decode()
    if rc != expected:
        raise ZinfError(LIB.zinf_status_name(rc).decode(), message)
    return message


def ptr(array):
    return array.ctypes.data_as(c_void_p)


def aligned_empty(nbytes, alignment=4096):
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + nbytes]


# ---- the aio handle -----------------------------------------------------------

def aio_round_trip(scratch, flags, file_flags, label):
    aio = c_void_p()
    check(LIB.zinf_aio_create(1 << 20, 8, 2, flags, ctypes.byref(aio)))
    path = os.path.join(scratch, "py_aio_%s.bin" % label)
    f = c_void_p()
    rc = LIB.zinf_aio_open(aio, path.encode(), ZINF_FILE_WRITE | ZINF_FILE_CREATE | ZINF_FILE_TRUNCATE | file_flags,
                           ctypes.byref(f))
    if rc != ZINF_OK and file_flags & ZINF_FILE_DIRECT:
        print("  %s: O_DIRECT not supported here (%s); skipped" % (label, LIB.zinf_last_error().decode()))
        LIB.zinf_aio_destroy(aio)
        return
    check(rc)
    backend = LIB.zinf_aio_backend(aio).decode()
    rng = np.random.default_rng(1)
    n = (3 << 20) // 4  # 3 MiB of float32: several blocks
    out = aligned_empty(n * 4).view(np.float32)
    out[:] = rng.standard_normal(n, dtype=np.float32)
    chunks = 4  # four requests in flight at once, each 768 KiB (4 KiB aligned)
    per = n // chunks
    for i in range(chunks):
        check(LIB.zinf_aio_pwrite(aio, f, ptr(out[i * per:]), per * 4, i * per * 4, None))
    count = c_u64()
    check(LIB.zinf_aio_wait_all(aio, ctypes.byref(count)))
    assert count.value == chunks, count.value
    size = c_u64()
    check(LIB.zinf_file_size(f, ctypes.byref(size)))
    assert size.value == n * 4, size.value
    back = aligned_empty(n * 4).view(np.float32)
    back[:] = 0
    req = c_void_p()
    check(LIB.zinf_aio_pread(aio, f, ptr(back), n * 4, 0, ctypes.byref(req)))
    nbytes = c_u64()
    check(LIB.zinf_aio_request_wait(req, ctypes.byref(nbytes)))
    LIB.zinf_aio_request_free(req)
    assert nbytes.value == n * 4
    assert np.array_equal(back, out), "read back differs"
    with open(path, "rb") as fh:  # and the bytes on disk are the array's
        assert np.array_equal(np.frombuffer(fh.read(), dtype=np.float32), out)
    if file_flags & ZINF_FILE_DIRECT:
        misaligned = out[1:]  # 4 bytes off a 4 KiB boundary
        msg = check(LIB.zinf_aio_pread(aio, f, ptr(misaligned), 4096, 0, None), ZINF_ERR_INVALID_ARGUMENT)
        assert "multiple of 4096" in msg, msg
    else:
        check(LIB.zinf_aio_pread(aio, f, ptr(back), 4096, n * 4, ctypes.byref(req)))  # past the end
        msg = check(LIB.zinf_aio_request_wait(req, None), ZINF_ERR_DATA_LOSS)
        assert path in msg, msg
        LIB.zinf_aio_request_free(req)
    check(LIB.zinf_aio_wait_all(aio, None), ZINF_ERR_DATA_LOSS if not file_flags & ZINF_FILE_DIRECT else ZINF_OK)
    LIB.zinf_file_close(f)
    LIB.zinf_aio_destroy(aio)
    os.remove(path)
    print("  aio %s (%s): %d bytes written in %d requests and read back" % (label, backend, n * 4, chunks))


# ---- the CPU Adam ---------------------------------------------------------------

def f32(x):
    return np.float32(x)


def reference_adam(o, step, grad_scale, p, m, v, g):
    """adam_math.h's sequence (1)-(7) in float32, constants as MakeAdamStepConstants."""
    bc1 = 1.0 - o.beta1 ** step if o.bias_correction else 1.0
    bc2 = 1.0 - o.beta2 ** step if o.bias_correction else 1.0
    k_scale, beta1, omb1 = f32(grad_scale), f32(o.beta1), f32(1.0 - o.beta1)
    beta2, omb2, eps = f32(o.beta2), f32(1.0 - o.beta2), f32(o.eps)
    step_size, inv_sqrt_bc2 = f32(o.lr / bc1), f32(1.0 / np.sqrt(bc2))
    wd, decay_factor = f32(o.weight_decay), f32(1.0 - o.lr * o.weight_decay)
    g = g.astype(np.float32) * k_scale                        # (1)
    if o.weight_decay != 0 and not o.adamw_mode:
        g = g + wd * p                                        # (2)
    m[:] = beta1 * m + omb1 * g                               # (3)
    v[:] = beta2 * v + omb2 * (g * g)                         # (4)
    d = np.sqrt(v) * inv_sqrt_bc2 + eps                       # (5)
    q = p * decay_factor if o.weight_decay != 0 and o.adamw_mode else p.copy()  # (6)
    p[:] = q - step_size * (m / d)                            # (7)


def bf16_bits(x):
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def test_adam():
    rng = np.random.default_rng(7)
    adam = c_void_p()
    check(LIB.zinf_adam_create(2, ctypes.byref(adam)))
    n = 65536 + 4099  # two blocks, the second with a SIMD tail
    cases = [("AdamW fp32 grads, bf16 copy", 1, 0.05, ZINF_DTYPE_FP32, ZINF_DTYPE_BF16),
             ("Adam (L2) fp16 grads, fp16 copy", 0, 0.01, ZINF_DTYPE_FP16, ZINF_DTYPE_FP16),
             ("AdamW bf16 grads, no bias correction", 1, 0.0, ZINF_DTYPE_BF16, None)]
    for label, adamw, wd, grad_dtype, copy_dtype in cases:
        o = AdamOptions()
        LIB.zinf_adam_options_default(ctypes.byref(o))
        o.lr, o.weight_decay, o.adamw_mode = 3e-3, wd, adamw
        if copy_dtype is None:
            o.bias_correction = 0
        p = rng.standard_normal(n, dtype=np.float32)
        m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
        rp, rm, rv = p.copy(), m.copy(), v.copy()
        copy = np.zeros(n, np.uint16)
        for step in range(1, 4):
            g32 = (rng.standard_normal(n, dtype=np.float32) * 4).astype(np.float32)
            if grad_dtype == ZINF_DTYPE_FP16:
                grads = g32.astype(np.float16)
                g_widened = grads.astype(np.float32)
            elif grad_dtype == ZINF_DTYPE_BF16:
                grads = bf16_bits(g32)
                g_widened = (grads.astype(np.uint32) << 16).view(np.float32)
            else:
                grads = g32
                g_widened = g32
            grad_scale = 0.25
            check(LIB.zinf_adam_step(adam, ctypes.byref(o), step, grad_scale, ptr(p), ptr(m), ptr(v), ptr(grads),
                                     grad_dtype, ptr(copy) if copy_dtype is not None else None,
                                     copy_dtype if copy_dtype is not None else ZINF_DTYPE_BF16, n))
            reference_adam(o, step, grad_scale, rp, rm, rv, g_widened)
            for name, got, want in (("params", p, rp), ("exp_avg", m, rm), ("exp_avg_sq", v, rv)):
                if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
                    raise AssertionError("%s step %d: %s differs from numpy at %d elements, first %d: %r vs %r" % (
                        label, step, name, bad.size, bad[0], got[bad[0]], want[bad[0]]))
            if copy_dtype == ZINF_DTYPE_BF16:
                assert np.array_equal(copy, bf16_bits(p)), "bf16 copy"
            elif copy_dtype == ZINF_DTYPE_FP16:
                assert np.array_equal(copy, p.astype(np.float16).view(np.uint16)), "fp16 copy"
        print("  adam %s: 3 steps over %d elements bit-identical to numpy" % (label, n))
    # Errors come back as codes with a message, never as a crash.
    o = AdamOptions()
    LIB.zinf_adam_options_default(ctypes.byref(o))
    o.eps = 0.0
    p = np.zeros(16, np.float32)
    msg = check(LIB.zinf_adam_step(adam, ctypes.byref(o), 1, 1.0, ptr(p), ptr(p.copy()), ptr(p.copy()),
                                   ptr(p.copy()), ZINF_DTYPE_FP32, None, ZINF_DTYPE_BF16, 16),
                ZINF_ERR_INVALID_ARGUMENT)
    assert "eps" in msg, msg
    LIB.zinf_adam_destroy(adam)


# ---- the engine's pointer arrays ----------------------------------------------

STAGE3_CONFIG = b"""{
  "train_micro_batch_size_per_gpu": 1,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                        "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0},
  "zinf": {"device": "cpu", "device_memory": 67108864}
}"""


def test_engine_tensor_arrays():
    """A unit's `tensors` array stays what it was when returned, as zinf.h
    promises, even after a later fetch gathers the unit at another address:
    a task enqueued with the first fetch's pointers may still read them."""
    engine, stream = c_void_p(), c_void_p()
    check(LIB.zinf_engine_create(STAGE3_CONFIG, None, ctypes.byref(engine)))
    shapes = [(c_i64 * 1)(70000), (c_i64 * 1)(1000)]  # two tensors per unit
    for u in range(2):
        specs = (ParamSpec * 2)(*[ParamSpec(b"w%d" % i, shapes[i], 1, ZINF_DTYPE_FP32, None) for i in range(2)])
        check(LIB.zinf_engine_add_unit(engine, b"unit%d" % u, specs, 2, None))
    check(LIB.zinf_stream_create(engine, ctypes.byref(stream)))

    grad_buffers = []  # (address, bytes) of every gradient buffer handed out

    def micro_step(order):
        got = {}
        for u in order:  # each unit fetched, and held until the micro-step's end
            p = UnitPointers()
            check(LIB.zinf_engine_fetch(engine, u, stream, ctypes.byref(p)))
            got[u] = p
        for u in order:
            g = UnitPointers()
            check(LIB.zinf_engine_grad_buffers(engine, u, ctypes.byref(g)))
            grad_buffers.append((g.data, g.num_elems * 4))
            check(LIB.zinf_engine_grads_ready(engine, u, stream))
            check(LIB.zinf_engine_release(engine, u, stream))
        boundary = c_int()
        check(LIB.zinf_engine_step(engine, ctypes.byref(boundary)))
        check(LIB.zinf_stream_synchronize(stream))
        return got

    first = micro_step([0])[0]
    first_data = first.data
    first_tensors = [first.tensors[i] for i in range(first.num_tensors)]
    assert first_tensors[0] == first_data, (first_tensors, first_data)
    # Unit 1 gathered first takes the memory unit 0 had; unit 0 lands elsewhere.
    second = micro_step([1, 0])[0]
    assert second.data != first_data, "unit 0 was gathered at the same address again: the test proves nothing"
    now = [first.tensors[i] for i in range(first.num_tensors)]
    assert now == first_tensors, "the array the first fetch returned changed: %s, was %s" % (now, first_tensors)
    assert [second.tensors[i] for i in range(second.num_tensors)][0] == second.data
    # On the CPU device every address lies in the one reservation the engine
    # reports: a front-end's single tensor over it covers them all.
    base, size = c_void_p(), c_u64()
    check(LIB.zinf_engine_host_memory(engine, ctypes.byref(base), ctypes.byref(size)))
    assert base.value and size.value > 0, (base.value, size.value)
    for data, n in [(first.data, first.num_elems * 4), (second.data, second.num_elems * 4)] + grad_buffers:
        assert base.value <= data and data + n <= base.value + size.value, (data, n, base.value, size.value)
    assert LIB.zinf_engine_host_memory(engine, None, ctypes.byref(size)) != 0  # a NULL out-pointer is refused
    LIB.zinf_stream_destroy(stream)
    LIB.zinf_engine_destroy(engine)
    print("ok: stage-3 fetch pointer arrays stay as returned")


def test_report_loss():
    """zinf.stop_on_nonfinite_loss through the C ABI: a NaN loss fails with
    FAILED_PRECONDITION naming it, and the next step refuses; without the
    key, a NaN loss is accepted."""
    for stop in (False, True):
        config = STAGE3_CONFIG.replace(b'"device": "cpu"',
                                       b'"device": "cpu", "stop_on_nonfinite_loss": %s' % (b"true" if stop else b"false"))
        engine = c_void_p()
        check(LIB.zinf_engine_create(config, None, ctypes.byref(engine)))
        w = (c_i64 * 1)(1000)
        spec = (ParamSpec * 1)(ParamSpec(b"w", w, 1, ZINF_DTYPE_FP32, None))
        check(LIB.zinf_engine_add_unit(engine, b"unit", spec, 1, None))
        check(LIB.zinf_engine_report_loss(engine, 3.25))
        if not stop:
            check(LIB.zinf_engine_report_loss(engine, float("nan")))
        else:
            message = check(LIB.zinf_engine_report_loss(engine, float("nan")), ZINF_ERR_FAILED_PRECONDITION)
            assert "the loss is nan" in message and "stop_on_nonfinite_loss" in message, message
            message = check(LIB.zinf_engine_step(engine, None), ZINF_ERR_FAILED_PRECONDITION)
            assert "the loss is nan" in message, message
        LIB.zinf_engine_destroy(engine)
    print("ok: a NaN loss stops the engine where the config says so")


def test_stream_adopt():
    """zinf_stream_adopt on the cpu device: INVALID_ARGUMENT naming why,
    with nothing written to `out` (a framework's streams exist only on a
    GPU; tests/gpu adopts a CUDA stream)."""
    engine = c_void_p()
    check(LIB.zinf_engine_create(STAGE3_CONFIG, None, ctypes.byref(engine)))
    stream = c_void_p(None)
    message = check(LIB.zinf_stream_adopt(engine, None, ctypes.byref(stream)), ZINF_ERR_INVALID_ARGUMENT)
    assert "no native streams to adopt" in message, message
    assert stream.value is None
    LIB.zinf_engine_destroy(engine)
    print("ok: the cpu device refuses to adopt a native stream")


def test_trace():
    """A caller's work on the engine's timeline: what it enqueues between
    zinf_engine_trace_begin and _end (here a 50 ms host function) is a span
    of the step in stats_json's timeline, beside the engine's own update;
    an unknown token is INVALID_ARGUMENT."""
    import json
    import time
    engine, stream = c_void_p(), c_void_p()
    check(LIB.zinf_engine_create(STAGE3_CONFIG, None, ctypes.byref(engine)))
    w = (c_i64 * 1)(1000)
    spec = (ParamSpec * 1)(ParamSpec(b"w", w, 1, ZINF_DTYPE_FP32, None))
    check(LIB.zinf_engine_add_unit(engine, b"unit", spec, 1, None))
    check(LIB.zinf_stream_create(engine, ctypes.byref(stream)))
    sleep = HOST_FN(lambda _: (time.sleep(0.05), 0)[1])
    p = UnitPointers()
    check(LIB.zinf_engine_fetch(engine, 0, stream, ctypes.byref(p)))
    token = c_i64(-1)
    check(LIB.zinf_engine_trace_begin(engine, stream, ctypes.byref(token)))
    assert token.value > 0, token.value  # after the first fetch: timed
    check(LIB.zinf_stream_enqueue_host(stream, sleep, None))
    check(LIB.zinf_engine_trace_end(engine, stream, token, b"compute", b"forward unit"))
    message = check(LIB.zinf_engine_trace_end(engine, stream, token, b"compute", b"again"), ZINF_ERR_INVALID_ARGUMENT)
    assert "not an open trace" in message, message
    g = UnitPointers()
    check(LIB.zinf_engine_grad_buffers(engine, 0, ctypes.byref(g)))
    check(LIB.zinf_engine_grads_ready(engine, 0, stream))
    check(LIB.zinf_engine_release(engine, 0, stream))
    check(LIB.zinf_engine_step(engine, None))
    check(LIB.zinf_stream_synchronize(stream))
    check(LIB.zinf_engine_synchronize(engine))
    out = c_void_p()
    check(LIB.zinf_engine_stats_json(engine, ctypes.byref(out)))
    stats = json.loads(ctypes.string_at(out.value).decode())
    LIB.zinf_string_free(out)
    spans = [t for t in stats["timeline"] if t["lane"] == "compute"]
    assert [t["what"] for t in spans] == ["forward unit"], stats["timeline"]
    assert spans[0]["end"] - spans[0]["start"] >= 0.045, spans
    assert any(t["lane"] == "optimizer" and t["what"] == "unit" for t in stats["timeline"]), stats["timeline"]
    assert stats["timeline_dropped"] == 0
    LIB.zinf_stream_destroy(stream)
    LIB.zinf_engine_destroy(engine)
    print("ok: traced work is on the step's timeline")


def test_call_cpu_accounting():
    """zinf_call_cpu_accounting: off, calls add nothing to the thread's
    total; on, an Adam step on the calling thread (one thread) counts most
    of the thread's CPU time over it and never more, while waiting on a
    stream for a 50 ms host function counts almost nothing."""
    import time
    adam = c_void_p()
    check(LIB.zinf_adam_create(1, ctypes.byref(adam)))
    o = AdamOptions()
    LIB.zinf_adam_options_default(ctypes.byref(o))
    n = 1 << 22
    p, m, v = np.ones(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32)
    g = np.full(n, 0.5, np.float32)

    def steps():
        for step in range(1, 6):
            check(LIB.zinf_adam_step(adam, ctypes.byref(o), step, 1.0, ptr(p), ptr(m), ptr(v), ptr(g),
                                     ZINF_DTYPE_FP32, None, ZINF_DTYPE_BF16, n))
    before = LIB.zinf_thread_call_cpu_seconds()
    steps()
    assert LIB.zinf_thread_call_cpu_seconds() == before, "counted while accounting is off"
    LIB.zinf_call_cpu_accounting(1)
    c0, s0 = time.thread_time(), LIB.zinf_thread_call_cpu_seconds()
    steps()
    busy, thread = LIB.zinf_thread_call_cpu_seconds() - s0, time.thread_time() - c0
    assert 0.5 * thread < busy <= thread + 1e-3, (busy, thread)
    LIB.zinf_adam_destroy(adam)

    engine, stream = c_void_p(), c_void_p()
    check(LIB.zinf_engine_create(STAGE3_CONFIG, None, ctypes.byref(engine)))
    check(LIB.zinf_stream_create(engine, ctypes.byref(stream)))
    sleep = HOST_FN(lambda _: (time.sleep(0.05), 0)[1])
    check(LIB.zinf_stream_enqueue_host(stream, sleep, None))
    t0, s0 = time.perf_counter(), LIB.zinf_thread_call_cpu_seconds()
    check(LIB.zinf_stream_synchronize(stream))
    waited, counted = time.perf_counter() - t0, LIB.zinf_thread_call_cpu_seconds() - s0
    LIB.zinf_call_cpu_accounting(0)
    assert waited >= 0.04 and counted < 0.01, (waited, counted)
    LIB.zinf_stream_destroy(stream)
    LIB.zinf_engine_destroy(engine)
    print("ok: call CPU accounting counts the thread's work inside calls (%.3f of %.3f s), not its waits (%.4f s in "
          "a %.3f s wait)" % (busy, thread, counted, waited))


def main():
    global LIB
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    LIB = load(sys.argv[1])
    assert LIB.zinf_abi_version() == 0
    check(LIB.zinf_set_log_level(b"warn"))
    print("zinf %s from %s, numpy %s" % (LIB.zinf_version().decode(), sys.argv[1], np.__version__))
    os.makedirs(sys.argv[2], exist_ok=True)
    with tempfile.TemporaryDirectory(dir=sys.argv[2]) as scratch:
        aio_round_trip(scratch, 0, ZINF_FILE_READ, "default")
        aio_round_trip(scratch, ZINF_AIO_POSIX, ZINF_FILE_READ, "posix")
        aio_round_trip(scratch, 0, ZINF_FILE_DIRECT, "o_direct")
    test_adam()
    test_engine_tensor_arrays()
    test_report_loss()
    test_stream_adopt()
    test_trace()
    test_call_cpu_accounting()
    print("PASS: python ctypes + numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
