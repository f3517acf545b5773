#!/bin/bash
# `pip install .` as a Python user gets it: a wheel of the source tree (the
# build shares the test build's CMake tree, so nothing is compiled twice),
# installed into a fresh virtual environment that has only PyPI's torch;
# then, with no zinf variable set and outside the source tree:
#   - `zinf --version` runs from the environment's PATH;
#   - a DeepSpeed-style script on zinf.deepspeed trains, and the library and
#     zinf.torch's C++ core it loaded are the wheel's;
#   - the C++ core refuses a torch other than the one it was built against,
#     naming the rebuild;
# then the editable install people working on zinf use (docs/python.md), by
# PYTHON into a prefix of its own, in the same build tree: the Python files
# come from the source tree, the native ones from the build, and a touched
# src/capi/engine_capi.cc is rebuilt when zinf next loads its library.
#   wheel_install.sh PYTHON SOURCE BUILD_DIR SCRATCH
# PYTHON: scripts/setup's environment (its scikit-build-core builds the
# wheel; its torch's version is the one installed fresh). Needs PyPI (or
# pip's cache) for torch.
set -euo pipefail
py=$1 src=$2 build=$3 scratch=$4
if ! "$py" -c 'import scikit_build_core, torch' 2>/dev/null; then
  echo "SKIP: $py lacks torch or scikit-build-core (scripts/setup makes the Python environment)"
  exit 77
fi
rm -rf "$scratch" && mkdir -p "$scratch"
t0=$SECONDS
# The tree keeps its test suites (pyproject.toml turns them off for users)
# and the ninja it was made with: another version rewrites ninja's log, and
# every object is built again.
make_program=$(sed -n 's/^CMAKE_MAKE_PROGRAM:[A-Z]*=//p' "$build/CMakeCache.txt")
ninja_version=$("$make_program" --version | cut -d. -f1-3)
"$py" -m pip wheel --no-build-isolation --no-deps --quiet --disable-pip-version-check -w "$scratch/wheel" \
  --config-settings=build-dir="$build" --config-settings=cmake.define.ZINF_BUILD_TESTS=ON \
  --config-settings=ninja.version="==$ninja_version" "$src"
# The shared tree configured again as it was, without the wheel's install layout.
cmake -DCMAKE_MAKE_PROGRAM="$make_program" "$build" > /dev/null
echo "wheel: $(cd "$scratch/wheel" && ls) in $((SECONDS - t0)) s"

t0=$SECONDS
base=$("$py" -c 'import sys; print(sys._base_executable)')
"$base" -m venv "$scratch/venv"
torch_version=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
numpy_version=$("$py" -c 'import numpy; print(numpy.__version__)')
"$scratch/venv/bin/pip" install --quiet --disable-pip-version-check "torch==$torch_version" "numpy==$numpy_version"
"$scratch/venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$scratch/wheel"/zinf-*.whl
echo "fresh environment with torch $torch_version and the wheel in $((SECONDS - t0)) s"

cd "$scratch"
clean=(env -i HOME="$HOME" PATH="$scratch/venv/bin:/usr/bin:/bin" ZINF_LOG_LEVEL=warn)
which_zinf=$("${clean[@]}" bash -c 'command -v zinf')
[[ "$which_zinf" == "$scratch/venv/bin/zinf" ]] || { echo "zinf on PATH is '$which_zinf'"; exit 1; }
"${clean[@]}" zinf --version | head -1

cat > train.py <<'PY'
import os, sys
import torch
import zinf.deepspeed as deepspeed
from zinf import _capi, _units

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
          "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
          "zinf": {"device": "cpu"}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
x, y = torch.randn(4, 16), torch.randn(4, 1)
losses = []
for _ in range(5):
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
assert losses[-1] < losses[0], losses
venv = os.path.realpath(sys.prefix)
lib = _units._loaded_library_path()
module, why = _units.extension()
assert lib and lib.startswith(venv), "libzinf.so loaded from %s, not the wheel in %s" % (lib, venv)
assert module is not None, "zinf.torch runs its Python core: " + str(why)
assert os.path.realpath(module.__file__).startswith(venv), module.__file__
print("zinf.deepspeed from the wheel: stage 3, 5 steps, loss %.4f -> %.4f; %s; C++ core %s"
      % (losses[0], losses[-1], os.path.basename(lib), os.path.basename(module.__file__)))
PY
"${clean[@]}" "$scratch/venv/bin/python" train.py

# Another torch than the one recorded at build time: a clear refusal.
recorded=$(find "$scratch/venv" -name _zinf_torch.torch_version)
echo "0.0.1" > "$recorded"
if out=$("${clean[@]}" "$scratch/venv/bin/python" train.py 2>&1); then
  echo "a C++ core recorded as built for torch 0.0.1 was loaded into torch $torch_version"; exit 1
fi
grep -q "was built against torch 0.0.1.*Rebuild zinf" <<< "$out" || { echo "unclear refusal:"; echo "$out" | tail -5; exit 1; }
echo "another torch: refused ($(grep -o 'was built against torch 0.0.1, but this environment has torch [^ ]*' <<< "$out"))"

# The editable install (pip install -e . with editable.rebuild=true), sharing the tree as above. It is
# made by PYTHON (whose torch the tree is built against: another torch would recompile the C++ core
# twice) into a prefix of its own, read as a site folder, so that PYTHON's environment is untouched.
t0=$SECONDS
"$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  --prefix "$scratch/editable" -e "$src" \
  --config-settings=build-dir="$build" --config-settings=editable.rebuild=true \
  --config-settings=cmake.define.ZINF_BUILD_TESTS=ON --config-settings=ninja.version="==$ninja_version"
site_dir=$("$py" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib", vars={"base": sys.argv[1]}))' \
  "$scratch/editable")
ls "$site_dir"/*zinf*.pth > /dev/null
echo "editable install in $((SECONDS - t0)) s"
cat > editable.py <<'PY'
import os, site, sys
src, build, site_dir = sys.argv[1:4]
site.addsitedir(site_dir)  # the editable install's .pth, as in its environment
import zinf.deepspeed  # noqa: E402,F401
from zinf import _capi, _units  # noqa: E402
_capi.lib()
lib, module = _units._loaded_library_path(), _units.extension()[0]
assert os.path.realpath(zinf.deepspeed.__file__).startswith(os.path.realpath(src)), zinf.deepspeed.__file__
assert lib and os.path.realpath(lib).startswith(os.path.realpath(build)), lib
assert module is not None and os.path.realpath(module.__file__).startswith(os.path.realpath(build)), module
print(os.path.realpath(lib))
PY
lib=$("${clean[@]}" "$py" editable.py "$src" "$build" "$site_dir" | tail -1)
echo "editable: zinf's Python from $src/python, its library from $lib"
before=$(stat -c %.9Y "$lib")
touch "$src/src/capi/engine_capi.cc"
t0=$SECONDS
out=$("${clean[@]}" "$py" editable.py "$src" "$build" "$site_dir" 2>&1)
after=$(stat -c %.9Y "$lib")
grep -q "Running cmake --build" <<< "$out" || { echo "no rebuild at import:"; echo "$out" | tail -5; exit 1; }
[[ "$after" != "$before" ]] || { echo "$lib was not rebuilt"; exit 1; }
echo "editable: a touched src/capi/engine_capi.cc rebuilt and reinstalled at import in $((SECONDS - t0)) s"
cmake -DCMAKE_MAKE_PROGRAM="$make_program" "$build" > /dev/null
