#!/usr/bin/env bash
# Installs the Debian packages dflash needs (only those missing; silent when
# all are present), then configures and builds: Release, Ninja, ccache, lld,
# precompiled headers. Safe to run again: every step is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(g++ cmake ninja-build ccache lld
      libtorch-dev libopenblas0-pthread
      librapidcheck-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
      libfmt-dev libgloo-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libspdlog-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "bootstrap: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /tmp/dflash-apt.log 2>&1 \
    || { tail -30 /tmp/dflash-apt.log; exit 1; }
fi

# Configure once (again only if the cache is missing), then build.
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > /tmp/dflash-cmake.log 2>&1 \
    || { cat /tmp/dflash-cmake.log; exit 1; }
fi
cmake --build build
