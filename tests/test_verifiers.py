"""Environments written with verifiers (``task: {name: verifiers}``, ``reasonrl.envs.verifiers``):
examples/verifiers' single-turn taskset and multi-turn env, written with verifiers' own v1 API,
run in the verifiers worker against the endpoint over the embedded model, and train on exactly
the token ids the policy sampled. The worker's interpreter is ``$REASONRL_VERIFIERS_PYTHON``
(``make verifiers-env``; under CI a missing one fails, since ``make test`` installs it)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reasonrl.config import load_recipe, recipe_from_dict
from reasonrl.envs.verifiers import VERIFIERS_INSTALL, VerifiersTask, verifiers_python
from reasonrl.policy.factory import build_policy

from helpers import require_interpreter

ROOT = Path(__file__).resolve().parents[1]
ENVS = str(ROOT / "examples" / "verifiers")
RECIPE = ROOT / "recipes" / "verifiers_arith.yaml"


@pytest.fixture(autouse=True)
def verifiers_env():
    require_interpreter(verifiers_python(), "verifiers", VERIFIERS_INSTALL, ".venv-verifiers")


def recipe(**task):
    return recipe_from_dict({
        "model": {"backend": "tiny"},
        "task": {"name": "verifiers", "pythonpath": [ENVS], **task},
        "rollout": {"num_generations": 4, "max_new_tokens": 32, "temperature": 1.0},
        "rewards": [], "eval": {"size": 0, "every": 0},
        "train": {"steps": 2, "prompts_per_step": 2, "seed": 0}})


class Spy:
    """The embedded policy, recording every ``sample_ids`` call's sampled ids under each row's
    context (a list: the rollouts of one problem share their first context)."""

    def __init__(self, policy):
        self.policy, self.tokenizer, self.sampled = policy, policy.tokenizer, {}

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def sample_ids(self, ids, mask, *args, **kwargs):
        out = self.policy.sample_ids(ids, mask, *args, **kwargs)
        for r in range(len(ids)):
            context = tuple(ids[r][mask[r].bool()].tolist())
            self.sampled.setdefault(context, []).append(out.completion_ids[r][out.completion_mask[r].bool()].tolist())
        return out


def test_a_multi_turn_env_trains_on_the_sampled_ids_and_the_templates_boundary():
    r = recipe(env="vf_arith_chain")
    policy = build_policy(r.model, log=lambda m: None)
    # A template that writes "=" after each reply: a turn boundary that is not the texts concatenated.
    policy.tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] + '=' }}"
                                      "{% elif m['role'] != 'system' %}{{ m['content'] }}{% endif %}{% endfor %}")
    task = VerifiersTask(env="vf_arith_chain", pythonpath=[ENVS])
    spy = Spy(policy)
    rollout = task.rollout_sampler(spy, r)
    problems = task.train_problems(0, 2, 0)
    try:
        s = rollout.sample([p.prompt for p in problems], 3, 20, 1.0, torch.Generator().manual_seed(0), problems=problems)
    finally:
        rollout.close()
    tok = policy.tokenizer
    assert s.completion_ids.shape[0] == 6 and s.loss_mask is not None
    metrics = rollout.metrics()
    assert metrics["verifiers/errors"] == 0 and metrics["verifiers/turns"] == 2
    for i in range(6):
        prompt = s.prompt_ids[i][s.prompt_mask[i].bool()].tolist()
        assert tok.decode(prompt) == problems[i // 3].prompt
        ids = s.completion_ids[i][s.completion_mask[i].bool()].tolist()
        loss = s.loss_mask[i][s.completion_mask[i].bool()].tolist()
        first = loss.index(0)
        second = first + loss[first:].index(1)
        turn1, between, turn2 = ids[:first], ids[first:second], ids[second:]
        # each trained run of ids is what the policy sampled from exactly the context before it
        spy.sampled[tuple(prompt)].remove(turn1)  # ValueError unless sampled from that very context
        spy.sampled[tuple(prompt + turn1 + between)].remove(turn2)
        assert all(loss[k] == 1 for k in range(second, len(ids)))
        # between the turns: the template's "=" after the reply, then the environment's message,
        # tokenised on their own; the sampled EOS stays where the model put it (or the reply
        # was cut at its 20 tokens)
        assert turn1[-1] == tok.eos_token_id or len(turn1) == 20
        text = tok.decode(between)
        assert re.fullmatch(r"=\d+\+\d+;", text) and between == tok(text, add_special_tokens=False)["input_ids"]
        assert s.sample_logprobs[i][s.completion_mask[i].bool()][torch.tensor(loss) == 0].abs().sum() == 0


def test_the_recipe_trains_through_the_cli_and_logs_the_environments_reward(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "-o", str(run),
                           "--set", "train.steps=3", "--set", "train.prompts_per_step=4", "--set", "log.plots=false"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/env" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["verifiers/errors"] == 0 and r["verifiers/turns"] == 1
        # the rubric's only reward is the row's reward
        assert r["reward/mean"] == pytest.approx(r["reward/env"]) == pytest.approx(r["verifiers/correct"])


def test_bad_environments_and_recipes_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no_such_env.*did not load"):
        VerifiersTask(env="no_such_env", pythonpath=[ENVS])
    base = load_recipe(RECIPE)
    for override, message in [("rollout.source=async", "rollout.source: sync"), ("eval.size=8", "eval.size: 0")]:
        out = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "-o", str(tmp_path / "r"),
                              "--set", override], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert out.returncode == 2 and message in out.stderr and not (tmp_path / "r").exists()
    assert base.rewards == []
