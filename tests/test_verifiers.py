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
from reasonrl.evaluate.evaluator import Evaluator
from reasonrl.params import ConfigError
from reasonrl.policy.factory import build_policy

from helpers import Scripted, char_ids, require_interpreter, scripted_samples, smollm2_tokenizer

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


def test_a_tool_environment_runs_its_mcp_tool_between_the_sampled_turns():
    """examples/verifiers/vf_calc_tools: a ``Toolset`` served over MCP by verifiers; the harness
    offers its tool, runs the call on the tool server and asks again. The scripted model calls
    the tool with the problem's expression, then answers with what the tool returned: the
    reward is 1 only if the tool ran and its result reached the model."""
    tok = smollm2_tokenizer()

    def reply(context: str) -> str:
        if "<|im_start|>tool" not in context:
            expression = re.findall(r"What is (\(\d+\+\d+\)\*\d+)\?", context)[-1]
            return f'<tool_call>{{"name": "calc", "arguments": {{"expression": "{expression}"}}}}</tool_call>'
        return "####" + re.findall(r"<\|im_start\|>tool\n(-?\d+)<\|im_end\|>", context)[-1]

    scripted = Scripted(tok, reply)
    task = VerifiersTask(env="vf_calc_tools", pythonpath=[ENVS])
    rollout = task.rollout_sampler(scripted, recipe(env="vf_calc_tools"))
    problems = task.train_problems(0, 2, 0)
    try:
        s = rollout.sample([p.prompt for p in problems], 2, 128, 1.0, torch.Generator().manual_seed(0), problems=problems)
    finally:
        rollout.close()
    metrics = rollout.metrics()
    assert metrics["verifiers/errors"] == 0 and metrics["verifiers/turns"] == 2
    assert s.env_rewards.tolist() == [1.0] * 4
    for i in range(4):
        ids = s.completion_ids[i][s.completion_mask[i].bool()].tolist()
        loss = s.loss_mask[i][s.completion_mask[i].bool()].tolist()
        first = loss.index(0)
        second = first + loss[first:].index(1)
        turn1, between, turn2 = ids[:first], ids[first:second], ids[second:]
        # the sampled ids (one per character: never what the tokenizer makes of the text), trained
        expression = re.findall(r"\((\d+)\+(\d+)\)\*(\d+)", problems[i // 2].prompt)[-1]
        a, b, c = map(int, expression)
        assert turn1 == char_ids(tok, reply(f"What is ({a}+{b})*{c}?")) + [tok.eos_token_id]
        assert turn2 == char_ids(tok, f"####{(a + b) * c}") + [tok.eos_token_id]
        # between them, never trained: the template's turn boundary and the tool's answer
        assert tok.decode(between) == f"\n<|im_start|>tool\n{(a + b) * c}<|im_end|>\n<|im_start|>assistant\n"
    # the role's harness settings reach our harness: no tool round answered, one turn, reward 0
    task = VerifiersTask(env="vf_calc_tools", pythonpath=[ENVS], config={"agent": {"harness": {"max_tool_rounds": 0}}})
    rollout = task.rollout_sampler(scripted, recipe(env="vf_calc_tools"))
    try:
        s = rollout.sample([problems[0].prompt], 1, 128, 1.0, problems=problems[:1])
    finally:
        rollout.close()
    assert rollout.metrics()["verifiers/turns"] == 1 and s.env_rewards.tolist() == [0.0]


class Oracle:
    """Answers each ``(a+b)*c;`` with ``####value`` when ``a`` is even, else ``####value+1``;
    records the temperatures it was asked for."""

    def __init__(self, policy):
        self.policy, self.tokenizer, self.temperatures = policy, policy.tokenizer, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def sample_ids(self, ids, mask, max_new_tokens, temperature=1.0, *args, **kwargs):
        self.temperatures.append(temperature)
        rows = []
        for r in range(len(ids)):
            a, b, c = map(int, re.findall(r"\((\d+)\+(\d+)\)\*(\d+);", self.tokenizer.decode(ids[r][mask[r].bool()]))[-1])
            value = (a + b) * c + (a % 2)
            rows.append(self.tokenizer(f"####{value}", add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id])
        return scripted_samples(ids, mask, rows, self.tokenizer)


def test_the_evaluator_scores_greedy_rollouts_with_the_environments_rubric():
    r = recipe(env="vf_arith", config={"taskset": {"count": 128, "seed": 0}})
    r.eval.size, r.eval.batch_size = 8, 5  # two calls of the worker
    task = VerifiersTask(env="vf_arith", pythonpath=[ENVS], config={"taskset": {"count": 128, "seed": 0}})
    oracle = Oracle(build_policy(r.model, log=lambda m: None))
    evaluator = Evaluator(r, task)
    result = evaluator(oracle)
    assert set(oracle.temperatures) == {0.0}  # greedy
    # the rubric's reward is 1 exactly where the oracle answered right: a even
    expected = [float(int(re.match(r"\((\d+)", p.prompt).group(1)) % 2 == 0) for p in evaluator.problems]
    assert len(expected) == 8 and 0 < sum(expected) < 8
    assert result.per_problem["env_reward"] == expected == result.per_problem["accuracy"]
    assert result.metrics["accuracy"] == result.metrics["env_reward"] == sum(expected) / 8
    assert result.metrics["verifiers/errors"] == 0 and result.metrics["verifiers/correct"] == sum(expected) / 8
    assert [t.startswith("####") for t in result.completions] == [True] * 8
    with pytest.raises(ConfigError, match="rubric"):  # sampled evaluation reads answers from text
        evaluator.sampled(oracle)


@pytest.mark.parametrize("source", [[], ["rollout.source=async", "rollout.partial=false", "rollout.max_staleness=1"]],
                         ids=["sync", "async"])
def test_the_recipe_trains_through_the_cli_and_logs_the_environments_reward(tmp_path, source):
    run = tmp_path / "run"
    sets = ["train.steps=3", "train.prompts_per_step=4", "log.plots=false", "eval.size=4", *source]
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "-o", str(run),
                           *[x for kv in sets for x in ("--set", kv)]],
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
        # the async sampler's rows within its staleness bound (the sync source is on-policy: no key)
        assert ("offpolicy/staleness_max" in r) == bool(source) and r.get("offpolicy/staleness_max", 0) <= 1
    # the rubric's greedy evaluation, before and after
    evals = [r for r in rows if "eval/env_reward" in r]
    assert [r["step"] for r in evals] == [0, 3] and all(r["eval/verifiers/errors"] == 0 for r in evals)


def test_bad_environments_and_recipes_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no_such_env.*did not load"):
        VerifiersTask(env="no_such_env", pythonpath=[ENVS])
    base = load_recipe(RECIPE)
    for overrides, message in [(["rollout.source=async"], "rollout.partial: false"),
                               (["eval.size=8", "eval.n=4"], "eval.n: 0"),
                               (["rollout.simulated_staleness=1"], "without simulated staleness")]:
        out = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "-o", str(tmp_path / "r"),
                              *[x for kv in overrides for x in ("--set", kv)]], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert out.returncode == 2 and message in out.stderr and not (tmp_path / "r").exists(), (overrides, out.stderr[-2000:])
    # the evaluated task decides: a verifiers eval.task beside a text task is judged by its rubric too
    text_task = {"model": {"backend": "tiny"}, "task": {"name": "arithmetic"}, "rewards": [{"name": "exact_answer"}],
                 "eval": {"size": 4, "n": 2, "task": {"name": "verifiers", "env": "vf_arith", "pythonpath": [ENVS]}}}
    with pytest.raises(ConfigError, match="task 'verifiers' is evaluated by its environment's rubric.*eval.n: 0"):
        recipe_from_dict(text_task)
    with pytest.raises(ConfigError, match="drop eval.task"):
        recipe_from_dict({**text_task, "task": {"name": "verifiers", "env": "vf_arith"}, "rewards": [],
                          "eval": {"size": 4, "task": {"name": "arithmetic"}}})
    # reasonrl eval samples n completions and reads answers from their text: refused, nothing written
    out = subprocess.run([sys.executable, "-m", "reasonrl.cli", "eval", "--model", "tiny", "--task", "verifiers",
                          "--task-param", "env=vf_arith", "--task-param", f"pythonpath=[{ENVS}]",
                          "-o", str(tmp_path / "e.json")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 2 and "rubric" in out.stderr and not (tmp_path / "e.json").exists()
    assert base.rewards == []
