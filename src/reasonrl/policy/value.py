"""A value model for PPO's critic: a causal LM's decoder stack with a scalar head.

V(s_t) is read at the position that predicts completion token t, the same positions as the
policy's log-probs (the prompt's last token gives the value of the first completion token),
as verl's critic reads ``values[:, -response_length - 1:-1]``. The head starts at zero, so a
new critic predicts V = 0 everywhere and its first updates fit the returns' scale rather than
undo a random one.

Two ways to get one (``critic.model`` in the recipe): a copy of the policy's weights (the
common choice, PPO as in InstructGPT and verl's default of initialising the critic from the
actor), or a separate, usually smaller, model that shares the policy's tokenizer.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.sampling import position_ids_from_mask

__all__ = ["ValueModel", "value_model_from_policy", "value_model_from"]


class ValueModel(nn.Module):
    """``backbone`` (a transformers decoder stack returning ``last_hidden_state``) + a linear head."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        dtype = next(backbone.parameters()).dtype
        self.head = nn.Linear(hidden_size, 1, dtype=dtype, device=next(backbone.parameters()).device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                completion_mask: Tensor) -> Tensor:
        """V(s_t) for every completion position, ``[B, T]`` float32 (zero outside the mask)."""
        t = completion_ids.shape[1]
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
        hidden = self.backbone(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                               use_cache=False).last_hidden_state
        values = self.head(hidden[:, -t - 1:-1]).squeeze(-1).float()
        return torch.where(completion_mask.bool(), values, 0.0)


def _decoder_stack(model: nn.Module) -> tuple[nn.Module, int]:
    from reasonrl.policy.lora import is_peft

    if is_peft(model):  # the critic learns in full: fold the adapters into its own copy
        model = model.merge_and_unload()
    backbone = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if backbone is None or backbone is model:
        raise ValueError(f"cannot find the decoder stack of {type(model).__name__} for a value head "
                         "(expected a transformers *ForCausalLM with a base model)")
    return backbone, model.config.hidden_size


def value_model_from_policy(policy: HFPolicy) -> ValueModel:
    """A value model on a copy of ``policy``'s weights (the LM head is not used)."""
    backbone, hidden = _decoder_stack(copy.deepcopy(policy.model))
    backbone.requires_grad_(True)
    return ValueModel(backbone, hidden)


def value_model_from(other: HFPolicy, student: HFPolicy) -> ValueModel:
    """A value model on a separately built model, which must read ``student``'s token ids."""
    from reasonrl.policy.teacher import check_shared_vocabulary

    check_shared_vocabulary(student.tokenizer, other.tokenizer, role="critic")
    backbone, hidden = _decoder_stack(other.model)
    backbone.requires_grad_(True)
    return ValueModel(backbone.to(student.device), hidden)
