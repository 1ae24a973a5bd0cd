"""Residual Advantage (RA) and CoRA: the pure maths, the teacher, the recipes, one run."""

import math

import pytest
import torch

from reasonrl.algos.advantages import grpo_advantages, reinforce_pp_advantages
from reasonrl.algos.masked import masked_mean
from reasonrl.methods.residual.advantage import (
    center_per_response,
    residual,
    residual_advantages,
    residual_reward,
    residual_state_value,
    residual_state_value_topk,
    residual_statistics,
)
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError, LoraConfig, ModelConfig, TeacherConfig, load_recipe
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.policy.hf import HFPolicy, position_ids_from_mask
from reasonrl.policy.tiny import TinySpec, new_tiny_model
from reasonrl.metrics_log import read_metrics
from reasonrl.methods.residual.teacher import Teacher
from reasonrl.policy.teacher import check_shared_vocabulary
from reasonrl.train.trainer import Trainer, outcome_token_rewards

from helpers import MINI_TINY, RECIPES, mini_policy, mini_recipe


# Three next-token distributions over a vocabulary of 3, used at positions t = 0, 1, 2.
PS = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3], [0.1, 0.1, 0.8]])
PT = torch.tensor([[0.2, 0.6, 0.2], [0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
# Row 0 samples tokens 1, 0, 2 (3 valid tokens); row 1 samples 0, 0 and is then padding.
TOKENS = torch.tensor([[1, 0, 2], [0, 0, 0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# t=0: Σ pS pT = .1+.18+.04 = .32, Σ pS² = .25+.09+.04 = .38 → V = −.06
# t=1: Σ pS pT = 1/3 = Σ pS² → V = 0;  t=2: identical distributions → V = 0
V_EXPECTED = torch.tensor([[-0.06, 0.0, 0.0], [-0.06, 0.0, 0.0]])
# row 0: r = [.6−.3, .5−1/3, .8−.8] = [.3, 1/6, 0] → δ = [.36, 1/6, 0]
# row 1: r = [.2−.5, 1/6]              = [−.3, 1/6] → δ = [−.24, 1/6]
DELTA = torch.tensor([[0.36, 1 / 6, 0.0], [-0.24, 1 / 6, 0.0]])
# row 0 mean (.36 + 1/6)/3 = .175556 → δ̃ = [.184444, −.008889, −.175556]
# row 1 mean (−.24 + 1/6)/2 = −.036667 → δ̃ = [−.203333, .203333, 0]
CENTRED = torch.tensor([[0.36 - 0.5266667 / 3, 1 / 6 - 0.5266667 / 3, -0.5266667 / 3],
                        [-0.2033333, 0.2033333, 0.0]])


def statistics(**kw):
    logits = torch.log(torch.stack([PS, PS])), torch.log(torch.stack([PT, PT]))
    return residual_statistics(*logits, TOKENS, MASK, **kw)


# --- the pure maths ----------------------------------------------------------------

def test_reward_value_delta_and_centring_by_hand():
    stats = statistics()
    torch.testing.assert_close(stats["student_value"], V_EXPECTED * MASK)
    r = residual_reward(stats["teacher_token_prob"], stats["student_token_prob"])
    torch.testing.assert_close(r, torch.tensor([[0.3, 1 / 6, 0.0], [-0.3, 1 / 6, 0.0]]))
    delta = (r - stats["student_value"]) * MASK
    torch.testing.assert_close(delta, DELTA)
    torch.testing.assert_close(center_per_response(delta, MASK), CENTRED, atol=1e-6, rtol=0)


def test_state_value_full_and_top_k_union():
    ps, pt = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    # full: .5(−.3) + .3(.2) + .2(.1) = −.07
    assert float(residual_state_value(ps, pt)) == pytest.approx(-0.07)
    # k=1: top1(S) = {0}, top1(T) = {1}; union {0,1}: .5(−.3) + .3(.2) = −.09
    assert float(residual_state_value_topk(ps, pt, 1)) == pytest.approx(-0.09)
    # k=2: {0,1} ∪ {1,2} = everything → the full value
    assert float(residual_state_value_topk(ps, pt, 2)) == pytest.approx(-0.07)
    # t=0 of the module example: the union {0,1} drops token 2, where pT − pS = 0; t=2: identical
    # distributions, 0 either way (t=1, a uniform student, has ties and is left out).
    stats = statistics(top_k=1)
    torch.testing.assert_close(stats["student_value"][:, [0, 2]], (V_EXPECTED * MASK)[:, [0, 2]])
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        residual_state_value_topk(ps, pt, 0)


def test_residual_delta_has_zero_mean_under_the_student_by_enumeration():
    g = torch.Generator().manual_seed(0)
    vocab = 7
    s_logits, t_logits = torch.randn(vocab, generator=g) * 2, torch.randn(vocab, generator=g) * 2
    # Row a scores token a: enumerate every action the student could take at one state.
    tokens = torch.arange(vocab).unsqueeze(-1)
    stats = residual_statistics(s_logits.expand(vocab, 1, vocab), t_logits.expand(vocab, 1, vocab),
                                tokens, torch.ones(vocab, 1))
    delta = (stats["teacher_token_prob"] - stats["student_token_prob"] - stats["student_value"]).squeeze(-1)
    ps = torch.softmax(s_logits, -1)
    assert float((ps * delta).sum()) == pytest.approx(0.0, abs=1e-7)
    assert float(delta.abs().max()) > 0.05  # and it is not trivially zero


def test_final_advantage_by_hand_and_clip():
    rewards = torch.tensor([1.0, 0.0])
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]) * rewards.unsqueeze(-1)
    ver = grpo_advantages(token_rewards, MASK, torch.tensor([0, 0]))
    # scores [1, 0]: mean .5, unbiased std √.5 → A = ±.5/(.707107 + 1e-6) = ±.707106
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(ver, torch.tensor([[a, a, a], [-a, -a, 0.0]]))
    stats = statistics()
    adv = residual_advantages(ver, stats["teacher_token_prob"], stats["student_token_prob"], stats["student_value"],
                              MASK, lam=0.5)
    torch.testing.assert_close(adv, ver + 0.5 * CENTRED * MASK, atol=1e-6, rtol=0)
    # row 0 token 0: .707106 + .5·.184444 = .799328
    assert float(adv[0, 0]) == pytest.approx(0.799328, abs=1e-5)
    clipped = residual_advantages(ver, stats["teacher_token_prob"], stats["student_token_prob"],
                                  stats["student_value"], MASK, lam=0.5, clip=0.1)
    # δ̃ clipped to ±.1: row 0 → [.1, −.008889, −.1], row 1 → [−.1, .1]
    torch.testing.assert_close(clipped, ver + 0.5 * torch.tensor([[0.1, -0.0088889, -0.1], [-0.1, 0.1, 0.0]]),
                               atol=1e-6, rtol=0)


def random_inputs(seed, b=6, t=9, vocab=5):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).long()
    tokens = torch.randint(0, vocab, (b, t), generator=g)
    stats = residual_statistics(torch.randn(b, t, vocab, generator=g), torch.randn(b, t, vocab, generator=g),
                                tokens, mask)
    rewards = torch.randint(0, 2, (b,), generator=g).float()
    last = (mask.cumsum(-1) == lengths.unsqueeze(-1)) & mask.bool()
    return rewards.unsqueeze(-1) * last.float(), mask, torch.arange(b) // 3, stats


@pytest.mark.parametrize("base", [grpo_advantages, reinforce_pp_advantages])
def test_each_response_keeps_its_mean_verifier_advantage(base):
    token_rewards, mask, groups, stats = random_inputs(1)
    ver = base(token_rewards, mask, groups)
    adv = residual_advantages(ver, stats["teacher_token_prob"], stats["student_token_prob"], stats["student_value"],
                              mask, lam=0.8)
    torch.testing.assert_close(masked_mean(adv, mask, dim=-1), masked_mean(ver, mask, dim=-1), atol=1e-6, rtol=0)
    assert float((adv - ver).abs().max()) > 1e-3  # the residual term did move credit between tokens
    assert torch.all(adv[mask == 0] == 0)


def aux_batch(token_rewards, mask, groups, stats):
    n, t = mask.shape
    batch = RolloutBatch(prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.long),
                         completion_ids=torch.zeros(n, t, dtype=torch.long), completion_mask=mask, group_ids=groups,
                         rewards=token_rewards.sum(-1), truncated=torch.zeros(n, dtype=torch.bool))
    batch.aux.update(stats)
    return batch


def test_registered_adapter_lambda_zero_is_the_base_exactly_and_stores_the_verifier_advantage():
    token_rewards, mask, groups, stats = random_inputs(2)
    batch = aux_batch(token_rewards, mask, groups, stats)
    for base, params, ref in [("grpo", {"scale": "none"}, grpo_advantages(token_rewards, mask, groups, scale="none")),
                              ("reinforce_pp", None, reinforce_pp_advantages(token_rewards, mask, groups))]:
        out = residual(token_rewards, mask, groups, batch=batch, base=base, lam=0.0, base_params=params)
        assert torch.equal(out, ref)
        assert torch.equal(batch.aux["verifier_advantage"], ref)
    out = residual(token_rewards, mask, groups, batch=batch, lam=0.5)
    expected = residual_advantages(grpo_advantages(token_rewards, mask, groups), stats["teacher_token_prob"],
                                   stats["student_token_prob"], stats["student_value"], mask, lam=0.5)
    assert torch.equal(out, expected)


def test_adapter_errors_are_clear():
    token_rewards, mask, groups, stats = random_inputs(3)
    bare = aux_batch(token_rewards, mask, groups, {})
    with pytest.raises(ValueError, match="needs a `teacher:` section in the recipe"):
        residual(token_rewards, mask, groups, batch=bare)
    batch = aux_batch(token_rewards, mask, groups, stats)
    with pytest.raises(ValueError, match="advantage.base: unknown advantage estimator 'gpro'.*Did you mean 'grpo'"):
        residual(token_rewards, mask, groups, batch=batch, base="gpro")
    with pytest.raises(ValueError, match="not 'residual'"):
        residual(token_rewards, mask, groups, batch=batch, base="residual")
    with pytest.raises(ValueError, match="advantage.base_params.gamma.*allowed: scale, eps"):
        residual(token_rewards, mask, groups, batch=batch, base_params={"gamma": 0.9})
    with pytest.raises(ValueError, match="advantage.lam must be a finite number"):
        residual(token_rewards, mask, groups, batch=batch, lam=float("nan"))
    with pytest.raises(ValueError, match="advantage.clip must be a number > 0"):
        residual(token_rewards, mask, groups, batch=batch, clip=0.0)


# --- config and recipes -------------------------------------------------------------

def test_teacher_config_checks():
    with pytest.raises(ConfigError, match="'teacher.update: true' \\(CoRA\\) needs 'teacher.lora'"):
        mini_recipe(teacher={"update": True})
    with pytest.raises(ConfigError, match="only trained with 'teacher.update: true'"):
        mini_recipe(teacher={"lora": {"r": 4}})
    with pytest.raises(ConfigError, match="unknown key 'teacher.model.tiny.warmup_step'.*Did you mean 'warmup_steps'"):
        mini_recipe(teacher={"model": {"tiny": {"warmup_step": 5}}})
    with pytest.raises(ConfigError, match="teacher.lr"):
        mini_recipe(teacher={"lr": 0})


def test_shipped_recipes():
    grpo = load_recipe(RECIPES / "grpo.yaml")
    ra, cora = load_recipe(RECIPES / "residual_advantage.yaml"), load_recipe(RECIPES / "cora.yaml")
    for r in (ra, cora):
        assert r.advantage.name == "residual" and r.advantage.params == {"base": "grpo", "lam": 0.5}
        assert r.teacher.model.tiny == {"warmup_steps": 1500, "careless_fraction": 0.0}
        # The same budget as the GRPO baseline: only the advantage and the teacher differ.
        assert (r.train, r.rollout, r.loss, r.optim, r.model, r.eval) == \
            (grpo.train, grpo.rollout, grpo.loss, grpo.optim, grpo.model, grpo.eval)
    assert not ra.teacher.update and ra.teacher.lora is None
    assert cora.teacher.update and cora.teacher.lora is not None


# --- the teacher ----------------------------------------------------------------------

TEACHER_MODEL = ModelConfig(backend="tiny", tiny={**MINI_TINY, "seed": 1})


def sampled_batch(student, n_prompts=3, g=4, seed=0):
    prompts = ["(3+4)*5;", "12-7;", "2*(6+1);"][:n_prompts]
    s = student.sample(prompts, g, 10, generator=torch.Generator().manual_seed(seed))
    rewards = torch.tensor([1.0, 0.0] * (len(prompts) * g // 2))
    batch = RolloutBatch(prompt_ids=s.prompt_ids, prompt_mask=s.prompt_mask, completion_ids=s.completion_ids,
                         completion_mask=s.completion_mask, group_ids=torch.arange(len(prompts)).repeat_interleave(g),
                         rewards=rewards, truncated=s.truncated, sample_logprobs=s.sample_logprobs)
    batch.token_rewards = outcome_token_rewards(batch)
    return batch


def direct_statistics(policy, batch):
    """Full-sequence forward, logits at every position, then the formulas written out."""
    ids, mask = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        logits = policy.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    p = batch.prompt_ids.shape[1]
    return torch.softmax(logits[:, p - 1:-1].float(), -1)


def test_annotate_matches_a_direct_full_forward():
    student = mini_policy(seed=0)
    teacher = Teacher(TeacherConfig(model=TEACHER_MODEL, micro_batch_size=5), student)
    batch = sampled_batch(student)
    metrics = teacher.annotate(batch, student)
    ps, pt = direct_statistics(student, batch), direct_statistics(teacher.policy, batch)
    n, t = batch.completion_ids.shape
    mask = batch.completion_mask
    assert 0 < int(mask.sum()) < n * t, "the batch needs both completion tokens and padding for both checks to bite"
    for i in range(n):
        for j in range(t):
            if not mask[i, j]:
                assert batch.aux["student_value"][i, j] == 0 and batch.aux["teacher_token_prob"][i, j] == 0
                continue
            y = batch.completion_ids[i, j]
            value = sum(float(ps[i, j, a] * pt[i, j, a] - ps[i, j, a] ** 2) for a in range(ps.shape[-1]))
            assert float(batch.aux["teacher_token_prob"][i, j]) == pytest.approx(float(pt[i, j, y]), abs=1e-5)
            assert float(batch.aux["student_token_prob"][i, j]) == pytest.approx(float(ps[i, j, y]), abs=1e-5)
            assert float(batch.aux["student_value"][i, j]) == pytest.approx(value, abs=1e-5)
    assert all(v.dtype == torch.float32 and v.shape == (n, t) for v in batch.aux.values())
    # The student's probabilities are those it sampled with (temperature 1).
    torch.testing.assert_close(batch.aux["student_token_prob"], batch.sample_logprobs.exp() * mask, atol=1e-5, rtol=0)
    assert metrics["teacher/abs_delta"] > 0


def test_vocabulary_mismatch_is_a_clear_error():
    check_shared_vocabulary(build_char_tokenizer(), build_char_tokenizer())
    with pytest.raises(ValueError, match="share one tokenizer vocabulary.*'x'"):
        check_shared_vocabulary(build_char_tokenizer(), build_char_tokenizer("0123456789+-*()=;#x"))
    other = build_char_tokenizer("9876543210+-*()=;#")
    student = HFPolicy(new_tiny_model(TinySpec(**MINI_TINY), len(other), other.pad_token_id, other.bos_token_id,
                                      other.eos_token_id), other)
    with pytest.raises(ValueError, match="student id .*, teacher id"):
        Teacher(TeacherConfig(model=TEACHER_MODEL), student)


def cora_teacher(student, **kw):
    cfg = TeacherConfig(model=TEACHER_MODEL, lora=LoraConfig(r=4, alpha=8), update=True, **kw)
    return Teacher(cfg, student)


def test_cora_update_changes_only_the_adapter_and_the_next_annotation():
    student = mini_policy(seed=0)
    teacher = cora_teacher(student, lr=1e-2)
    batch = sampled_batch(student)
    teacher.annotate(batch, student)
    before_probs = batch.aux["teacher_token_prob"].clone()
    residual(batch.token_rewards, batch.completion_mask, batch.group_ids, batch=batch)
    before = {k: v.detach().clone() for k, v in teacher.policy.model.named_parameters()}
    metrics = teacher.update(batch)
    after = dict(teacher.policy.model.named_parameters())
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    assert metrics["teacher/loss"] == pytest.approx(
        float(-(batch.aux["verifier_advantage"] * torch.log(before_probs.clamp_min(1e-30))).sum()
              / batch.completion_mask.sum()), rel=1e-4)
    teacher.annotate(batch, student)
    assert not torch.allclose(batch.aux["teacher_token_prob"], before_probs)
    # The step moved the teacher towards the verifier: L_T on the same rollouts went down.
    logp_after = torch.log(batch.aux["teacher_token_prob"].clamp_min(1e-30))
    loss_after = float(-(batch.aux["verifier_advantage"] * logp_after).sum() / batch.completion_mask.sum())
    assert loss_after < metrics["teacher/loss"]


def test_cora_clip_acts_from_the_second_epoch_and_state_round_trips():
    student = mini_policy(seed=0)
    batch = sampled_batch(student)
    one = cora_teacher(student, lr=5e-2, clip=0.01)
    one.annotate(batch, student)
    residual(batch.token_rewards, batch.completion_mask, batch.group_ids, batch=batch)
    assert one.update(batch)["teacher/clip_fraction"] == 0.0  # ratio 1 on the first step
    several = cora_teacher(student, lr=5e-2, clip=0.01, epochs=3)
    assert several.update(batch)["teacher/clip_fraction"] > 0
    fresh = cora_teacher(student)
    fresh.load_state_dict(several.state_dict())
    a, b = dict(fresh.policy.model.named_parameters()), dict(several.policy.model.named_parameters())
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(RuntimeError, match="teacher.update: true"):
        Teacher(TeacherConfig(model=TEACHER_MODEL), student).update(batch)


# --- one run, wired as the Trainer will be -------------------------------------------

def wire_teacher(monkeypatch):
    """The lines the Trainer needs (see docs/methods/residual_advantage.md), patched in."""
    setup, prepare, optimise = Trainer._setup, Trainer._prepare_advantages, Trainer._optimise

    def _setup(self):
        setup(self)
        r = self.recipe
        self.teacher = Teacher(r.teacher, self.policy, log=self.log) if r.teacher is not None else None

    def _prepare_advantages(self, batch, step):
        self.teacher_metrics = {}
        if self.teacher is not None:
            self.teacher_metrics = self.teacher.annotate(batch, self.policy, self.recipe.rollout.temperature)
        prepare(self, batch, step)

    def _optimise(self, batch, watch):
        out = optimise(self, batch, watch)
        r = self.recipe
        if self.teacher is not None and r.teacher.update:
            out.update(self.teacher.update(batch, r.rollout.temperature, r.train.share_prompt))
        out.update(self.teacher_metrics)
        return out

    monkeypatch.setattr(Trainer, "_setup", _setup)
    monkeypatch.setattr(Trainer, "_prepare_advantages", _prepare_advantages)
    monkeypatch.setattr(Trainer, "_optimise", _optimise)


def final_weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final_model" / "model.safetensors"))


def test_cora_end_to_end_and_lambda_zero_trains_like_grpo(tmp_path, monkeypatch):
    wire_teacher(monkeypatch)
    teacher = {"model": {"backend": "tiny", "tiny": {**MINI_TINY, "seed": 1}}}
    # A length reward varies within groups even for the untrained mini model, so GRPO has signal.
    common = {"train": {"steps": 2}, "eval": {"size": 0},
              "rewards": [{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}]}
    cora = mini_recipe(teacher={**teacher, "lora": {"r": 4}, "update": True, "lr": 1e-2},
                       advantage={"name": "residual", "base": "grpo", "lam": 0.5}, **common)
    summary = Trainer(cora, tmp_path / "cora", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "cora") if "loss" in r]
    assert summary["steps"] == 2 and len(rows) == 2
    assert all(math.isfinite(r["teacher/loss"]) and r["teacher/abs_delta"] > 0 for r in rows)

    ra0 = mini_recipe(teacher=teacher, advantage={"name": "residual", "lam": 0.0}, **common)
    grpo = mini_recipe(**common)
    Trainer(ra0, tmp_path / "ra0", log=lambda m: None).run()
    Trainer(grpo, tmp_path / "grpo", log=lambda m: None).run()
    assert any(r["reward/std"] > 0 for r in read_metrics(tmp_path / "grpo") if "loss" in r)
    w_cora, w_ra0, w_grpo = (final_weights(tmp_path / x) for x in ("cora", "ra0", "grpo"))
    # λ = 0 is GRPO exactly (the teacher's forward passes draw no randomness) ...
    assert all(torch.equal(w_ra0[k], w_grpo[k]) for k in w_grpo)
    # ... and with λ > 0 the teacher's credit reaches the student's update.
    assert any(not torch.equal(w_cora[k], w_grpo[k]) for k in w_grpo)
