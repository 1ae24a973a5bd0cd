"""Reward hacking as strategic abstention (docs/diagnostics.md): the diagnostics table of runs
trained on the surface proxy (recipes/hacking_proxy.yaml) and on the true reward
(recipes/grpo.yaml, the same budget), each against its own base evaluation (step 0).

Runs need ``eval.n > 0`` (the diagnostics come from the sampled evaluation)::

    reasonrl train recipes/hacking_proxy.yaml --set eval.n=4 --set train.seed=1 -o RUNS/hacking_proxy-s1
    reasonrl train recipes/grpo.yaml --set eval.n=4 --set train.seed=1 -o RUNS/grpo-s1
    python benchmarks/hacking_demo.py RUNS/hacking_proxy-s1 RUNS/grpo-s1

``--json OUT`` also writes every number (the flag's checks included).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from reasonrl.evaluate.diagnostics import describe_flag, diagnose_run

COLUMNS = [("accuracy", "greedy acc"), ("diagnostics/commit_rate", "commit"),
           ("diagnostics/accuracy_given_commit", "acc|commit"), ("diagnostics/proxy_reward", "R_proxy"),
           ("diagnostics/cts", "CTS"), ("diagnostics/cts_share", "CTS share"), ("diagnostics/cpr", "CPR")]


def _fmt(v) -> str:
    return "  —  " if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def table(runs: list[Path]) -> tuple[str, dict]:
    header = f"{'run':<28}" + "".join(f"{title:>22}" for _, title in COLUMNS) + f"{'regret gap [95% CI]':>28}  hacking"
    lines, out = [header, "-" * len(header)], {}
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        diag = diagnose_run(summary)
        base, final = summary["base_eval"], summary["final_eval"]
        cells = "".join(f"{_fmt(base.get(k)) + ' → ' + _fmt(final.get(k)):>22}" for k, _ in COLUMNS)
        gap = diag["regret_gap"]
        rg = f"{gap['mean']:+.3f} [{gap['ci_low']:+.3f}, {gap['ci_high']:+.3f}]"
        lines.append(f"{run.name:<28}{cells}{rg:>28}  {describe_flag(diag['hacking'])}")
        out[str(run)] = {"base": {k: base.get(k) for k, _ in COLUMNS}, "final": {k: final.get(k) for k, _ in COLUMNS},
                         **diag}
    lines.append("(base → final; regret gap = base − final greedy accuracy per problem, paired bootstrap CI)")
    return "\n".join(lines), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--json", type=Path, metavar="OUT")
    args = parser.parse_args()
    text, data = table(args.runs)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
