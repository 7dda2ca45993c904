#!/usr/bin/env bash
# ci/sanitize.sh [ctest args...]
# The whole tree under AddressSanitizer + UndefinedBehaviorSanitizer (and
# LeakSanitizer, which comes with ASan), built with g++ against the same
# libtorch in build-asan/, then the quick suite under it (or the ctest
# arguments given). Suppressions for libtorch itself live in ci/sanitizers/,
# one comment each; nothing of dflash is suppressed. docs/RELIABILITY.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DFLASH_ASAN_BUILD:-$root/build-asan}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDFLASH_SANITIZE=address,undefined -DDFLASH_CUDA=OFF -DDFLASH_BUILD_BENCH=OFF \
    > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 2; }
fi
start=$(date +%s)
cmake --build "$build"
built=$(date +%s)
supp=$root/ci/sanitizers
# libtorch is not instrumented: ODR and container-overflow reports across
# its boundary are not meaningful (docs/RELIABILITY.md).
export ASAN_OPTIONS="detect_leaks=1:detect_odr_violation=0:detect_container_overflow=0:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export DFLASH_SANITIZED=1  # ci/cli_tests.sh: no address-space limit under ASan
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
if [ $# -eq 0 ]; then set -- -L quick; fi
rc=0
ctest --test-dir "$build" -j"$(nproc)" --output-on-failure --timeout 1800 "$@" || rc=$?
echo "sanitize: build $((built - start)) s, tests $(( $(date +%s) - built )) s, exit $rc"
exit $rc
