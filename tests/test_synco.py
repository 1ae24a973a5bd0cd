"""SynCo: the three rewards and R_S by hand, the reliability filter, the proposal parser and the
Synthesizer's warm-up data, ``extend_batch`` on scripted samples (exactly the reliable tasks
appended as new groups with the right rewards), the Synthesizer's update (only its weights
move), exact resume and a short run."""

import pytest
import torch

from reasonrl.methods.synco.maths import (agreement, canonical_answer, char_ngrams, is_reliable, novelty,
                                  synthesizer_reward, task_quality, teachability)
from reasonrl.config import ConfigError
from reasonrl.methods.synco import method as synco_method
from reasonrl.hooks import MethodContext
from reasonrl.methods.synco.method import SynCo
from reasonrl.policy.tiny import TinySpec
from reasonrl.rewards.scorer import build_scorer
from reasonrl.rollout.collect import sample_and_score
from reasonrl.perf import Stopwatch
from reasonrl.tasks.arithmetic import FORMS, render, true_answer
from reasonrl.methods.synco.task import (ArithmeticProposalTask, evaluate_expression, form_of,
                                                 parse_proposal)
from reasonrl.problem import Problem
from reasonrl.tasks.base import build_task, in_eval_split
from reasonrl.metrics_log import read_metrics
from reasonrl.train.optim import Learner
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, mini_policy, mini_recipe, scripted_samples, straight_and_resumed

# A mini Synthesizer: the mini architecture warmed up on the proposal task (a few seconds).
MINI_SYNTH = {"backend": "tiny", "tiny": {**MINI_TINY, "warmup_steps": 40, "task": "arithmetic_proposals",
                                          "task_params": {"wrong_fraction": 0.3}}}

# -- the rewards by hand ------------------------------------------------------------------------


def test_reliability_and_teachability_by_hand():
    a = agreement(["7", "7", "7", "5", "5", None, "7", "8"], "7")
    assert (a.p_hat, a.mode_count, a.reference_is_mode, a.reliability) == (0.5, 4, True, 0.5)
    assert teachability(a.p_hat) == 1.0
    b = agreement(["5"] * 5 + ["7"] * 3, "7")  # a_S is not the mode: unreliable, yet learnable
    assert (b.p_hat, b.reliability) == (3 / 8, 0.0)
    assert teachability(b.p_hat) == pytest.approx(4 * 3 / 8 * 5 / 8) == pytest.approx(0.9375)
    assert agreement(["7", "7", "5", "5"], "7").reliability == 0.5  # a tie: a_S is one of the modes
    none_mode = agreement([None, None, None, "7"], "7")  # "no answer" is the mode
    assert (none_mode.p_hat, none_mode.reliability) == (0.25, 0.0)
    assert agreement(["07", "7.0", "7"], "7").p_hat == 1.0  # numbers compare as numbers
    assert canonical_answer("1,000") == "1000" and canonical_answer(None) is None
    assert teachability(0.0) == teachability(1.0) == 0.0
    with pytest.raises(ValueError):
        teachability(1.5)


def test_novelty_quality_and_synthesizer_reward_by_hand():
    assert char_ngrams("(13+2)*6", 3) == {"(13", "13+", "3+2", "+2)", "2)*", ")*6"}
    assert novelty("(13+2)*6", ["(13+2)*5"]) == pytest.approx(1 - 5 / 7)  # 5 shared 3-grams of 7
    assert novelty("(13+2)*6", ["(13+2)*6", "1+1*2"]) == 0.0  # an exact duplicate
    assert novelty("(13+2)*6", []) == 1.0
    assert task_quality(True, 2 / 7, 0.5) == pytest.approx(0.5 + 1 / 7)
    assert task_quality(False, 1.0, 0.25) == 0.25
    # R_S = 1[valid] (0.2 R_q + 0.3 R_rel + 0.5 R_teach)
    assert synthesizer_reward(True, 0.5, 0.5, 1.0) == pytest.approx(0.1 + 0.15 + 0.5)
    assert synthesizer_reward(True, 1.0, 0.75, 0.75, (0.2, 0.3, 0.5)) == pytest.approx(0.2 + 0.225 + 0.375)
    assert synthesizer_reward(False, 1.0, 1.0, 1.0) == 0.0
    assert synthesizer_reward(True, 1.0, 0.0, 0.0, (1.0, 0.0, 0.0)) == 1.0
    with pytest.raises(ValueError):
        synthesizer_reward(True, 1.0, 1.0, 1.0, (0.5, 0.5))


def test_reliability_filter():
    assert is_reliable(0.5, 0.5) and is_reliable(1.0, 0.5)
    assert not is_reliable(0.49, 0.5) and not is_reliable(0.0, 0.0 + 1e-9)
    # R_rel >= tau implies p_hat >= tau (when a_S is the mode, R_rel = p_hat).
    a = agreement(["3", "3", "3", "4"], "3")
    assert a.reliability == a.p_hat == 0.75


# -- the proposal parser and the Synthesizer's warm-up data ---------------------------------------


@pytest.mark.parametrize("text, question, answer, value, form", [
    ("(13+2)*6;####90", "(13+2)*6", "90", 90, "(a+b)*c"),
    ("(13+2)*6;13+2=15;15*6=90;####90", "(13+2)*6", "90", 90, "(a+b)*c"),
    ("  3+4*5;####23\n", "3+4*5", "23", 23, "a+b*c"),
    ("12-3;####9", "12-3", "9", 9, None),  # a valid problem of no arithmetic form
    ("2*(3+4);####-1", "2*(3+4)", "-1", 14, "c*(a+b)"),  # well formed, wrong answer
    ("4*5+0;####020", "4*5+0", "20", 20, "c*b+a"),  # the answer is canonicalised
    ("(1+2)*(3+4)-5;####16", "(1+2)*(3+4)-5", "16", 16, None),
    ("21+2*3;####27", "21+2*3", "27", 27, None),  # an operand above max_operand (20): no form
])
def test_parse_good_proposals(text, question, answer, value, form):
    p = parse_proposal(text, max_question_chars=20, max_operand=20)
    assert p is not None and (p.question, p.answer, p.value, p.form) == (question, answer, value, form)
    assert p.correct == (str(value) == answer)


@pytest.mark.parametrize("text", [
    "", "(13+2)*6;####", "(13+2)*6####90", "(13+2)*6;####90;####90", "(13+2*6;####90", "13+2)*6;####90",
    "13;####13", "-3+4;####1", "03+4;####7", "3+4;####7x", "3++4;####7", "3+4=7;####7", "3+4;##7",
    "3+4;####7;", "3+4;3+4#7;####7", "(1+2)*(3+4)*(5+6)-17+1;####215", ";####7", "3+4;####", "()+1;####1",
    "3+4;####12345678",
])
def test_parse_bad_proposals(text):
    assert parse_proposal(text, max_question_chars=20, max_operand=20) is None


def test_expression_values_and_forms_agree_with_the_arithmetic_task():
    for form in FORMS:
        for a, b, c in [(3, 4, 5), (0, 20, 9), (11, 7, 2)]:
            q = render(form, a, b, c)
            assert evaluate_expression(q) == true_answer(form, a, b, c)
            assert form_of(q, 20) == form
    assert evaluate_expression("2*(3+4)-5") == 9 and evaluate_expression("10-3-2") == 5
    assert evaluate_expression("2*3)") is None and evaluate_expression("__import__('os')") is None
    assert form_of("3+4*1", 20) is None and form_of("3+04*2", 20) is None and form_of("3+4*2", 3) is None


def test_warmup_data_parses_slips_a_share_and_avoids_the_held_out_split():
    task = ArithmeticProposalTask(wrong_fraction=0.3)
    problems = task.warmup_problems(0, 600, seed=0)
    assert problems == task.warmup_problems(0, 600, seed=0)  # a pure function of (step, count, seed)
    wrong = 0
    for p in problems:
        prop = parse_proposal(p.solution, 20, 20)
        assert prop is not None and prop.form == p.meta["form"] and prop.answer == p.answer
        assert prop.correct == (not p.meta["wrong"])
        assert not in_eval_split(prop.question, 0.1) and not in_eval_split(p.prompt[:-1], 0.1)
        assert prop.question + ";" != p.prompt  # a new problem, not the seed
        wrong += p.meta["wrong"]
    assert 0.25 < wrong / len(problems) < 0.35
    assert all(p.meta["wrong"] is False for p in task.train_problems(0, 50, 0))
    # The Synthesizer's cache key depends on its task and the task's parameters.
    keys = {TinySpec().key(), TinySpec(task="arithmetic_proposals").key(),
            TinySpec(task="arithmetic_proposals", task_params={"wrong_fraction": 0.3}).key(),
            TinySpec(task="arithmetic_proposals", task_params={"wrong_fraction": 0.0}).key()}
    assert len(keys) == 4


# -- extend_batch on scripted samples -----------------------------------------------------------

SEED = Problem(prompt="(3+4)*5;", answer="35", meta={"form": "(a+b)*c", "bracketed": True})
# The Synthesizer's four proposals for the seed, and the Reasoner's four answers to each.
PROPOSALS = ["(13+2)*6;13+2=15;15*6=90;####90",  # correct; the Reasoner agrees 3/4 → reliable
             "5*(9+11);9+11=20;5*20=102;####102",  # a slip; the Reasoner says 100 → filtered out
             "(13+2*6;####1",  # not a problem
             "3+4*5;####23"]  # correct; a 2–2 tie with 35 → R_rel 0.5, reliable at tau 0.5
ANSWERS = {"(3+4)*5;": ["35", "35", "23", "35"],
           "(13+2)*6;": ["90", "90", "90", "80"],
           "5*(9+11);": ["100", "100", "100", "102"],
           "3+4*5;": ["23", "35", "23", "35"]}


def script(policy, answers):
    """Make ``policy.sample`` answer each prompt with the scripted final answers (in order)."""
    def sample(prompts, g, max_new, temperature=1.0, generator=None, stop=None, **_):
        ids, mask = policy.encode_prompts(prompts)
        rows = [policy.tokenizer(f"####{a}", add_special_tokens=False)["input_ids"] + [policy.tokenizer.eos_token_id]
                for p in prompts for a in answers[p][:g]]
        return scripted_samples(ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0), rows, policy.tokenizer)
    policy.sample = sample


def scripted_synthesizer(method, texts):
    synth = method.synth

    def sample(prompts, g, max_new, temperature=1.0, generator=None, stop=None, **_):
        ids, mask = synth.encode_prompts(prompts)
        tok = synth.tokenizer
        rows = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
        return scripted_samples(ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0), rows, tok)
    synth.sample = sample


def built_method(tmp_path, **params):
    recipe = mini_recipe(methods=[{"name": "synco", "model": MINI_SYNTH, "group_size": 4, **params}])
    policy = mini_policy()
    scorer = build_scorer(recipe).start()
    method = SynCo(**recipe.methods[0].params)
    method.setup(MethodContext(recipe=recipe, policy=policy, run_dir=tmp_path, log=lambda s: None,
                               learner=lambda params, optim: Learner(params, optim, 4),
                               scorer=scorer, task=build_task(recipe), generator=torch.Generator().manual_seed(0)))
    return recipe, policy, scorer, method


def real_batch(recipe, policy, scorer):
    batch, _ = sample_and_score(policy, scorer, [SEED], recipe, torch.Generator().manual_seed(1), group_offset=0,
                                policy_version=0, watch=Stopwatch())
    return batch


def test_questions_of_the_script_are_training_problems():
    for text in PROPOSALS:
        p = parse_proposal(text, 20, 20)
        assert p is None or not in_eval_split(p.question, 0.1)


def test_extend_batch_appends_exactly_the_reliable_tasks_as_new_groups(tmp_path):
    recipe, policy, scorer, m = built_method(tmp_path, mix=2.0)  # up to 2 synthetic groups per real one
    try:
        script(policy, ANSWERS)
        scripted_synthesizer(m, PROPOSALS)
        batch = real_batch(recipe, policy, scorer)
        assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 1.0]
        out, metrics = m.extend_batch(batch, 0)
    finally:
        scorer.close()
    assert len(out) == 4 + 2 * 4
    assert out.rewards[:4].tolist() == batch.rewards.tolist()
    assert out.rewards[4:].tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]  # 1[â = a_S]
    gids = out.group_ids.tolist()
    assert gids[:4] == [0] * 4 and len(set(gids[4:8])) == 1 and len(set(gids[8:])) == 1
    assert len({gids[0], gids[4], gids[8]}) == 3  # new group ids
    assert set(out.meta) == set(batch.meta)
    assert out.meta["prompt"][4:] == ["(13+2)*6;"] * 4 + ["3+4*5;"] * 4
    assert out.meta["answer"][4:] == ["90"] * 4 + ["23"] * 4
    assert out.meta["meta/form"][4:] == ["(a+b)*c"] * 4 + ["a+b*c"] * 4
    assert out.meta["reward/exact_answer"][4:] == out.rewards[4:].tolist()
    # R_S by hand: R_q = 0.5·1[in form] + 0.5·novelty (vs the seed "(3+4)*5"; the buffer is empty).
    r0 = 0.2 * 1.0 + 0.3 * 0.75 + 0.5 * 4 * 0.75 * 0.25  # novelty 1; p̂ 0.75
    r1 = 0.2 * 1.0 + 0.3 * 0.0 + 0.5 * 4 * 0.25 * 0.75  # a_S not the mode
    r3 = 0.2 * (0.5 + 0.5 * (1 - 1 / 7)) + 0.3 * 0.5 + 0.5 * 1.0  # "3+4" is a 3-gram of the seed
    assert m._pending.rewards.tolist() == pytest.approx([r0, r1, 0.0, r3])
    assert m._pending.group_ids.tolist() == [0, 0, 0, 0]
    assert metrics["synco/valid_fraction"] == 0.75
    assert metrics["synco/reliable_fraction"] == pytest.approx(2 / 3)
    assert metrics["synco/synth_answer_accuracy"] == pytest.approx(2 / 3)
    assert metrics["synco/reliable_answer_accuracy"] == 1.0 and metrics["synco/wrong_rejected_fraction"] == 1.0
    assert metrics["synco/synthetic_groups"] == 2 and metrics["synco/reasoner_rows"] == 12
    # The Reasoner's answers against the true values: 3/4, 3/4 (100 is right), 2/4.
    assert metrics["synco/reasoner_synthetic_accuracy"] == pytest.approx(8 / 12)
    assert m.buffer == ["(13+2)*6", "5*(9+11)", "3+4*5"]


def test_mix_caps_the_synthetic_groups_and_the_buffer_makes_repeats_stale(tmp_path):
    recipe, policy, scorer, m = built_method(tmp_path, mix=1.0)
    try:
        script(policy, ANSWERS)
        scripted_synthesizer(m, PROPOSALS)
        batch = real_batch(recipe, policy, scorer)
        out, metrics = m.extend_batch(batch, 0)
        # One real group, mix 1: the first reliable task only.
        assert len(out) == 8 and out.meta["prompt"][4:] == ["(13+2)*6;"] * 4 and metrics["synco/synthetic_groups"] == 1
        m.after_update(out, 0)
        m.mix = None
        out, _ = m.extend_batch(real_batch(recipe, policy, scorer), 1)
        assert len(out) == 12
    finally:
        scorer.close()
    # The same proposals again: every one is now an exact duplicate (novelty 0).
    r0 = 0.2 * 0.5 + 0.3 * 0.75 + 0.5 * 0.75
    assert m._pending.rewards[0].item() == pytest.approx(r0)


def test_synthesizer_update_moves_only_the_synthesizer(tmp_path):
    recipe, policy, scorer, m = built_method(tmp_path)
    try:
        script(policy, ANSWERS)
        scripted_synthesizer(m, PROPOSALS)
        out, _ = m.extend_batch(real_batch(recipe, policy, scorer), 0)
    finally:
        scorer.close()
    before_policy = {k: v.clone() for k, v in policy.model.state_dict().items()}
    before_synth = {k: v.clone() for k, v in m.synth.model.state_dict().items()}
    metrics = m.after_update(out, 0)
    assert metrics["synco/synth_skipped"] == 0.0 and metrics["synco/synth_grad_norm"] > 0
    assert all(torch.equal(v, policy.model.state_dict()[k]) for k, v in before_policy.items())
    assert any(not torch.equal(v, m.synth.model.state_dict()[k]) for k, v in before_synth.items())
    assert m.after_update(out, 0) == {}  # one update per round
    state = m.state_dict()
    assert set(state) >= {"synthesizer", "optimizer", "buffer"}


def test_recipe_checks():
    with pytest.raises(ConfigError, match="arithmetic"):
        mini_recipe(task={"name": "gsm8k"}, methods=[{"name": "synco"}])
    with pytest.raises(ConfigError, match="weights"):
        mini_recipe(methods=[{"name": "synco", "weights": [0.5, 0.5]}])
    with pytest.raises(ConfigError, match="sync"):
        mini_recipe(rollout={"source": "async"}, methods=[{"name": "synco"}])


# -- in the Trainer -----------------------------------------------------------------------------

RUN = {"methods": [{"name": "synco", "model": MINI_SYNTH, "group_size": 4, "tau_rel": 0.0, "max_new_tokens": 24}],
       "train": {"steps": 3, "prompts_per_step": 2, "checkpoint_every": 1, "micro_batch_size": 8,
                 "threads": 1},
       "eval": {"size": 8}}


def lenient(text, max_question_chars=20, max_operand=None):
    """A stand-in parser for the untrained mini Synthesizer, whose samples never parse: any
    sample with three digits is read as the problem ``d0+d1*c`` (c = d2 in 2..9), its answer
    right when the sample has an even length. The run then has valid proposals of varied R_S
    (novelty, form), synthetic groups and Synthesizer updates, all depending on the samples."""
    digits = [ch for ch in text if ch.isdigit()]
    if len(digits) < 3:
        return None
    q = f"{digits[0]}+{digits[1]}*{max(2, int(digits[2]))}"
    value = evaluate_expression(q)
    return parse_proposal(f"{q};####{value + len(text) % 2}", max_question_chars, max_operand)


def test_short_run_logs_the_method_and_trains_on_more_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(synco_method, "parse_proposal", lenient)
    summary = Trainer(mini_recipe(**RUN), tmp_path / "run", log=lambda m: None).run()
    rows = read_metrics(tmp_path / "run")
    steps = [r for r in rows if "synco/proposals" in r]
    assert len(steps) == 3 and summary["steps"] == 3
    for r in steps:
        assert r["synco/proposals"] == 4 and 0.0 <= r["synco/valid_fraction"] <= 1.0
        assert r["train/rows"] == 2 * 4 + r["synco/synthetic_rows"]
        assert "synco/synth_lr" in r
    assert sum(r["synco/synthetic_groups"] for r in steps) > 0  # the path is exercised
    assert any(r["synco/synth_skipped"] == 0.0 for r in steps)


def test_exact_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(synco_method, "parse_proposal", lenient)
    rows = straight_and_resumed(mini_recipe(**RUN), tmp_path, monkeypatch)
    assert any(r.get("synco/synth_skipped") == 0.0 for r in rows)  # the Synthesizer learned on the way
