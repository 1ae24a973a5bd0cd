"""Evidence seeking (OmniSeek-style, issue 12 item 4): the ``evidence`` environment and its task,
the tool-use reward, the necessity reward (pure math by hand, the masked forwards on a mini
model), the recipes end to end and their load-time errors."""

import math
import re
import random
from pathlib import Path

import pytest
import torch

import reasonrl.policy.hf as hf_policy  # the module whose sample_completions an episode turn calls
from reasonrl.methods.omniseek.maths import channel_necessity, necessity_mask, necessity_reward
from reasonrl.config import ConfigError, load_recipe
from reasonrl.envs.base import Step
from reasonrl.methods.omniseek.env import CALL_RE, EvidenceEnv, EvidenceSeekTask, evidence_tool_use
from reasonrl.hooks import MethodContext
from reasonrl.methods.omniseek.method import NecessityReward
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.tiny import TinySpec, new_tiny_model
from reasonrl.rewards.basic import exact_answer
from reasonrl.rollout.episodes import EpisodeRollout, sample_problems
from reasonrl.problem import Problem
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, RECIPES, episode_batch, mini_recipe, scripted, scripted_samples

A, B = "0123456789" * 3, "9876543210" * 3  # streams of 30: a_i = i mod 10, b_j = 9 − j mod 10


def problem(i=13, j=7):
    return Problem(f"A{i}+B{j};", str(int(A[i]) + int(B[j])), meta={"a": A, "b": B, "i": i, "j": j})


def evidence_policy(seed=0):
    tok = build_char_tokenizer(EvidenceSeekTask.alphabet)
    spec = TinySpec(**{**MINI_TINY, "seed": seed, "max_positions": 128})
    return HFPolicy(new_tiny_model(spec, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id), tok)


# -- the environment -------------------------------------------------------------------------

def test_the_env_answers_segments_of_each_stream_on_its_channel():
    env = EvidenceEnv(max_segment=3, max_calls=4, call_cost=0.1)
    assert env.reset(problem(), 0) == ""
    info = lambda a, b, both, err: {"calls_a": a, "calls_b": b, "used_both": both, "tool_errors": err}  # noqa: E731
    assert env.step("A13-15]") == Step("=345;", -0.1, False, info(1.0, 0.0, 0.0, 0.0), "a")
    assert env.step("A3-3]") == Step("=3;", -0.1, False, info(1.0, 0.0, 0.0, 0.0), "a")
    assert env.step("B7-7]") == Step("=2;", -0.1, False, info(0.0, 1.0, 1.0, 0.0), "b")  # both used: once
    # Over max_segment: an error reply, of no channel (no item to mask), counted in tool_errors.
    assert env.step("B0-3]") == Step("=;", -0.1, False, info(0.0, 1.0, 0.0, 1.0), None)
    assert env.step("B1-1]").done  # over max_calls
    for bad in ("B5-4]", "A28-30]"):  # start > end; past the stream's end
        fresh = EvidenceEnv()
        fresh.reset(problem(), 0)
        assert fresh.step(bad).observation == "=;" and fresh.step(bad).info["tool_errors"] == 1.0
    env = EvidenceEnv()
    env.reset(problem(), 0)
    for final in ("3+2=5;####5", "A13]", "C1-2]", "A1-2"):
        assert env.step(final).done  # not a call: the episode ends
    with pytest.raises(ValueError, match="streams 'a' and 'b'"):
        EvidenceEnv().reset(Problem("1+1;", "2"), 0)
    assert env.channels == ("a", "b") and env.stop == ("]",)


def test_an_error_reply_is_no_evidence_so_both_streams_count_only_when_answered():
    env = EvidenceEnv()
    env.reset(problem(), 0)
    assert env.step("A13-13]").info["used_both"] == 0.0
    err = env.step("B5-4]")  # start > end: an error reply of no channel, not a use of stream B
    assert (err.observation, err.channel, err.info["used_both"], err.info["tool_errors"]) == ("=;", None, 0.0, 1.0)
    state = env.state_dict()
    again = EvidenceEnv()
    again.reset(problem(), 0)
    again.load_state_dict(state)
    for e in (env, again):  # the answered streams resume with the env
        assert e.step("B7-7]").info["used_both"] == 1.0


def test_an_evidence_episode_tags_each_streams_tokens(monkeypatch):
    pol = evidence_policy()
    monkeypatch.setattr(hf_policy, "sample_completions",
                        scripted(["A13-13]", "B7-7]", "3+2=5;####5</s>"], pol.tokenizer, []))
    ep = EpisodeRollout(pol, mini_recipe(task={"name": "evidence_seek"}, env={"name": "evidence"},
                                         rollout={"max_new_tokens": 16, "max_turns": 8}))
    s = sample_problems(ep, [problem()], 2, 16, 1.0, torch.Generator().manual_seed(0))
    assert s.texts == ["A13-13]=3;B7-7]=2;3+2=5;####5"] * 2
    #                        A 1 3 - 1 3 ]  = 3 ;  B 7 - 7 ]  = 2 ;  3 + 2 = 5 ; # # # # 5 </s>
    assert s.env_channels.tolist() == [[0] * 7 + [1] * 3 + [0] * 5 + [2] * 3 + [0] * 12] * 2
    assert s.loss_mask.tolist() == [[1] * 7 + [0] * 3 + [1] * 5 + [0] * 3 + [1] * 12] * 2
    assert exact_answer(s.texts[0], problem()) == 1.0
    m = ep.metrics()
    assert m["episode/calls_a"] == 1 and m["episode/calls_b"] == 1 and m["episode/used_both"] == 1


# -- the task and its warm-up ----------------------------------------------------------------

def replay(task_problem, solution):
    """Run ``solution`` through the environment turn by turn (a turn ends at ']'); return the
    final turn and the streams called, asserting each observation is what the env answers."""
    env = EvidenceEnv()
    env.reset(task_problem, 0)
    called, rest = [], solution
    while "]" in rest:
        turn, rest = rest[:rest.index("]") + 1], rest[rest.index("]") + 1:]
        step = env.step(turn)
        assert not step.done and step.info["tool_errors"] == 0.0
        assert rest.startswith(step.observation), (solution, step.observation)
        rest = rest[len(step.observation):]
        called.append(step.channel)
    assert env.step(rest).done
    return rest, called


def test_the_warm_up_trajectories_are_what_the_env_answers():
    task = EvidenceSeekTask(skip_fraction=0.3, max_window=3)
    problems = task.warmup_problems(5, 400, 0)
    both = 0
    for p in problems:
        final, called = replay(p, p.solution)
        assert len(called) in (1, 2) and len(set(called)) == len(called)
        a_i, b_j = int(p.meta["a"][p.meta["i"]]), int(p.meta["b"][p.meta["j"]])
        x, y = (int(v) for v in final.split("=")[0].split("+"))
        assert final == f"{x}+{y}={x + y};####{x + y}"  # a self-consistent sum and the answer format
        assert ("a" not in called or x == a_i) and ("b" not in called or y == b_j)  # the item called is the one used
        both += len(called) == 2
        if len(called) == 2:
            assert exact_answer(p.solution, p) == 1.0 and evidence_tool_use(p.solution, p) == 1.0
        assert set(p.prompt + p.solution) <= set(task.alphabet)
        assert len(p.prompt) + len(p.solution) + 2 <= 64  # with BOS and EOS: the warm-up fits any max_positions
    assert 0.65 < both / len(problems) < 0.75  # skip_fraction 0.3 call one stream only
    assert EvidenceSeekTask(skip_fraction=0).warmup_problems(0, 1, 0)[0].solution.count("]") == 2
    windows = [len(s.split("=")[1].split(";")[0]) for p in problems for s in p.solution.split(";") if "]" in s]
    assert set(windows) == {1, 2, 3}


def test_the_task_is_deterministic_and_its_splits_are_disjoint():
    task = EvidenceSeekTask()
    train = task.train_problems(0, 50, 1)
    assert train == task.train_problems(0, 50, 1) and [p.meta for p in train] == [p.meta for p in
                                                                                  task.train_problems(0, 50, 1)]
    held = task.eval_problems(50)
    key = lambda p: (p.meta["a"], p.meta["b"], p.meta["i"], p.meta["j"])  # noqa: E731
    assert not {key(p) for p in train} & {key(p) for p in held}
    for p in train + held:
        assert p.answer == str(int(p.meta["a"][p.meta["i"]]) + int(p.meta["b"][p.meta["j"]]))
        assert p.prompt == f"A{p.meta['i']}+B{p.meta['j']};" and len(p.meta["a"]) == 30
    with pytest.raises(ValueError, match="skip_fraction"):
        EvidenceSeekTask(skip_fraction=2)


def test_hints_are_noisy_priors_in_the_prompt_and_the_warm_ups_shortcut():
    plain, hinted = EvidenceSeekTask(), EvidenceSeekTask(hint_accuracy=0.8)
    problems = hinted.train_problems(0, 2000, 1)
    right = []
    for p in problems:
        m = p.meta
        a_i, b_j = m["a"][m["i"]], m["b"][m["j"]]
        assert p.prompt == f"A{m['i']}={m['hints'][0]}+B{m['j']}={m['hints'][1]};"
        assert p.answer == str(int(a_i) + int(b_j)) and set(p.prompt) <= set(hinted.alphabet)
        right += [m["hints"][0] == a_i, m["hints"][1] == b_j]
    assert 0.77 < sum(right) / len(right) < 0.83  # each hint is the item with probability 0.8
    # Hint-free problems are exactly what they were without the parameter (no hint drawn).
    assert all("hints" not in p.meta and p.prompt == f"A{p.meta['i']}+B{p.meta['j']};"
               for p in plain.train_problems(0, 20, 1) + plain.eval_problems(20))
    assert all(p.meta["hints"] == p.meta["a"][p.meta["i"]] + p.meta["b"][p.meta["j"]]
               for p in EvidenceSeekTask(hint_accuracy=1.0).train_problems(0, 50, 1))
    assert all(h[0] != p.meta["a"][p.meta["i"]] and h[1] != p.meta["b"][p.meta["j"]]
               for p in EvidenceSeekTask(hint_accuracy=0.0).train_problems(0, 50, 1) for h in [p.meta["hints"]])
    # The warm-up's skipped stream takes its hint: the text-only shortcut.
    skipped = 0
    for p in EvidenceSeekTask(hint_accuracy=0.5, skip_fraction=1.0).warmup_problems(0, 200, 0):
        final, called = replay(p, p.solution)
        x, y = (int(v) for v in final.split("=")[0].split("+"))
        assert len(called) == 1
        assert (x, y)[1 - "ab".index(called[0])] == int(p.meta["hints"][1 - "ab".index(called[0])])
        skipped += 1
    assert skipped == 200
    with pytest.raises(ValueError, match="hint_accuracy"):
        EvidenceSeekTask(hint_accuracy=1.5)


# -- the tool-use reward ---------------------------------------------------------------------

@pytest.mark.parametrize("completion, score", [
    ("A13-13]=3;B7-7]=2;3+2=5;####5", 1.0),  # called and right
    ("B7-8]=21;3+2=5;####5", 1.0),  # one call is a call
    ("A13-13]=3;B7-7]=2;3+3=6;####6", 0.0),  # called, wrong
    ("3+2=5;####5", 0.0),  # right without a call
    ("A13]3+2=5;####5", 0.0),  # not a call
    ("A13-13]=3;", 0.0),  # no answer
])
def test_the_tool_use_reward_needs_a_call_and_a_right_answer(completion, score):
    assert evidence_tool_use(completion, problem()) == score
    assert bool(CALL_RE.search(completion)) == ("-" in completion)


# -- the necessity reward: pure math by hand -------------------------------------------------

NAN, INF = float("nan"), float("inf")


def test_the_necessity_reward_on_a_hand_built_case():
    # Row 0: model tokens at 0, 3, 5; stream a at 1-2, stream b at 4. Row 1: the same, wrong answer.
    # Row 2: no observation (M empty); NaN / -inf on padding and observation positions.
    response = torch.tensor([[1, 0, 0, 1, 0, 1], [1, 0, 0, 1, 0, 1], [1, 1, 1, 0, 0, 0]])
    channel = torch.tensor([[0, 1, 1, 0, 2, 0], [0, 1, 1, 0, 2, 0], [0] * 6])
    full = torch.tensor([[-1.0, NAN, 0.0, -0.5, 0.0, -0.2]] * 2 + [[-1.0, -1.0, -1.0, NAN, NAN, NAN]])
    no_a = torch.tensor([[-1.0, -INF, 0.0, -2.5, 0.0, -0.1]] * 2 + [[-3.0, -3.0, -3.0, NAN, NAN, NAN]])
    no_b = torch.tensor([[-1.0, 0.0, NAN, -0.5, 0.0, -0.8]] * 2 + [[-3.0, -3.0, -3.0, -INF, NAN, NAN]])
    m = necessity_mask(response, channel)
    assert m.tolist() == [[False, False, False, True, False, True]] * 2 + [[False] * 6]
    # nec_a row 0 = ([−0.5 − (−2.5)]₊ + [−0.2 − (−0.1)]₊) / 2 = (2.0 + 0) / 2 = 1.0
    # nec_b row 0 = ([0]₊ + [−0.2 − (−0.8)]₊) / 2 = 0.6 / 2 = 0.3;   r = 1 · min(1.0, 0.3) = 0.3
    torch.testing.assert_close(channel_necessity(full, no_a, m), torch.tensor([1.0, 1.0, 0.0]))
    r, nec = necessity_reward(full, [no_a, no_b], m, torch.tensor([True, False, True]))
    torch.testing.assert_close(nec, torch.tensor([[1.0, 1.0, 0.0], [0.3, 0.3, 0.0]]))
    torch.testing.assert_close(r, torch.tensor([0.3, 0.0, 0.0]))  # the gate; M empty gives 0, not NaN
    # The min: a trajectory that needs only one stream scores 0.
    r, _ = necessity_reward(full, [no_a, full], m, torch.tensor([1, 1, 1]))
    assert r.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="at least one"):
        necessity_reward(full, [], m, torch.ones(3))


# -- the necessity method on a mini model ----------------------------------------------------

def hand_batch(pol, rows):
    """A batch of episodes given as (prompt, [(text, kind)], correct): kind 'm' for the model's
    tokens, 'a' / 'b' for an observation of that stream."""
    correct = [float(c) for _, _, c in rows]
    return episode_batch(pol, [p for p, _, _ in rows], [parts for _, parts, _ in rows], {"a": 1, "b": 2},
                         rewards=correct, meta={"reward/exact_answer": correct})


EPISODE = [("A13-13]", "m"), ("=3;", "a"), ("B7-7]", "m"), ("=2;", "b"), ("3+2=5;####5", "m"), ("</s>", "m")]


def necessity_method(pol, **params):
    method = NecessityReward(**params)
    recipe = mini_recipe(task={"name": "evidence_seek"}, env={"name": "evidence"},
                         rollout={"max_new_tokens": 16, "max_turns": 8})
    method.setup(MethodContext(recipe=recipe, policy=pol, run_dir=Path("."), log=lambda m: None))
    return method


def test_masking_a_channel_changes_the_later_log_probs_only_and_equals_deleting_its_tokens():
    pol = evidence_policy()
    pol.model.eval()
    method = necessity_method(pol)
    batch = hand_batch(pol, [("A3+B7;", EPISODE, True), ("A13+B17;", EPISODE[:2] + [("3+8=11;####11", "m")], True)])
    assert not batch.prompt_mask.all()  # left padding, where position ids come from the mask
    compared = untouched = 0
    with torch.no_grad():
        full = method._logprobs(batch, None)
        for k in (1, 2):
            hidden = batch.aux["env_channel"] == k
            masked = method._logprobs(batch, hidden)
            for r in range(2):
                live = batch.completion_mask[r].bool()
                if not hidden[r].any():
                    torch.testing.assert_close(masked[r], full[r], atol=1e-6, rtol=0)
                    untouched += 1
                    continue
                first = int(hidden[r].nonzero()[0])
                # Token t is predicted at position t − 1: tokens up to the first hidden one see nothing hidden.
                torch.testing.assert_close(masked[r, :first + 1], full[r, :first + 1], atol=1e-6, rtol=0)
                later = (~hidden[r]) & live & (torch.arange(len(live)) > first)
                assert (masked[r] - full[r]).abs()[later].max() > 1e-3
                # Masking the keys = deleting the tokens with every other position id kept.
                ids = torch.cat([batch.prompt_ids[r], batch.completion_ids[r]])
                seen = torch.cat([batch.prompt_mask[r], batch.completion_mask[r]]).bool()
                pos = (seen.long().cumsum(0) - 1).clamp(min=0)
                keep = seen & ~torch.cat([torch.zeros_like(batch.prompt_mask[r]), hidden[r]]).bool()
                logits = pol.model(input_ids=ids[keep][None], position_ids=pos[keep][None]).logits[0]
                logp = torch.log_softmax(logits.float(), -1)
                p = batch.prompt_ids.shape[1]
                kept_at = {int(q): n for n, q in enumerate(keep.nonzero().flatten())}
                for t in range(1, len(live)):
                    if live[t] and not hidden[r, t] and (p + t - 1) in kept_at:
                        want = logp[kept_at[p + t - 1], batch.completion_ids[r, t]]
                        torch.testing.assert_close(masked[r, t], want, atol=1e-5, rtol=0)
                        compared += 1
    assert compared > 20
    assert untouched > 0, "every row had tokens of both channels: the unmasked case was never checked"


def test_the_method_adds_the_gated_necessity_to_the_reward():
    pol = evidence_policy()
    method = necessity_method(pol, coef=0.5)
    rows = [("A13+B7;", EPISODE, True), ("A13+B7;", EPISODE, False),
            ("A2+B3;", [("2+6=8;####8", "m"), ("</s>", "m")], True),  # no observation
            ("A2+B3;", EPISODE[:2] + [("3+2=5;####5", "m")], True)]  # stream a only
    batch = hand_batch(pol, rows)
    before = batch.rewards.clone()
    metrics = method.annotate(batch, 0)
    with torch.no_grad():
        full = method._logprobs(batch, None)
        masked = [method._logprobs(batch, batch.aux["env_channel"] == k) for k in (1, 2)]
        masked[1][2:] = full[2:]  # rows without stream b tokens keep ℓ^{\b} = ℓ^full
        m = necessity_mask(batch.response_mask, batch.aux["env_channel"])
        want, nec = necessity_reward(full, masked, m, torch.tensor([True, False, True, True]))
    assert want[0] > 0 and want[1:].tolist() == [0.0, 0.0, 0.0]  # the gate, no evidence, one stream only
    torch.testing.assert_close(batch.rewards, before + 0.5 * want, atol=1e-5, rtol=0)
    assert metrics["necessity/a"] == pytest.approx(float(nec[0].mean()), abs=1e-5)
    assert metrics["necessity/b"] == pytest.approx(float(nec[1].mean()), abs=1e-5)
    assert metrics["necessity/reward"] == pytest.approx(float(want.mean()), abs=1e-5) and metrics["necessity/rows"] == 0.75
    assert pol.model.training  # restored


def test_a_batch_without_observations_gets_necessity_zero_without_a_forward(monkeypatch):
    pol = evidence_policy()
    method = necessity_method(pol, coef=1.0)
    batch = hand_batch(pol, [("A2+B3;", [("2+6=8;####8", "m")], True)] * 2)
    del batch.aux["env_channel"]
    monkeypatch.setattr(method, "_logprobs", lambda *a: pytest.fail("no forward is needed"))
    metrics = method.annotate(batch, 0)
    assert batch.rewards.tolist() == [1.0, 1.0]
    assert metrics == {"necessity/a": 0.0, "necessity/b": 0.0, "necessity/reward": 0.0, "necessity/rows": 0.0}
    assert all(math.isfinite(v) for v in metrics.values())
    batch.meta = {}
    with pytest.raises(ValueError, match="reward/exact_answer"):
        method.annotate(batch, 0)


# -- the recipes -----------------------------------------------------------------------------

def mini_overrides():
    return [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()] + [
        "train.steps=2", "train.prompts_per_step=2", "rollout.num_generations=4", "eval.size=4",
        "log.plots=false", "log.progress=false"]


def seeker(model, tokenizer, ids, mask, g, max_new_tokens, *args, **kwargs):
    """A stand-in for ``sample_completions`` that plays an evidence episode (the untrained mini
    model never calls a tool): call A at the asked position, then B, then answer with the items
    seen, right on every other row, so groups differ and the policy trains."""

    rows = []
    for r, (row, m) in enumerate(zip(ids, mask)):
        text = tokenizer.decode(row[m.bool()], skip_special_tokens=True)
        i, j = (int(v) for v in re.match(r"A(\d+)(?:=\d)?\+B(\d+)", text).groups())  # with or without hints
        seen = [int(v) for v in re.findall(r"\]=(\d)\d*;", text)]
        calls = text.count("]")
        turn = f"A{i}-{i}]" if calls == 0 else f"B{j}-{j}]" if calls == 1 else \
            f"{seen[0]}+{seen[1]}={sum(seen) + r % 2};####{sum(seen) + r % 2}"
        rows.append(tokenizer(turn, add_special_tokens=False)["input_ids"][:max_new_tokens]
                    + ([tokenizer.eos_token_id] if calls >= 2 else []))
    return scripted_samples(ids, mask, rows, tokenizer)


@pytest.mark.parametrize("name", ["evidence", "evidence_necessity"])
def test_the_recipe_trains_end_to_end(name, tmp_path, monkeypatch):
    monkeypatch.setattr(hf_policy, "sample_completions", seeker)
    recipe = load_recipe(RECIPES / f"{name}.yaml", mini_overrides())
    assert recipe.rollout.max_turns == 8 and recipe.model.tiny["max_positions"] == 128
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 2
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0 and "reward/mean" in r]
    assert len(rows) == 2 and all(r["episode/used_both"] == 1.0 and r["episode/calls_a"] == 1.0 for r in rows)
    assert all(r["reward/exact_answer"] == 0.5 and r["reward/evidence_tool_use"] == 0.5 for r in rows)
    assert all(not r.get("skipped") and r["grad_norm"] > 0 for r in rows)
    if name == "evidence_necessity":
        assert all(r["necessity/rows"] == 1.0 and r["necessity/a"] > 0 and r["necessity/b"] > 0 for r in rows)
        assert all(0 < r["necessity/reward"] <= min(r["necessity/a"], r["necessity/b"]) for r in rows)
    else:
        assert not any("necessity/a" in r for r in rows)


EVIDENCE = {"task": {"name": "evidence_seek"}, "env": {"name": "evidence"}, "rollout": {"max_new_tokens": 16}}
NECESSITY = [{"name": "necessity_reward"}]
BAD = [
    ({"methods": NECESSITY, "task": {"name": "evidence_seek"}}, "method 'necessity_reward': .*this recipe has no env"),
    ({"methods": NECESSITY, "task": {"name": "arithmetic_tools"}, "env": {"name": "calculator"}},
     r"env 'calculator' has none"),
    ({**EVIDENCE, "methods": [{"name": "necessity_reward", "correct_reward": "format"}]},
     r"correct_reward 'format' .* not among the recipe's rewards \['exact_answer'\]"),
    ({**EVIDENCE, "methods": [{"name": "necessity_reward", "coef": -1}]}, "coef must be >= 0"),
    ({**EVIDENCE, "env": {"name": "evidence", "max_segment": 0}}, "env.max_segment must be >= 1"),
    ({**EVIDENCE, "task": {"name": "evidence_seek", "length": 1}}, "task.length must be >= 2"),
]


@pytest.mark.parametrize("sections, message", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_evidence_settings_are_recipe_errors(sections, message):
    with pytest.raises(ConfigError, match=message):
        mini_recipe(**sections)


def test_the_tiny_model_warms_up_on_the_evidence_task():
    spec = TinySpec(**{**MINI_TINY, "task": "evidence_seek", "max_positions": 128})
    task = spec.warmup_task()
    assert isinstance(task, EvidenceSeekTask) and set("AB]") <= set(task.alphabet)
    rng = random.Random(0)
    assert all(CALL_RE.search(task.trajectory(p, rng)) for p in task.train_problems(0, 20, 0))
