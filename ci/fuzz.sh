#!/usr/bin/env bash
# ci/fuzz.sh SECONDS [TARGET ...]
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan, against the
# same libtorch) in build-fuzz/ and runs each for SECONDS over its seed
# corpus (fuzz/corpus/<target>/ plus the fixtures listed below). New inputs
# go to build-fuzz/corpus/ (not the tree). A finding is written to
# build-fuzz/findings/<target>-crash-*; reproduce it with
#   build-fuzz/fuzz/fuzz_<target> build-fuzz/findings/<target>-crash-...
# then add the input to fuzz/corpus/<target>/ (a regression input) with the fix.
# Exit 1 when any target found something. docs/RELIABILITY.md.
set -euo pipefail
secs=${1:?usage: ci/fuzz.sh SECONDS [TARGET ...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DFLASH_FUZZ_BUILD:-$root/build-fuzz}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config_toml hf_config safetensors jsonl trainer_state counterexample
                                     chat_records)
# chat_records is Python (fuzz/chat_records_fuzz.py, the parser of `dflash
# prepare`), fuzzed by atheris in the torch environment (ci/bootstrap.sh).
torch_python=${DFLASH_TORCH_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dflash/torch-$(cat "$root/cmake/TORCH_VERSION")}/bin/python

if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER=clang++ -DDFLASH_FUZZ=ON -DDFLASH_CUDA=OFF \
    -DDFLASH_BUILD_TESTS=OFF -DDFLASH_BUILD_BENCH=OFF > "$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; exit 2; }
fi
cmake --build "$build" --target fuzz

# Seeds beyond fuzz/corpus: the fixtures in the tree that each parser reads.
seeds() {
  case $1 in
    config_toml) ls "$root"/fixtures/configs/*.toml "$root"/fixtures/configs/hostile/*.toml ;;
    *) ;;
  esac
}

supp=$root/ci/sanitizers
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
mkdir -p "$build/findings"
failed=()
for t in "${targets[@]}"; do
  work=$build/corpus/$t
  mkdir -p "$work"
  for f in $(seeds "$t"); do cp -f "$f" "$work/seed-$(basename "$f")"; done
  echo "== fuzz_$t: ${secs} s"
  run=("$build/fuzz/fuzz_$t")
  [ "$t" = chat_records ] && run=("$torch_python" "$root/fuzz/chat_records_fuzz.py" --fuzz)
  if ! "${run[@]}" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 \
      -print_final_stats=1 -artifact_prefix="$build/findings/$t-" "$work" \
      "$root/fuzz/corpus/$t" > "$build/findings/$t.log" 2>&1; then
    failed+=("$t")
    tail -60 "$build/findings/$t.log"
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|Done [0-9]+ runs" \
    "$build/findings/$t.log" | tr '\n' ' ' || true
  echo
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in: ${failed[*]} (inputs under $build/findings/)"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${secs} s each, nothing found"
