"""SURGE checkpoint fusion: the matrix algebra by hand, the model-level fusion, ``reasonrl fuse``."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from reasonrl.methods.surge.maths import complement, fuse_matrix, retained_rank
from reasonrl.cli import main
from reasonrl.config import ConfigError
from reasonrl.methods.surge.fuse import FUSE_FILE, FuseSettings, fuse, fuse_models
from reasonrl.policy.tiny import TinySpec, load_tiny_policy

from helpers import MINI_TINY, mini_policy, mini_recipe


# ---------------------------------------------------------------- k(ρ) and one matrix, by hand

def test_retained_rank_on_a_diagonal_matrix_by_hand():
    s = torch.linalg.svdvals(torch.diag(torch.tensor([1.0, 3.0, 2.0])))  # σ = 3, 2, 1: energies 9, 4, 1 of 14
    assert [retained_rank(s, r) for r in (0.0, 0.5, 9 / 14, 0.65, 0.9, 13 / 14, 0.93, 1.0)] == [0, 1, 1, 2, 2, 2, 3, 3]
    assert retained_rank(torch.tensor([2.0, 0.0, 0.0]), 1.0) == 1  # k(1) is the (numerical) rank
    assert retained_rank(torch.zeros(3), 0.9) == 0  # an unchanged matrix has no dominant subspace
    with pytest.raises(ValueError, match="retain must be in"):
        retained_rank(s, 1.2)


def test_fused_matrix_by_hand_two_sided_one_sided_and_residual():
    base = torch.zeros(3, 3, dtype=torch.float64)
    anchor = torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
    donor = torch.ones(3, 3, dtype=torch.float64)
    # ρ = 0.9 → k = 2: U_k, V_k span e1, e2; P_a = diag(3, 2, 0); the two-sided complement of
    # the all-ones Δ_d keeps only entry (3, 3); the one-sided one keeps the whole third row.
    two = fuse_matrix(base, anchor, donor, retain=0.9, gamma=0.5)
    assert two.rank == 2 and two.full_rank == 3 and two.retained_energy == pytest.approx(13 / 14)
    assert torch.allclose(two.fused, torch.diag(torch.tensor([3.0, 2.0, 0.5], dtype=torch.float64)), atol=1e-12)
    assert two.donor_component_norm == pytest.approx(1.0) and two.donor_norm == pytest.approx(3.0)
    one = fuse_matrix(base, anchor, donor, retain=0.9, gamma=0.5, projection="one_sided")
    expected = torch.tensor([[3.0, 0, 0], [0, 2.0, 0], [0.5, 0.5, 0.5]], dtype=torch.float64)
    assert torch.allclose(one.fused, expected, atol=1e-12)
    res = fuse_matrix(base, anchor, donor, retain=0.9, gamma=0.0, beta_res=0.5)  # + 0.5 · R_a = 0.5 · diag(0, 0, 1)
    assert torch.allclose(res.fused, torch.diag(torch.tensor([3.0, 2.0, 0.5], dtype=torch.float64)), atol=1e-12)
    shifted = fuse_matrix(base + 1, anchor + 1, donor + 1, retain=0.9, gamma=0.5)  # task vectors, not weights
    assert torch.allclose(shifted.fused, two.fused + 1, atol=1e-12)


def test_retain_one_gamma_zero_gives_the_anchor_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(12, 8, generator=g)
    anchor = base + 0.01 * torch.randn(12, 8, generator=g)
    donor = base + 0.01 * torch.randn(12, 8, generator=g)
    out = fuse_matrix(base, anchor, donor, retain=1.0, gamma=0.0)
    assert out.rank == 8 and out.fused.dtype == torch.float32 and torch.equal(out.fused, anchor)
    # A rank-2 update (float64 weights: float32 storage would add a rounding floor to Δ_a):
    # k(1) = 2 and P_a rebuilt from the SVD equals Δ_a up to round-off.
    base64 = base.double()
    low = base64 + torch.randn(12, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 8, generator=g, dtype=torch.float64)
    out = fuse_matrix(base64, low, donor.double(), retain=1.0, gamma=0.0)
    assert out.rank == 2 and torch.allclose(out.fused, low, atol=1e-12, rtol=0)


def test_donor_component_is_orthogonal_to_the_anchor_top_k_subspaces():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(10, 7, generator=g, dtype=torch.float64)
    delta_a = torch.randn(10, 7, generator=g, dtype=torch.float64)
    delta_d = torch.randn(10, 7, generator=g, dtype=torch.float64)
    gamma = 0.7
    out = fuse_matrix(base, base + delta_a, base + delta_d, retain=0.7, gamma=gamma)
    u, s, vh = torch.linalg.svd(delta_a, full_matrices=False)
    k = out.rank
    assert 1 <= k < 7
    u_k, v_k = u[:, :k], vh[:k].T
    c_d = (out.fused - base - (u_k * s[:k]) @ vh[:k]) / gamma
    assert c_d.norm() > 0.5
    assert (u_k.T @ c_d).abs().max() < 1e-10 and (c_d @ v_k).abs().max() < 1e-10
    dense = (torch.eye(10, dtype=torch.float64) - u_k @ u_k.T) @ delta_d @ (torch.eye(7, dtype=torch.float64) - v_k @ v_k.T)
    assert torch.allclose(c_d, dense, atol=1e-10)
    one = complement(delta_d, u_k, v_k, "one_sided")
    assert (u_k.T @ one).abs().max() < 1e-10 and (one @ v_k).abs().max() > 1e-3  # left side only


def test_random_controls_have_the_donor_component_norm():
    g = torch.Generator().manual_seed(2)
    base = torch.randn(9, 6, generator=g, dtype=torch.float64)
    anchor = base + torch.randn(9, 6, generator=g, dtype=torch.float64)
    donor = base + torch.randn(9, 6, generator=g, dtype=torch.float64)
    real = fuse_matrix(base, anchor, donor, retain=0.6, gamma=1.0)
    p_a = fuse_matrix(base, anchor, donor, retain=0.6, gamma=0.0).fused - base
    u_k = torch.linalg.svd(anchor - base, full_matrices=False)[0][:, :real.rank]
    for control, in_complement in (("random", True), ("random_unconstrained", False)):
        a = fuse_matrix(base, anchor, donor, retain=0.6, control=control, generator=torch.Generator().manual_seed(5))
        b = fuse_matrix(base, anchor, donor, retain=0.6, control=control, generator=torch.Generator().manual_seed(5))
        direction = a.fused - base - p_a
        assert torch.equal(a.fused, b.fused)
        assert direction.norm().item() == pytest.approx(real.donor_component_norm, rel=1e-9)
        assert not torch.allclose(a.fused, real.fused, atol=1e-3)
        assert ((u_k.T @ direction).abs().max() < 1e-10) == in_complement
    with pytest.raises(ValueError, match="needs a generator"):
        fuse_matrix(base, anchor, donor, control="random")


def test_unchanged_anchor_matrix_takes_the_whole_donor_update():
    base = torch.ones(4, 3)
    donor = base + torch.arange(12.0).reshape(4, 3)
    out = fuse_matrix(base, base.clone(), donor, retain=0.9, gamma=0.5)
    assert out.rank == 0 and out.retained_energy == 1.0
    assert torch.allclose(out.fused, base + 0.5 * (donor - base))


# ---------------------------------------------------------------- whole models

def perturbed(seed: int, scale: float = 0.05):
    """The mini base model with every parameter moved by a seeded random update (an 'RL checkpoint')."""
    policy = mini_policy(0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return policy


def test_one_dim_parameters_are_copied_from_the_anchor_and_embeddings_follow_the_option():
    base, anchor, donor = mini_policy(0).model, perturbed(1).model, perturbed(2).model
    before = {n: p.detach().clone() for n, p in anchor.named_parameters()}
    report = fuse_models(base, anchor, donor, FuseSettings(retain=0.5, gamma=1.0, embeddings="anchor"))
    after = dict(anchor.named_parameters())
    one_dim = [n for n, p in after.items() if p.dim() == 1]
    assert one_dim and all(torch.equal(after[n], before[n]) for n in one_dim)
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    assert "lm_head.weight" not in after  # tied: one matrix, fused or copied once
    fused = [m["name"] for m in report["matrices"]]
    assert "model.layers.0.self_attn.q_proj.weight" in fused and "model.embed_tokens.weight" not in fused
    assert not torch.equal(after["model.layers.0.self_attn.q_proj.weight"], before["model.layers.0.self_attn.q_proj.weight"])
    assert set(report["copied_from_anchor"]) == set(one_dim) | {"model.embed_tokens.weight"}
    assert all(m["rank"] < m["full_rank"] and m["retained_energy"] >= 0.5 for m in report["matrices"])

    anchor2 = perturbed(1).model
    report2 = fuse_models(base, anchor2, donor, FuseSettings(retain=0.5, embeddings="svd"))
    assert "model.embed_tokens.weight" in [m["name"] for m in report2["matrices"]]
    assert not torch.equal(dict(anchor2.named_parameters())["model.embed_tokens.weight"],
                           before["model.embed_tokens.weight"])


def test_model_fusion_at_retain_one_gamma_zero_is_the_anchor():
    anchor = perturbed(1).model
    before = {n: p.detach().clone() for n, p in anchor.named_parameters()}
    report = fuse_models(mini_policy(0).model, anchor, perturbed(2).model, FuseSettings(retain=1.0, gamma=0.0))
    assert all(torch.equal(p, before[n]) for n, p in anchor.named_parameters())
    assert report["summary"]["anchor_energy_retained"] == pytest.approx(1.0)


def test_shape_mismatch_names_the_parameter():
    other = load_tiny_policy(TinySpec(**{**MINI_TINY, "intermediate_size": 48}))
    with pytest.raises(ConfigError, match=r"parameter 'model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight' has shape"):
        fuse_models(mini_policy(0).model, perturbed(1).model, other.model, FuseSettings())


# ---------------------------------------------------------------- files and the command line

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real 2-step GRPO run of the mini model (checkpoints at steps 1 and 2) and its base folder."""
    from reasonrl.train.trainer import Trainer

    root = tmp_path_factory.mktemp("surge")
    load_tiny_policy(TinySpec(**MINI_TINY)).save(root / "base")
    recipe = mini_recipe(train={"steps": 2, "prompts_per_step": 4, "checkpoint_every": 1, "keep_checkpoints": 3,
                                "micro_batch_size": 8}, eval={"size": 0}, optim={"lr": 1e-2, "warmup_steps": 0},
                         # a length reward: the untrained mini model never answers right, and an
                         # all-zero reward would leave the checkpoints equal to the base
                         rewards=[{"name": "soft_overlong", "max_len": 16, "buffer_len": 14}])
    Trainer(recipe, root / "run").run()
    steps = [AutoModelForCausalLM.from_pretrained(p) for p in
             (root / "base", root / "run/checkpoints/step_000001/model", root / "run/final_model")]
    q = [m.model.layers[0].self_attn.q_proj.weight for m in steps]
    assert not torch.equal(q[0], q[1]) and not torch.equal(q[1], q[2])  # both steps moved the weights
    return root


def test_fuse_writes_a_loadable_hf_folder_with_its_report(run, tmp_path):
    out = tmp_path / "fused"
    info = fuse(str(run / "run" / "checkpoints" / "step_000001"), str(run / "run"), str(run / "base"), out,
                FuseSettings(retain=0.7, gamma=1.0), log=lambda _m: None)
    assert info["resolved"]["anchor"].endswith("step_000001/model")
    assert info["resolved"]["donor"].endswith("run/final_model")
    saved = json.loads((out / FUSE_FILE).read_text())
    assert saved["settings"]["retain"] == 0.7 and saved["matrices"] and saved["summary"]["matrices"] == len(saved["matrices"])
    nonzero = [m for m in saved["matrices"] if m["anchor_norm"] > 0]
    assert nonzero, "every fused matrix has a zero anchor"
    assert all(0 <= m["rank"] <= m["full_rank"] and m["retained_energy"] >= 0.7 for m in nonzero)
    assert [p.name for p in tmp_path.iterdir()] == ["fused"]  # no temporary folder left beside it
    model = AutoModelForCausalLM.from_pretrained(out)
    fused_q = model.model.layers[0].self_attn.q_proj.weight
    anchor_q = AutoModelForCausalLM.from_pretrained(run / "run" / "checkpoints" / "step_000001" / "model")
    assert not torch.equal(fused_q, anchor_q.model.layers[0].self_attn.q_proj.weight)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(["3+4="], return_tensors="pt")
    gen = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.shape[1] > ids["input_ids"].shape[1]


def test_fuse_command_end_to_end_and_its_bad_input(run, tmp_path, capsys):
    step1, final, base = (str(run / "run" / "checkpoints" / "step_000001"), str(run / "run"), str(run / "base"))
    out = tmp_path / "fused"
    assert main(["fuse", step1, final, "--base", base, "--retain", "0.9", "--gamma", "1.0", "-o", str(out)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["output"] == str(out) and line["matrices"] > 0
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    fused = AutoModelForCausalLM.from_pretrained(out)
    anchor = AutoModelForCausalLM.from_pretrained(run / "run" / "checkpoints" / "step_000001" / "model")
    assert torch.equal(fused.model.norm.weight, anchor.model.norm.weight)  # 1-D: the anchor's

    again = main(["fuse", step1, final, "--base", base, "-o", str(out)])
    assert again == 2 and "already exists" in capsys.readouterr().err
    bad = [(["--retain", "1.5"], "retain must be <= 1"), (["--projection", "two"], "Did you mean 'two_sided'"),
           (["--control", "noise"], "'fuse.control' must be one of")]
    for extra, message in bad:
        assert main(["fuse", step1, final, "--base", base, "-o", str(tmp_path / "x"), *extra]) == 2
        assert message in capsys.readouterr().err
    assert main(["fuse", step1, str(tmp_path / "missing"), "--base", base, "-o", str(tmp_path / "x")]) == 2
    assert "donor" in (err := capsys.readouterr().err) and "no such folder" in err
    other = tmp_path / "other"
    load_tiny_policy(TinySpec(**{**MINI_TINY, "intermediate_size": 48})).save(other)
    assert main(["fuse", step1, str(other), "--base", base, "-o", str(tmp_path / "x")]) == 2
    assert "has shape" in capsys.readouterr().err
    assert main(["fuse", step1, str(run / "base" / "config.json"), "--base", base, "-o", str(tmp_path / "x")]) == 2
    assert "a file" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # nothing half-written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused", "other"]


def _cache_validation(out, numbers):
    """Validation numbers of the run's checkpoints, where the sweep's scorer reads its cache, so
    which checkpoint is the anchor and which the donor is fixed by the test, not by chance."""
    (out / "evals").mkdir(parents=True)
    for step, (greedy, length) in numbers.items():
        (out / "evals" / f"ckpt{step}.validation.json").write_text(json.dumps(
            {"model": f"step_{step}", "split": "validation", "problems": 3, "greedy": greedy, "greedy_ci": [0, 1],
             "avg": greedy, "length": length, "per_problem_greedy": [greedy] * 3, "per_problem_avg": [greedy] * 3}))


def test_sweep_chooses_on_validation_and_reports_on_test(run, tmp_path):
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "surge_sweep", Path(__file__).resolve().parents[1] / "benchmarks" / "surge_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sweep
    spec.loader.exec_module(sweep)
    out = tmp_path / "sweep"
    _cache_validation(out, {1: (0.3, 10.0), 2: (0.6, 12.0)})  # step 2 the more accurate, step 1 shorter
    common = ["--base", str(run / "base"), "--gamma", "1", "--size", "3", "--val-size", "3", "--n", "2",
              "--max-new-tokens", "6", "--seed", "1"]
    args = [f"best:{run / 'run'}", f"shorter:{run / 'run'}", "--retain", "0.5", "0.9", "--controls", "random",
            *common, "-o", str(out)]
    assert sweep.main(args) == 0
    report = json.loads((out / "sweep.json").read_text())
    assert report["anchor"].endswith("step_000002/model") and report["donor"].endswith("step_000001/model")
    chosen = report["chosen"]
    assert [r["model"] for r in report["rows"]] == ["anchor", "donor", "r0.5_g1", "r0.9_g1", f"{chosen}_random"]
    cells = report["rows"][2:4]
    assert chosen == max(cells, key=lambda r: (r["validation"]["greedy"], r["validation"]["avg"]))["model"]
    for r in report["rows"]:  # every model scored on both splits, 3 problems each
        assert r["validation"]["problems"] == 3 and r["test"]["problems"] == 3
    # The test split is the task's first held-out problems: the anchor's test greedy is what
    # `reasonrl eval --size 3` reports for it.
    from reasonrl.cli import main as reasonrl

    assert reasonrl(["eval", "--model", report["anchor"], "--task", "arithmetic", "--size", "3", "--n", "2",
                     "--k", "2", "--max-new-tokens", "6", "--seed", "1", "-o", str(tmp_path / "e.json")]) == 0
    direct = json.loads((tmp_path / "e.json").read_text())["arithmetic"]["metrics"]
    assert report["rows"][0]["test"]["greedy"] == direct["greedy"]["mean"]
    assert report["rows"][0]["test"]["avg"] == direct["avg@2"]["mean"]
    s, a, d = (next(r for r in report["rows"] if r["model"] == m)["test"] for m in (chosen, "anchor", "donor"))
    assert report["verdict"] == {"beats_both": s["greedy"] > max(a["greedy"], d["greedy"]),
                                 "shorter_than_anchor": s["length"] < a["length"]}
    control = json.loads((out / "models" / f"{chosen}_random" / FUSE_FILE).read_text())["settings"]
    assert control["control"] == "random" and control["retain"] == report["settings"]["retain"]
    assert sorted(p.name for p in (out / "report").iterdir()) == ["anchor-s1", "donor-s1", "surge-s1", "surge_random-s1"]
    assert "**SURGE** (chosen)" in (out / "sweep.md").read_text()

    with pytest.raises(SystemExit, match="the donor must be a checkpoint of the anchor's run"):
        sweep.main([f"best:{run / 'run'}", f"shorter:{tmp_path}", *common, "-o", str(tmp_path / "x")])
    other = tmp_path / "none_shorter"
    _cache_validation(other, {1: (0.3, 14.0), 2: (0.6, 12.0)})  # the best checkpoint is also the shortest
    with pytest.raises(SystemExit, match="no checkpoint of the run answers shorter than the anchor ckpt2"):
        sweep.main([f"best:{run / 'run'}", f"shorter:{run / 'run'}", *common, "-o", str(other)])


def test_eval_loads_a_checkpoint_folder_as_its_model(run):
    # `reasonrl eval --model runs/X/checkpoints/step_N` (and the sweep) read the checkpoint's model/
    from reasonrl.policy.factory import load_for_eval

    policy = load_for_eval(str(run / "run" / "checkpoints" / "step_000001"))
    saved = AutoModelForCausalLM.from_pretrained(run / "run" / "checkpoints" / "step_000001" / "model")
    final = AutoModelForCausalLM.from_pretrained(run / "run" / "final_model")
    name = "model.layers.0.self_attn.q_proj.weight"
    got = dict(policy.model.named_parameters())[name]
    assert torch.equal(got, dict(saved.named_parameters())[name])
    assert not torch.equal(got, dict(final.named_parameters())[name])
