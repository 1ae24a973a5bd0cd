#!/usr/bin/env bash
# Run on a GPU on 2026-12-04 (one H200, torch 2.11 + CUDA 13.0, transformers 5.17): ok in 97 s of
# stages, after fixing what its first run found (docs/scaling.md, "Checked on a GPU").
#
# The GPU check of issue 30 for a machine with one NVIDIA GPU and no network: GRPO on cuda in
# bf16 (embedded model and a random model of SmolLM2-135M's architecture; plain and FSDP2 with
# one rank under torch.distributed.run), and one fp32 step on CPU vs GPU. Stages and tolerances:
# benchmarks/gpu_check.py. It installs nothing: the repository's src/ goes on PYTHONPATH, and a
# missing dependency is named and fails the check.
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine: under 8 minutes
#   bash benchmarks/gpu_check.sh --cpu      # dry run here
#   PYTHON=/path/to/python bash benchmarks/gpu_check.sh   # another interpreter
#
# The LAST line printed is always one JSON object: `GPU_CHECK {"ok": true|false, "failed": [...], ...}`;
# the exit status is 0 only when ok is true.
set -u
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# reasonrl writes its caches (built tiny models) under $REASONRL_CACHE; keep them out of $HOME.
export REASONRL_CACHE="${REASONRL_CACHE:-${TMPDIR:-/tmp}/reasonrl-gpu-check-cache}"

# 460 s for the whole check (the python side stops starting arms after 440 s), so the 8-minute
# limit holds even when an arm hangs; the report line below is printed whatever happens.
log=$(mktemp "${TMPDIR:-/tmp}/gpu_check.XXXXXX.log")
timeout -k 10 460 "$PY" benchmarks/gpu_check.py "$@" 2>&1 | tee "$log"
code=${PIPESTATUS[0]}
last=$(tail -n 1 "$log")
case "$last" in
  "GPU_CHECK {"*) exit "$code" ;;
esac
# The python side died before its report (interpreter missing, killed by the timeout, a crash).
reason="exit $code"
[ "$code" = 124 ] || [ "$code" = 137 ] && reason="timed out after 460 s (exit $code)"
tailtext=$(tail -n 5 "$log" | tr -d '\000-\037"\\' | cut -c1-400 | tr '\n' ' ')
printf 'GPU_CHECK {"ok": false, "failed": ["driver"], "driver": {"error": "%s before the report; log %s; last output: %s"}}\n' \
  "$reason" "$log" "$tailtext"
[ "$code" = 0 ] && code=1
exit "$code"
