#!/usr/bin/env bash
# Run HERE (a Debian 12 machine with apt): gathers what ci/gpu-check.sh needs
# on the GPU machine beyond its image (torch 2.11 in python3, CMake, Ninja,
# nvcc, g++; no internet) into .gpu-deps/ (git-ignored, ~5 MB), which the
# device tool carries with the tree: the Debian packages of the header and
# test libraries dflash builds against. Nothing is installed here.
#   ci/gpu-gather.sh            then   device run, carry [".gpu-deps"]:
#                                      ci/gpu-check.sh $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libcli11-dev libgtest-dev libgmock-dev libfmt-dev libfmt9 nlohmann-json3-dev
      librapidcheck-dev libtomlplusplus-dev libtomlplusplus3 libgloo-dev)
mkdir -p .gpu-deps
cd .gpu-deps
missing=()
for p in "${pkgs[@]}"; do
  compgen -G "${p}_*.deb" > /dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get download "${missing[@]}" > /tmp/dflash-gpu-gather.log 2>&1 || {
    # Package lists may be missing on a fresh machine.
    apt-get update -qq && apt-get download "${missing[@]}"
  }
fi
# pytest (and what it needs), for the PyTorch ops' tests (stage torch_ops):
# wheels the GPU machine's python puts on sys.path without installing.
if ! compgen -G "wheels/pytest-*.whl" > /dev/null; then
  python3 -m pip download -q --only-binary=:all: -d wheels pytest==9.2.0 \
    > /tmp/dflash-gpu-gather.log 2>&1 || { tail -5 /tmp/dflash-gpu-gather.log; exit 1; }
fi
echo "gpu-gather: $(ls ./*.deb | wc -l) packages, $(ls wheels/*.whl | wc -l) wheels in .gpu-deps ($(du -sh . | cut -f1))"
