"""The one declared data flow (``reasonrl.dataflow``): the stage order, who sees which rewards, and
every ``batch.aux`` / ``batch.meta`` key a stage reads declared by the stages that write it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from reasonrl.algos.advantages import grpo_advantages
from reasonrl.config import ConfigError
from reasonrl.dataflow import ENV_CHANNEL, REWARDS, STAGE_NAMES, declared_stages, meta_reward
from reasonrl.hooks import Method
from reasonrl.metrics_log import read_metrics
from reasonrl.registry import ADVANTAGES, METHODS, PROMPT_SAMPLERS, SELECTORS
from reasonrl.rollout.samplers import PromptSampler
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe

SRC = Path(__file__).resolve().parents[1] / "src" / "reasonrl"
BONUS = 10.0
SEEN: dict[str, list] = {}


class Shaper(Method):
    """Adds BONUS to every row's reward in ``annotate``, as RL-ARC or SAVER add their terms."""

    @classmethod
    def declared_keys(cls, config):
        return {"annotate": ((REWARDS,), ())}

    def annotate(self, batch, step):
        SEEN.setdefault("annotate_in", []).append(batch.rewards.clone())
        batch.rewards = batch.rewards + BONUS
        return {}


class Recorder(PromptSampler):
    def observe(self, problems, rewards, step):
        SEEN.setdefault("sampler", []).extend(v for values in rewards for v in values)


def recording_selector(batch):
    SEEN.setdefault("select", []).append(batch.rewards.clone())
    return batch


def recording_advantage(token_rewards, response_mask, group_ids):
    SEEN.setdefault("advantage", []).append(token_rewards.sum(-1).clone())
    return grpo_advantages(token_rewards, response_mask, group_ids)


@pytest.fixture
def recorders():
    SEEN.clear()
    added = ((METHODS, "_shaper", Shaper), (PROMPT_SAMPLERS, "_recorder", Recorder),
             (SELECTORS, "_recorder", recording_selector), (ADVANTAGES, "_recorder", recording_advantage))
    for reg, name, obj in added:
        reg._items[name] = obj
    yield
    for reg, name, _ in added:
        del reg._items[name]


def test_stage_order_is_the_trainers():
    assert STAGE_NAMES == ("rollout", "select", "extend_batch", "token_reward", "annotate", "behaviour", "advantage",
                           "update", "after_update")
    assert all(callable(getattr(Trainer, f"_{stage}", None)) for stage in STAGE_NAMES)
    # train_step walks the tuple; it names no stage itself
    body = inspect.getsource(Trainer.train_step)
    assert "STAGE_NAMES" in body and "_annotate(" not in body


def test_who_sees_which_rewards(tmp_path, recorders):
    """Only the advantage sees a method's reward term: the prompt sampler, the selectors and the
    reward/* metrics see the scored rewards (DESIGN: feedback and filters act on the verifier)."""
    recipe = mini_recipe(methods=[{"name": "_shaper"}], sampler={"name": "_recorder"},
                         selection=[{"name": "_recorder"}], advantage={"name": "_recorder"},
                         train={"steps": 2}, eval={"size": 0})
    Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    scored = torch.cat(SEEN["select"])
    assert len(SEEN["select"]) == len(SEEN["advantage"]) == len(SEEN["annotate_in"]) == 2
    assert torch.equal(torch.cat(SEEN["annotate_in"]), scored)  # annotate gets the scored rewards
    assert sorted(SEEN["sampler"]) == sorted(scored.tolist())  # the sampler observed the same
    assert torch.allclose(torch.cat(SEEN["advantage"]), scored + BONUS)  # the advantage sees the sum
    rows = [r for r in read_metrics(tmp_path / "run") if "reward/mean" in r]
    assert [r["reward/mean"] for r in rows] == pytest.approx([float(s.mean()) for s in SEEN["select"]])


def test_rollout_declares_reward_scores_and_env_channels():
    r = mini_recipe(rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}])
    stage, who, produces, consumes = declared_stages(r)[0]
    assert stage == "rollout" and produces == (meta_reward("exact_answer"), meta_reward("soft_overlong"))
    r = mini_recipe(env={"name": "evidence"}, task={"name": "evidence_seek"}, rollout={"max_turns": 3})
    assert ENV_CHANNEL in declared_stages(r)[0][2]


class Gated(Method):
    """Reads recipe reward ``format``'s scores, as RL-ARC's correctness gate reads its reward's."""

    @classmethod
    def declared_keys(cls, config):
        return {"annotate": ((), (meta_reward("format"),))}


def test_a_gate_on_a_reward_the_recipe_lacks_is_refused_at_load():
    METHODS._items["_gated"] = Gated
    try:
        with pytest.raises(ConfigError, match=r"method '_gated' reads batch.meta\['reward/format'\], which no earlier "
                                              r"stage of the recipe writes; written by the rollout, with 'format'"):
            mini_recipe(methods=[{"name": "_gated"}])
        mini_recipe(methods=[{"name": "_gated"}], rewards=[{"name": "exact_answer"}, {"name": "format"}])
    finally:
        del METHODS._items["_gated"]


def test_every_method_that_changes_rewards_declares_it():
    """A method whose ``annotate`` assigns ``batch.rewards`` declares REWARDS (read from the source)."""
    changed = []
    for name in METHODS.names():
        cls = METHODS.get(name)
        source = inspect.getsource(cls)
        if "batch.rewards = " in source:
            changed.append(name)
            keys = cls.declared_keys({})
            assert REWARDS in keys.get("annotate", ((),))[0], f"method '{name}' changes batch.rewards undeclared"
    assert len(changed) >= 7, changed  # rlcpr, saver, necessity_reward, rl_arc, fsg_verifier, clinical_judge, advice_gain


def _constant_strings(tree: ast.Module) -> dict[str, str]:
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


def _aux_reads() -> dict[str, list[str]]:
    """Every ``batch.aux`` key read anywhere in the package by a constant (``x.aux[K]``,
    ``x.aux.get(K)``, ``K in x.aux``) → the files that read it."""
    names: dict[str, str] = {}
    trees = {}
    for path in SRC.rglob("*.py"):
        trees[path] = ast.parse(path.read_text(encoding="utf-8"))
        names.update(_constant_strings(trees[path]))
    reads: dict[str, list[str]] = {}

    def key_of(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return names.get(node.id)
        return None

    def is_aux(node):
        return isinstance(node, ast.Attribute) and node.attr == "aux"

    for path, tree in trees.items():
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript) and is_aux(node.value) and isinstance(node.ctx, ast.Load):
                key = key_of(node.slice)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and is_aux(node.func.value) and node.args:
                key = key_of(node.args[0])
            if key is not None:
                reads.setdefault(key, []).append(path.relative_to(SRC).as_posix())
    return reads


def _declared_keys() -> set[str]:
    declared = {ENV_CHANNEL}
    for reg in (SELECTORS, ADVANTAGES):
        for n in reg.names():
            fn = reg.get(n)
            declared.update(getattr(fn, "produces", ()), getattr(fn, "consumes", ()), getattr(fn, "optional", ()))
    for n in METHODS.names():
        cls = METHODS.get(n)
        declared.update(getattr(cls, "writes", ()))
        for config in ({}, {"span_map": True}):
            for keys in cls.declared_keys(config).values():
                for group in keys:
                    declared.update(group)
    return declared


def test_every_aux_key_read_is_declared():
    reads = _aux_reads()
    assert {"values", "seq_logprob", ENV_CHANNEL} <= set(reads), sorted(reads)  # the scan finds real reads
    undeclared = {k: v for k, v in reads.items() if k not in _declared_keys()}
    assert not undeclared, f"batch.aux keys read without any stage declaring them: {undeclared}"


def test_a_selector_declares_the_reward_its_parameters_name():
    """``mixed_quality`` gates on the scores of the reward its ``quality`` names: checked at load."""
    with pytest.raises(ConfigError, match=r"selector 'mixed_quality' reads batch.meta\['reward/format'\]"):
        mini_recipe(selection=[{"name": "mixed_quality", "quality": "format"}])
    r = mini_recipe(selection=[{"name": "mixed_quality", "quality": "format"}],
                    rewards=[{"name": "exact_answer"}, {"name": "format", "weight": 0.0}])
    assert [c for s, _, _, c in declared_stages(r) if s == "select"] == [(meta_reward("format"),)]
