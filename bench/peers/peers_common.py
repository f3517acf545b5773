"""What bench/peers/cpu_adam.py and bench/peers/storage.py share: where the
repository, the zinf CLI and libzinf.so are, the header of versions and
machine both print first, medians and ratios. Plain functions, no state
beyond the module's constants; not thread-safe only in that os.environ is
written by setup_environment() (call it before importing torch).
"""
import os
import platform
import shutil
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def setup_environment(max_threads):
    """Environment the peers need, set before torch or deepspeed is imported:
    DeepSpeed on its CPU accelerator, OpenMP at most `max_threads` threads
    (torch.set_num_threads then picks the count per case), zinf's Python
    package and library from this checkout unless the caller chose others."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ["OMP_NUM_THREADS"] = str(max_threads)
    lib = os.path.join(REPO, "build", "src", "capi", "libzinf.so")
    if not os.environ.get("ZINF_LIBRARY") and os.path.exists(lib):
        os.environ["ZINF_LIBRARY"] = lib
    py = os.path.join(REPO, "python")
    if py not in sys.path:
        sys.path.insert(0, py)


def zinf_cli():
    """The zinf binary: $ZINF, else build/zinf of this checkout."""
    return os.environ.get("ZINF") or os.path.join(REPO, "build", "zinf")


def _first_line(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        text = (out.stdout or out.stderr).strip()
        return text.splitlines()[0] if text else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "not found"


def git_revision():
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except OSError:
        return "?"


def cpu_model():
    model, flags = platform.processor() or "?", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("?", "", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line
                    break
    except OSError:
        pass
    simd = "avx512f" if " avx512f" in flags else "avx2" if " avx2" in flags else "-"
    return "%s, %d cpus, %s" % (model, os.cpu_count() or 0, simd)


def versions(with_torch=True, with_fio=False):
    """The header's facts, as a dict (also printed by print_header)."""
    v = {"zinf": _first_line([zinf_cli(), "--version"]), "zinf_revision": git_revision(),
         "zinf_library": os.environ.get("ZINF_LIBRARY", "(dynamic loader path)"),
         "python": platform.python_version(), "cpu": cpu_model(), "kernel": platform.release()}
    if with_torch:
        import torch
        import deepspeed
        v["torch"] = torch.__version__
        v["deepspeed"] = deepspeed.__version__
        v["ds_accelerator"] = os.environ.get("DS_ACCELERATOR", "")
    if with_fio:
        v["fio"] = _first_line(["fio", "--version"]) if shutil.which("fio") else "not found"
    try:
        v["load_average"] = "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        pass
    return v


def print_header(title, facts):
    print("# " + title)
    for k, val in facts.items():
        print("#   %-16s %s" % (k, val))


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def rotated(items, round_index):
    """items rotated by round_index: which engine runs first changes every round."""
    k = round_index % len(items)
    return items[k:] + items[:k]


def parse_size(text):
    """"64M" -> 67108864 (K, M, G, T are powers of 1024); plain digits as is."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = str(text).strip()
    if t and t[-1].upper() in units:
        return int(float(t[:-1]) * units[t[-1].upper()])
    return int(t)


def format_count(n):
    for unit, div in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d%s" % (n // div, unit)
    return str(n)


def ds_op_flags(op_name):
    """The compile flags DeepSpeed's JIT build of `op_name` used (its
    torch_extensions build.ninja): the SIMD and optimization level that
    matter for a comparison. "?" when not found."""
    try:
        from torch.utils.cpp_extension import _get_build_directory
        ninja = os.path.join(_get_build_directory(op_name, verbose=False), "build.ninja")
        with open(ninja) as f:
            for line in f:
                if line.startswith("cflags ="):
                    flags = line.split("=", 1)[1].split()
                    keep = [x for x in flags if x.startswith(("-O", "-march", "-mavx", "-D__AVX", "-fopenmp"))]
                    return " ".join(keep) + " (last -O wins)"
    except (ImportError, OSError):
        pass
    return "?"


class OtherCpu:
    """CPU time the rest of the machine used while a case ran: from
    /proc/stat (every CPU's user and system ticks, not interrupts, which
    serve this process's own I/O; and the hypervisor's steal) minus
    this process's own (/proc/self/stat, all its threads), which includes
    its waited-for children (cutime, cstime) and the live processes `pids`
    (workers). Read as cores: 0.0 means nothing else ran, 1.0 one whole core
    taken from a 2-core run. Linux only; None where /proc is missing."""

    def _sample(self):
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy, steal = v[0] + v[1] + v[2], v[7] if len(v) > 7 else 0  # user, nice, system (not irq: our I/O's)
        own = 0
        for i, pid in enumerate(["self"] + list(self.pids)):
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
            if i == 0:
                own += int(fields[13]) + int(fields[14])  # cutime, cstime: waited-for children
        return busy, steal, own

    def __init__(self, pids=()):
        import time
        self._time = time.monotonic
        self.pids = pids
        try:
            self.t0, self.s0 = self._time(), self._sample()
        except OSError:
            self.s0 = None

    def stop(self):
        """{'others': cores, 'steal': cores} since construction."""
        if self.s0 is None:
            return None
        s1, wall = self._sample(), self._time() - self.t0
        hz = os.sysconf("SC_CLK_TCK")
        others = ((s1[0] - self.s0[0]) - (s1[2] - self.s0[2])) / hz / max(wall, 1e-9)
        return {"others": max(0.0, others), "steal": (s1[1] - self.s0[1]) / hz / max(wall, 1e-9)}
