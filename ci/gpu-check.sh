#!/usr/bin/env bash
# The GPU check (docs/GPU.md), run ON the GPU machine from the repository
# root, after ci/gpu-gather.sh ran here and .gpu-deps/ travelled with the tree:
#   ci/gpu-check.sh OUTDIR
# Builds dflash against that machine's own torch (python3's), then runs, each
# under its own time limit (about 12.5 minutes in all at most):
#   build       configure + the dflash binary
#   build_tests the gpu test executables (each on its own: -k 0)
#   gpu_tests   ctest -L gpu: CUDA vs float64 CPU reference parity (step, loss,
#               attention; generated configs in fp32, bf16, fp64), the CUDA
#               generator replay of activation checkpointing, memory ceilings
#               on the CUDA caching allocator, a one-rank NCCL group
#   torch_ops   the PyTorch ops (docs/PYTORCH.md) on CUDA: opcheck, parity,
#               the compile + checkpoint test, ci/flex_contrast.py --device cuda
#   bench       dflash bench --device cuda (GPU sizes: loss Q=8192 H=4096
#               V=128256 bf16, attention S=8192 with 256 blocks of 16)
#   train       dflash train on fixtures/configs/tiny-train-random.toml with
#               --device cuda (preflight gate included, 10 cases)
# and writes OUTDIR/summary.json (each stage: rc, seconds) beside the logs,
# bench.json and env.json. Exit status: 0 when every stage passed.
# DFLASH_GPU_CMAKE_ARGS adds configure arguments (a dry run on a machine
# with the packages installed: -DCMAKE_IGNORE_PREFIX_PATH=/usr makes the
# build use .gpu-deps' CMake packages only).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: ci/gpu-check.sh OUTDIR}
mkdir -p "$out"
deps=${DFLASH_GPU_DEPS:-/tmp/dflash-gpu-deps}
build=${DFLASH_GPU_BUILD:-/tmp/dflash-gpu-build}
python=${DFLASH_TORCH_PYTHON:-$(command -v python3)}
jobs=$(nproc)
declare -A rc secs
order=()

stage() {  # stage NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  order+=("$name")
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)" | tee -a "$out/$name.log"
  timeout "$limit" "$@" >> "$out/$name.log" 2>&1
  rc[$name]=$?
  secs[$name]=$((SECONDS - t0))
  echo "== $name: rc ${rc[$name]} in ${secs[$name]}s" | tee -a "$out/$name.log"
  tail -n 5 "$out/$name.log"
}

unpack() {
  ls .gpu-deps/*.deb > /dev/null 2>&1 || {
    echo "no .gpu-deps/*.deb: run ci/gpu-gather.sh here first and carry .gpu-deps"; return 1; }
  mkdir -p "$deps"
  local f tmp
  for f in .gpu-deps/*.deb; do
    if command -v dpkg-deb > /dev/null; then
      dpkg-deb -x "$f" "$deps" || return 1
    else  # a .deb is an ar archive holding data.tar.*
      tmp=$(mktemp -d) && (cd "$tmp" && ar x "$OLDPWD/$f") && tar -xf "$tmp"/data.tar.* -C "$deps" \
        || return 1
      rm -rf "$tmp"
    fi
  done
}

configure_and_build() {
  cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDFLASH_TORCH_PYTHON="$python" \
    -DCMAKE_PREFIX_PATH="$deps/usr" -DDFLASH_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
    ${DFLASH_GPU_CMAKE_ARGS:-} \
    && cmake --build "$build" -j "$jobs" --target dflash
}

if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
else
  echo "no nvidia-smi on this machine" > "$out/gpu.txt"
fi
export CPATH="$deps/usr/include${CPATH:+:$CPATH}"
stage build 180 bash -c "$(declare -f unpack configure_and_build); deps=$deps build=$build \
  python=$python jobs=$jobs; unpack && configure_and_build"
if [ "${rc[build]}" -eq 0 ]; then
  "$build/dflash" env --json "$out/env.json" > /dev/null 2>&1
  # The test executables apart (-k 0): one that fails to build (say, no
  # nccl.h in that wheel) leaves the others, the bench and the run.
  stage build_tests 120 cmake --build "$build" -j "$jobs" -- -k 0 harness_cuda_gpu_test \
    dist_nccl_gpu_test dist_split_gpu_test decode_speculative_gpu_test
  stage gpu_tests 120 ctest --test-dir "$build" -L gpu --output-on-failure
  # The PyTorch ops on CUDA (docs/PYTORCH.md): opcheck and parity, the
  # compile + checkpoint test, and flex_attention in the same set-up.
  # pytest comes as wheels from .gpu-deps (ci/gpu-gather.sh), unzipped.
  stage torch_ops 180 bash -c "set -e; cmake --build '$build' -j $jobs --target dflash_torch_ops
    mkdir -p /tmp/dflash-gpu-wheels; for w in .gpu-deps/wheels/*.whl; do
      '$python' -m zipfile -e \"\$w\" /tmp/dflash-gpu-wheels; done
    export PYTHONPATH=python:/tmp/dflash-gpu-wheels DFLASH_TEST_DEVICE=cuda
    export DFLASH_OPS_LIBRARY='$build/python/dflash/libdflash_ops.so'
    '$python' -m pytest -q -p no:cacheprovider python/dflash/ops_test.py \
      python/dflash/compile_checkpoint_test.py
    '$python' ci/flex_contrast.py --device cuda"
  stage bench 90 "$build/dflash" bench --device cuda --repeats 2 --json "$out/bench.json"
  rm -rf /tmp/dflash-gpu-run  # a warm machine keeps /tmp between runs
  stage train 60 "$build/dflash" train --config fixtures/configs/tiny-train-random.toml --device cuda \
    --out-dir /tmp/dflash-gpu-run --preflight-cases 10
fi

status=0
{
  printf '{\n  "gpu": "%s",\n  "stages": {' "$(head -n1 "$out/gpu.txt" | tr -d '"')"
  sep=""
  for s in "${order[@]}"; do
    printf '%s\n    "%s": {"rc": %d, "seconds": %d}' "$sep" "$s" "${rc[$s]}" "${secs[$s]}"
    sep=","
    [ "${rc[$s]}" -eq 0 ] || status=1
  done
  printf '\n  },\n  "passed": %s\n}\n' "$([ $status -eq 0 ] && echo true || echo false)"
} > "$out/summary.json"
cat "$out/summary.json"
exit $status
