#!/usr/bin/env bash
# The nightly suite: the quick suite and the `nightly` label with 20x the
# property cases and fresh seeds (printed, so a failure can be replayed:
# DFLASH_CASES=... DFLASH_SEED=... ctest -R <test>), then `dflash parity`
# at 20x its default case count with the same seed, then the mutation runner
# (ci/mutants.sh: every mutant of ci/mutants.toml killed), the fuzz targets
# for 3 minutes each (ci/fuzz.sh) and the quick suite under ASan + UBSan
# (ci/sanitize.sh), and the quick suite built against the newest torch of
# cmake/TORCH_RANGE (ci/torch-newest.sh). docs/RELIABILITY.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/bootstrap.sh
seed="${DFLASH_SEED:-$(date +%s)}"
echo "nightly seed: $seed"
export DFLASH_SEED="$seed" DFLASH_CASES="${DFLASH_CASES:-3000}"
export RC_PARAMS="${RC_PARAMS:-max_success=2000 seed=$seed}"
ctest --test-dir build -j"$(nproc)" --output-on-failure --timeout 3600 \
  --output-junit nightly-ctest.xml
build/dflash parity --cases 4000 --seed "$seed" --json build/nightly-parity.json \
  --junit build/nightly-parity.xml --out-dir build
# Mutation testing of the real sources: every mutant must be killed
# (DFLASH_MUTANTS_ONLY="name ..." runs a subset, e.g. where a session's
# time does not hold the whole run; the log says so).
if [ -n "${DFLASH_MUTANTS_ONLY:-}" ]; then
  echo "nightly: mutation runner on a subset: $DFLASH_MUTANTS_ONLY"
  # shellcheck disable=SC2086
  ci/mutants.sh --json build/nightly-mutants.json --only $DFLASH_MUTANTS_ONLY
else
  ci/mutants.sh --json build/nightly-mutants.json
fi
# The newest torch of cmake/TORCH_RANGE: its own environment and build,
# the quick suite (the package's tests included) against it.
ci/torch-newest.sh
# Every parser fuzzed, then the quick suite under the sanitizers.
ci/fuzz.sh "${DFLASH_FUZZ_SECONDS:-180}"
ci/sanitize.sh
