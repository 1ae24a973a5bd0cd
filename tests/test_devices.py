"""Devices (``model.device``), gradient checkpointing and the batch's device rule."""

import pytest
import torch
import yaml

from reasonrl.config import ConfigError, recipe_from_dict
from reasonrl.devices import resolve_device
from reasonrl.policy.factory import build_policy
from reasonrl.sections import ModelConfig

from helpers import run_cli

NO_CUDA = not torch.cuda.is_available()


def test_auto_and_cpu_resolve_to_the_cpu_here_and_bad_specs_name_the_key():
    if NO_CUDA:
        assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    for bad in ("gpu", "cuda:x", "CPU", ""):
        with pytest.raises(ConfigError, match="model.device must be one of auto, cpu, cuda, cuda:N"):
            recipe_from_dict({"model": {"device": bad}})


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device")
def test_a_recipe_asking_for_cuda_without_one_fails_at_load_with_exit_2(tmp_path):
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match=f"model.device is '{spec}' but this machine has no CUDA device"):
            recipe_from_dict({"model": {"device": spec}})
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"model": {"device": "cuda"}, "train": {"steps": 1}}))
    done = run_cli("train", str(path), "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 2
    assert "model.device is 'cuda' but this machine has no CUDA device" in done.stderr
    assert not (tmp_path / "run").exists()


def test_the_policy_lands_on_the_run_device_and_samples_come_back_on_the_cpu():
    policy = build_policy(ModelConfig(device="cpu"))
    assert policy.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in policy.model.parameters())
    samples = policy.sample(["1+2="], 2, 4, generator=torch.Generator().manual_seed(0))
    assert samples.completion_ids.device.type == "cpu" and samples.sample_logprobs.device.type == "cpu"


def grads_and_logprobs(policy, samples, groups):
    policy.model.train()
    policy.model.zero_grad(set_to_none=True)
    logp, entropy = policy.completion_logprobs(samples.prompt_ids, samples.prompt_mask, samples.completion_ids,
                                               samples.completion_mask, groups, with_entropy=True)
    mask = samples.completion_mask.float()
    ((logp * mask).sum() + (entropy * mask).sum()).backward()
    return logp.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters()}


def test_gradient_checkpointing_recomputes_without_changing_logprobs_or_gradients():
    plain = build_policy(ModelConfig(device="cpu"))
    recompute = build_policy(ModelConfig(device="cpu"), gradient_checkpointing=True)
    samples = plain.sample(["12+7=", "3*4="], 4, 10, generator=torch.Generator().manual_seed(1))
    groups = torch.arange(2).repeat_interleave(4)
    recompute.model.train()
    # transformers runs no KV cache under gradient checkpointing: the shared-prompt path steps aside.
    assert recompute.recomputes_activations() and not plain.recomputes_activations()
    a_logp, a_grads = grads_and_logprobs(plain, samples, groups)
    b_logp, b_grads = grads_and_logprobs(recompute, samples, groups)
    assert torch.allclose(a_logp, b_logp, atol=2e-6)
    worst = max(float((a_grads[n] - b_grads[n]).abs().max() / a_grads[n].abs().max().clamp(min=1e-12)) for n in a_grads)
    assert worst < 1e-4
    assert sum(float(g.abs().sum()) for g in a_grads.values()) > 0


def test_bf16_precision_computes_in_bf16_over_fp32_weights_and_keeps_logprobs_fp32():
    messages = []
    fp32 = build_policy(ModelConfig(device="cpu"))
    bf16 = build_policy(ModelConfig(device="cpu"), precision="bf16", log=messages.append)
    assert bf16.autocast is torch.bfloat16 and fp32.autocast is None
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():  # this machine: AVX2 only
        assert any("bf16 matmuls run 7-30x slower than fp32" in m for m in messages)
    samples = fp32.sample(["12+7=", "3*4="], 2, 8, generator=torch.Generator().manual_seed(1))
    seen = []
    hook = bf16.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    args = (samples.prompt_ids, samples.prompt_mask, samples.completion_ids, samples.completion_mask)
    logp_bf16, _ = bf16.completion_logprobs(*args)
    logp_fp32, _ = fp32.completion_logprobs(*args)
    hook.remove()
    assert seen == [torch.bfloat16]  # the matmuls ran in bf16 ...
    assert logp_bf16.dtype == torch.float32 and all(p.dtype == torch.float32 for p in bf16.model.parameters())
    mask = samples.completion_mask.bool()
    gap = float((logp_bf16 - logp_fp32)[mask].abs().max())
    assert 0 < gap < 0.5  # ... so the log-probs differ from fp32's by bf16 rounding, not more
