"""BoT-GRPO (bag-of-tokens advantage) and the ``arithmetic_steps`` process reward."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import reasonrl.methods.bot_grpo.advantage as bot_module
from reasonrl.algos.advantages import grpo_advantages
from reasonrl.methods.bot_grpo.advantage import (
    bag_of_tokens_advantages,
    bag_stats,
    bag_weights,
    bot_grpo,
    bot_token_rewards,
)
from reasonrl.batch import RolloutBatch
from reasonrl.config import load_recipe
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.registry import ADVANTAGES, TOKEN_REWARDS
from reasonrl.methods.bot_grpo.token_reward import arithmetic_steps
from reasonrl.rewards.token_level import dense_token_rewards
from reasonrl.tasks.arithmetic import ArithmeticTask, worked_solution
from reasonrl.problem import Problem
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe

NAN = float("nan")


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# --------------------------------------------------------------------------- the advantage

# Group 0 has responses of 2, 4 and 1 tokens; group 7 of 3 and 2. Padding holds NaN/99
# to prove it never leaks.
WORKED_R = torch.tensor([
    [1.0, 0.0, NAN, 99.0],
    [1.0, 1.0, 1.0, 1.0],
    [0.0, 99.0, 99.0, 99.0],
    [2.0, 2.0, 2.0, NAN],
    [0.0, 0.0, 99.0, 99.0],
])
WORKED_M = torch.tensor([
    [1, 1, 0, 0],
    [1, 1, 1, 1],
    [1, 0, 0, 0],
    [1, 1, 1, 0],
    [1, 1, 0, 0],
])
WORKED_G = torch.tensor([0, 0, 0, 7, 7])


def test_bag_weights_make_every_response_weigh_one():
    w = bag_weights(WORKED_M)
    close(w, [[0.5, 0.5, 0, 0], [0.25] * 4, [1, 0, 0, 0], [1 / 3] * 3 + [0], [0.5, 0.5, 0, 0]])
    close(w.sum(-1), [1.0] * 5)
    close(bag_weights(torch.zeros(1, 3)), [[0.0, 0.0, 0.0]])  # an empty row weighs nothing


def test_weighted_bag_statistics_by_hand():
    mean, std, count = bag_stats(WORKED_R, WORKED_M, WORKED_G)
    # Group 0: r̄ = 1/2, 1, 0 → μ_w = (0.5 + 1 + 0)/3 = 0.5 (the plain token mean would be 5/7).
    # Σ w (r − μ)² = [0.5·0.25 + 0.5·0.25] + [4 · 0.25·0.25] + [1·0.25] = 0.75; /3 → σ² = 0.25, σ = 0.5.
    # Group 7: r̄ = 2, 0 → μ_w = 1; Σ w (r − μ)² = 3·(1/3)·1 + 2·0.5·1 = 2; /2 → σ = 1.
    close(mean, [0.5, 0.5, 0.5, 1.0, 1.0])
    close(std, [0.5, 0.5, 0.5, 1.0, 1.0])
    close(count, [3.0, 3.0, 3.0, 2.0, 2.0])
    _, unbiased, _ = bag_stats(WORKED_R, WORKED_M, WORKED_G, std="unbiased")
    # Bessel over responses: 0.75/(3−1) = 0.375 and 2/(2−1) = 2.
    close(unbiased, [math.sqrt(0.375)] * 3 + [math.sqrt(2.0)] * 2)


def test_bag_of_tokens_advantages_by_hand():
    adv = bag_of_tokens_advantages(WORKED_R, WORKED_M, WORKED_G)
    # (1 − 0.5)/0.5 = 1, (0 − 0.5)/0.5 = −1; group 7: (2 − 1)/1 = 1, (0 − 1)/1 = −1 (eps 1e-6 aside).
    close(adv, [[1, -1, 0, 0], [1, 1, 1, 1], [-1, 0, 0, 0], [1, 1, 1, 0], [-1, -1, 0, 0]])
    assert torch.isfinite(adv).all()
    assert (adv[WORKED_M == 0] == 0).all()
    unbiased = bag_of_tokens_advantages(WORKED_R, WORKED_M, WORKED_G, std="unbiased")
    s = math.sqrt(0.375)
    close(unbiased[0, :2], [0.5 / s, -0.5 / s])
    close(unbiased[3, :3], [1 / math.sqrt(2)] * 3)


def test_sequence_constant_reward_reduces_to_grpo():
    # One group, R = [1, 0, 0, 0] over responses of 1..4 tokens: μ = 0.25, Σ (R − μ)² = 0.75.
    # Population σ = sqrt(0.75/4) = √3/4 → A = 0.75/(√3/4) = √3 and −0.25/(√3/4) = −1/√3.
    # Unbiased σ = sqrt(0.75/3) = 0.5 → A = 1.5 and −0.5 (what `grpo` gives).
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    groups = torch.zeros(4, dtype=torch.long)
    broadcast = rewards[:, None] * mask
    pop = bag_of_tokens_advantages(broadcast, mask, groups)
    close(pop, torch.tensor([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])[:, None] * mask)
    unbiased = bag_of_tokens_advantages(broadcast, mask, groups, std="unbiased")
    close(unbiased, torch.tensor([1.5, -0.5, -0.5, -0.5])[:, None] * mask)

    # The registered adapter on the pipeline's last-token rewards equals `grpo` exactly
    # (up to float rounding) with std="unbiased", on random groups and lengths.
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (12,), generator=gen)
    mask = (torch.arange(8)[None, :] < lengths[:, None]).long()
    rewards = torch.randint(0, 3, (12,), generator=gen).float() / 2
    groups = torch.tensor([5] * 4 + [2] * 3 + [9] * 4 + [4])  # the last is a singleton: A = 0
    last = (torch.arange(8)[None, :] == (lengths - 1)[:, None]).float() * rewards[:, None]
    batch = SimpleNamespace(dense_rewards=None, truncated=torch.zeros(12, dtype=torch.bool))
    grpo = ADVANTAGES.get("grpo")(last, mask, groups)
    torch.testing.assert_close(ADVANTAGES.get("bot_grpo")(last, mask, groups, batch=batch, std="unbiased"),
                               grpo, atol=1e-6, rtol=1e-6)
    assert grpo.abs().sum() > 0  # the comparison is not between two zero tensors
    # Population: GRPO's formula with the biased std, computed per group by hand.
    pop = bot_grpo(last, mask, groups, batch=batch)
    for g in groups.unique():
        rows = groups == g
        r = rewards[rows]
        expected = (r - r.mean()) / (r.std(unbiased=False) + 1e-6) if rows.sum() > 1 else torch.zeros_like(r)
        close(pop[rows], expected[:, None] * mask[rows])
    torch.testing.assert_close(grpo_advantages(last, mask, groups), grpo)


def test_degenerate_groups_and_masks():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0]])
    r = torch.tensor([[1.0, 3.0, 9.0], [5.0, 9.0, 9.0], [1.0, 1.0, 1.0], [7.0, 7.0, 7.0], [2.0, 0.0, 9.0]])
    groups = torch.tensor([0, 1, 1, 1, 2])
    adv = bag_of_tokens_advantages(r, mask, groups)
    # Group 0 and group 2 are singletons: no relative signal, A = 0 even though their tokens differ.
    assert (adv[0] == 0).all() and (adv[4] == 0).all()
    # Group 1: the empty row 3 is not in the bag (n = 2); r̄ = 5, 1 → μ = 3, σ² = (1·4 + 3·(1/3)·4)/2 = 4.
    close(adv[1], [1.0, 0.0, 0.0])
    close(adv[2], [-1.0, -1.0, -1.0])
    assert (adv[3] == 0).all()
    # Equal rewards everywhere: σ = 0 and every advantage is 0, not 0/0.
    flat = bag_of_tokens_advantages(torch.ones(3, 2), torch.ones(3, 2), torch.zeros(3, dtype=torch.long))
    assert (flat == 0).all()


def test_advantages_are_detached_targets():
    r = WORKED_R.nan_to_num().clone().requires_grad_(True)
    adv = bag_of_tokens_advantages(r, WORKED_M, WORKED_G)
    assert not adv.requires_grad


def test_dense_rewards_with_outcome_and_terminator():
    # Row 0 finished (EOS at t=2, dense 0 there) and right: d' = [1, 1, R=1]; r = d' + 1·R = [2, 2, 2].
    # Row 1 finished and wrong: d' = [1, 0, R=0]; r = [1, 0, 0].
    # Row 2 truncated (no terminator), its outcome spread over tokens as a KL-in-reward
    # penalty would leave it: R = Σ = 0.5; d = [0, 1]; r = d + 1·0.5 = [0.5, 1.5] (with weight 2: [1, 2]).
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]])
    token_rewards = torch.tensor([[0, 0, 1.0, 0], [0, 0, 0, 0], [0.25, 0.25, 0, 0]])
    dense = torch.tensor([[1.0, 1.0, 0, 0], [1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    truncated = torch.tensor([False, False, True])
    r = bot_token_rewards(token_rewards, mask, dense, truncated, outcome_weight=1.0)
    close(r, [[2, 2, 2, 0], [1, 0, 0, 0], [0.5, 1.5, 0, 0]])
    r2 = bot_token_rewards(token_rewards, mask, dense, truncated, outcome_weight=2.0)
    close(r2[2], [1.0, 2.0, 0, 0])
    r0 = bot_token_rewards(token_rewards, mask, dense, truncated, outcome_weight=0.0)
    close(r0, [[1, 1, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0]])
    # Without dense rewards: R broadcast to every valid token (not on the last token only).
    close(bot_token_rewards(token_rewards, mask, None, truncated), [[1, 1, 1, 0], [0, 0, 0, 0], [0.5, 0.5, 0, 0]])

    # The adapter feeds exactly these rewards to the bag. Rows 0, 1 form a group: r̄ = 2, 1/3 →
    # μ = 7/6, σ² = [(2 − μ)² + ((1 − μ)² + 2μ²)/3] / 2 (each row's tokens weigh 1/3).
    groups = torch.tensor([0, 0, 3])
    batch = SimpleNamespace(dense_rewards=dense, truncated=truncated)
    adv = bot_grpo(token_rewards, mask, groups, batch=batch)
    torch.testing.assert_close(adv, bag_of_tokens_advantages(r, mask, groups))
    mu = (2 + 1 / 3) / 2
    var = ((2 - mu) ** 2 + ((1 - mu) ** 2 + 2 * (0 - mu) ** 2) / 3) / 2
    close(adv[0, :3], [(2 - mu) / (math.sqrt(var) + 1e-6)] * 3)
    close(adv[1, :3], [(1 - mu) / math.sqrt(var), -mu / math.sqrt(var), -mu / math.sqrt(var)])
    assert (adv[2] == 0).all()  # a singleton group


def test_bad_parameters_name_themselves():
    m = torch.ones(2, 2)
    g = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="std"):
        bot_grpo(m, m, g, std="bessel")
    with pytest.raises(TypeError, match="outcome_weight"):
        bot_grpo(m, m, g, outcome_weight="lots")
    with pytest.raises(ValueError, match="eps"):
        bot_grpo(m, m, g, eps=-1.0)
    with pytest.raises(ValueError, match="dense_rewards"):
        bot_grpo(m, m, g, batch=SimpleNamespace(dense_rewards=torch.ones(2, 3), truncated=None))
    with pytest.raises(ValueError, match=r"\[B,T\]"):
        bag_of_tokens_advantages(torch.ones(2, 3), m, g)


# --------------------------------------------------------------------------- the process reward

def problem(expr: str, answer: int) -> Problem:
    return Problem(prompt=expr + ";", answer=str(answer))


BRACKETS = problem("(3+4)*5", 35)


@pytest.mark.parametrize("completion, expected", [
    # Right: 3+4=7; (6 chars) 7*5=35; (7) ####35 (6) → all 1.
    ("3+4=7;7*5=35;####35", [1.0] * 19),
    # Careless (brackets ignored): 4*5 is not a reducible operation of (3+4)*5, so 0; the
    # expression stays (3+4)*5 and 3+20 is not one of its operations either; 23 ≠ 35.
    ("4*5=20;3+20=23;####23", [0.0] * 21),
    # Garbage.
    ("x7*;=##", [0.0] * 7),
    # Truncated mid-step: the right first step keeps its credit; "7*5=3" is wrong as written.
    ("3+4=7;7*5=3", [1.0] * 6 + [0.0] * 5),
    # Arithmetic slip in a legal step: 0 for it; 8*5 is then not an operation of (3+4)*5.
    ("3+4=8;8*5=40;####40", [0.0] * 19),
    # A wrong step in the middle does not advance the expression; the later steps are judged
    # against the true state and earn their credit.
    ("3+4=7;4*5=20;7*5=35;####35", [1.0] * 6 + [0.0] * 7 + [1.0] * 13),
    # + and * may swap operands; spaces are allowed.
    (" 4 + 3 = 7; 5*7=35; #### 35", [1.0] * 27),
    # A right answer without steps earns its own characters; nothing after the answer counts.
    ("####35;1+1=2", [1.0] * 6 + [0.0] * 6),
    ("3+4=7;7*5=35;####35\n\nmore", [1.0] * 19 + [0.0] * 6),
    # The answer digits must be the whole number: 350 is wrong.
    ("####350", [0.0] * 7),
    # An empty segment and a malformed one.
    (";3+4;", [0.0] * 5),
    ("", []),
])
def test_arithmetic_steps_per_character(completion, expected):
    assert arithmetic_steps(completion, BRACKETS) == expected


def test_arithmetic_steps_respects_precedence_and_both_bracket_forms():
    plain = problem("3+4*5", 23)
    assert arithmetic_steps("4*5=20;3+20=23;####23", plain) == [1.0] * 21
    # Adding first breaks precedence: 0, then 7*5 is no operation of 3+20... of 3+4*5; 35 ≠ 23.
    assert arithmetic_steps("3+4=7;7*5=35;####35", plain) == [0.0] * 19
    right_first = problem("5*(3+4)", 35)
    assert arithmetic_steps("3+4=7;5*7=35;####35", right_first) == [1.0] * 19
    # The careless warm-up solution of c*(a+b) is c*a+b: 5*3 is not reducible in 5*(3+4).
    careless = worked_solution("c*(a+b)", 3, 4, 5, careless=True)
    assert careless == "5*3=15;15+4=19;####19"
    assert arithmetic_steps(careless, right_first) == [0.0] * len(careless)


def test_arithmetic_steps_on_every_task_solution():
    task = ArithmeticTask()
    for p in task.eval_problems(50):
        assert arithmetic_steps(p.solution, p) == [1.0] * len(p.solution)
    careless = [p for p in task.warmup_problems(0, 64, seed=0) if not p.solution.endswith("####" + p.answer)]
    assert careless  # the warm-up data does contain the careless mistake
    for p in careless:
        rewards = arithmetic_steps(p.solution, p)
        # The first careless step is no legal reduction, and the answer is wrong.
        assert rewards[0] == 0.0 and rewards[-1] == 0.0


def test_arithmetic_steps_reads_the_last_expression_of_a_templated_few_shot_prompt():
    task = ArithmeticTask(template="Question: What is {expr}?\nAnswer:", few_shot=2)
    p = task.eval_problems(1)[0]
    assert p.prompt.count("Question:") == 3
    assert arithmetic_steps(" " + p.solution, p) == [1.0] * (len(p.solution) + 1)
    # An unreadable prompt: no step can be judged, the answer still can.
    assert arithmetic_steps("3+4=7;####35", Problem(prompt="hello", answer="35")) == [0.0] * 6 + [1.0] * 6


@pytest.mark.parametrize("completion", ["9" * 5000 + "+1=1;", "####" + "9" * 5000, ";;;;", "((((", "=" * 300,
                                        "1+1=2;" * 200, "\x00\u00e9#;####", "-1--1=0;####-"])
@pytest.mark.parametrize("prompt, answer", [("(3+4)*5;", "35"), ("(" * 500 + "1+1" + ")" * 500, None),
                                            ("", ""), ("1+2*" * 100 + "3", "x"), ("3**4;", "81")])
def test_arithmetic_steps_never_raises_on_garbage(completion, prompt, answer):
    out = arithmetic_steps(completion, Problem(prompt=prompt, answer=answer))
    assert len(out) == len(completion) and set(out) <= {0.0, 1.0}


def test_arithmetic_steps_is_registered():
    assert TOKEN_REWARDS.get("arithmetic_steps") is arithmetic_steps


def test_characters_map_onto_char_tokens_and_eos():
    tok = build_char_tokenizer()
    texts = ["3+4=7;7*5=3", "4*5=20;"]  # the first ends with EOS, the second is truncated
    ids = [tok.convert_tokens_to_ids(list(t)) for t in texts]
    ids[0].append(tok.eos_token_id)
    width = 13
    completion = torch.full((2, width), tok.pad_token_id)
    mask = torch.zeros(2, width, dtype=torch.long)
    for i, row in enumerate(ids):
        completion[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    batch = RolloutBatch(
        prompt_ids=torch.tensor([tok.convert_tokens_to_ids(list("(3+4)*5;"))] * 2),
        prompt_mask=torch.ones(2, 8, dtype=torch.long), completion_ids=completion, completion_mask=mask,
        group_ids=torch.tensor([0, 0]), rewards=torch.tensor([0.0, 0.0]), truncated=torch.tensor([False, True]),
        meta={"completion": texts, "problem": [BRACKETS, BRACKETS]})
    dense = dense_token_rewards(tok, batch, arithmetic_steps, {})
    # One token per character; EOS decodes to nothing (0); padding 0.
    close(dense[0], [1.0] * 6 + [0.0] * 5 + [0.0] + [0.0])
    close(dense[1], [0.0] * 7 + [0.0] * 6)
    batch.dense_rewards = dense
    # Both wrong (R = 0): the finished row's EOS takes R = 0 too, so r = dense and
    # r̄ = 6/12 = 0.5 and 0 → μ = 0.25, σ² = [(1/12)(6·0.75² + 6·0.25²) + 7·(1/7)·0.25²]/2 = 0.1875,
    # σ = √3/4 → A = 0.75/σ = √3 on the right step, −0.25/σ = −1/√3 elsewhere.
    adv = bot_grpo(torch.zeros(2, width), mask, batch.group_ids, batch=batch)
    s3 = math.sqrt(3)
    close(adv[0], [s3] * 6 + [-1 / s3] * 6 + [0.0])
    close(adv[1], [-1 / s3] * 7 + [0.0] * 6)


# --------------------------------------------------------------------------- recipe and end to end

ROOT = Path(__file__).resolve().parents[1]


def test_recipe_is_grpo_plus_bot_and_the_process_reward():
    bot = load_recipe(ROOT / "recipes" / "bot_grpo.yaml").to_dict()
    grpo = load_recipe(ROOT / "recipes" / "grpo.yaml", ["eval.every=5"]).to_dict()
    assert bot["advantage"] == {"name": "bot_grpo", "std": "population", "eps": 1e-6, "outcome_weight": 1.0}
    assert bot["token_reward"]["name"] == "arithmetic_steps"
    assert bot["eval"]["every"] == 5 and bot["eval"]["size"] == 200
    same = {k for k in grpo if k not in ("advantage", "token_reward")}
    assert {k: bot[k] for k in same} == {k: grpo[k] for k in same}  # same model, budget, loss, eval


def test_short_training_run_uses_the_dense_rewards(tmp_path, monkeypatch):
    seen = []
    original = bot_module.bot_token_rewards

    def spy(token_rewards, response_mask, dense, truncated, outcome_weight=1.0):
        seen.append(dense)
        return original(token_rewards, response_mask, dense, truncated, outcome_weight)

    monkeypatch.setattr(bot_module, "bot_token_rewards", spy)
    recipe = mini_recipe(token_reward={"name": "arithmetic_steps"}, advantage={"name": "bot_grpo"})
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 4
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0 and "reward/mean" in r]
    # The policy loss is logged as "loss"; the "loss/policy" this line read was never logged, so its check never ran.
    policy_losses = [r["loss"] for r in rows if "loss" in r]
    assert len(rows) == 4 and policy_losses, "loss was never logged"
    assert all(math.isfinite(loss) for loss in policy_losses)
    assert len(seen) >= 1 and all(d is not None and d.dim() == 2 for d in seen)
    assert all(((d == 0) | (d == 1)).all() for d in seen)  # char tokens: each gets one 0/1 character reward
