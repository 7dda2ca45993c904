#!/usr/bin/env bash
# The nightly suite: everything in the quick suite plus the `nightly` label
# (larger property runs). RC_PARAMS raises RapidCheck's case count.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/bootstrap.sh
RC_PARAMS="${RC_PARAMS:-max_success=500}" ctest --test-dir build -j"$(nproc)" --output-on-failure
