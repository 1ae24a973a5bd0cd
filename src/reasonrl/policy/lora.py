"""LoRA adapters through PEFT, and the weight I/O that differs with them."""

from __future__ import annotations

from pathlib import Path

from reasonrl.sections import LoraConfig


def apply_lora(model, cfg: LoraConfig):
    try:
        import peft
    except ImportError as exc:
        raise ImportError("model.lora needs PEFT: pip install 'reasonrl[lora]'") from exc
    config = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                             target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config)


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def base_model(model):
    """The transformers model under a PEFT wrapper (its LoRA layers sit inside its modules), or
    ``model`` itself when it has none."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def other_adapters(model) -> bool:
    """Whether ``model`` carries a PEFT adapter other than LoRA (prompt or prefix tuning act on
    the inputs or the KV cache, outside the modules a hand-written forward calls)."""
    return any(getattr(c, "peft_type", None) != "LORA" for c in getattr(model, "peft_config", {}).values())


def adapter_state(model) -> dict:
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_adapter_state(model, state: dict) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"adapter weights do not fit the model: unexpected keys {unexpected[:5]}")


def save_merged(model, tokenizer, path: Path) -> None:
    """Base weights with the adapters folded in: a plain model ``from_pretrained`` loads."""
    import copy

    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
