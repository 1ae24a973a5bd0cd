"""LoRA through PEFT on the embedded model: only adapters train, save/load/merge round trips."""

import torch
from transformers import AutoModelForCausalLM

from reasonrl.config import LoraConfig
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.lora import apply_lora, save_merged
from reasonrl.train.trainer import Trainer

from reasonrl.policy.tiny import TinySpec, load_tiny_policy

from helpers import MINI_TINY, mini_policy, mini_recipe

PROMPTS = ["(3+4)*5;", "1+2*3;"]


def lora_policy(seed=0) -> HFPolicy:
    pol = mini_policy(seed)
    pol.model = apply_lora(pol.model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    return pol


def perturb_adapters(pol):
    # PEFT initialises B = 0, so a fresh adapter is a no-op; give it something to carry.
    with torch.no_grad():
        for name, p in pol.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)


def logprobs(pol, s):
    with torch.no_grad():
        return pol.completion_logprobs(s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)[0]


def test_only_adapters_train():
    pol = lora_policy()
    trainable = [n for n, p in pol.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert len(list(pol.parameters())) == len(trainable)


def test_save_load_and_merge_round_trip(tmp_path):
    pol = lora_policy()
    perturb_adapters(pol)
    s = pol.sample(PROMPTS, 2, 8, generator=torch.Generator().manual_seed(0))
    reference = logprobs(pol, s)
    pol.save(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()  # adapters only

    again = lora_policy()
    assert not torch.equal(logprobs(again, s), reference)
    again.load_weights(tmp_path / "adapter")
    torch.testing.assert_close(logprobs(again, s), reference, atol=0, rtol=0)

    save_merged(pol.model, pol.tokenizer, tmp_path / "merged")
    merged = HFPolicy(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"), pol.tokenizer)
    torch.testing.assert_close(logprobs(merged, s), reference, atol=1e-5, rtol=1e-5)


def test_trainer_with_lora_changes_adapters_only_and_writes_merged(tmp_path):
    recipe = mini_recipe(model={"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
                                "save_merged": True},
                         loss={"entropy_coef": 0.1}, train={"steps": 2})
    trainer = Trainer(recipe, tmp_path / "run", log=lambda m: None)
    trainer.run()
    trained = {n.removeprefix("base_model.model.").replace(".base_layer", ""): p
               for n, p in trainer.policy.model.named_parameters() if "lora_" not in n}
    before = load_tiny_policy(TinySpec(**MINI_TINY)).model.named_parameters()
    for name, p in before:
        assert torch.equal(trained[name], p), name  # frozen base weights untouched
    moved = [p for n, p in trainer.policy.model.named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in moved)  # B started at 0: the adapters trained
    assert (tmp_path / "run" / "final_model" / "adapter_config.json").is_file()
    assert (tmp_path / "run" / "final_model" / "merged" / "config.json").is_file()
    ckpt = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    assert (ckpt / "model" / "adapter_model.safetensors").is_file()
