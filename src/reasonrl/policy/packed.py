"""The training forward as one packed sequence (``train.length_buckets: 0``).

The shared-prompt forward (``HFPolicy.completion_logprobs``, ``reasonrl.policy.prefix``) runs the
prompts' common prefix, each prompt's suffix and the completions as three forwards, each padded
to its own longest row. Packed, the same tokens are laid end to end in one sequence without any
padding::

    [ prefix | suffix 0 | suffix 1 | ... | completion 0 | completion 1 | ... ]

each completion cut after its last attended token, every token at the position it has in its
own row (a suffix continues the prefix, a completion its prompt). Every product over the weights
then runs once, over all the step's real tokens (on SmolLM2 at 2 prompts x 4 completions: one
product over ~570 rows instead of three over ~175-200, which run nearer the matmul peak), and
the embedding's gradient is one dense table instead of one per forward.

Attention is not one dense masked product over the whole sequence (quadratic in its length:
slower than the three forwards' already at 570 tokens, 27 ms against 11 ms a layer); it runs per
segment, as the three forwards do: the prefix causally over itself, each suffix over the prefix
and itself, each completion over the prefix, its prompt's suffix and itself
(:func:`packed_attention`, which ``reasonrl.policy.attention.sdpa_gqa`` calls when the forward
carries a layout). The result equals the three forwards up to float rounding (the same keys,
values and positions for every token). In half precision on a CPU a segment's attention is
:func:`grouped_attention` (two products and a softmax) instead of torch's flash kernel, whose
backward was the slower part of the learner's attention at these segment lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from reasonrl.policy.prefix import MIN_SHARED_PREFIX, common_prefix, completion_lengths

__all__ = ["PACKED_KWARG", "PackedLayout", "pack", "packed_attention", "grouped_attention"]

# The keyword a packed forward hands its layout down with: transformers passes a model's extra
# keyword arguments through the decoder layers to the attention function.
PACKED_KWARG = "reasonrl_packed"


@dataclass
class PackedLayout:
    """Where every token of a packed forward sits. ``L`` packed tokens; ``G`` distinct prompts
    with their common prefix of ``c`` tokens and suffixes padded (on the right) to ``S``; ``N``
    completion rows padded to ``W``. Padded slots repeat a real token's index: their outputs are
    computed and never read, so they add nothing to any gradient."""

    ids: Tensor  # [1, L] token ids
    positions: Tensor  # [1, L] each token's position in its own row
    prefix: int  # c
    suffix_q: Tensor  # [G, S] packed index of each suffix slot
    suffix_k: Tensor  # [G, c + S] the keys a suffix reads: the prefix, then its own slots
    suffix_mask: Tensor  # [G, 1, S, c + S] True where a query may attend
    completion_q: Tensor  # [N, W]
    completion_k: Tensor  # [N, c + S + W] the prefix, its prompt's suffix, its own slots
    completion_mask: Tensor  # [N, 1, W, c + S + W]
    back: Tensor  # [L] where token l's output sits in [prefix | suffix slots | completion slots]
    keep: Tensor  # [K] the packed positions whose logits are needed (distinct)
    predict: Tensor  # [P] for each real completion token, its row in the kept logits
    targets: Tensor  # [P] that token's id
    dest: Tensor  # [P] its flat index in an [N, T] table


def pack(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor,
         inverse: Tensor, min_prefix: int = MIN_SHARED_PREFIX) -> PackedLayout:
    """The packed layout of distinct left-padded prompts ``[G, Wp]`` and completions ``[N, T]``
    whose row ``r`` continues prompt ``inverse[r]``. Each completion keeps its tokens up to its
    last attended one (at least one); tokens inside that span with mask 0 stay as queries and
    are masked as keys, as in the padded forward."""
    dev = prompt_ids.device
    g_count, width = prompt_ids.shape
    n, t = completion_ids.shape
    lengths = prompt_mask.ne(0).sum(1)
    c = common_prefix(prompt_ids, prompt_mask, min_prefix)
    starts = width - lengths  # each prompt's first real column (left padding)
    suffix_len = lengths - c
    s = int(suffix_len.max())
    w_len = completion_lengths(completion_mask).clamp(min=1)
    w = int(w_len.max())

    # Packed order: prefix, the suffixes one after another, then the completions.
    suffix_start = c + torch.cat([suffix_len.new_zeros(1), suffix_len.cumsum(0)[:-1]])
    comp_base = c + int(suffix_len.sum())
    comp_start = comp_base + torch.cat([w_len.new_zeros(1), w_len.cumsum(0)[:-1]])
    length = comp_base + int(w_len.sum())

    col_s = torch.arange(s, device=dev)
    col_w = torch.arange(w, device=dev)
    real_s = col_s[None] < suffix_len[:, None]  # [G, S]
    real_w = col_w[None] < w_len[:, None]  # [N, W]
    # Padded slots point at the segment's first token (real: every segment has >= 1 token).
    suffix_q = suffix_start[:, None] + torch.where(real_s, col_s[None], 0)
    completion_q = comp_start[:, None] + torch.where(real_w, col_w[None], 0)

    ids = torch.empty(length, dtype=prompt_ids.dtype, device=dev)
    positions = torch.empty(length, dtype=torch.long, device=dev)
    if c:
        first = int(starts[0])
        ids[:c] = prompt_ids[0, first: first + c]
        positions[:c] = torch.arange(c, device=dev)
    src_col = (starts + c)[:, None] + col_s[None]  # [G, S] the suffix slot's prompt column
    ids[suffix_q[real_s]] = prompt_ids.gather(1, src_col.clamp(max=width - 1))[real_s]
    positions[suffix_q[real_s]] = (c + col_s[None].expand(g_count, s))[real_s]
    ids[completion_q[real_w]] = completion_ids[:, :w][real_w]
    positions[completion_q[real_w]] = (lengths[inverse][:, None] + col_w[None])[real_w]

    prefix_idx = torch.arange(c, device=dev)
    suffix_k = torch.cat([prefix_idx[None].expand(g_count, c), suffix_q], dim=1)
    causal_s = col_s[None, :] <= col_s[:, None]  # [S, S] query i reads key j <= i
    suffix_mask = torch.cat([torch.ones(g_count, s, c, dtype=torch.bool, device=dev),
                             causal_s[None] & real_s[:, None, :]], dim=2)[:, None]
    completion_k = torch.cat([prefix_idx[None].expand(n, c), suffix_q[inverse], completion_q], dim=1)
    key_ok = completion_mask[:, :w].ne(0) & real_w  # a completion token with mask 0 is no key
    causal_w = col_w[None, :] <= col_w[:, None]
    completion_mask_4d = torch.cat([torch.ones(n, w, c, dtype=torch.bool, device=dev),
                                    real_s[inverse][:, None, :].expand(n, w, s),
                                    causal_w[None] & key_ok[:, None, :]], dim=2)[:, None]

    back = torch.empty(length, dtype=torch.long, device=dev)
    back[:c] = prefix_idx
    back[suffix_q[real_s]] = (c + torch.arange(g_count * s, device=dev).view(g_count, s))[real_s]
    back[completion_q[real_w]] = (c + g_count * s + torch.arange(n * w, device=dev).view(n, w))[real_w]

    # Logits: token 0 of a completion is predicted at its prompt's last token, token i > 0 at
    # the completion's token i - 1.
    suffix_end = suffix_start + suffix_len - 1  # [G]
    inner = real_w & (col_w[None] < (w_len - 1)[:, None])  # slots 0 .. w_r - 2
    keep = torch.cat([suffix_end, completion_q[inner]])
    inner_rank = torch.full((n, w), -1, dtype=torch.long, device=dev)
    inner_rank[inner] = g_count + torch.arange(int(inner.sum()), device=dev)
    predict_table = torch.cat([inverse[:, None], inner_rank[:, :w - 1]], dim=1)  # [N, W]: row r, token i
    predict = predict_table[real_w]
    targets = completion_ids[:, :w][real_w]
    dest = (torch.arange(n, device=dev)[:, None] * t + col_w[None])[real_w]
    return PackedLayout(ids[None], positions[None], c, suffix_q, suffix_k, suffix_mask, completion_q, completion_k,
                        completion_mask_4d, back, keep, predict, targets, dest)


def packed_attention(query: Tensor, key: Tensor, value: Tensor, layout: PackedLayout, dropout: float = 0.0,
                     scaling: float | None = None) -> Tensor:
    """Attention of a packed forward, per segment (see the module docstring): ``query [1, H, L, d]``,
    ``key``/``value`` ``[1, K, L, d]``; returns ``[1, L, H, d]`` (transformers' attention output).
    Query head ``h`` reads key/value head ``h // (H/K)``: inside torch's kernel (``enable_gqa``), or
    in :func:`grouped_attention` where :func:`use_grouped_attention` chooses it."""
    gqa = query.shape[1] != key.shape[1]
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # [L, heads, d]

    def gather(x: Tensor, index: Tensor) -> Tensor:  # [B, X] -> [B, heads, X, d]
        return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:]).transpose(1, 2)

    grouped = use_grouped_attention(query, dropout)

    def attend(qs: Tensor, ks: Tensor, vs: Tensor, mask: Tensor | None) -> Tensor:  # -> [B * X, H, d]
        if grouped:
            out = grouped_attention(qs, ks, vs, mask, scaling)
        else:
            out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                                 is_causal=mask is None, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(-1, *out.shape[1:2], out.shape[-1])

    c = layout.prefix
    parts = []
    if c:
        causal = None if not grouped else torch.ones(c, c, dtype=torch.bool, device=query.device).tril()[None, None]
        parts.append(attend(query[:, :, :c], key[:, :, :c], value[:, :, :c], causal))
    parts.append(attend(gather(q, layout.suffix_q), gather(k, layout.suffix_k), gather(v, layout.suffix_k),
                        layout.suffix_mask))
    parts.append(attend(gather(q, layout.completion_q), gather(k, layout.completion_k), gather(v, layout.completion_k),
                        layout.completion_mask))
    return torch.cat(parts).index_select(0, layout.back)[None]


def use_grouped_attention(query: Tensor, dropout: float) -> bool:
    """Whether :func:`packed_attention` runs :func:`grouped_attention` rather than torch's kernel:
    on a CPU in half precision (the learner under bf16 autocast, whose queries and keys arrive in
    float32 from the rotary embedding and whose products autocast runs in bf16; or a half-precision
    model), where it is faster than the CPU flash kernel at these short segments, its log-probs as
    near float32 and its gradient a little further (docs/scaling.md, "Packed training forward").
    Float32 keeps the kernel, which beats float32 products; dropout needs the kernel; a GPU's
    attention kernels are another matter, not measured."""
    device = query.device.type
    half = (torch.bfloat16, torch.float16)
    autocast = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) in half
    return device == "cpu" and dropout == 0.0 and (query.dtype in half or autocast)


def grouped_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float | None = None) -> Tensor:
    """softmax(q·kᵀ·scale, masked) · v for ``query [B, H, X, d]``, ``key``/``value`` ``[B, K, Y, d]``
    (query head ``h`` reads key head ``h // (H/K)``) and a boolean ``mask`` ``[B, 1, X, Y]`` (True: may
    attend; every query has at least one key). The H/K query heads of a key head are stacked along
    the query axis, so each product is one ``[(H/K)·X, d] × [d, Y]`` per key head without copying the
    keys to every query head; the products run in the inputs' precision (bf16 under bf16 autocast),
    the softmax in float32.

    Against torch's CPU flash kernel on SmolLM2's packed bf16 learner (9 query heads over 3 key
    heads, segments of 30-300 tokens): a forward + backward of the step's batch 0.15-0.3 s faster
    (2.0-2.3 s against 2.2-2.6 s, alternating), log-probs as near float32 (mean |Δ| 2.71e-2
    against 2.70e-2), the gradient's relative distance to float32 0.044 against 0.037: the scores
    are rounded to bf16 before the softmax, where the kernel keeps them in float32. It keeps the
    probabilities for the backward (float32, ~5 MB a layer at that batch)."""
    b, h, x, d = query.shape
    kv, y = key.shape[1], key.shape[2]
    g = h // kv
    scores = torch.matmul(query.reshape(b, kv, g * x, d), key.transpose(-1, -2)).view(b, kv, g, x, y)
    scores = (scores.float() * (d ** -0.5 if scale is None else scale)).masked_fill(~mask[:, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, kv, g * x, y)
    return torch.matmul(probs, value).view(b, h, x, d)
