#!/usr/bin/env bash
# The issue-5 side-by-side runs: each method and its GRPO baseline, same budget, seeds 1-3,
# one run at a time (each uses both cores). Skips runs that already finished, so it can be
# restarted. Usage: benchmarks/compare_methods.sh [arith|mwrl|coverage|all] [OUT_DIR]
set -u
which=${1:-all}
out=${2:-runs/compare}
mkdir -p "$out"
run() {  # run NAME RECIPE [--set ...]
  local name=$1 recipe=$2; shift 2
  if [ -f "$out/$name/summary.json" ]; then echo "skip $name"; return; fi
  rm -rf "$out/$name"
  local start=$SECONDS
  .venv/bin/reasonrl train "$recipe" -o "$out/$name" --set log.progress=false "$@" > "$out/$name.log" 2>&1 \
    && echo "done $name in $((SECONDS - start))s" || echo "FAILED $name (see $out/$name.log)"
}
for s in 1 2 3; do
  if [ "$which" = arith ] || [ "$which" = all ]; then
    # eval every 25 steps for every arithmetic run, so one GRPO baseline serves all methods
    run grpo-s$s recipes/grpo.yaml --set train.seed=$s --set eval.every=25
    run grpo_dropout-s$s recipes/grpo_dropout.yaml --set train.seed=$s --set eval.every=25
    # the same at a third of the lr: the kept third of the rows makes token-mean steps ~3x larger
    run grpo_dropout_lr1e-4-s$s recipes/grpo_dropout.yaml --set train.seed=$s --set eval.every=25 --set optim.lr=1e-4
    run bot_grpo-s$s recipes/bot_grpo.yaml --set train.seed=$s --set eval.every=25
    run residual-s$s recipes/residual_advantage.yaml --set train.seed=$s --set eval.every=25
    run cora-s$s recipes/cora.yaml --set train.seed=$s --set eval.every=25
  fi
  if [ "$which" = mwrl ] || [ "$which" = all ]; then
    # one thread each: these were measured beside the arithmetic stream
    run mwrl-s$s recipes/mwrl.yaml --set train.seed=$s --set train.threads=1
    run mwrl_grpo-s$s recipes/mwrl_grpo.yaml --set train.seed=$s --set train.threads=1
  fi
  if [ "$which" = coverage ] || [ "$which" = all ]; then
    run coverage-s$s recipes/coverage.yaml --set train.seed=$s --set train.threads=1
    run coverage_baseline-s$s recipes/coverage_baseline.yaml --set train.seed=$s --set train.threads=1
  fi
done
