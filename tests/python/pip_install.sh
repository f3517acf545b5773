#!/bin/bash
# `pip install ./python` as a user runs it (offline: the build backend is
# Debian's setuptools, hence --no-build-isolation), into a scratch target,
# then zinf.torch imported from there trains one step.
#   pip_install.sh PYTHON PYTHON_SRC SCRATCH LIBZINF
set -euo pipefail
py=$1 src=$2 scratch=$3 lib=$4
if ! "$py" -c 'import setuptools, torch' 2>/dev/null || ! "$py" -m pip --version >/dev/null 2>&1; then
  echo "SKIP: $py lacks torch, pip or setuptools (scripts/setup makes the Python environment)"
  exit 77
fi
rm -rf "$scratch" && mkdir -p "$scratch"
cp -r "$src" "$scratch/src"  # pip builds in the source tree: keep the checkout clean
"$py" -m pip install --no-build-isolation --no-deps --quiet --target "$scratch/site" "$scratch/src"
cd "$scratch"
ZINF_LIBRARY=$lib ZINF_LOG_LEVEL=warn PYTHONPATH="$scratch/site" "$py" - <<'PY'
import torch, zinf.torch
assert zinf.torch.__file__.startswith(__import__("os").getcwd()), zinf.torch.__file__
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
engine = zinf.torch.initialize(model, {"train_micro_batch_size_per_gpu": 1, "zinf": {"device": "cpu"}})
loss = engine(torch.ones(4, 8)).pow(2).mean()
engine.backward(loss)
assert engine.step()
print("pip-installed zinf.torch: one step, loss %.4f" % loss.item())
PY
