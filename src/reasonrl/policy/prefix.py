"""Work a forward pass over prompts and completions need not do twice, or at all.

Three layers of sharing, each exact up to float rounding (masked keys get zero attention weight):

* **A common prefix** (:func:`common_prefix`). A few-shot template makes every prompt of a batch
  start with the same tokens (SmolLM2's reasoning-gym recipe: 47 of its 61 prompt tokens).
  :func:`prompt_pass` runs those tokens once, expands their KV cache to the distinct prompts, and
  runs each prompt's own suffix after it, laid out as ``[prefix | left-padded suffix]``: the
  attention mask has a hole between the two, and positions continue the prefix, so every real
  token sees exactly the keys and positions it has in its own left-padded row.
* **A shared prompt** (``train.share_prompt``, verl's "prefix grouper" idea): each distinct prompt
  runs once and its cache is expanded to the rows of its group (``HFPolicy.completion_logits``).
* **Length buckets** (:func:`length_buckets`, ``train.length_buckets``): rows sorted by completion
  length run in a few forwards, each padded only to its own longest completion. Completions end
  at a stop string or EOS at very different lengths (SmolLM2's recipe: 550 real tokens in a
  ``64 × 16`` block), and a padded position costs the same FLOPs as a real one.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

__all__ = ["MIN_SHARED_PREFIX", "common_prefix", "prompt_pass", "length_buckets", "fork_cache", "completion_lengths",
           "cache_kw", "cache_of"]

# transformers 5.2x renamed the KV cache ``past_key_values`` -> ``cache``, as the forward's argument
# and the output's field; pyproject's range admits both (the GPU machine runs 5.17, this one 5.25).
_CACHE_NAME = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_kw(cache) -> dict:
    """The keyword argument that hands ``cache`` to a transformers model's forward."""
    return {_CACHE_NAME: cache}


def cache_of(outputs):
    """The KV cache a transformers forward with ``use_cache=True`` returned."""
    return getattr(outputs, _CACHE_NAME)

# Below this many common tokens one more forward call costs more than the tokens it saves
# (the embedded task's prompts share 0-2 tokens; SmolLM2's few-shot template 47).
MIN_SHARED_PREFIX = 16


def completion_lengths(completion_mask: Tensor) -> Tensor:
    """Each row's length: one past its last attended completion token (0 for an empty row).
    Positions after it are padding; positions before it stay, holes included."""
    width = completion_mask.shape[1]
    positions = torch.arange(1, width + 1, device=completion_mask.device)
    return (completion_mask.ne(0).long() * positions).amax(dim=1) if width else completion_mask.new_zeros(len(completion_mask))


def common_prefix(ids: Tensor, mask: Tensor, min_len: int = MIN_SHARED_PREFIX) -> int:
    """How many leading real tokens every left-padded row of ``ids``/``mask`` shares, at most
    the shortest row's length − 1 (each row keeps a suffix of ≥ 1 token, whose last position
    predicts what follows); 0 when that is under ``min_len`` or there is one row."""
    if ids.shape[0] < 2:
        return 0
    lengths = mask.ne(0).sum(1)
    shortest = int(lengths.min())
    if shortest - 1 < min_len:
        return 0
    width = ids.shape[1]
    # Row i's real tokens start at width - lengths[i] (left padding, contiguous).
    cols = (width - lengths).unsqueeze(1) + torch.arange(shortest - 1, device=ids.device)
    starts = ids.gather(1, cols)
    same = (starts == starts[:1]).all(0).long()
    c = int(same.cumprod(0).sum())
    return c if c >= min_len else 0


def prompt_pass(model, ids: Tensor, mask: Tensor, min_prefix: int = MIN_SHARED_PREFIX):
    """Run the distinct prompts ``ids``/``mask`` ([P, W], left-padded) through ``model`` with
    their common prefix computed once. Returns ``(last_logits [P, V], cache, layout_mask,
    last_pos [P])``: the logits at each prompt's last token, the KV cache over the layout, the
    attention mask that goes with that cache (``[P, W']``; a continuation appends to it), and
    each prompt's last position (a continuation's positions follow it)."""
    c = common_prefix(ids, mask, min_prefix)
    if c == 0:
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], cache_of(out), mask, pos[:, -1]
    lengths = mask.ne(0).sum(1)
    width = ids.shape[1]
    first = int(width - lengths.max())  # the longest row's first real column
    prefix = ids[:1, width - int(lengths[0]): width - int(lengths[0]) + c]
    ones = torch.ones_like(prefix)
    head = model(input_ids=prefix, attention_mask=ones, position_ids=torch.arange(c, device=ids.device)[None],
                 use_cache=True, logits_to_keep=1)
    cache = cache_of(head)
    cache.batch_repeat_interleave(ids.shape[0])
    # Each row's suffix is its real tokens after the prefix, still left-padded (the prefix's
    # columns, now at the far left of each row, are masked out of the suffix block).
    s_ids, s_mask = ids[:, first + c:], mask[:, first + c:].clone()
    real_start = (width - lengths).unsqueeze(1)
    col = torch.arange(first + c, width, device=ids.device).unsqueeze(0)
    s_mask = s_mask * (col >= real_start + c).to(s_mask.dtype)
    layout = torch.cat([torch.ones(ids.shape[0], c, dtype=mask.dtype, device=mask.device), s_mask], dim=1)
    pos = (layout.long().cumsum(-1) - 1).clamp(min=0)[:, c:]
    out = model(input_ids=s_ids, attention_mask=layout, position_ids=pos, **cache_kw(cache), use_cache=True,
                logits_to_keep=1)
    return out.logits[:, -1], cache_of(out), layout, pos[:, -1]


def fork_cache(cache, rows: Tensor):
    """A new cache holding ``rows`` of ``cache`` (an index may repeat), leaving ``cache`` as it
    is, so several continuations can each extend their own rows of one prompt pass; indexing
    keeps the autograd graph, so gradients flow back into the shared pass."""
    fork = copy.copy(cache)
    fork.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in fork.layers:
        _select_rows(layer, rows)
    return fork


def _select_rows(layer, rows: Tensor) -> None:
    """``layer.batch_select_indices(rows)`` through ``index_select`` where the layer holds just
    keys and values: the backward of transformers' ``keys[rows, ...]`` adds the rows' gradients
    into the shared prompt rows with parallel atomic adds on a multi-threaded CPU (in a
    run-dependent order: 40 distinct results in 40 tries at 2 threads), ``index_select``'s backward
    adds them in row order, so a 2-thread run repeats to the bit. Other layer kinds keep their own."""
    if type(layer).batch_select_indices is not DynamicLayer.batch_select_indices:
        layer.batch_select_indices(rows)
    elif layer.get_seq_length() > 0:
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)


def length_buckets(lengths: Tensor, max_buckets: int, overhead: int) -> list[Tensor]:
    """Split rows into at most ``max_buckets`` groups of similar ``lengths`` ([N], ≥ 1) so that
    Σ_b n_b · max_b + overhead · (number of buckets) is least: ``n_b · max_b`` is the bucket's
    padded token count, ``overhead`` what one more forward call costs, in tokens. Returns the
    row indices of each bucket, shortest first (an exact dynamic programme over the sorted
    lengths, O(max_buckets · N²) on N ≤ a micro-batch)."""
    order = torch.argsort(lengths, stable=True)
    ls = lengths[order].tolist()
    n = len(ls)
    k_max = max(1, min(max_buckets, n))
    inf = float("inf")
    # cost[k][i]: the best cost of the first i sorted rows in k buckets; back[k][i]: its last cut.
    cost = [[inf] * (n + 1) for _ in range(k_max + 1)]
    back = [[0] * (n + 1) for _ in range(k_max + 1)]
    cost[0][0] = 0.0
    for k in range(1, k_max + 1):
        for i in range(1, n + 1):
            for j in range(k - 1, i):
                c = cost[k - 1][j] + (i - j) * ls[i - 1] + overhead
                if c < cost[k][i]:
                    cost[k][i], back[k][i] = c, j
    k = min(range(1, k_max + 1), key=lambda kk: (cost[kk][n], kk))
    cuts, i = [], n
    while k > 0:
        j = back[k][i]
        cuts.append((j, i))
        i, k = j, k - 1
    return [order[a:b] for a, b in reversed(cuts)]
