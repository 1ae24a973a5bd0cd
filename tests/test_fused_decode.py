"""The fused Llama decode step (``rollout.decoder: fused``) and the inverse-CDF draw.

The sampling contracts (masks, stop strings, compaction, partial rollouts, pad == EOS) run for
both decoders in the conformance suite and ``test_sampler_levers.py``; here: the step's logits
against transformers' own decode, the draw's distribution, and what it refuses."""

import pytest
import torch

from reasonrl.config import ConfigError, LoraConfig, ModelConfig
from reasonrl.policy.fused_decode import (FusedLlamaDecoder, HFDecoder, direct_step_unsupported, fused_unsupported,
                                         int8_weight_levels)
from reasonrl.policy.sampling import _draw_inverse_cdf, position_ids_from_mask

from helpers import MINI_TINY, gqa_policy, mini_policy


ATOL_BF16 = 0.25


# Prompts of different lengths; the second set shares an 18-token prefix, which the prefill runs
# once (reasonrl.policy.prefix), so the decode steps continue a cache with a hole in its mask.
PROMPT_SETS = {"own": ["1+2;", "(12+3)*4;", "7;"],
               "shared-prefix": ["1+1=2;2+2=4;3+3=6;1+2;", "1+1=2;2+2=4;3+3=6;(12+3)*4;", "1+1=2;2+2=4;3+3=6;7;"]}


@pytest.mark.parametrize("prompts", list(PROMPT_SETS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "autocast"])
def test_fused_step_equals_transformers_decode(dtype, prompts):
    """Prefill, decode steps over left-padded prompts of different lengths, a compaction and more
    steps: the logits equal transformers' decode up to float rounding (products in another order).
    ``autocast``: a float32 model under bf16 autocast, as a ``train.precision: bf16`` policy
    samples itself (its products return bf16)."""
    from reasonrl.policy.tiny import load_tiny_policy

    pol = load_tiny_policy()  # trained: logits of size ~10, so a wrong term would show
    model = pol.model.to(torch.float32 if dtype == "autocast" else dtype).eval()
    ids, mask = pol.encode_prompts(PROMPT_SETS[prompts])
    ref, fused = HFDecoder(model), FusedLlamaDecoder(model)
    # Under autocast the scores, too, are rounded to bf16 (transformers' sdpa and the fused
    # products alike, in other orders): one logit of 132 differed by 0.37 before this decoder's
    # grouped prompt attention as after it.
    atol = {torch.float32: 1e-4, torch.bfloat16: ATOL_BF16, "autocast": 2 * ATOL_BF16}[dtype]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "autocast"):
        (a, a_mask, a_last), (b, b_mask, b_last) = ref.prefill(ids, mask, 2, 12), fused.prefill(ids, mask, 2, 12)
        torch.testing.assert_close(b, a)
        assert torch.equal(a_mask, b_mask) and torch.equal(a_last, b_last)
        assert torch.equal(a_last, position_ids_from_mask(mask)[:, -1])  # the prompts' own last positions
        # The shared prefix sits at the left of every row of the layout, then a hole, then the suffix.
        assert torch.equal(a_mask, mask) == (prompts == "own")
        mask, pos = a_mask.repeat_interleave(2, 0), a_last.unsqueeze(1).repeat_interleave(2, 0) + 1
        gen = torch.Generator().manual_seed(0)
        compared = 0
        for t in range(10):
            tok = torch.randint(0, len(pol.tokenizer), (mask.shape[0],), generator=gen)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
            a, b = ref.step(tok, mask, pos), fused.step(tok, mask, pos)
            torch.testing.assert_close(b.float(), a.float(), atol=atol, rtol=0)
            assert a.float().abs().max() > 3  # real logits, not a near-uniform pass
            compared += 1
            pos = pos + 1
            if t == 4:  # compaction: rows 1, 2 and 5 leave the batch
                keep = torch.tensor([0, 3, 4])
                ref.select(keep), fused.select(keep)
                mask, pos = mask[keep], pos[keep]
    assert compared == 10


@pytest.mark.parametrize("prompts", list(PROMPT_SETS))
def test_grouped_prompt_attention_equals_transformers_decode_with_grouped_heads(prompts):
    """The fused step reads each prompt's keys once for its G rows (``_by_prompt``): with grouped
    key/value heads (2 query heads a key head, as SmolLM2's 3 a head), G = 4 rows a prompt, and a
    compaction that leaves groups of 3, 1 and 2 rows, its logits are transformers' decode's. The
    attention is made sharp (queries and keys scaled up) and the head loud, so that a row reading
    another prompt's keys, or another head's, moves the logits by far more than the tolerance."""
    pol = gqa_policy(seed=3)
    model = pol.model.eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
        model.lm_head.weight.mul_(30.0)
    ids, mask = pol.encode_prompts(PROMPT_SETS[prompts])
    g = 4
    ref, fused = HFDecoder(model), FusedLlamaDecoder(model)
    with torch.no_grad():
        (a, a_mask, a_last), (b, _, _) = ref.prefill(ids, mask, g, 12), fused.prefill(ids, mask, g, 12)
        torch.testing.assert_close(b, a)
        mask, pos = a_mask.repeat_interleave(g, 0), a_last.unsqueeze(1).repeat_interleave(g, 0) + 1
        gen = torch.Generator().manual_seed(0)
        for t in range(9):
            tok = torch.randint(0, len(pol.tokenizer), (mask.shape[0],), generator=gen)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
            a, b = ref.step(tok, mask, pos), fused.step(tok, mask, pos)
            torch.testing.assert_close(b, a, atol=2e-4, rtol=0)
            assert a.std(-1).min() > 1.0  # loud logits
            pos = pos + 1
            if t == 3:  # prompt 0 keeps rows 0, 1, 3; prompt 1 keeps row 6; prompt 2 keeps rows 8, 11
                keep = torch.tensor([0, 1, 3, 6, 8, 11])
                ref.select(keep), fused.select(keep)
                mask, pos = mask[keep], pos[keep]
    assert a.shape[0] == 6


def test_inverse_cdf_draws_the_distribution_and_never_a_zero():
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0], [0.1, 0.1, 0.1, 0.1, 0.6]])
    gen = torch.Generator().manual_seed(0)
    live = torch.arange(3)
    draws = torch.stack([_draw_inverse_cdf(probs, live, 3, gen, {}) for _ in range(20000)])  # [draws, rows]
    for row in range(3):
        freq = torch.bincount(draws[:, row], minlength=5).double() / len(draws)
        torch.testing.assert_close(freq, probs[row].double(), atol=0.012, rtol=0)  # ~3.5 sd at n = 20000
        assert (freq[probs[row] == 0] == 0).all()


def test_inverse_cdf_gives_live_rows_their_full_batch_tokens():
    """After compaction the live rows draw with the uniforms they would have had in the full batch."""
    probs = torch.softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(1)), -1)
    full = _draw_inverse_cdf(probs, torch.arange(6), 6, torch.Generator().manual_seed(5), {})
    live = torch.tensor([1, 4, 5])
    part = _draw_inverse_cdf(probs[live], live, 6, torch.Generator().manual_seed(5), {})
    assert torch.equal(part, full[live])


def test_fused_decoder_merges_lora_adapters_into_its_weights():
    """With LoRA the fused step samples from the adapted model: its logits equal transformers'
    decode through the PEFT layers (B set non-zero: PEFT starts it at 0, which would hide a
    decoder that ignored the adapters), and differ from the base model's."""
    from reasonrl.policy.factory import build_policy

    pol = build_policy(ModelConfig(backend="tiny", tiny=dict(MINI_TINY), lora=LoraConfig(r=4)), decoder="fused")
    model = pol.model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    ids, mask = pol.encode_prompts(PROMPT_SETS["own"])
    tok = torch.tensor([5, 9, 11, 3, 7, 2])
    with torch.no_grad():
        ref, fused = HFDecoder(model), FusedLlamaDecoder(model)
        a, b = ref.prefill(ids, mask, 2, 4), fused.prefill(ids, mask, 2, 4)
        torch.testing.assert_close(b[0], a[0])  # the prefill: the model's own forward in both
        mask2 = torch.cat([a[1].repeat_interleave(2, 0), torch.ones(6, 1, dtype=a[1].dtype)], -1)
        pos = a[2].unsqueeze(1).repeat_interleave(2, 0) + 1
        adapted = ref.step(tok, mask2, pos)
        torch.testing.assert_close(fused.step(tok, mask2, pos), adapted, atol=1e-4, rtol=0)
        with model.disable_adapter():
            base = FusedLlamaDecoder(model)
            base.prefill(ids, mask, 2, 4)
            plain = base.step(tok, mask2, pos)
    assert (plain - adapted).abs().max() > 0.1  # the adapters matter, and the fused step applied them


def test_fused_decoder_refuses_what_it_cannot_merge_and_names_the_fix():
    from peft import LoraConfig as PeftLora, get_peft_model

    dora = get_peft_model(mini_policy().model, PeftLora(r=4, target_modules=["q_proj"], use_dora=True))
    assert "DoRA" in fused_unsupported(dora)
    emb = get_peft_model(mini_policy().model, PeftLora(r=4, target_modules=["embed_tokens"]))
    assert "LoRA on an embedding" in fused_unsupported(emb)
    plain = mini_policy()
    assert fused_unsupported(plain.model) is None
    plain.model.config.mlp_bias = True
    assert "mlp_bias" in fused_unsupported(plain.model)
    with pytest.raises(ConfigError, match=r"rollout.decoder is 'fused' but config.mlp_bias.*use rollout.decoder: hf"):
        FusedLlamaDecoder(plain.model)


def test_the_int8_step_decodes_over_int8_weights_close_to_the_float_step():
    """``int8=True``: every product runs over prepacked int8 weights; on the trained embedded
    model the next-token distribution stays close to the float step's (with AVX512-VNNI's 127
    weight levels measured 3.3e-3 at most, 1.1e-3 on average; with AVX2's 63 levels 0.072 and
    2.8e-3, where 127 levels saturated to 0.74 and 0.031) with the same greedy token, yet is not
    the same."""
    from reasonrl.policy.tiny import load_tiny_policy

    pol = load_tiny_policy()
    model = pol.model.eval()
    ids, mask = pol.encode_prompts(PROMPT_SETS["own"])
    ref, int8 = FusedLlamaDecoder(model), FusedLlamaDecoder(model, int8=True)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        (a, _, last), (b, _, _) = ref.prefill(ids, mask, 2, 12), int8.prefill(ids, mask, 2, 12)
        torch.testing.assert_close(b, a)  # the prefill is the model's own forward
        assert isinstance(int8.head, torch.ScriptObject) and all(isinstance(w, torch.ScriptObject)
                                                                 for layer in int8.packed for w in layer)
        pos = last.unsqueeze(1).repeat_interleave(2, 0) + 1
        differs, kls = 0.0, []
        for _ in range(10):
            tok = torch.randint(0, len(pol.tokenizer), (6,), generator=gen)
            x, y = torch.log_softmax(ref.step(tok, None, pos), -1), torch.log_softmax(int8.step(tok, None, pos), -1)
            kls.append((x.exp() * (x - y)).sum(-1))
            assert torch.equal(x.argmax(-1), y.argmax(-1))
            differs = max(differs, float((x - y).abs().max()))
            pos = pos + 1
    kls = torch.cat(kls)
    assert float(kls.max()) < (0.05 if int8_weight_levels() == 127 else 0.1) and float(kls.mean()) < 5e-3
    assert differs > 1e-3  # int8 weights, not the float ones


def test_int8_sampling_needs_the_fused_decoder_and_a_cpu():
    from reasonrl.config import recipe_from_dict
    from reasonrl.policy.fused_decode import FUSED_INT8

    with pytest.raises(ConfigError, match="rollout.dtype: int8 is the fused decode step over int8 weights: set "
                                          "rollout.decoder: fused"):
        recipe_from_dict({"rollout": {"dtype": "int8"}}, "test recipe")
    with pytest.raises(ValueError, match="decodes with the fused step; this policy's decoder is 'hf'"):
        mini_policy().sampling_copy("int8")
    twin = mini_policy(decoder="fused").sampling_copy("int8")
    assert twin.decoder == FUSED_INT8 and twin.model.dtype == torch.float32
    s = twin.sample(["1+2;"], 4, 6, generator=torch.Generator().manual_seed(0))
    assert s.completion_ids.shape[0] == 4 and (s.sample_logprobs[s.completion_mask.bool()] < 0).all()
    meta = mini_policy(decoder="fused")
    meta.model.to("meta")
    with pytest.raises(ConfigError, match="rollout.dtype: int8 runs torch's CPU int8 kernels .* the model is on meta"):
        FusedLlamaDecoder(meta.model, int8=True)


def test_recipe_key_reaches_the_sampler_and_its_bf16_copy():
    from reasonrl.config import recipe_from_dict

    with pytest.raises(ConfigError, match="rollout.decoder"):
        recipe_from_dict({"rollout": {"decoder": "vllm"}}, "test recipe")
    pol = mini_policy(decoder="fused")
    twin = pol.sampling_copy("bfloat16")
    assert twin.decoder == "fused"
    s = twin.sample(["1+2;"], 4, 6, generator=torch.Generator().manual_seed(0))
    assert s.completion_ids.shape[0] == 4 and (s.sample_logprobs[s.completion_mask.bool()] < 0).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_a_fused_low_precision_run_trains_and_resumes_exactly(tmp_path, monkeypatch, dtype):
    """The recipe key reaches the trainer's sampler (a bf16 copy, or a copy decoding over int8
    weights, so the behaviour policy is explicit) and a crash + resume in this mode equals the
    straight run."""
    from reasonrl.metrics_log import read_metrics
    from reasonrl.train.trainer import Trainer
    from safetensors.torch import load_file

    from helpers import crash_at_step, mini_recipe

    recipe = mini_recipe(rollout={"decoder": "fused", "dtype": dtype},
                         off_policy={"name": "tis", "level": "token", "cap": 2.0})
    prefills = []
    real_prefill = FusedLlamaDecoder.prefill
    monkeypatch.setattr(FusedLlamaDecoder, "prefill", lambda self, *a: prefills.append((self.model.dtype, self.int8))
                        or real_prefill(self, *a))
    Trainer(recipe, tmp_path / "a", log=lambda m: None).run()
    # training rollouts: the bf16 sampler, or the fp32 copy with int8 weights; fused either way
    assert ((torch.bfloat16, False) if dtype == "bfloat16" else (torch.float32, True)) in prefills
    monkeypatch.undo()
    with crash_at_step(monkeypatch, 2):
        Trainer(recipe, tmp_path / "b", log=lambda m: None).run()
    Trainer(recipe, tmp_path / "b", resume=True, log=lambda m: None).run()
    rows = [[{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_metrics(tmp_path / d)]
            for d in "ab"]
    assert rows[0] == rows[1]
    assert any("offpolicy/kl_behaviour" in r for r in rows[0])  # the sampler's mismatch is measured
    wa, wb = (load_file(str(tmp_path / d / "final_model" / "model.safetensors")) for d in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_lora_run_samples_with_the_fused_decoder_from_its_current_adapters(tmp_path, monkeypatch):
    """In a LoRA run the fused sampler repacks at every sampling call, so it samples from the
    adapters the learner just updated (the packed head changes from one step to the next)."""
    from reasonrl.train.trainer import Trainer

    from helpers import mini_recipe

    heads = []
    real_reload = FusedLlamaDecoder.reload
    monkeypatch.setattr(FusedLlamaDecoder, "reload",
                        lambda self: real_reload(self) or heads.append(self.packed[0][0].to_dense().clone()
                                                                      if self.packed[0][0].is_mkldnn else
                                                                      self.packed[0][0].clone()))
    # The embedded trained model ("tiny": {}): rewards vary within groups, so the adapters move.
    recipe = mini_recipe(model={"tiny": {}, "lora": {"r": 4}}, rollout={"decoder": "fused"}, train={"steps": 3},
                         optim={"lr": 1e-2}, eval={"size": 2})
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 3 and len(heads) >= 3
    assert not torch.equal(heads[0], heads[-1])  # layer 0's q/k/v moved with the adapters


def _decode_both(model, ids, mask, steps=8, g=2, compact_at=3):
    """The logits of transformers' forward and of the direct step, step by step over the same
    random tokens, with a compaction; returns how many steps were compared."""
    ref, direct = HFDecoder(model, direct=False), HFDecoder(model)
    assert direct.direct and not ref.direct
    with torch.no_grad():
        (a, layout, last), (b, _, _) = ref.prefill(ids, mask, g, steps + 1), direct.prefill(ids, mask, g, steps + 1)
        assert torch.equal(a, b)
        mask, pos = layout.repeat_interleave(g, 0), last.unsqueeze(1).repeat_interleave(g, 0) + 1
        gen = torch.Generator().manual_seed(1)
        for t in range(steps):
            tok = torch.randint(0, model.config.vocab_size, (mask.shape[0],), generator=gen)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
            a, b = ref.step(tok, mask, pos), direct.step(tok, mask, pos)
            assert torch.equal(a, b), f"step {t}: {(a.float() - b.float()).abs().max()}"
            pos = pos + 1
            if t == compact_at:
                keep = torch.tensor([0, 2, 3])
                ref.select(keep), direct.select(keep)
                mask, pos = mask[keep], pos[keep]
    return steps


@pytest.mark.parametrize("prompts", [*PROMPT_SETS, "no-padding"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_direct_step_gives_transformers_logits_to_the_bit(dtype, prompts):
    """``HFDecoder``'s direct step (the default ``hf`` decode step of a Llama on CPU) against
    ``model(...)``: the same logits bit for bit over left-padded prompts, a shared prefix (a hole in
    the mask), prompts without padding (transformers passes no mask then), and a compaction."""
    from reasonrl.policy.tiny import load_tiny_policy

    pol = load_tiny_policy()
    model = pol.model.to(dtype).eval()
    texts = ["1+2;", "3+4;", "5*6;"] if prompts == "no-padding" else PROMPT_SETS[prompts]
    ids, mask = pol.encode_prompts(texts)
    assert bool(mask.all()) == (prompts == "no-padding")
    assert _decode_both(model, ids, mask) == 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_direct_step_with_grouped_heads_gives_transformers_logits_to_the_bit(dtype):
    model = gqa_policy().model.to(dtype).eval()  # on reasonrl's attention function, as HFPolicy sets it up
    ids = torch.randint(1, model.config.vocab_size, (3, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :3] = mask[2, :1] = 0
    assert _decode_both(model, ids, mask) == 8


def test_direct_step_runs_the_lora_layers_and_their_hooks():
    """A PEFT LoRA model: the direct step calls the adapted projections (logits equal to the PEFT
    forward to the bit, and unlike the base model's), so forward hooks on those layers (LoGRA's)
    still see every decode step."""
    from reasonrl.policy.factory import build_policy

    pol = build_policy(ModelConfig(backend="tiny", tiny=dict(MINI_TINY), lora=LoraConfig(r=4)))
    model = pol.model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    calls = []
    q_proj = model.get_base_model().model.layers[0].self_attn.q_proj
    q_proj.register_forward_hook(lambda *_: calls.append(1))
    assert direct_step_unsupported(model) is None
    ids, mask = pol.encode_prompts(PROMPT_SETS["own"])
    assert _decode_both(model, ids, mask, steps=4) == 4
    assert len(calls) == 2 * (1 + 4)  # the two prefills and each decoder's 4 steps
    with torch.no_grad():
        direct = HFDecoder(model)
        last, layout, pos = direct.prefill(ids, mask, 1, 2)
        tok = last.argmax(-1)
        step_mask = torch.cat([layout, torch.ones_like(layout[:, :1])], -1)
        adapted = direct.step(tok, step_mask, pos.unsqueeze(1) + 1)
        with model.disable_adapter():
            base = HFDecoder(model)
            base.prefill(ids, mask, 1, 2)
            plain = base.step(tok, step_mask, pos.unsqueeze(1) + 1)
    assert (plain - adapted).abs().max() > 0.1


def test_direct_step_steps_aside_where_it_would_not_be_transformers_forward():
    """Every model it cannot reproduce runs ``model(...)``, with the reason."""
    from peft import PrefixTuningConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    assert direct_step_unsupported(mini_policy().model) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=30))
    assert "LlamaForCausalLM" in direct_step_unsupported(gpt2)
    assert HFDecoder(gpt2).direct is False
    eager = mini_policy().model
    eager.set_attn_implementation("eager")
    assert "'eager'" in direct_step_unsupported(eager)
    hooked = mini_policy().model
    hooked.model.layers[1].register_forward_hook(lambda *_: None)
    assert "LlamaDecoderLayer" in direct_step_unsupported(hooked)
    prefix = get_peft_model(mini_policy().model, PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    assert "other than LoRA" in direct_step_unsupported(prefix)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *_: None)
    try:
        assert "every module" in direct_step_unsupported(mini_policy().model)
    finally:
        handle.remove()
