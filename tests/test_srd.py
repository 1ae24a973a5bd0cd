"""SRD (self-retrospection distillation): the hindsight and the views by hand, the foresight
JSD by hand, the key property (a signal on reward-uniform groups, none when the views agree),
template errors, and the ``srd`` method in the Trainer (split invariance, exact resume,
coef 0 is GRPO bit for bit)."""

import math

import pytest
import torch

from reasonrl.methods.srd.maths import (fit_hindsight, foresight_jsd, hindsight, per_foresight_mean, render_student,
                                render_teacher, uniform_groups)
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.hooks import MethodContext
from reasonrl.methods.srd.method import FORESIGHT_MASK, STUDENT_IDS, STUDENT_MASK, TEACHER_IDS, TEACHER_MASK, \
    SelfRetrospectionDistillation
from reasonrl.metrics_log import read_metrics
from reasonrl.train.objective import TermInputs
from reasonrl.train.trainer import Trainer

from helpers import mini_policy, mini_recipe, straight_and_resumed

# -- pure pieces by hand ------------------------------------------------------------------------


def test_hindsight_splits_knowledge_and_pitfalls_in_order_without_duplicates():
    completions = ["3+4=7;####7", "3*4=12;####12", "3+4=7;####7", "3-4=1;####1", "4+3=7;####7"]
    rewards = [1.0, 0.0, 1.0, 0.0, 1.0]
    k, p = hindsight(completions, rewards, 0.5, num_knowledge=2, num_pitfalls=1)
    assert k == ["3+4=7;####7", "4+3=7;####7"]  # the duplicate success is skipped
    assert p == ["3*4=12;####12"]  # only the first failure: num_pitfalls = 1
    # An all-failure group (GRPO's zero-advantage case) still has pitfalls to reflect on.
    assert hindsight(completions[1:2] * 3, [0.0] * 3, 0.5, 2, 2) == ([], ["3*4=12;####12"])


def test_views_by_hand_gold_answer_and_trajectories_only_in_the_teacher_view():
    t = render_teacher("{knowledge}{pitfalls}####{answer};{prompt}", "+#{completion}", "-#{completion}",
                       "(3+4)*5;", "35", ["3+4=7;7*5=35;####35"], ["4*5=20;3+20=23;####23"])
    assert t == "+#3+4=7;7*5=35;####35-#4*5=20;3+20=23;####23####35;(3+4)*5;"
    s = render_student("{prompt}", "(3+4)*5;")
    assert s == "(3+4)*5;" and "35" not in s and "#" not in s


def test_fit_hindsight_keeps_the_longest_interleaved_prefix():
    k, p = ["k1", "k2"], ["p1"]

    def fits_up_to(n):
        return lambda kk, pp: len(kk) + len(pp) <= n

    assert fit_hindsight(k, p, fits_up_to(3)) == (["k1", "k2"], ["p1"])
    assert fit_hindsight(k, p, fits_up_to(2)) == (["k1"], ["p1"])  # k1, p1 before k2
    assert fit_hindsight(k, p, fits_up_to(1)) == (["k1"], [])
    assert fit_hindsight(k, p, fits_up_to(0)) == ([], [])  # y* and x only
    assert fit_hindsight(k, p, lambda kk, pp: False) is None  # not even the bare context


def test_uniform_groups():
    got = uniform_groups(torch.tensor([1., 1., 0., 1., 0., 0.]), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert got == {0: True, 1: False, 2: True}


S, T = [0.5, 0.5], [0.8, 0.2]  # student, teacher next-token distributions
M = [0.65, 0.35]  # the β = 0.5 mixture
JSD = 0.5 * (0.8 * math.log(0.8 / M[0]) + 0.2 * math.log(0.2 / M[1])) \
    + 0.5 * (0.5 * math.log(0.5 / M[0]) + 0.5 * math.log(0.5 / M[1]))  # 0.050672


def test_foresight_jsd_and_per_foresight_mean_by_hand():
    s = torch.tensor([S, S], dtype=torch.float64).log().view(1, 2, 2).repeat(2, 1, 1)
    t = torch.tensor([T, S], dtype=torch.float64).log().view(1, 2, 2).repeat(2, 1, 1)
    jsd = foresight_jsd(s, t, beta=0.5)
    assert jsd[0].tolist() == pytest.approx([JSD, 0.0], abs=1e-12)
    # Foresight 0 has both tokens, foresight 1 only the first: means JSD/2 and JSD.
    mask = torch.tensor([[1, 1], [1, 0]])
    assert per_foresight_mean(jsd, mask).tolist() == pytest.approx([JSD / 2, JSD], abs=1e-12)
    # The teacher side gets no gradient.
    tz = t.clone().requires_grad_(True)
    sz = s.clone().requires_grad_(True)
    foresight_jsd(sz, tz).sum().backward()
    assert tz.grad is None and sz.grad.abs().sum() > 0


# -- the loss term on a hand-built batch ----------------------------------------------------------


def group_batch(policy, prompt, answer, completions, rewards, group_id=0):
    tok = policy.tokenizer
    n = len(completions)
    p_ids, p_mask = policy.encode_prompts([prompt] * n)
    rows = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    width = max(map(len, rows))
    c_ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    c_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return RolloutBatch(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids, completion_mask=c_mask,
                        group_ids=torch.full((n,), group_id), rewards=torch.tensor(rewards),
                        truncated=torch.zeros(n, dtype=torch.bool),
                        meta={"prompt": [prompt] * n, "completion": list(completions), "answer": [answer] * n})


def srd_method(tmp_path, **params):
    m = SelfRetrospectionDistillation(**params)
    m.setup(MethodContext(recipe=mini_recipe(), policy=mini_policy(), run_dir=tmp_path, log=lambda s: None))
    return m


def term(method, micro, mini):
    inputs = TermInputs(micro=micro, mini=mini, logits=torch.zeros(1), logprobs=None, mask=None,
                        temperature=1.0, agg={})
    return method.loss_term(inputs)[0]


def two_groups(policy):
    all_fail = group_batch(policy, "(3+4)*5;", "35", ["4*5=20;3+20=23;####23"] * 4, [0.0] * 4, 0)
    all_pass = group_batch(policy, "(1+2)*3;", "9", ["1+2=3;3*3=9;####9", "1+2=3;####9"] * 2, [1.0] * 4, 1)
    return RolloutBatch.concat([all_fail, all_pass], pad_id=policy.tokenizer.pad_token_id)


def test_the_views_in_the_batch_gold_answer_never_in_the_student_view(tmp_path):
    m = srd_method(tmp_path)
    batch = two_groups(m.policy)
    metrics = m.annotate(batch, 0)
    assert metrics["srd/groups"] == 2 and metrics["srd/uniform_group_fraction"] == 1.0
    tok = m.policy.tokenizer
    carriers = torch.nonzero(batch.aux[FORESIGHT_MASK].sum(-1) > 0).squeeze(-1).tolist()
    assert carriers == [0, 4]  # each group's first row; every other row carries nothing

    def text(ids, mask, i):
        return tok.decode(ids[i][mask[i].bool()], skip_special_tokens=True)

    assert text(batch.aux[TEACHER_IDS], batch.aux[TEACHER_MASK], 0) == "-#4*5=20;3+20=23;####23####35;(3+4)*5;"
    assert text(batch.aux[TEACHER_IDS], batch.aux[TEACHER_MASK], 4) == "+#1+2=3;3*3=9;####9####9;(1+2)*3;"
    for i, prompt in ((0, "(3+4)*5;"), (4, "(1+2)*3;")):
        assert text(batch.aux[STUDENT_IDS], batch.aux[STUDENT_MASK], i) == prompt  # the task only
    assert metrics["srd/knowledge"] == 0.5 and metrics["srd/pitfalls"] == 0.5


def test_loss_is_positive_with_a_gradient_on_reward_uniform_groups(tmp_path):
    """Both groups have uniform rewards (GRPO's advantage is 0 there); L_SRD still pulls."""
    m = srd_method(tmp_path, coef=1.0)
    batch = two_groups(m.policy)
    m.annotate(batch, 0)
    m.policy.model.zero_grad()
    loss = term(m, batch, batch)
    loss.backward()
    assert loss.item() > 1e-5  # small: the mini model is nearly untrained, so the views differ little
    grad = sum(float(p.grad.abs().sum()) for p in m.policy.parameters() if p.grad is not None)
    assert grad > 1e-4
    # The term is the sum over micro-batches with the mini-batch's foresight count: any split.
    halves = sum(term(m, part, batch).item() for part in batch.split(3))
    # (float32 rounding of a small JSD computed from O(0.1) terms: absolute, not relative, tolerance)
    assert halves == pytest.approx(loss.item(), abs=1e-7)
    assert m.after_update(batch, 0)["srd/jsd"] > 0


def test_loss_is_zero_when_the_two_views_are_identical(tmp_path):
    m = srd_method(tmp_path, teacher_template="{prompt}", coef=1.0)
    batch = two_groups(m.policy)
    m.annotate(batch, 0)
    m.policy.model.zero_grad()
    loss = term(m, batch, batch)
    loss.backward()
    assert abs(loss.item()) < 1e-7
    grads = [p.grad for p in m.policy.parameters() if p.grad is not None]
    assert grads, "the backward pass reached no parameter"
    assert all(float(g.abs().max()) < 1e-7 for g in grads)


def test_context_budget_drops_trajectories_then_skips(tmp_path):
    # Bare teacher view "####35;(3+4)*5;" is 15 tokens; with one pitfall (23 + 2) it is 40.
    m = srd_method(tmp_path, max_context=15 + 16 + 5)
    batch = two_groups(m.policy)
    metrics = m.annotate(batch, 0)
    assert metrics["srd/pitfalls"] == 0 and metrics["srd/knowledge"] == 0 and metrics["srd/groups"] == 2
    metrics = srd_method(tmp_path, max_context=10).annotate(batch, 0)
    assert metrics["srd/groups"] == 0 and metrics["srd/skipped_groups"] == 2
    assert term(m, batch, batch).item() == 0.0  # no foresight rows: nothing to add


def test_max_groups_and_uniform_only(tmp_path):
    policy = mini_policy()
    mixed = group_batch(policy, "(2+2)*2;", "8", ["2+2=4;4*2=8;####8", "2*2=4;####6"] * 2, [1., 0., 1., 0.], 2)
    batch = RolloutBatch.concat([mixed, two_groups(policy)], pad_id=policy.tokenizer.pad_token_id)
    metrics = srd_method(tmp_path, groups="uniform").annotate(batch, 0)
    assert metrics["srd/groups"] == 2 and metrics["srd/uniform_distilled_fraction"] == 1.0
    assert metrics["srd/uniform_group_fraction"] == pytest.approx(2 / 3)
    metrics = srd_method(tmp_path, max_groups=1).annotate(batch, 0)
    assert metrics["srd/groups"] == 1 and metrics["srd/knowledge"] == 1 and metrics["srd/pitfalls"] == 1


# -- template errors --------------------------------------------------------------------------------


def test_bad_templates_fail_clearly():
    with pytest.raises(ConfigError, match="student_template.*only \\{prompt\\}"):
        mini_recipe(methods=[{"name": "srd", "student_template": "####{answer};{prompt}"}])
    with pytest.raises(ConfigError, match="teacher_template.*unknown placeholders \\['gold'\\]"):
        mini_recipe(methods=[{"name": "srd", "teacher_template": "{gold}{prompt}"}])
    with pytest.raises(ConfigError, match="knowledge_item.*needs \\{completion\\}"):
        mini_recipe(methods=[{"name": "srd", "knowledge_item": "+#"}])
    with pytest.raises(ConfigError, match="beta"):
        mini_recipe(methods=[{"name": "srd", "beta": 1.5}])


def test_a_template_the_tokenizer_cannot_encode_fails_at_setup(tmp_path):
    r = mini_recipe(methods=[{"name": "srd", "teacher_template": "Answer: {answer}\n{prompt}"}], eval={"size": 0})
    with pytest.raises(ConfigError, match=r"teacher_template .*does not know: .*'A'"):
        Trainer(r, tmp_path / "run", log=lambda m: None).run()
    assert not (tmp_path / "run").exists()  # it fails before the run folder exists


# -- the method in the Trainer ------------------------------------------------------------------


def final_weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final_model" / "model.safetensors"))


def test_coef_zero_is_grpo_exactly_and_a_positive_coef_changes_the_update(tmp_path):
    common = {"train": {"steps": 2}, "eval": {"size": 0}}
    Trainer(mini_recipe(**common), tmp_path / "grpo", log=lambda m: None).run()
    for name, coef in (("zero", 0.0), ("srd", 1.0)):
        Trainer(mini_recipe(methods=[{"name": "srd", "coef": coef}], **common), tmp_path / name,
                log=lambda m: None).run()
    grpo, zero, srd = (final_weights(tmp_path / d) for d in ("grpo", "zero", "srd"))
    assert all(torch.equal(grpo[k], zero[k]) for k in grpo)
    assert any(not torch.equal(grpo[k], srd[k]) for k in grpo)
    rows = [r for r in read_metrics(tmp_path / "srd") if "loss" in r]
    assert len(rows) == 2 and all(r["srd/jsd"] > 0 and r["srd/groups"] == 4 for r in rows)
    assert all(0 < r["srd/foresight_len"] <= 16 for r in rows)


def test_the_term_does_not_depend_on_the_micro_batch_split(tmp_path):
    weights = {}
    for mb in (16, 4):
        r = mini_recipe(methods=[{"name": "srd", "coef": 1.0}], train={"steps": 1, "micro_batch_size": mb},
                        eval={"size": 0})
        Trainer(r, tmp_path / str(mb), log=lambda m: None).run()
        weights[mb] = final_weights(tmp_path / str(mb))
    assert all(torch.allclose(weights[16][k], weights[4][k], atol=1e-6) for k in weights[16])


def test_srd_resumes_exactly(tmp_path, monkeypatch):
    # checkpoint_every 1: straight_and_resumed crashes at a random step in [1, steps), and with
    # the helper's default of 2 a crash at step 1 leaves no checkpoint to resume from.
    r = mini_recipe(methods=[{"name": "srd", "coef": 1.0, "max_groups": 3}],
                    train={"steps": 4, "checkpoint_every": 1}, eval={"size": 0})
    rows = straight_and_resumed(r, tmp_path, monkeypatch)
    assert sum("srd/jsd" in row for row in rows) == 4
