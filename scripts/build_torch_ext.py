#!/usr/bin/env python3
"""Builds zinf.torch's C++ core (_zinf_torch: src/torch/torch_hooks.cc and torch_comm.cc) for
the Python and torch that run this script, with torch's own extension
builder (a C++ compiler is all it needs; about a minute), where CMake's
build of it does not fit: another Python or torch than the build's (a GPU
machine's image), or zinf's package installed by pip.

  build_torch_ext.py OUT_DIR [--source ROOT] [--reuse MODULE]

ROOT holds src/torch/ (torch_hooks.cc, torch_comm.cc and their headers) and
include/zinf/zinf.h (default: this checkout, or the GPU bundle this script
sits in). --reuse MODULE: a module already built; when it loads here,
nothing is built. Prints the module's path last; set ZINF_TORCH_EXTENSION
to it (or put it beside libzinf.so)."""
import argparse
import importlib.util
import os
import sys
import time


def loads(path):
    """Whether the module at `path` imports into this interpreter (and why not)."""
    import torch  # noqa: F401  (the module needs torch's libraries loaded, as zinf.torch has them)
    try:
        spec = importlib.util.spec_from_file_location("_zinf_torch", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return True, None
    except ImportError as e:
        return False, str(e)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--reuse")
    args = ap.parse_args()
    if args.reuse:
        ok, why = loads(args.reuse)
        if ok:
            print("build_torch_ext: %s loads here: nothing to build" % args.reuse)
            print(args.reuse)
            return
        print("build_torch_ext: %s does not load here (%s): building" % (args.reuse, why))
    here = os.path.join(args.source, "src", "torch")
    sources = [os.path.join(here, "torch_hooks.cc"), os.path.join(here, "torch_comm.cc")]
    include = os.path.join(args.source, "include")
    for path in sources + [os.path.join(here, "torch_core.h"), os.path.join(here, "torch_comm.h"),
                           os.path.join(include, "zinf", "zinf.h")]:
        if not os.path.isfile(path):
            raise SystemExit("build_torch_ext: %s is missing (--source names the folder that holds src/ and include/)"
                             % path)
    import torch
    from torch.utils import cpp_extension
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    module = cpp_extension.load(name="_zinf_torch", sources=sources, extra_include_paths=[include],
                                build_directory=os.path.abspath(args.out), extra_cflags=["-O2"], verbose=False)
    print("build_torch_ext: built for torch %s and Python %s in %.0f s" % (
        torch.__version__, sys.version.split()[0], time.time() - t0))
    print(module.__file__)


if __name__ == "__main__":
    main()
