"""``train.retain_memory`` on and off: a SmolLM2 GRPO step's time, system time and page faults.

The vs-TRL batch (``benchmarks/vs_trl.py``'s defaults: SmolLM2-135M-Instruct float32, 2 prompts x
4 completions of 32 new tokens, 2-shot GSM8K prompts, the fused decoder, the packed forward) in
fresh processes, the two settings alternating; each process runs ``--steps`` steps and the first
(the optimiser's state, oneDNN's primitives) is left out. glibc's allocator is set once for a whole
process, hence one process a setting (``reasonrl.train.allocator``).

    .venv/bin/python benchmarks/allocator.py [--rounds 2] [--steps 5]

The last line is machine-readable: ``retain_step_ratio=<on/off> retain_sys_s=<on> default_sys_s=<off>``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def one_process(retain: bool, steps: int) -> list[dict]:
    sys.path.insert(0, str(HERE))
    import vs_trl

    torch.set_num_threads(2)
    args = argparse.Namespace(prompts=2, generations=4, max_new_tokens=32, steps=steps, decoder="fused",
                              precision="fp32", length_buckets=0)
    trainer = vs_trl.build_ours(args, "smollm2-135m", {"path": str(vs_trl.GSM8K), "few_shot": 2},
                                retain_memory=retain)
    rows = []
    for step in range(steps):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        trainer.train_step(step)
        after = resource.getrusage(resource.RUSAGE_SELF)
        rows.append({"step_s": time.perf_counter() - start, "sys_s": after.ru_stime - before.ru_stime,
                     "minor_faults": after.ru_minflt - before.ru_minflt})
    return rows[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="processes per setting, alternating")
    ap.add_argument("--steps", type=int, default=5, help="steps per process; the first is left out")
    ap.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_process(args.child == "on", args.steps)))
        return
    rows: dict[str, list[dict]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for setting in ("off", "on"):
            out = subprocess.run([sys.executable, __file__, "--child", setting, "--steps", str(args.steps)],
                                 capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            rows[setting] += got
            print(f"round {r} retain_memory {setting:>3}: step " +
                  " ".join(f"{g['step_s']:.2f}" for g in got) + " s, system " +
                  " ".join(f"{g['sys_s']:.2f}" for g in got) + " s, faults " +
                  " ".join(str(g["minor_faults"]) for g in got), flush=True)
    med = {s: {k: statistics.median(g[k] for g in rows[s]) for k in rows[s][0]} for s in rows}
    print(f"\nmedians over {len(rows['on'])} steps a setting ({args.rounds} processes each)")
    print(f"{'retain_memory':<14}{'step s':>9}{'system s':>10}{'minor faults':>14}")
    for s in ("off", "on"):
        print(f"{s:<14}{med[s]['step_s']:>9.2f}{med[s]['sys_s']:>10.2f}{med[s]['minor_faults']:>14.0f}")
    print(f"retain_step_ratio={med['on']['step_s'] / med['off']['step_s']:.3f} "
          f"retain_sys_s={med['on']['sys_s']:.2f} default_sys_s={med['off']['sys_s']:.2f}")


if __name__ == "__main__":
    main()
