"""SURGE sweep: anchor and donor from one run, a grid of (retain ρ, γ), chosen on validation, reported on test.

Every choice is made on a **validation** split and every reported number comes from a disjoint
**test** split (``reasonrl.methods.surge.select``): test = the task's first ``--size`` held-out
problems (the ones training's ``eval`` and ``reasonrl eval --size`` score), validation = the next
``--val-size``. Each model is scored on both by the evaluation ``reasonrl eval`` runs (greedy
accuracy and avg@n with bootstrap intervals, mean sampled completion length in tokens; the same
seed for every model).

- ANCHOR ``best:RUN_DIR``: the run's kept checkpoint with the best validation greedy accuracy
  (the later on ties). A model folder or alias is taken as given.
- DONOR ``shorter:RUN_DIR``: among the same run's other kept checkpoints that answer shorter than
  the anchor on validation, the shortest (ties: higher validation accuracy, then later). The
  abstract's donor is a shorter-answering checkpoint of the anchor's run, so with ``best:`` the two
  must name the same run. A model folder is taken as given.
- The grid ``--retain`` × ``--gamma`` is fused and scored; **SURGE** is the cell with the best
  validation greedy accuracy (ties: validation avg@n, then grid order). Its geometric controls
  (``--controls``: a random direction of the same norm) are fused at that cell only.

Writes ``OUT/sweep.json`` (every model's validation and test numbers, the choices),
``OUT/sweep.md`` (tables), and ``OUT/report/<arm>-s<SEED>/`` (``summary.json`` with the test
numbers and per-problem outcomes, ``recipe.json`` naming the arm): one folder per arm (anchor,
donor, base with ``--with-base``, surge, surge_<control>), so the seeds' sweeps compare with

    reasonrl report OUT_seed*/report/* --baseline anchor -o surge.html

Models and per-model evaluations stay in ``OUT/models`` and ``OUT/evals``; a rerun reuses them.

    python benchmarks/surge_sweep.py best:runs/surge_qs/seed1 shorter:runs/surge_qs/seed1 --base tiny \\
        --retain 0.5 0.7 0.9 --gamma 0.5 1.0 --controls random --size 200 --val-size 200 --n 4 --seed 1 \\
        -o runs/surge_sweep/seed1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from reasonrl.fsutil import atomic_write_text
from reasonrl.methods.surge.fuse import FUSE_FILE, FuseSettings, fuse
from reasonrl.methods.surge.select import Scored, choose_anchor, choose_cell, choose_donor, split_eval_problems
from reasonrl.train.checkpoint import MODEL_DIR, list_checkpoints

SPLITS = ("validation", "test")


class Scorer:
    """Scores models on the validation and the test split (cached per model and split in OUT/evals)."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        import yaml

        from reasonrl.config import recipe_from_dict
        from reasonrl.evaluate.evaluator import Evaluator
        from reasonrl.train.trainer import build_task

        params = {}
        for item in args.task_param:
            key, _, value = item.partition("=")
            params[key] = yaml.safe_load(value)
        recipe = recipe_from_dict({
            "task": {"name": args.task, **params},
            "eval": {"size": args.size, "n": args.n, "k": sorted({1, args.n}), "temperature": args.temperature,
                     "seed": args.seed},
            "rollout": {"max_new_tokens": args.max_new_tokens}}, "surge_sweep")
        self.evaluator = Evaluator(recipe, build_task(recipe))
        validation, test = split_eval_problems(self.evaluator.task, args.size, args.val_size)
        self.problems = {"validation": validation, "test": test}
        self.n, self.out = args.n, out

    def __call__(self, model: str, name: str, splits: tuple[str, ...] = SPLITS, step: int = 0) -> dict[str, Any]:
        """{split: numbers} for ``model`` (scored under ``name``), plus ``model`` and ``step``."""
        from reasonrl.policy.factory import load_for_eval

        row: dict[str, Any] = {"model": name, "path": model, "step": step}
        policy = None
        for split in splits:
            path = self.out / "evals" / f"{name}.{split}.json"
            if not path.is_file():
                policy = policy or load_for_eval(model)
                self.evaluator.problems = self.problems[split]
                result = self.evaluator.sampled(policy)
                m = result["metrics"]
                saved = {"model": model, "split": split, "problems": len(self.problems[split]),
                         "greedy": m["greedy"]["mean"], "greedy_ci": [m["greedy"]["ci_low"], m["greedy"]["ci_high"]],
                         "avg": m[f"avg@{self.n}"]["mean"], "length": m["response_length"],
                         "per_problem_greedy": [float(r["greedy"]) for r in result["per_problem"]],
                         "per_problem_avg": [r["correct"] / self.n for r in result["per_problem"]]}
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, json.dumps(saved))
            row[split] = json.loads(path.read_text())
        return row


def scored(row: dict[str, Any]) -> Scored:
    v = row["validation"]
    return Scored(row["model"], v["greedy"], v["length"], v["avg"], row["step"])


def checkpoints(run_dir: Path, score: Scorer) -> list[dict[str, Any]]:
    """Every kept checkpoint of the run, scored on validation."""
    found = list_checkpoints(run_dir)
    if not found:
        raise SystemExit(f"{run_dir}: no kept checkpoints (set train.checkpoint_every and train.keep_checkpoints)")
    return [score(str(c / MODEL_DIR), f"ckpt{int(c.name.removeprefix('step_'))}", ("validation",),
                  int(c.name.removeprefix("step_"))) for c in found]


def grid_settings(args: argparse.Namespace, retain: float, gamma: float, control: str) -> FuseSettings:
    return FuseSettings.validated(retain=retain, gamma=gamma, projection=args.projection, embeddings=args.embeddings,
                                  control=control, seed=args.seed)


def fused(args: argparse.Namespace, out: Path, anchor: str, donor: str, name: str, settings: FuseSettings) -> str:
    folder = out / "models" / name
    if not (folder / FUSE_FILE).is_file():
        fuse(anchor, donor, args.base, folder, settings, overwrite=True)
    return str(folder)


def _cell(r: dict[str, Any], split: str, n: int) -> str:
    s = r.get(split)
    if s is None:
        return "— | — | —"
    lo, hi = s["greedy_ci"]
    return f"{s['greedy']:.3f} [{lo:.3f}, {hi:.3f}] | {s['avg']:.3f} | {s['length']:.2f}"


def tables(report: dict[str, Any]) -> str:
    n = report["n"]
    lines = ["Checkpoints of the run, on validation (anchor: best greedy; donor: shortest below the anchor):", "",
             f"| checkpoint | greedy [95% CI] | avg@{n} | mean length | role |", "|---|---|---|---|---|"]
    for r in report["checkpoints"]:
        lines.append(f"| {r['model']} | {_cell(r, 'validation', n)} | {r.get('role', '')} |")
    lines += ["", f"Models: chosen on validation ({report['val_size']} problems), reported on test "
              f"({report['size']} problems):", "",
              f"| model | validation greedy | test greedy [95% CI] | test avg@{n} | test mean length | |",
              "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        mark = "**SURGE** (chosen)" if r["model"] == report["chosen"] else r.get("note", "")
        lines.append(f"| {r['model']} | {r['validation']['greedy']:.3f} | {_cell(r, 'test', n)} | {mark} |")
    v = report["verdict"]
    lines += ["", f"SURGE = {report['chosen']} on test: beats both inputs (greedy) {'yes' if v['beats_both'] else 'no'}; "
              f"shorter than the anchor {'yes' if v['shorter_than_anchor'] else 'no'}"]
    return "\n".join(lines)


def write_report_runs(report: dict[str, Any], out: Path, seed: int) -> list[Path]:
    """One run-like folder per arm for ``reasonrl report --baseline``: ``summary.json`` holds the
    arm's test numbers and per-problem outcomes, ``recipe.json`` only the arm's name (so the
    seeds of one arm form one group, whatever cell each seed chose)."""
    arms = {"anchor": "anchor", "donor": "donor", "base": "base", report["chosen"]: "surge",
            **{f"{report['chosen']}_{c}": f"surge_{c}" for c in report["controls"]}}
    written = []
    for row in report["rows"]:
        arm = arms.get(row["model"])
        if arm is None:
            continue
        t, n = row["test"], report["n"]
        folder = out / "report" / f"{arm}-s{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        summary = {"steps": 0, "final_eval": {"accuracy": t["greedy"], f"avg@{n}": t["avg"], "response_length": t["length"]},
                   "final_eval_per_problem": {"accuracy": t["per_problem_greedy"], f"avg@{n}": t["per_problem_avg"]},
                   "surge": {"model": row["model"], "path": row["path"], "chosen_cell": report["chosen"],
                             "anchor": report["anchor"], "donor": report["donor"]}}
        atomic_write_text(folder / "summary.json", json.dumps(summary, indent=1))
        atomic_write_text(folder / "recipe.json", json.dumps({"surge": {"arm": arm}}))
        atomic_write_text(folder / "metrics.jsonl", json.dumps({"step": 0}) + "\n")
        written.append(folder)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("anchor", help="best:RUN_DIR, or a checkpoint, run or model folder")
    p.add_argument("donor", help="shorter:RUN_DIR, or a checkpoint, run or model folder")
    p.add_argument("--base", required=True)
    p.add_argument("--retain", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    p.add_argument("--gamma", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--controls", nargs="*", default=["random"], help="random, random_unconstrained (none: no controls)")
    p.add_argument("--projection", default="two_sided")
    p.add_argument("--embeddings", default="svd")
    p.add_argument("--with-base", action="store_true", help="score the base model too")
    p.add_argument("--task", default="arithmetic")
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--size", type=int, default=200, help="test problems (the task's first held-out problems)")
    p.add_argument("--val-size", type=int, default=200, help="validation problems (the next held-out problems)")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="evaluation and control seed; names the report folders")
    p.add_argument("-o", "--output", required=True)
    args = p.parse_args(argv)
    out = Path(args.output)
    score = Scorer(args, out)

    anchor_run = Path(args.anchor[5:]) if args.anchor.startswith("best:") else None
    donor_run = Path(args.donor[8:]) if args.donor.startswith("shorter:") else None
    if anchor_run is not None and donor_run is not None and anchor_run.resolve() != donor_run.resolve():
        raise SystemExit(f"the donor must be a checkpoint of the anchor's run: best:{anchor_run} but shorter:{donor_run}")
    pool: dict[Path, list[dict[str, Any]]] = {}

    def run_checkpoints(run: Path) -> list[dict[str, Any]]:
        if run not in pool:
            pool[run] = checkpoints(run, score)
        return pool[run]

    if anchor_run is not None:
        candidates = run_checkpoints(anchor_run)
        pick = choose_anchor([scored(r) for r in candidates])
        anchor_row = next(r for r in candidates if r["model"] == pick.name)
    else:
        anchor_row = score(args.anchor, "anchor", ("validation",))
    if donor_run is not None:
        candidates = run_checkpoints(donor_run)
        try:
            pick = choose_donor([scored(r) for r in candidates], scored(anchor_row))
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        donor_row = next(r for r in candidates if r["model"] == pick.name)
    else:
        donor_row = score(args.donor, "donor", ("validation",))
    anchor, donor = anchor_row["path"], donor_row["path"]
    for row, role in ((anchor_row, "anchor"), (donor_row, "donor")):
        row["role"] = role
    print(f"anchor: {anchor_row['model']} ({anchor})\ndonor: {donor_row['model']} ({donor})", file=sys.stderr)

    rows = [{**score(anchor, anchor_row["model"], SPLITS, anchor_row["step"]), "model": "anchor",
             "note": anchor_row["model"]},
            {**score(donor, donor_row["model"], SPLITS, donor_row["step"]), "model": "donor", "note": donor_row["model"]}]
    if args.with_base:
        rows.append(score(args.base, "base"))
    cells = []
    for retain in args.retain:
        for gamma in args.gamma:
            name = f"r{retain:g}_g{gamma:g}"
            row = score(fused(args, out, anchor, donor, name, grid_settings(args, retain, gamma, "none")), name)
            row["fuse"] = json.loads((out / "models" / name / FUSE_FILE).read_text())["summary"]
            row["settings"] = {"retain": retain, "gamma": gamma}
            cells.append(row)
            rows.append(row)
    chosen = choose_cell([scored(r) for r in cells]).name
    settings = next(r["settings"] for r in cells if r["model"] == chosen)
    for control in args.controls:
        name = f"{chosen}_{control}"
        row = score(fused(args, out, anchor, donor, name,
                          grid_settings(args, settings["retain"], settings["gamma"], control)), name)
        row["note"] = f"control of {chosen}"
        rows.append(row)
    a, d, s = rows[0]["test"], rows[1]["test"], next(r for r in rows if r["model"] == chosen)["test"]
    report = {"anchor": anchor, "donor": donor, "base": args.base, "task": args.task, "size": args.size,
              "val_size": args.val_size, "n": args.n, "seed": args.seed, "chosen": chosen, "settings": settings,
              "controls": list(args.controls),
              "verdict": {"beats_both": s["greedy"] > max(a["greedy"], d["greedy"]),
                          "shorter_than_anchor": s["length"] < a["length"]},
              "checkpoints": [r for rs in pool.values() for r in rs] or [anchor_row, donor_row], "rows": rows}
    atomic_write_text(out / "sweep.json", json.dumps(report, indent=1))
    md = tables(report)
    atomic_write_text(out / "sweep.md", md + "\n")
    write_report_runs(report, out, args.seed)
    print(md)
    print(f"\nresults in {out / 'sweep.json'}, {out / 'sweep.md'} and {out / 'report'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
