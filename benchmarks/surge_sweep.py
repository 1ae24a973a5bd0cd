"""SURGE sweep: fuse a grid of (retain ρ, γ) plus random-direction controls, evaluate each.

Every model (anchor, donor, optionally the base, each fused model) is evaluated by the same
function as ``reasonrl eval`` (``reasonrl.cli.main(["eval", ...])``, in this process) on the
same held-out problems with the same seed: greedy accuracy and avg@n with bootstrap intervals,
and the mean sampled completion length (tokens). Writes ``OUT/sweep.json`` and ``OUT/sweep.md``
(a table with, per fused model, whether it beats both inputs on greedy accuracy and is shorter
than the anchor: the claim under test, docs/methods/surge.md). Models and per-model eval files
stay in ``OUT/models`` and ``OUT/evals``; a rerun reuses what is already there.

ANCHOR may be ``best:RUN_DIR``: the run's kept checkpoint with the highest held-out accuracy
(``eval/accuracy`` in its metrics.jsonl at a checkpoint's step; the latest on ties).

    python benchmarks/surge_sweep.py best:runs/quickstart/seed0 runs/surge_donor/seed0 --base tiny \\
        --retain 0.5 0.7 0.9 --gamma 0.5 1.0 --controls random random_unconstrained -o runs/surge_sweep/seed0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reasonrl.cli import main as reasonrl
from reasonrl.fsutil import atomic_write_text
from reasonrl.methods.surge.fuse import FUSE_FILE, FuseSettings, fuse
from reasonrl.train.checkpoint import MODEL_DIR, list_checkpoints
from reasonrl.metrics_log import read_metrics


def best_checkpoint(run_dir: Path) -> Path:
    """The kept checkpoint whose step has the highest ``eval/accuracy`` (latest on ties)."""
    accuracy = {r["step"]: r["eval/accuracy"] for r in read_metrics(run_dir) if "eval/accuracy" in r}
    scored = [(accuracy[int(c.name.removeprefix("step_"))], int(c.name.removeprefix("step_")), c)
              for c in list_checkpoints(run_dir) if int(c.name.removeprefix("step_")) in accuracy]
    if not scored:
        raise SystemExit(f"best:{run_dir}: no checkpoint at a step with eval/accuracy (set eval.every to a divisor "
                         "of train.checkpoint_every and keep more checkpoints: train.keep_checkpoints)")
    return max(scored)[2]


def evaluate(model: str, name: str, out: Path, args: argparse.Namespace) -> dict:
    path = out / "evals" / f"{name}.json"
    if not path.is_file():
        code = reasonrl(["eval", "--model", model, "--task", args.task, "--size", str(args.size), "--n", str(args.n),
                         "--k", str(args.n), "--max-new-tokens", str(args.max_new_tokens), "--seed", str(args.seed),
                         "--temperature", str(args.temperature), "-o", str(path),
                         *[a for p in args.task_param for a in ("--task-param", p)]])
        if code:
            raise SystemExit(f"reasonrl eval of {name} failed ({code})")
    metrics = json.loads(path.read_text())[args.task]["metrics"]
    greedy, avg = metrics["greedy"], metrics[f"avg@{args.n}"]
    return {"model": name, "greedy": greedy["mean"], "greedy_ci": [greedy["ci_low"], greedy["ci_high"]],
            f"avg@{args.n}": avg["mean"], "length": metrics["response_length"]}


def grid(args: argparse.Namespace) -> list[tuple[str, FuseSettings]]:
    out = []
    for retain in args.retain:
        for gamma in args.gamma:
            for control in ["none", *args.controls]:
                name = f"r{retain:g}_g{gamma:g}" + ("" if control == "none" else f"_{control}")
                out.append((name, FuseSettings.validated(retain=retain, gamma=gamma, projection=args.projection,
                                                         embeddings=args.embeddings, control=control,
                                                         seed=args.seed)))
    return out


def table(rows: list[dict], n: int) -> str:
    lines = [f"| model | greedy acc [95% CI] | avg@{n} | mean length | beats both | shorter than anchor |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r["greedy_ci"]
        verdict = ("", "") if "beats_both" not in r else (
            "yes" if r["beats_both"] else "no", "yes" if r["shorter_than_anchor"] else "no")
        lines.append(f"| {r['model']} | {r['greedy']:.3f} [{lo:.3f}, {hi:.3f}] | {r[f'avg@{n}']:.3f} | "
                     f"{r['length']:.2f} | {verdict[0]} | {verdict[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("anchor", help="a checkpoint, run or model folder, or best:RUN_DIR")
    p.add_argument("donor")
    p.add_argument("--base", required=True)
    p.add_argument("--retain", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    p.add_argument("--gamma", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--controls", nargs="*", default=["random"], help="random, random_unconstrained (none: no controls)")
    p.add_argument("--projection", default="two_sided")
    p.add_argument("--embeddings", default="svd")
    p.add_argument("--with-base", action="store_true", help="evaluate the base model too")
    p.add_argument("--task", default="arithmetic")
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", required=True)
    args = p.parse_args(argv)
    out = Path(args.output)
    anchor = str(best_checkpoint(Path(args.anchor[5:])) / MODEL_DIR) if args.anchor.startswith("best:") else args.anchor
    print(f"anchor: {anchor}", file=sys.stderr)
    rows = [evaluate(anchor, "anchor", out, args), evaluate(args.donor, "donor", out, args)]
    if args.with_base:
        rows.append(evaluate(args.base, "base", out, args))
    for name, settings in grid(args):
        folder = out / "models" / name
        if not (folder / FUSE_FILE).is_file():
            fuse(anchor, args.donor, args.base, folder, settings, overwrite=True)
        row = evaluate(str(folder), name, out, args)
        row["fuse"] = json.loads((folder / FUSE_FILE).read_text())["summary"]
        rows.append(row)
    a, d = rows[0], rows[1]
    for r in rows[2 + args.with_base:]:
        r["beats_both"] = r["greedy"] > max(a["greedy"], d["greedy"])
        r["shorter_than_anchor"] = r["length"] < a["length"]
    report = {"anchor": anchor, "donor": args.donor, "base": args.base, "task": args.task, "size": args.size,
              "n": args.n, "seed": args.seed, "rows": rows}
    atomic_write_text(out / "sweep.json", json.dumps(report, indent=1))
    md = table(rows, args.n)
    atomic_write_text(out / "sweep.md", md + "\n")
    print(md)
    print(f"\nresults in {out / 'sweep.json'} and {out / 'sweep.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
