"""Trie-constrained decoding over a closed label set, and multi-chain rank fusion (CARing, spec §8).

Evaluation of a semantic-ID model (SIDReasoner's step 5): after the prompt (and, with
reasoning, a sampled chain), a beam search that may only follow a prefix trie of the valid
labels' token sequences produces a ranked top-K list, so no output is ever an invalid ID.

Each trie path is a label's tokens followed by EOS, so a label that is a prefix of another
(``I21`` and ``I21.0`` under a BPE tokenizer) is still one complete, distinct path. At every
step the logits of tokens the trie does not allow are set to −inf AFTER the log-softmax over
the full vocabulary (as Hugging Face's ``PrefixConstrainedLogitsProcessor``), so a path's
score is its true log-probability under the model, Σ_t log π(y_t | x, y_<t).

Multi-chain reasoning: ``chains`` reasoning prefixes are sampled freely up to ``think_end``;
each is followed by a constrained beam; the ranked lists are fused by reciprocal rank fusion
(``algos.semantic_ids.reciprocal_rank_fusion``). INFERRED: the spec names one reasoning pass
then a constrained beam; the multi-chain fusion is the issue's.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from reasonrl.methods.caring.semantic_ids import reciprocal_rank_fusion

__all__ = ["Trie", "label_trie", "constrained_beam_search", "rank_labels", "multi_chain_rank"]


class Trie:
    """A prefix trie over token-id sequences."""

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        if not sequences:
            raise ValueError("Trie: no sequences")
        self.root: dict[int, dict] = {}
        self.sequences = [tuple(s) for s in sequences]
        if len(set(self.sequences)) != len(self.sequences):
            raise ValueError("Trie: two labels have the same token sequence")
        for seq in self.sequences:
            if not seq:
                raise ValueError("Trie: an empty sequence")
            node = self.root
            for t in seq:
                node = node.setdefault(int(t), {})
        self.depth = max(len(s) for s in self.sequences)

    def allowed(self, prefix: Sequence[int]) -> list[int]:
        """The tokens that may follow ``prefix`` (empty: ``prefix`` is complete or off the trie)."""
        node = self.root
        for t in prefix:
            node = node.get(int(t))
            if node is None:
                return []
        return sorted(node)


def label_trie(tokenizer: Any, labels: Sequence[str]) -> tuple[Trie, dict[tuple[int, ...], str]]:
    """The trie of ``labels`` (each tokenised without special tokens, then EOS) and the map from
    a path (EOS dropped) back to its label."""
    eos = tokenizer.eos_token_id
    paths = {tuple(tokenizer(label, add_special_tokens=False)["input_ids"]): label for label in labels}
    if len(paths) != len(set(labels)):
        raise ValueError("label_trie: two labels tokenise to the same ids")
    return Trie([p + (eos,) for p in paths]), paths


@torch.no_grad()
def constrained_beam_search(model: Any, prompt_ids: torch.Tensor, trie: Trie,
                            beam_size: int) -> list[tuple[tuple[int, ...], float]]:
    """The ``beam_size`` best complete trie paths after ``prompt_ids`` (1-D), best first, with
    their log-probabilities. Every step expands all live beams over their allowed tokens and
    keeps the best ``beam_size`` (finished paths stay in the pool); ``beam_size = 1`` is greedy.
    Exact (every path scored) when ``beam_size`` ≥ the number of paths."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    device = prompt_ids.device
    live: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    done: list[tuple[tuple[int, ...], float]] = []
    for _ in range(trie.depth):
        if not live:
            break
        ids = torch.stack([torch.cat([prompt_ids, torch.tensor(p, dtype=torch.long, device=device)]) for p, _ in live])
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1, :].float()
        logp = torch.log_softmax(logits, -1)
        candidates = []
        for row, (path, score) in enumerate(live):
            for t in trie.allowed(path):  # the mask: only the trie's continuations are candidates
                candidates.append((path + (t,), score + float(logp[row, t])))
        pool = sorted(done + candidates, key=lambda c: -c[1])[:beam_size]
        done = [c for c in pool if not trie.allowed(c[0])]
        live = [c for c in pool if trie.allowed(c[0])]
    return sorted(done, key=lambda c: -c[1])


def rank_labels(policy: Any, prompts: Sequence[str], labels: Sequence[str], beam_size: int = 10,
                continuations: Sequence[Sequence[int]] | None = None) -> list[list[str]]:
    """For each prompt, the top-``beam_size`` labels by constrained beam search (best first).
    ``continuations[i]``: token ids appended to prompt i before the beam (a reasoning chain)."""
    trie, to_label = label_trie(policy.tokenizer, labels)
    eos = policy.tokenizer.eos_token_id
    model = policy.model
    was_training = model.training
    model.eval()
    out = []
    try:
        for i, prompt in enumerate(prompts):
            ids, _ = policy.encode_prompts([prompt])
            ids = ids[0]
            if continuations is not None and len(continuations[i]):
                ids = torch.cat([ids, torch.tensor(list(continuations[i]), dtype=torch.long, device=ids.device)])
            beams = constrained_beam_search(model, ids, trie, beam_size)
            out.append([to_label[path[:-1] if path[-1] == eos else path] for path, _ in beams])
    finally:
        model.train(was_training)
    return out


def multi_chain_rank(policy: Any, prompts: Sequence[str], labels: Sequence[str], *, chains: int = 4,
                     think_end: str = "</think>", max_chain_tokens: int = 128, temperature: float = 1.0,
                     beam_size: int = 10, rrf_k: float = 60.0, generator: torch.Generator | None = None
                     ) -> tuple[list[list[str]], list[list[list[str]]]]:
    """Sample ``chains`` reasoning chains per prompt (free decoding, cut at ``think_end``), run a
    constrained beam after each (the chain's sampled tokens, then ``think_end``'s if the chain
    did not write it), and fuse the chains' lists by RRF, score(ℓ) = Σ_chains 1/(rrf_k + rank).
    Returns (fused lists, per-chain lists)."""
    if chains < 1:
        raise ValueError(f"chains must be >= 1, got {chains}")
    tok = policy.tokenizer
    samples = policy.sample(list(prompts), chains, max_chain_tokens, temperature, generator, stop=[think_end])
    end_ids = tok(think_end, add_special_tokens=False)["input_ids"]
    conts, texts = [], []
    for row in range(len(prompts) * chains):
        keep = samples.completion_ids[row][samples.completion_mask[row].bool()].tolist()
        keep = [t for t in keep if t != tok.eos_token_id]
        conts.append(keep if think_end in samples.texts[row] or think_end in tok.decode(keep) else keep + end_ids)
        texts.append(prompts[row // chains])
    per_row = rank_labels(policy, texts, labels, beam_size, continuations=conts)
    per_prompt = [per_row[i * chains:(i + 1) * chains] for i in range(len(prompts))]
    return [reciprocal_rank_fusion(lists, rrf_k)[:beam_size] for lists in per_prompt], per_prompt
