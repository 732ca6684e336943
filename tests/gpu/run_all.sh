#!/usr/bin/env bash
# The GPU test suite, on the GPU machine: bash tests/gpu/run_all.sh (from any directory).
# Each workload runs in a child process (tests/gpu/_workloads.py); with OUT set, the JUnit
# report goes to $OUT/gpu-tests.xml. Exit status: pytest's.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
args=(-q -p no:logging -p no:cacheprovider -rA --durations=0 tests/gpu)
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  args+=(--junitxml "$OUT/gpu-tests.xml" -o junit_logging=out-err)
fi
exec python3 -m pytest "${args[@]}"
