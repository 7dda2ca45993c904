#!/usr/bin/env bash
# Stands in for the torch environment's python when CMake found none, so the
# Python interop tests fail, saying why, instead of not being registered.
echo "no suitable python was found at configure time (python3 >= 3.11; the torch environment with torch, safetensors, transformers, PyYAML):" \
     "run ci/bootstrap.sh (it installs them and reconfigures), or set DFLASH_TORCH_PYTHON" >&2
exit 1
