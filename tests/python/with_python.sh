#!/bin/bash
# Runs a Python test with the interpreter of scripts/setup's environment, or
# skips (exit 77) naming what is missing.
#   with_python.sh PYTHON SCRIPT [ARGS...]
py=$1
shift
if [[ ! -x $py ]]; then
  echo "SKIP: $py does not exist (scripts/setup makes the Python environment; ZINF_PYTHON names another)"
  exit 77
fi
exec "$py" "$@"
