"""End-to-end: GRPO raises held-out accuracy of the embedded model.

Uses the real embedded model (the shipped weights) and
a shortened recipes/grpo.yaml. The base model solves bracketed problems as if
the brackets were absent; the answer reward has to fix that.
"""

from pathlib import Path

from reasonrl.config import load_recipe
from reasonrl.train.trainer import Trainer

GRPO = Path(__file__).resolve().parents[1] / "recipes" / "grpo.yaml"


def test_grpo_raises_held_out_accuracy(tmp_path):
    recipe = load_recipe(GRPO, ["train.steps=120", "log.plots=false", "log.progress=false"])
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    base, final = summary["base_eval"], summary["final_eval"]
    assert 0.1 <= base["accuracy"] <= 0.6  # the embedded model leaves room for RL
    # 200 problems: the binomial noise of one accuracy is about 3.5 points; demand far more.
    assert final["accuracy"] - base["accuracy"] >= 0.15, summary
    bracketed = ("accuracy[(a+b)*c]", "accuracy[c*(a+b)]")
    assert sum(final[k] for k in bracketed) - sum(base[k] for k in bracketed) >= 0.6, summary
