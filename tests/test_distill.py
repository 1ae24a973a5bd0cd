"""On-policy distillation: the divergences by hand, their gradients, the loss-term hook, the
``opd`` method end to end (split invariance, exact resume, pure distillation learns)."""

import math
from pathlib import Path

import pytest
import torch

from reasonrl.algos.distill import (forward_kl, generalized_jsd, restrict_top_k, reverse_kl,
                                    sampled_reverse_kl_surrogate, token_divergence)
from reasonrl.config import ConfigError
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, mini_recipe, recipe_diff, straight_and_resumed

S, T = [0.5, 0.5], [0.8, 0.2]  # student, teacher
REVERSE = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)  # 0.223144
FORWARD = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)  # 0.192745
M = [0.5 * 0.8 + 0.5 * 0.5, 0.5 * 0.2 + 0.5 * 0.5]  # the β = 0.5 mixture: [0.65, 0.35]
JSD = 0.5 * (0.8 * math.log(0.8 / M[0]) + 0.2 * math.log(0.2 / M[1])) \
    + 0.5 * (0.5 * math.log(0.5 / M[0]) + 0.5 * math.log(0.5 / M[1]))  # 0.050672


def logits_of(p):
    return torch.tensor(p, dtype=torch.float64).log().view(1, 1, -1)


def test_exact_divergences_by_hand():
    s, t = logits_of(S), logits_of(T)
    assert token_divergence(s, t, "reverse_kl").item() == pytest.approx(REVERSE, abs=1e-12)
    assert token_divergence(s, t, "forward_kl").item() == pytest.approx(FORWARD, abs=1e-12)
    assert token_divergence(s, t, "jsd", beta=0.5).item() == pytest.approx(JSD, abs=1e-12)
    # GKD's end points, as in TRL: β = 0 is the forward KL, β = 1 the reverse KL.
    assert token_divergence(s, t, "jsd", beta=0.0).item() == pytest.approx(FORWARD, abs=1e-12)
    assert token_divergence(s, t, "jsd", beta=1.0).item() == pytest.approx(REVERSE, abs=1e-12)
    # An asymmetric β by hand: M = 0.25 T + 0.75 S.
    m = [0.25 * 0.8 + 0.75 * 0.5, 0.25 * 0.2 + 0.75 * 0.5]
    want = 0.25 * (0.8 * math.log(0.8 / m[0]) + 0.2 * math.log(0.2 / m[1])) \
        + 0.75 * (0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1]))
    assert token_divergence(s, t, "jsd", beta=0.25).item() == pytest.approx(want, abs=1e-12)
    # Identical distributions: every divergence is zero.
    for d in ("reverse_kl", "forward_kl", "jsd"):
        assert token_divergence(t, t, d).item() == pytest.approx(0.0, abs=1e-12)


def test_temperature_scales_both_distributions():
    s, t = logits_of(S), logits_of(T)
    # At τ = 2 the teacher is softmax(log T / 2) ∝ sqrt(T); the uniform student stays uniform.
    q = [math.sqrt(0.8), math.sqrt(0.2)]
    q = [x / sum(q) for x in q]
    want = 0.5 * math.log(0.5 / q[0]) + 0.5 * math.log(0.5 / q[1])
    assert token_divergence(s, t, "reverse_kl", temperature=2.0).item() == pytest.approx(want, abs=1e-12)


def test_top_k_restricts_to_the_teachers_top_tokens_and_renormalises():
    s, t = logits_of([0.2, 0.2, 0.6]), logits_of([0.6, 0.3, 0.1])
    # The teacher's top 2 are tokens 0 and 1: T' = [2/3, 1/3], S' = [1/2, 1/2].
    want = 0.5 * math.log(0.5 / (2 / 3)) + 0.5 * math.log(0.5 / (1 / 3))
    assert token_divergence(s, t, "reverse_kl", top_k=2).item() == pytest.approx(want, abs=1e-12)
    want_fwd = (2 / 3) * math.log((2 / 3) / 0.5) + (1 / 3) * math.log((1 / 3) / 0.5)
    assert token_divergence(s, t, "forward_kl", top_k=2).item() == pytest.approx(want_fwd, abs=1e-12)
    # k ≥ the vocabulary is the full divergence.
    full = token_divergence(s, t, "reverse_kl")
    assert token_divergence(s, t, "reverse_kl", top_k=3).item() == pytest.approx(full.item(), abs=1e-12)
    rs, rt = restrict_top_k(s.log_softmax(-1), t.log_softmax(-1), 2)
    assert rs.exp().sum().item() == pytest.approx(1.0) and rt.exp().sum().item() == pytest.approx(1.0)


def test_gradients_by_hand():
    t = logits_of(T)
    z = torch.zeros(1, 1, 2, dtype=torch.float64, requires_grad=True)  # the uniform student
    token_divergence(z, t, "reverse_kl").sum().backward()
    # d KL(S‖T)/dz_j = p_j (log p_j − log q_j − KL)
    g0 = 0.5 * (math.log(0.5) - math.log(0.8) - REVERSE)
    assert z.grad.view(-1).tolist() == pytest.approx([g0, -g0], abs=1e-12)
    z.grad = None
    token_divergence(z, t, "forward_kl").sum().backward()
    assert z.grad.view(-1).tolist() == pytest.approx([0.5 - 0.8, 0.5 - 0.2], abs=1e-12)  # p_S − p_T
    # No gradient reaches the teacher.
    tz = t.clone().requires_grad_(True)
    token_divergence(z, tz, "jsd").sum().backward()
    assert tz.grad is None


def test_sampled_reverse_kl_is_unbiased_for_the_exact_gradient():
    """E_{y∼π_S}[∇(k_y · log π_S(y))] = ∇KL(π_S‖π_T), enumerated over the vocabulary."""
    torch.manual_seed(0)
    z = torch.randn(5, dtype=torch.float64, requires_grad=True)
    t = torch.randn(5, dtype=torch.float64)
    exact = torch.autograd.grad(reverse_kl(z.log_softmax(-1), t.log_softmax(-1)), z)[0]
    probs = z.log_softmax(-1).exp().detach()
    expected = torch.zeros(5, dtype=torch.float64)
    for y in range(5):
        s_logp = z.log_softmax(-1)[y]
        surrogate, k = sampled_reverse_kl_surrogate(s_logp, t.log_softmax(-1)[y])
        assert k.item() == pytest.approx((z.log_softmax(-1)[y] - t.log_softmax(-1)[y]).item())
        expected += probs[y] * torch.autograd.grad(surrogate, z)[0]
    assert torch.allclose(expected, exact, atol=1e-12)


def test_divergences_are_non_negative_and_jsd_bounded():
    torch.manual_seed(1)
    s, t = torch.randn(4, 7, 11), torch.randn(4, 7, 11)
    for d in ("reverse_kl", "forward_kl", "jsd"):
        assert (token_divergence(s, t, d) >= -1e-6).all()
    assert (token_divergence(s, t, "jsd") <= math.log(2) + 1e-6).all()
    # forward_kl / reverse_kl are each other's mirror.
    a, b = s.log_softmax(-1), t.log_softmax(-1)
    assert torch.allclose(forward_kl(a, b), reverse_kl(b, a))
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(a, b, beta=1.5)


# -- the method in the Trainer -------------------------------------------------------------------

TEACHER = {"backend": "tiny", "tiny": {**MINI_TINY, "seed": 1}}
COMMON = {"train": {"steps": 2}, "eval": {"size": 0},
          "rewards": [{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}]}


def final_weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final_model" / "model.safetensors"))


def test_coef_zero_is_grpo_exactly_and_a_positive_coef_changes_the_update(tmp_path):
    Trainer(mini_recipe(**COMMON), tmp_path / "grpo", log=lambda m: None).run()
    for name, coef in (("zero", 0.0), ("opd", 1.0)):
        r = mini_recipe(methods=[{"name": "opd", "teacher": TEACHER, "coef": coef}], **COMMON)
        Trainer(r, tmp_path / name, log=lambda m: None).run()
    grpo, zero, opd = (final_weights(tmp_path / d) for d in ("grpo", "zero", "opd"))
    assert all(torch.equal(grpo[k], zero[k]) for k in grpo)
    assert any(not torch.equal(grpo[k], opd[k]) for k in grpo)
    rows = [r for r in read_metrics(tmp_path / "opd") if "loss" in r]
    assert len(rows) == 2 and all(r["opd/reverse_kl"] > 0 for r in rows)


@pytest.mark.parametrize("divergence", ["reverse_kl", "jsd", "sampled_reverse_kl"])
def test_the_term_does_not_depend_on_the_micro_batch_split(tmp_path, divergence):
    rows = {}
    for mb in (16, 4):
        r = mini_recipe(methods=[{"name": "opd", "teacher": TEACHER, "divergence": divergence}],
                        train={"steps": 1, "micro_batch_size": mb}, eval={"size": 0})
        Trainer(r, tmp_path / str(mb), log=lambda m: None).run()
        rows[mb] = final_weights(tmp_path / str(mb))
    assert all(torch.allclose(rows[16][k], rows[4][k], atol=1e-6) for k in rows[16])


def test_pure_distillation_moves_the_student_toward_the_teacher(tmp_path):
    r = mini_recipe(methods=[{"name": "opd", "teacher": TEACHER, "divergence": "reverse_kl"}],
                    loss={"policy": "none"}, optim={"lr": 3e-3, "warmup_steps": 0},
                    train={"steps": 8}, eval={"size": 0})
    Trainer(r, tmp_path / "run", log=lambda m: None).run()
    rows = [row for row in read_metrics(tmp_path / "run") if "opd/reverse_kl" in row]
    kl = [row["opd/reverse_kl"] for row in rows]
    assert len(kl) == 8
    assert sum(kl[-3:]) / 3 < 0.8 * sum(kl[:3]) / 3, kl
    # No policy term: `loss` is 0 and the objective actually trained on is logged as `loss/total`.
    assert all(row["loss"] == 0.0 and row["loss/total"] > 0 for row in rows)
    assert sum(r["loss/total"] for r in rows[-3:]) < sum(r["loss/total"] for r in rows[:3])


def test_opd_resumes_exactly(tmp_path, monkeypatch):
    r = mini_recipe(methods=[{"name": "opd", "teacher": TEACHER, "divergence": "jsd", "top_k": 8}],
                    train={"steps": 4}, eval={"size": 0})
    rows = straight_and_resumed(r, tmp_path, monkeypatch)
    assert sum("opd/jsd" in row for row in rows) == 4


def test_recipe_errors_are_clear():
    with pytest.raises(ConfigError, match="num_iterations"):
        mini_recipe(methods=[{"name": "opd", "teacher": TEACHER, "divergence": "sampled_reverse_kl"}],
                    train={"num_iterations": 2})
    with pytest.raises(ConfigError, match="divergence"):
        mini_recipe(methods=[{"name": "opd", "teacher": TEACHER, "divergence": "kl"}])


# --- recipes/opd_smollm2.yaml: smollm2_grpo.yaml with OPD and a real (HF) teacher ------------------

SMOLLM2_TEACHER = {"backend": "hf", "path": "runs/smollm2-teacher/final_model"}


def test_opd_smollm2_differs_from_smollm2_grpo_in_the_method_alone():
    from reasonrl.recipe import load_recipe

    # loss.epsilon: ppo_clip's, refused with loss.policy none
    assert recipe_diff("opd_smollm2", "smollm2_grpo") == {"loss.policy", "loss.epsilon", "methods"}
    r = load_recipe("recipes/opd_smollm2.yaml")
    assert r.loss.policy == "none" and r.loss.kl.coef == 0.0
    (method,) = r.methods
    assert method.name == "opd" and method.params["teacher"] == SMOLLM2_TEACHER
    # the method's settings are the toy recipe's (recipes/opd.yaml), only the teacher differs
    toy = load_recipe("recipes/opd.yaml").methods[0]
    assert toy.name == "opd"
    assert {k: v for k, v in method.params.items() if k != "teacher"} == \
        {k: v for k, v in toy.params.items() if k != "teacher"}


@pytest.mark.parametrize("name", ["opd_smollm2", "ts_opd_smollm2"])
def test_a_smollm2_teacher_is_set_by_the_documented_override_and_a_missing_one_is_named(name):
    from reasonrl.policy.teacher import build_teacher_policy
    from reasonrl.recipe import load_recipe

    override = "methods.0.teacher.path=runs/other/final_model"
    assert "--set " + override.replace("runs/other/final_model", "<model folder>") in Path(f"recipes/{name}.yaml").read_text()
    assert recipe_diff(name, name, (override,)) == {"methods"}
    (method,) = load_recipe(f"recipes/{name}.yaml", [override]).methods
    (default,) = load_recipe(f"recipes/{name}.yaml").methods
    assert method.params == {**default.params, "teacher": {"backend": "hf", "path": "runs/other/final_model"}}
    # an absent teacher folder fails at load, naming the folder (the student is not needed for that)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        build_teacher_policy({**SMOLLM2_TEACHER, "path": "runs/no-such-teacher/final_model"}, student=None)
