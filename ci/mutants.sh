#!/usr/bin/env bash
# Mutation testing of the real sources (nightly): every mutant of
# ci/mutants.toml applied to a scratch copy, rebuilt, and run against
# `dflash parity`, the SPEC oracle and the quick tests of its area; prints the
# kill table and writes a JSON summary. See ci/mutants.py and docs/HARNESS.md.
#   ci/mutants.sh [--json mutants.json] [--only NAME ...] [--cases N]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 ci/mutants.py "$@"
