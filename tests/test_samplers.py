"""Prompt samplers: the default keeps today's prompts, observe sees every prompt's rewards,
the learnability sampler's choices follow its weights and resume exactly."""

import pytest
import torch

from reasonrl.registry import PROMPT_SAMPLERS
from reasonrl.rollout.samplers import Learnability, PromptSampler
from reasonrl.tasks.arithmetic import ArithmeticTask
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import comparable, crash_at_step, mini_recipe, weights


class Recording(PromptSampler):
    handed: list = []
    observed: list = []

    def problems(self, step, count, round=0):
        out = super().problems(step, count, round)
        Recording.handed.append((step, round, [p.prompt for p in out]))
        return out

    def observe(self, problems, rewards, step):
        Recording.observed.append((step, [p.prompt for p in problems], rewards))

    def metrics(self):
        return {"recording/observed": float(len(Recording.observed))}


@pytest.fixture
def recording():
    PROMPT_SAMPLERS._items["_recording"] = Recording
    Recording.handed, Recording.observed = [], []
    yield Recording
    del PROMPT_SAMPLERS._items["_recording"]


def test_observe_receives_every_sampled_prompt_with_its_rewards(tmp_path, recording):
    # Dynamic sampling with a reward the untrained model never earns: every group is flat, so each
    # step uses all three rounds, and the sampler observes each round's prompts, dropped or not.
    recipe = mini_recipe(sampler={"name": "_recording"}, rollout={"dynamic_sampling": True, "max_sampling_rounds": 3},
                         rewards=[{"name": "format"}], train={"steps": 2}, eval={"size": 0})
    Trainer(recipe, tmp_path / "d", log=lambda m: None).run()
    assert [(s, prompts) for s, _, prompts in recording.handed] == [(s, p) for s, p, _ in recording.observed]
    assert [(s, r) for s, r, _ in recording.handed] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(len(rw) == len(p) and all(len(g) == 4 for g in rw) for _, p, rw in recording.observed)
    # The rewards observed are the rewards scored: their mean over every row is the logged reward/mean.
    recording.handed, recording.observed = [], []
    recipe = mini_recipe(sampler={"name": "_recording"}, train={"steps": 2}, eval={"size": 0},
                         rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}])
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "r") if r["step"] > 0]
    assert len(recording.observed) == len(rows) == 2
    for (step, prompts, rewards), row in zip(recording.observed, rows):
        values = [v for group in rewards for v in group]
        assert len(prompts) == 4 and len(values) == 16
        assert sum(values) / len(values) == pytest.approx(row["reward/mean"], rel=1e-6)
        assert len(set(values)) > 1  # real, varied rewards
    # The sampler's metrics are logged with the step they were measured after.
    assert [row["recording/observed"] for row in rows] == [1.0, 2.0]


def test_the_default_sampler_is_the_task_stream():
    task = ArithmeticTask()
    sampler = PROMPT_SAMPLERS.get("stream")(task=task, seed=5)
    assert sampler.problems(3, 4, 0) == task.train_problems(3, 4, 5)
    assert sampler.problems(3, 4, 2) == task.train_problems(3, 4, 5 + 7919 * 2)


def test_learnability_weights_and_choices():
    task = ArithmeticTask()
    sampler = Learnability(task=task, seed=0, pool=4, floor=0.0)
    pool = task.train_problems(0, 16, 0)
    # p̂ = (S + ½)/(n + 1): always right → (4.5/5)(0.5/5) = 0.09; half right → 0.25; unseen → 0.25.
    sampler.observe(pool[:2], [[1.0] * 4, [1.0, 0.0, 1.0, 0.0]], step=0)
    assert sampler.weight(pool[0]) == pytest.approx(0.9 * 0.1)
    assert sampler.weight(pool[1]) == pytest.approx(0.25)
    assert sampler.weight(pool[2]) == pytest.approx(0.25)
    # A problem solved every time is chosen far less often than one solved half the time.
    solved = Learnability(task=task, seed=0, pool=4, floor=0.0)
    for p in pool[:8]:
        solved.observe([p], [[1.0] * 40], step=0)
    picks = [q.prompt for _ in range(50) for q in solved.problems(0, 4, 0)]
    first_half = sum(p in {q.prompt for q in pool[:8]} for p in picks)
    assert first_half < len(picks) * 0.2
    assert set(picks) <= {q.prompt for q in pool}


def test_learnability_sampler_resumes_with_the_same_prompts(tmp_path, monkeypatch):
    recipe = mini_recipe(sampler={"name": "learnability", "pool": 3},
                         rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}],
                         train={"steps": 4}, eval={"size": 0})
    seen = {"a": [], "b": []}
    original_problems = Learnability.problems
    label = {"run": "a"}

    def recording(self, step, count, round=0):
        out = original_problems(self, step, count, round)
        seen[label["run"]].append((step, [p.prompt for p in out]))
        return out

    monkeypatch.setattr(Learnability, "problems", recording)
    Trainer(recipe, tmp_path / "a", log=lambda m: None).run()
    label["run"] = "b"
    with crash_at_step(monkeypatch, 2):
        Trainer(recipe, tmp_path / "b", log=lambda m: None).run()
    seen["b"] = [x for x in seen["b"] if x[0] < 2]  # what the crashed run trained on before its checkpoint
    Trainer(recipe, tmp_path / "b", resume=True, log=lambda m: None).run()
    assert seen["a"] == seen["b"]
    stream = [p.prompt for p in ArithmeticTask().train_problems(2, 4, recipe.train.seed)]
    assert seen["a"][2][1] != stream  # the sampler really chose: not the plain stream
    assert comparable(read_metrics(tmp_path / "a")) == comparable(read_metrics(tmp_path / "b"))
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
