#!/usr/bin/env bash
# The newest torch of cmake/TORCH_RANGE, nightly: its own environment
# (${XDG_CACHE_HOME:-~/.cache}/dflash/torch-<version>, made by ci/bootstrap.sh
# like the default one) and build directory (build-torch-<version>), then the
# quick suite against it: the C++ tests, the CLI tests and the package's
# pytest tests (their python is that environment's, with the package built
# against its torch). The version is $DFLASH_NEWEST_TORCH, else the newest
# release on PyPI inside the range. docs/BUILDING.md records the results.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r lo hi < cmake/TORCH_RANGE
version=${DFLASH_NEWEST_TORCH:-}
if [ -z "$version" ]; then
  # Releases on PyPI (the default environment's pip), kept when major.minor
  # lies in the range (compared as major * 1000 + minor).
  pip_python="${DFLASH_TORCH_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dflash/torch-$(head -n1 cmake/TORCH_VERSION)}/bin/python"
  [ -x "$pip_python" ] || pip_python=python3
  version=$("$pip_python" -m pip index versions torch 2>/dev/null \
    | sed -n 's/^Available versions: //p' | tr ',' '\n' | tr -d ' ' \
    | grep -E "^[0-9]+\.[0-9]+\.[0-9]+$" \
    | awk -F. -v lo="$lo" -v hi="$hi" 'BEGIN { split(lo, a, "."); split(hi, b, ".") }
        { m = $1 * 1000 + $2; if (m >= a[1] * 1000 + a[2] && m <= b[1] * 1000 + b[2]) print }' \
    | sort -V | tail -n1)
fi
[ -n "$version" ] || { echo "torch-newest: no torch release in $lo to $hi found on PyPI" >&2; exit 1; }
build_dir="build-torch-$version"
echo "torch-newest: torch $version (range $lo to $hi) in $build_dir"
DFLASH_TORCH_VERSION="$version" DFLASH_BUILD_DIR="$build_dir" ci/bootstrap.sh
DFLASH_EXPECT_TORCH="$version" ctest --test-dir "$build_dir" -L quick -j"$(nproc)" \
  --output-on-failure --timeout 1800
