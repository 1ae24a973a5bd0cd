"""LoGRA (arXiv 2610.06647): the pure formulas by hand, the sketch against the full gradient, the
forward-mode KL probe against a finite-difference KL, the seam, exact resume, a short run, and the
low-rank sync to an async sampler."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.methods.logra import maths as L
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.methods.logra.optimizer import LoGRALearner, _eager_attention
from reasonrl.policy.lowrank import apply_lowrank_updates, lowrank_payload_bytes
from reasonrl.metrics_log import read_metrics
from reasonrl.train.optim import Learner, build_learner
from reasonrl.train.trainer import Trainer

from helpers import QUIET, mini_policy, mini_recipe, straight_and_resumed

LOGRA = {"name": "logra", "params": {"rank": 8, "update_ratio": 1e-3, "measure_kl": True}}
PROXY = [{"name": "proxy_length_keyword", "max_len": 24}]  # rewards that differ inside groups of an untrained model


def logra_recipe(**sections):
    return mini_recipe(rewards=PROXY, optim=sections.pop("optim", LOGRA), **sections)


def hand_batch(policy, rows: int = 2, length: int = 6, seed: int = 0, prompts=("1+2=", "13*4=")) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    prompt_ids, prompt_mask = policy.encode_prompts(list(prompts[:rows]))
    comp = torch.randint(4, policy.model.config.vocab_size, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[1, -2:] = 0
    return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=comp, completion_mask=mask,
                        group_ids=torch.arange(rows), rewards=torch.zeros(rows), truncated=torch.zeros(rows, dtype=torch.bool))


def toy_loss(policy, batch):
    logits = policy.completion_logits(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    logp = torch.log_softmax(logits.float(), -1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    return -(logp * batch.completion_mask).sum() / batch.completion_mask.sum()


# -- pure formulas ------------------------------------------------------------------------

def test_row_adam_by_hand():
    # mean_j Ŝ² = [12.5, 0.5]; v = 0.5·that = [6.25, 0.25]; v̂ = v/(1−0.5) = [12.5, 0.5]; ρ = [√12.5, √0.5];
    # s ∝ min(ρ)/ρ = [0.2, 1]; diag(s)Ŝ = [[0.6, 0.8], [0, 1]] (norm √2), rescaled to ‖Ŝ‖ = √26: ×√13.
    s = torch.tensor([[3.0, 4.0], [0.0, 1.0]])
    d, v = L.row_adam(s, torch.zeros(2), step=1, beta2=0.5, eps=0.0)
    torch.testing.assert_close(v, torch.tensor([6.25, 0.25]))
    torch.testing.assert_close(d, math.sqrt(13) * torch.tensor([[0.6, 0.8], [0.0, 1.0]]))
    # step 2 with the same sketch: v = 0.5·v + 0.5·[12.5, 0.5] = [9.375, 0.375], v̂ = v/0.75 = [12.5, 0.5]: same D.
    d2, v2 = L.row_adam(s, v, step=2, beta2=0.5, eps=0.0)
    torch.testing.assert_close(v2, torch.tensor([9.375, 0.375]))
    torch.testing.assert_close(d2, d)
    # ε adds ε·mean(ρ) to every row: a huge ε flattens s, so D → Ŝ.
    torch.testing.assert_close(L.row_adam(s, torch.zeros(2), 1, 0.5, eps=1e9)[0], s, atol=1e-6, rtol=1e-6)


def test_step_scale_budget_mismatch_and_normalisation_by_hand():
    assert L.step_scale(1e-4, 4e-4, alpha_max=3.0) == pytest.approx(0.5)  # √(b/KL̂)
    assert L.step_scale(1e-2, 1e-6, alpha_max=3.0) == 3.0  # capped
    assert L.step_scale(1e-4, 0.0, alpha_max=3.0) == 1.0  # the probe saw no change
    assert L.cosine_budget(0, 2e-4, 2e-5, 11) == pytest.approx(2e-4)
    assert L.cosine_budget(5, 2e-4, 2e-5, 11) == pytest.approx(1.1e-4)  # half way: the mean
    assert L.cosine_budget(10, 2e-4, 2e-5, 11) == pytest.approx(2e-5)
    assert L.cosine_budget(50, 2e-4, 2e-5, 11) == pytest.approx(2e-5)
    assert L.floored_budget(1e-4, 3e-5, 0.5) == pytest.approx(7e-5)
    assert L.floored_budget(1e-4, 9e-5, 0.5) == pytest.approx(5e-5)  # the floor φ·b
    gen, prev = torch.tensor([[-1.0, -2.0, -9.0]]), torch.tensor([[-1.5, -2.1, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    # mean gap over the two valid tokens = (0.5 + 0.1)/2 = 0.3: m = 0.7·0.1 + 0.3·0.3
    assert L.update_mismatch(0.1, gen, prev, mask, 0.3) == pytest.approx(0.16)
    assert L.update_mismatch(0.1, prev, gen, mask, 0.3) == pytest.approx(0.07)  # a negative gap counts as 0
    assert L.global_scale(400.0, 4.0, 0.1) == pytest.approx(1.0)  # 0.1·√(400/4)
    d, a = torch.randn(5, 3), L.rademacher_projection(3, 7, 0, 1, "x")
    torch.testing.assert_close(L.lowrank_sq_norm(d, a), (d @ a).pow(2).sum())


def test_predicted_kl_by_hand():
    z = torch.zeros(1, 1, 2)
    u = torch.tensor([[[1.0, -1.0]]])
    # q = [½, ½], Σ q u = 0: KL̂ = ½ (½·1 + ½·1) = ½; at T = 2, u/2: ¼ of that.
    assert float(L.predicted_kl(z, u, torch.ones(1, 1))) == pytest.approx(0.5)
    assert float(L.predicted_kl(z, u, torch.ones(1, 1), temperature=2.0)) == pytest.approx(0.125)
    assert float(L.predicted_kl(z, torch.ones(1, 1, 2), torch.ones(1, 1))) == 0.0  # a shift of every logit


def test_projection_is_rademacher_and_rebuilt_from_its_seed():
    a = L.rademacher_projection(4, 50, seed=0, update=1, layer="model.layers.0.self_attn.q_proj")
    assert set(a.unique().tolist()) == {-0.5, 0.5}  # ±1/√r
    assert torch.equal(a, L.rademacher_projection(4, 50, 0, 1, "model.layers.0.self_attn.q_proj"))
    assert not torch.equal(a, L.rademacher_projection(4, 50, 0, 2, "model.layers.0.self_attn.q_proj"))
    assert not torch.equal(a, L.rademacher_projection(4, 50, 0, 1, "model.layers.0.self_attn.k_proj"))
    # a stable hash (not Python's salted str hash), so another process rebuilds the same A
    assert L.projection_seed(0, 1, "model.layers.0.self_attn.q_proj") == 7118389939956506737


# -- the optimiser on a model --------------------------------------------------------------

def test_sketch_equals_full_gradient_times_projection():
    policy = mini_policy()
    batch = hand_batch(policy)
    toy_loss(policy, batch).backward()
    full = {n: m.weight.grad.clone() for n, m in policy.model.named_modules() if n.endswith(("q_proj", "down_proj"))}
    policy.model.zero_grad(set_to_none=True)
    learner = LoGRALearner(policy, logra_recipe())
    learner.begin_step(batch)
    toy_loss(policy, batch).backward()
    assert all(p.grad is None for p in policy.model.parameters())  # no full weight gradient was formed
    assert len(full) == 4
    for name, g in full.items():
        torch.testing.assert_close(learner.slots[name][0], g @ learner.proj[name].T, rtol=1e-4, atol=1e-6)


def test_jvp_predicted_kl_matches_a_finite_difference_kl():
    """KL(π_W ‖ π_{W+εΔW}) ≈ ε²·KL̂ for ΔW = −D A at every target layer at once (float64; prompts
    of one length, since transformers' eager attention turns a left-padded float64 row into NaN)."""
    policy = mini_policy()
    policy.model.double()
    learner = LoGRALearner(policy, logra_recipe())
    batch = hand_batch(policy, prompts=("12+2=", "13*4="))
    g = torch.Generator().manual_seed(1)
    learner.dirs = {n: torch.randn(m.out_features, 8, generator=g, dtype=torch.float64) * 0.1
                    for n, m in learner.layers.items()}
    learner.proj = {n: a.double() for n, a in learner.proj.items()}
    kl_hat, rows, old = learner._probe(batch)
    assert kl_hat > 0
    w0 = {n: m.weight.detach().clone() for n, m in learner.layers.items()}
    errors = []
    for eps in (1e-3, 1e-4):
        with torch.no_grad():
            for n, m in learner.layers.items():
                m.weight.copy_(w0[n] - eps * learner.dirs[n] @ learner.proj[n])
            with _eager_attention(policy.model):
                new = learner._logits(rows)
        measured = float(L.exact_kl(old, new, rows.response_mask.bool()))
        errors.append(abs(measured / (eps ** 2 * kl_hat) - 1))
    assert errors[1] < 1e-3 and errors[1] < errors[0] / 5  # the third-order term vanishes with ε
    # float32 with a left-padded prompt (the training case): finite
    policy32 = mini_policy()
    learner32 = LoGRALearner(policy32, logra_recipe())
    learner32.dirs = {n: d.float() for n, d in learner.dirs.items()}
    assert math.isfinite(learner32._probe(hand_batch(policy32))[0])


def test_the_seam_and_load_time_refusals():
    policy = mini_policy()
    assert type(build_learner(policy, mini_recipe())) is Learner
    assert isinstance(build_learner(mini_policy(), logra_recipe()), LoGRALearner)
    with pytest.raises(ConfigError, match="optim.lr does not apply to optim.name: logra"):
        logra_recipe(optim={**LOGRA, "lr": 1e-3})
    with pytest.raises(ConfigError, match="cannot train LoRA adapters"):
        logra_recipe(model={"backend": "tiny", "tiny": {"hidden_size": 32}, "lora": {"r": 4}})
    with pytest.raises(ConfigError, match="optim.params.rannk"):
        logra_recipe(optim={"name": "logra", "params": {"rannk": 8}})
    with pytest.raises(ConfigError, match="optim.params.rank=64 exceeds"):
        LoGRALearner(mini_policy(), logra_recipe(optim={"name": "logra", "params": {"rank": 64}}))
    with pytest.raises(ValueError, match="only be the policy's"):  # an auxiliary model's Learner
        Learner(policy.parameters(), logra_recipe().optim, 4)


def test_short_run_moves_only_the_target_layers_with_finite_metrics(tmp_path):
    from safetensors.torch import load_file

    from reasonrl.policy.factory import build_policy

    recipe = logra_recipe(train={"steps": 3, "threads": 1})
    Trainer(recipe, tmp_path / "run", **QUIET).run()
    rows = [r for r in read_metrics(tmp_path / "run") if "logra/alpha" in r]
    assert len(rows) == 3
    for r in rows:
        for key in ("predicted_kl", "alpha", "budget", "mismatch", "step_norm", "measured_kl"):
            assert math.isfinite(r[f"logra/{key}"])
        assert 0 < r["logra/alpha"] <= 3.0 and r["logra/step_norm"] > 0 and r["logra/measured_kl"] > 0
        assert r["logra/predicted_kl"] <= r["logra/budget"] * (1 + 1e-6)  # α never exceeds the budget
    before = build_policy(recipe.model, log=lambda m: None).model.state_dict()  # built as the run built it
    after = load_file(str(tmp_path / "run" / "final_model" / "model.safetensors"))
    moved = {k for k in after if not torch.equal(before[k], after[k])}
    assert moved and all(k.endswith(("proj.weight",)) for k in moved)
    assert not any("embed" in k or "norm" in k for k in moved)  # frozen, as in the paper


def test_exact_resume(tmp_path, monkeypatch):
    rows = straight_and_resumed(logra_recipe(train={"steps": 4, "threads": 1, "checkpoint_every": 2}),
                                tmp_path, monkeypatch)
    assert sum("logra/alpha" in r for r in rows) == 4


# -- sync of (D, seed) -------------------------------------------------------------------

def test_sampler_applies_low_rank_updates_to_the_same_bits():
    from reasonrl.rollout.async_source import SamplerWorker

    recipe = logra_recipe(rollout={"source": "async"})
    policy = mini_policy()
    learner = LoGRALearner(policy, recipe)
    learner.record_updates = True
    worker = SamplerWorker(recipe, {"step": 0, "generator": torch.Generator().get_state(), "sampler": {},
                                    "lowrank": True})
    try:
        worker._handle(("weights", 0, 0, policy.weights()))
        batch = hand_batch(policy)
        batch.sample_logprobs = torch.zeros_like(batch.completion_ids, dtype=torch.float32)
        for _ in range(2):  # two updates in one message (as with sync_every: 2)
            learner.begin_step(batch)
            toy_loss(policy, batch).backward()
            learner.step(batch)
        payload = learner.take_updates()
        assert [u[0] for u in payload["updates"]] == [1, 2] and not learner.pending
        worker._handle(("lowrank", 2, 2, payload))
        theirs, ours = worker.policy.weights(), policy.weights()
        assert worker.version == 2 and all(torch.equal(theirs[k], ours[k]) for k in ours)
        d_bytes = sum(d.numel() * 4 for _, _, ds in payload["updates"] for d in ds.values())
        assert lowrank_payload_bytes(payload) == d_bytes + 16 + 2 * 16
        with pytest.raises(RuntimeError, match="an update was lost"):
            worker._handle(("lowrank", 5, 5, {**payload, "updates": [(4, 1.0, {})]}))
    finally:
        worker.scorer.close()


def test_async_run_syncs_low_rank_updates_and_equals_the_sync_run(tmp_path):
    """At max_staleness 0 the sampler that only receives (D, k, α) and the seed samples exactly
    what the learner's own weights sample: the runs agree number for number and bit for bit."""
    from safetensors.torch import load_file

    common = {"train": {"steps": 3, "threads": 1}}
    Trainer(logra_recipe(**common, rollout={"sampler_threads": 1}), tmp_path / "sync", **QUIET).run()
    Trainer(logra_recipe(**common, rollout={"source": "async", "max_staleness": 0, "sampler_threads": 1}),
            tmp_path / "async", **QUIET).run()
    rows = read_metrics(tmp_path / "async")
    synced = [r for r in rows if "logra/sync_bytes" in r]
    assert synced, "logra/sync_bytes was never logged"
    for r in synced:
        assert 0 < r["logra/sync_bytes"] < r["logra/full_sync_bytes"]
    drop = ("perf/", "offpolicy/", "async/", "logra/sync_bytes", "logra/full_sync_bytes")
    same = [[{k: v for k, v in r.items() if not k.startswith(drop)} for r in read_metrics(tmp_path / d)]
            for d in ("sync", "async")]
    assert same[0] == same[1]
    wa, wb = (load_file(str(tmp_path / d / "final_model" / "model.safetensors")) for d in ("sync", "async"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_apply_lowrank_updates_is_the_formula():
    lin = torch.nn.Linear(6, 3, bias=False)
    w0 = lin.weight.detach().clone()
    d = torch.randn(3, 2)
    apply_lowrank_updates(torch.nn.Sequential(lin), {"seed": 5, "rank": 2, "updates": [(3, 0.5, {"0": d})]})
    a = L.rademacher_projection(2, 6, 5, 3, "0")
    torch.testing.assert_close(lin.weight.detach(), w0 - 0.5 * d @ a)
