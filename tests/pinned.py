"""The pinned regression runs: short GRPO, RA and CoRA runs from shipped starting weights.

Their metrics and final weights were recorded before the engine redesign (issue 9) by
``tests/data/pinned/make_pins.py``; ``tests/test_pinned_runs.py`` checks that the code of
today reproduces them. The recipes exercise most of the objective's wiring at once: KL in
the loss against a reference model, an entropy bonus, two optimisation passes (so π_old is
recomputed and the clip acts), micro-batch accumulation, a linear LR schedule with warm-up.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

DATA = Path(__file__).resolve().parent / "data" / "pinned"

_COMMON = {
    # device: cpu, explicitly: the numbers recorded before model.device existed hold on the CPU.
    "model": {"backend": "hf", "path": str(DATA / "student"), "device": "cpu"},
    "task": {"name": "arithmetic", "max_operand": 4},
    "rollout": {"num_generations": 4, "max_new_tokens": 20, "temperature": 1.0},
    "optim": {"lr": 1e-3, "warmup_steps": 2, "schedule": "linear"},
    "train": {"steps": 3, "prompts_per_step": 4, "micro_batch_size": 6, "checkpoint_every": 2, "seed": 3},
    "eval": {"size": 12},
    "log": {"plots": False, "progress": False},
}

PIN_RUNS = {
    "grpo": {
        "loss": {"kl": {"coef": 0.05, "estimator": "k3"}, "entropy_coef": 0.01, "epsilon": 0.2, "epsilon_high": 0.28},
        "train": {**_COMMON["train"], "num_iterations": 2},
    },
    "ra": {
        "advantage": {"name": "residual", "base": "grpo", "lam": 0.5},
        "teacher": {"model": {"backend": "hf", "path": str(DATA / "teacher")}},
    },
    "cora": {
        "advantage": {"name": "residual", "base": "grpo", "lam": 0.5},
        "teacher": {"model": {"backend": "hf", "path": str(DATA / "teacher")}, "update": True,
                    "lora": {"r": 4, "alpha": 8}, "lr": 1e-3},
    },
}


def pinned_recipe(name: str):
    from reasonrl.config import recipe_from_dict

    return recipe_from_dict({**_COMMON, **PIN_RUNS[name]}, f"pinned run '{name}'")


def run_pinned(name: str, run_dir: Path):
    """Train the pinned run ``name``; return (metric rows without timings, final weights)."""
    from reasonrl.metrics_log import read_metrics
    from reasonrl.train.trainer import Trainer

    Trainer(pinned_recipe(name), run_dir, log=lambda m: None).run()
    rows = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_metrics(run_dir)]
    return rows, load_file(str(run_dir / "final_model" / "model.safetensors"))
