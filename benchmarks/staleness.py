"""The staleness test bed: the quickstart recipe at simulated staleness k, uncorrected, with
each off-policy correction, and with the stale-rollout methods (TIC-/GMC-GRPO, PPO, COPC), 3
seeds each; final held-out accuracy mean ± sd, steps to reach 0.8, the share of seeds that
collapse (end below the base model), and a ``reasonrl report`` with statistics against the
on-policy run (k = 0).

    .venv/bin/python benchmarks/staleness.py OUT                      # the corrections (hours on 2 cores)
    .venv/bin/python benchmarks/staleness.py OUT --steps 100 --ks 0 2 8 --arms none tis decoupled_ppo
    .venv/bin/python benchmarks/staleness.py OUT --steps 100 --ks 0 2 4 8 --arms none behaviour_ppo tic_grpo gmc_grpo ppo copc
    .venv/bin/python benchmarks/staleness.py OUT --steps 100 --ks 8 --arms tic_grpo gmc_grpo \
        --set rollout.num_generations=16 --set train.prompts_per_step=8     # same samples, larger groups

``rollout.simulated_staleness: k`` samples every batch with the weights of exactly k
optimiser versions ago (deterministic, so differences are the corrections', not timing's).
The ``async_*`` arms instead run the async source at ``rollout.max_staleness: k`` with real
partial rollouts (RollVerify's prefix checks on them): timing decides the lag, so their cells
are not reproducible number for number, and they need the machine to themselves.
"Uncorrected" is ``off_policy: {name: none}``: the update of no correction, with every
``offpolicy/*`` metric logged. At k = 0 every correction's weights are 1, so only the
uncorrected run is trained there. Runs that finished are skipped, so the script can be
restarted; one run at a time (each uses both cores). The last line is machine-readable:
``staleness_<k>/<arm>=<mean accuracy>`` for every cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "grpo.yaml"
CRITIC = {"name": "critic", "lr": 1.0e-4, "warmup_steps": 5, "clip": 0.5}
# Every arm is a set of recipe overrides. The first five are the off-policy corrections of
# GRPO (issue 10); at k = 0 their weights are 1, so only "none" is trained there.
ARMS = {
    "none": {"off_policy": {"name": "none"}},
    "tis": {"off_policy": {"name": "tis", "level": "token", "cap": 2.0}},
    "mis": {"off_policy": {"name": "mis", "level": "token", "cap": 2.0}},
    "decoupled_ppo": {"off_policy": {"name": "decoupled_ppo", "cap": 5.0}},
    "behaviour_ppo": {"off_policy": {"name": "behaviour_ppo"}},
    # Issue 11's methods. TIC-/GMC-GRPO take their trajectory ratio against the behaviour
    # log-probs (anchor μ); on-policy both equal GRPO (unit-tested), so they skip k = 0 too.
    "tic_grpo": {"loss.policy": "tic_grpo", "off_policy": {"name": "behaviour_ppo"}},
    "gmc_grpo": {"loss.policy": "gmc_grpo", "off_policy": {"name": "behaviour_ppo"}},
    # PPO with a critic (recipes/ppo.yaml), its ratio against μ as in behaviour_ppo; COPC
    # (recipes/copc.yaml). Both differ from GRPO on-policy, so they run at k = 0.
    "ppo": {"advantage": {"name": "gae", "gamma": 1.0, "lam": 0.95}, "methods": [CRITIC],
            "off_policy": {"name": "behaviour_ppo"}},
    "copc": {"advantage": {"name": "copc", "gamma": 1.0, "lam": 0.95, "c_low": 0.5, "c_high": 2.0},
             "methods": [CRITIC], "off_policy": {"name": "ratio_mask", "cap": 5.0}},
}
# COPC's joint sweep: the mask's band c_mask (off_policy cap) × the trace clip's upper bound.
# With c_high > 1 the product of traces Π c_{t+j} can grow like c_high^L along a completion.
for _mask in (2.0, 5.0):
    for _high in (1.0, 2.0):
        if (_mask, _high) != (5.0, 2.0):  # the spec's defaults are the "copc" arm
            ARMS[f"copc_m{_mask:g}_h{_high:g}"] = {
                **ARMS["copc"], "advantage": {**ARMS["copc"]["advantage"], "c_high": _high},
                "off_policy": {"name": "ratio_mask", "cap": _mask}}
# COPC with the PPO ratio taken against μ (its non-decoupled form), as the ppo arm's.
ARMS["copc_behaviour"] = {**ARMS["copc"], "off_policy": {"name": "ratio_mask", "cap": 5.0, "anchor": "behaviour"}}
# RollVerify (recipes/rollverify.yaml): the stale weights sample each completion's first 8 of 32
# tokens, the current ones the rest; the prefix check decides the stale prefixes at the switch.
for _name, _check in (("partial_keep", "keep"), ("partial_discard", "discard"),
                      ("rollverify_sequence", "rollverify_sequence"), ("rollverify_token", "rollverify_token")):
    ARMS[_name] = {"rollout.simulated_partial": 8, "rollout.prefix_check": {"name": _check},
                   "off_policy": {"name": "behaviour_ppo"}}
# Real partial rollouts (recipes/rollverify_async.yaml): the async source with rollout.max_staleness
# = k instead of the simulated lag, weights arriving mid-generation wherever timing puts them.
# "async_partial" continues from the stale prefix and KV cache (no check); "async_whole" waits for
# a batch's end to take new weights (rollout.partial: false); the others check the prefixes.
ARMS["async_whole"] = {"rollout.source": "async", "rollout.partial": False, "off_policy": {"name": "behaviour_ppo"}}
ARMS["async_partial"] = {"rollout.source": "async", "rollout.partial": True, "off_policy": {"name": "behaviour_ppo"}}
for _check in ("keep", "discard", "rollverify_token"):
    ARMS[f"async_{_check}"] = {**ARMS["async_partial"], "rollout.prefix_check": {"name": _check}}
ASYNC_ARMS = {a for a in ARMS if a.startswith("async_")}
ON_POLICY_ARMS = {"none", "ppo", "copc"}  # the arms that differ from each other at k = 0 (the partial ones need k > 0)


def cells(ks: list[int], arms: list[str]) -> list[tuple[int, str]]:
    return [(k, a) for k in ks for a in arms if k > 0 or a in ON_POLICY_ARMS]


def tag(extra: list[str]) -> str:
    """The run folder's suffix for further overrides: rollout.num_generations=16 -> -num_generations16."""
    return "".join(f"-{e.split('=')[0].split('.')[-1]}{e.split('=', 1)[1]}" for e in extra)


def run(out: Path, k: int, arm: str, seed: int, steps: int | None, extra: list[str] = ()) -> Path:
    run_dir = out / f"k{k}-{arm}{tag(extra)}-s{seed}"
    if (run_dir / "summary.json").exists():
        print(f"skip {run_dir.name}", flush=True)
        return run_dir
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    lag = f"rollout.max_staleness={k}" if arm in ASYNC_ARMS else f"rollout.simulated_staleness={k}"
    sets = [f"train.seed={seed}", lag, "log.progress=false"]
    sets += [f"{key}={json.dumps(value)}" for key, value in ARMS[arm].items()] + list(extra)
    if steps:
        sets += [f"train.steps={steps}", f"eval.every={max(steps // 4, 1)}"]
    command = [sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "-o", str(run_dir)]
    for s in sets:
        command += ["--set", s]
    start = time.perf_counter()
    with open(out / f"{run_dir.name}.log", "w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    status = "done" if done.returncode == 0 else f"FAILED (exit {done.returncode}, see {run_dir.name}.log)"
    print(f"{status} {run_dir.name} in {time.perf_counter() - start:.0f}s", flush=True)
    return run_dir


def final(run_dir: Path, key: str) -> float | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text())["final_eval"].get(key) if path.exists() else None


def late(run_dir: Path, key: str) -> float | None:
    from reasonrl.metrics_log import read_metrics

    values = [r[key] for r in read_metrics(run_dir) if isinstance(r.get(key), (int, float))] if run_dir.exists() else []
    return statistics.mean(values[-20:]) if values else None


def steps_to(run_dir: Path, level: float) -> int | None:
    """The first evaluation step whose held-out accuracy reaches ``level`` (None: never)."""
    from reasonrl.metrics_log import read_metrics

    for r in read_metrics(run_dir):
        if r.get("step", 0) > 0 and isinstance(r.get("eval/accuracy"), (int, float)) and r["eval/accuracy"] >= level:
            return r["step"]
    return None


def collapsed(run_dir: Path) -> bool:
    """A run "collapses" when it ends below the accuracy it started from (the base model's)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary["final_accuracy"] < summary["base_accuracy"]


def mean_sd(values: list[float | None]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    parser.add_argument("--arms", "--corrections", nargs="+", default=list(ARMS)[:5], choices=list(ARMS),
                        help="default: the five corrections of GRPO")
    parser.add_argument("--set", dest="extra", action="append", default=[],
                        help="a further recipe override for every run, named in the run folder (e.g. "
                             "rollout.num_generations=16)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=None, help="shorten every run (default: the recipe's)")
    parser.add_argument("--no-train", action="store_true", help="only summarise the runs in OUT")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    grid = cells(args.ks, args.arms)
    suffix = tag(args.extra)
    if not args.no_train:
        for seed in args.seeds:  # seed-major: a partial grid still has every cell
            for k, correction in grid:
                run(args.out, k, correction, seed, args.steps, args.extra)

    print("\n| k | arm | final accuracy | steps to 0.8 | collapsed | KL(μ‖π) late | IS weight max late "
          "| masked/truncated late |")
    print("|---|---|---|---|---|---|---|---|")
    line = []
    for k, correction in grid:
        dirs = [args.out / f"k{k}-{correction}{suffix}-s{s}" for s in args.seeds]
        acc = [final(d, "accuracy") for d in dirs]
        cut = [(late(d, "offpolicy/masked_fraction") or 0) + (late(d, "offpolicy/truncated_fraction") or 0)
               for d in dirs if d.exists()]
        reach = [steps_to(d, 0.8) for d in dirs if (d / "summary.json").exists()]
        reached = [x for x in reach if x is not None]
        fell = [collapsed(d) for d in dirs if (d / "summary.json").exists()]
        print(f"| {k} | {correction} | {mean_sd(acc)} | {mean_sd(reached) if reached else 'never'} "
              f"({len(reached)}/{len(reach)}) | {sum(fell)}/{len(fell)} "
              f"| {mean_sd([late(d, 'offpolicy/kl_behaviour') for d in dirs])} "
              f"| {mean_sd([late(d, 'offpolicy/is_weight_max') for d in dirs])} | {mean_sd(cut)} |")
        got = [a for a in acc if a is not None]
        if got:
            line.append(f"staleness_{k}/{correction}{suffix}={statistics.mean(got):.4f}")
    finished = [d for d in sorted(args.out.iterdir()) if (d / "summary.json").exists()]
    if finished and any(d.name.startswith("k0-none-") for d in finished):
        subprocess.run([sys.executable, "-m", "reasonrl.cli", "report", *map(str, finished), "-o",
                        str(args.out / "report.html"), "--baseline", "k0-none"], check=False)
    print(" ".join(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
