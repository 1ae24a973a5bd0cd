"""TS-OPD: strata and gates on hand-built tables, the routed loss against a direct computation,
screening, split invariance and exact resume."""

from types import SimpleNamespace

import pytest
import torch

from reasonrl.methods.ts_opd import maths as ts
from reasonrl.algos.distill import forward_kl, reverse_kl
from reasonrl.algos.losses import aggregate
from reasonrl.config import ConfigError
from reasonrl.methods.ts_opd.method import STRATUM_KEY, TransferStratifiedOPD
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, mini_policy, mini_recipe, recipe_diff, straight_and_resumed


def test_strata_by_hand():
    #          student  teacher  → stratum
    table = [(0.00, 1.00, ts.ACQUIRE),      # the teacher solves what the student cannot
             (0.25, 0.50, ts.ACQUIRE),      # both thresholds inclusive on these sides
             (0.50, 0.75, ts.CONSOLIDATE),  # both can
             (0.30, 0.50, ts.CONSOLIDATE),
             (0.00, 0.25, ts.SKIP),         # both fail
             (1.00, 0.00, ts.SKIP)]         # only the student succeeds
    p_s, p_t, want = (torch.tensor(c) for c in zip(*table))
    assert ts.strata(p_s.float(), p_t.float(), 0.25, 0.5).tolist() == want.tolist()


def test_gates_by_hand():
    d = torch.tensor([[0.1, 2.0, 3.0, 0.2, 1.5, 9.0],
                      [5.0, 0.0, 5.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    # ρ = 0.4: ⌈0.4·5⌉ = 2 tokens of row 0 (3.0, 2.0; the 9.0 is padding), ⌈0.4·4⌉ = 2 of row 1
    # (a tie at 5.0: both kept).
    assert ts.disagreement_gate(d, mask, 0.4).tolist() == [[0, 1, 1, 0, 0, 0], [1, 0, 1, 0, 0, 0]]
    # ρ = 0.5 on row 1: ⌈2⌉ = 2; ties at 0.0 are not reached.
    assert ts.disagreement_gate(d, mask, 0.5)[1].tolist() == [1, 0, 1, 0, 0, 0]
    # The first maximal run of d > 1: row 0 tokens 1-2 (token 4 starts a second run); row 1 token 0 only.
    assert ts.first_divergent_gate(d, mask, 1.0).tolist() == [[0, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    conf = torch.tensor([[0.95, 0.5, 0.9, 0.2, 0.99, 0.99]])
    assert ts.confidence_gate(conf, mask[:1], 0.9).tolist() == [[1, 0, 1, 0, 1, 0]]
    assert ts.token_gate("none", disagreement=d, teacher_max_prob=d, mask=mask, rho=0.1, confidence=0.5,
                         divergence=1.0).tolist() == mask.float().tolist()
    with pytest.raises(ValueError, match="allowed"):
        ts.token_gate("random", disagreement=d, teacher_max_prob=d, mask=mask, rho=0.1, confidence=0.5, divergence=1.0)


def test_brake_by_hand():
    assert ts.brake_active(0.5, 0.8) and not ts.brake_active(0.9, 0.8)
    assert ts.brake_scale(0.4, 0.8) == pytest.approx(0.5) and ts.brake_scale(1.2, 0.8) == 1.0


def hand_method(gate="none", brake=None, top_k=None):
    m = TransferStratifiedOPD(teacher={}, gate=gate, brake=brake, top_k=top_k, rho=0.5)
    m.teacher, m.share_prompt = mini_policy(seed=1), True
    return m


def hand_batch(policy, strata):
    ids, mask = policy.encode_prompts(["1+2;", "3*4;"])
    comp = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10], [3, 5, 7, 0], [4, 4, 4, 4]])
    cmask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    from reasonrl.batch import RolloutBatch

    return RolloutBatch(prompt_ids=ids.repeat_interleave(2, 0), prompt_mask=mask.repeat_interleave(2, 0),
                        completion_ids=comp, completion_mask=cmask, group_ids=torch.tensor([0, 0, 1, 1]),
                        rewards=torch.zeros(4), truncated=torch.zeros(4, dtype=torch.bool),
                        aux={STRATUM_KEY: torch.tensor(strata)})


def inputs_for(policy, batch, temperature=1.0):
    from reasonrl.train.objective import TermInputs

    logits = policy.completion_logits(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                      batch.completion_mask, batch.group_ids)
    logp = logits.float().log_softmax(-1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    mask = batch.completion_mask.float()
    agg = dict(mode="token-mean", total_tokens=int(mask.sum()), total_seqs=len(batch), norm_len=4)
    return TermInputs(micro=batch, mini=batch, logits=logits, logprobs=logp, mask=mask, temperature=temperature,
                      agg=agg)


def test_loss_routes_forward_kl_to_acquisition_reverse_kl_to_consolidation():
    student = mini_policy(seed=0)
    method = hand_method()
    batch = hand_batch(student, [ts.ACQUIRE, ts.ACQUIRE, ts.CONSOLIDATE, ts.SKIP])
    inputs = inputs_for(student, batch)
    loss, stats = method.loss_term(inputs)
    s = inputs.logits.float().log_softmax(-1)
    with torch.no_grad():
        t = method.teacher.completion_logits(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                             batch.completion_mask, batch.group_ids).float().log_softmax(-1)
    per_token = torch.stack([forward_kl(s[0], t[0]), forward_kl(s[1], t[1]), reverse_kl(s[2], t[2]),
                             torch.zeros(4)])
    want = aggregate(per_token, inputs.mask, "token-mean", total_tokens=int(inputs.mask.sum()))
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert loss.item() > 0
    # Gated tokens per stratum: every valid token of rows 0-1 (acquisition) and row 2 (consolidation).
    assert stats["token/ts_opd/gated_acquisition"] == 7 and stats["token/ts_opd/gated_consolidation"] == 3
    assert stats["token/ts_opd/gated"] == 14  # the skipped row's tokens pass the 'none' gate but carry no loss
    # An all-skip batch has no loss and no gradient.
    skip = hand_batch(student, [ts.SKIP] * 4)
    loss0, _ = method.loss_term(inputs_for(student, skip))
    assert loss0.item() == 0.0


def test_brake_penalty_adds_the_entropy_gradient_only_when_active():
    student = mini_policy(seed=0)
    batch = hand_batch(student, [ts.SKIP] * 4)
    method = hand_method(brake="penalty")
    method.brake_coef = 0.5
    inputs = inputs_for(student, batch)
    s = inputs.logits.float().log_softmax(-1)
    entropy = -(s.exp() * s).sum(-1)
    for active in (1.0, 0.0):
        method.step_brake = active
        loss, _ = method.loss_term(inputs)
        want = -0.5 * active * aggregate(entropy, inputs.mask, "token-mean", total_tokens=int(inputs.mask.sum()))
        assert loss.item() == pytest.approx(float(want.detach()), abs=1e-6)


def test_annotate_routes_groups_from_group_success_and_cached_teacher_success():
    student = mini_policy(seed=0)
    batch = hand_batch(student, [0, 0, 0, 0])
    del batch.aux[STRATUM_KEY]
    batch.rewards = torch.tensor([0.0, 0.0, 1.0, 1.0])
    batch.sample_logprobs = torch.full((4, 4), -0.5)
    problems = [SimpleNamespace(prompt="a"), SimpleNamespace(prompt="a"), SimpleNamespace(prompt="b"),
                SimpleNamespace(prompt="b")]
    batch.meta["problem"] = problems
    method = hand_method(brake="scale")
    method.teacher_success = {"a": 1.0, "b": 0.875}  # screened before: nothing to sample
    metrics = method.annotate(batch, 0)
    assert batch.aux[STRATUM_KEY].tolist() == [ts.ACQUIRE, ts.ACQUIRE, ts.CONSOLIDATE, ts.CONSOLIDATE]
    assert metrics["ts_opd/acquisition"] == 0.5 and metrics["ts_opd/consolidation"] == 0.5
    assert metrics["ts_opd/screened"] == 0 and metrics["ts_opd/teacher_success"] == pytest.approx(0.9375)
    assert metrics["ts_opd/entropy"] == pytest.approx(0.5) and method.h0 == pytest.approx(0.5)


# -- in the Trainer ----------------------------------------------------------------------------

TEACHER = {"backend": "tiny", "tiny": {**MINI_TINY, "seed": 1}}
# A length reward varies within groups even for untrained mini models, so the strata are mixed.
REWARDS = [{"name": "soft_overlong", "max_len": 24, "buffer_len": 20}]


def ts_recipe(**extra):
    method = {"name": "ts_opd", "teacher": TEACHER, "n": 4, "success_at": -0.3, **extra.pop("method", {})}
    return mini_recipe(methods=[method], rewards=REWARDS, loss={"policy": "none"}, eval={"size": 0}, **extra)


def test_a_run_screens_routes_and_logs(tmp_path):
    Trainer(ts_recipe(train={"steps": 3}), tmp_path / "run", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "run") if "ts_opd/acquisition" in r]
    assert len(rows) == 3
    assert rows[0]["ts_opd/screened"] == 4  # four new problems, n teacher samples each
    for r in rows:
        total = r["ts_opd/acquisition"] + r["ts_opd/consolidation"] + r["ts_opd/both_fail"] + r["ts_opd/teacher_fails"]
        assert total == pytest.approx(1.0)
        assert 0 < r["ts_opd/gated"] <= 0.5  # the default gate keeps ⌈0.3·T_i⌉ of each row
    assert any(r["ts_opd/acquisition"] + r["ts_opd/consolidation"] > 0 for r in rows)


def test_split_invariance(tmp_path):
    weights = {}
    for mb in (16, 4):
        Trainer(ts_recipe(train={"steps": 1, "micro_batch_size": mb}), tmp_path / str(mb), log=lambda m: None).run()
        from safetensors.torch import load_file

        weights[mb] = load_file(str(tmp_path / str(mb) / "final_model" / "model.safetensors"))
    assert all(torch.allclose(weights[16][k], weights[4][k], atol=1e-6) for k in weights[16])


def test_exact_resume(tmp_path, monkeypatch):
    rows = straight_and_resumed(ts_recipe(train={"steps": 4}, method={"brake": "scale"}), tmp_path, monkeypatch)
    assert sum("ts_opd/brake" in r for r in rows) == 4


def test_an_async_source_is_refused():
    with pytest.raises(ConfigError, match="sync"):
        ts_recipe(rollout={"source": "async"})
    with pytest.raises(ConfigError, match="gate"):
        ts_recipe(method={"gate": "top"})


# --- recipes/ts_opd_smollm2.yaml: smollm2_grpo.yaml with TS-OPD and a real (HF) teacher -------------

def test_ts_opd_smollm2_differs_from_smollm2_grpo_in_the_method_alone():
    from reasonrl.recipe import load_recipe

    # loss.epsilon: ppo_clip's, refused with loss.policy none
    assert recipe_diff("ts_opd_smollm2", "smollm2_grpo") == {"loss.policy", "loss.epsilon", "methods"}
    # and from the OPD arm in the method's entry alone (same teacher)
    assert recipe_diff("ts_opd_smollm2", "opd_smollm2") == {"methods"}
    r = load_recipe("recipes/ts_opd_smollm2.yaml")
    assert r.loss.policy == "none" and r.rollout.source == "sync"
    (method,) = r.methods
    assert method.name == "ts_opd"
    assert method.params["teacher"] == {"backend": "hf", "path": "runs/smollm2-teacher/final_model"}
    assert method.params["teacher"] == load_recipe("recipes/opd_smollm2.yaml").methods[0].params["teacher"]
    # the method's settings are the toy recipe's (recipes/ts_opd.yaml), only the teacher differs
    toy = load_recipe("recipes/ts_opd.yaml").methods[0]
    assert {k: v for k, v in method.params.items() if k != "teacher"} == \
        {k: v for k, v in toy.params.items() if k != "teacher"}
