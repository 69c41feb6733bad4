#!/usr/bin/env bash
# The prepared GPU check: one line per check (PASS/FAIL/SKIP + what),
# exit status nonzero if any check failed; under 5 minutes on whatever GPUs
# this machine has (one GPU: gloo over CUDA tensors; two or more: NCCL too).
# Without a GPU every check prints SKIP and the exit status is 0.
# What each check means: benchmarks/gpu_check.py. Extra arguments go to it
# (--rehearse-on-cpu N: the same checks on the CPU, to test the harness).
set -u
cd "$(dirname "$0")/.." || exit 2
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
# the whole check is bounded: each run has --max-wall-s, this the sum
exec timeout --kill-after=10 290 "$PY" benchmarks/gpu_check.py "$@"
