"""Semantic-ID tokens in a policy's tokenizer and embedding matrix, and the alignment SFT
(CARing / SIDReasoner stage 1; SIDReasoner: https://arxiv.org/abs/2603.23183, github.com/zmlxzyh/SIDReasoner).

``add_sid_tokens`` adds the L·K tokens ``<a_0>…`` to a Hugging Face tokenizer as ordinary
(not special) added tokens, so each encodes to ONE id and decoding with
``skip_special_tokens=True`` keeps them, then resizes the model's embedding matrix (and an
untied output head). New rows are initialised (our choice; the source does not say):

- ``init="mean"``: the mean of the existing input-embedding rows (all new rows equal; the
  alignment SFT then tells them apart);
- ``init="text"``: row of token t = the mean input embedding of the tokens of ``texts[t]``
  (e.g. the descriptions of the labels under that code), falling back to the mean.

For an untied head the output row gets the same vector. The embedded character-level model
needs none of this: ``next_visit``'s ``sid_style: char`` writes one SID token as one
character of its alphabet, so its tokenizer already holds every SID token and
``add_sid_tokens`` adds nothing.

``alignment_sft`` runs the task's alignment mix (history → ID, code → ID, ID → code:
``NextVisitTask.warmup_problems``) through ``reasonrl.train.sft``; ``prepare_sid_model`` does
both and saves an HF folder that a recipe's ``model.path`` (``backend: hf``) then trains with
GRPO and the coverage reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Sequence

import torch

from reasonrl.train.sft import SFTExample, sft

__all__ = ["add_sid_tokens", "alignment_examples", "alignment_sft", "prepare_sid_model"]


def add_sid_tokens(policy: Any, tokens: Sequence[str], init: Literal["mean", "text"] = "mean",
                   texts: dict[str, str] | None = None) -> list[str]:
    """Add the ``tokens`` the tokenizer lacks and resize the embeddings; returns the tokens added.
    After it, every token of ``tokens`` encodes to a single id (checked)."""
    from tokenizers import AddedToken

    if init not in ("mean", "text"):
        raise ValueError(f"add_sid_tokens: init must be 'mean' or 'text', got {init!r}")
    tok, model = policy.tokenizer, policy.model
    vocab = tok.get_vocab()
    new = [t for t in dict.fromkeys(tokens) if t not in vocab]
    if new:
        old_rows = model.get_input_embeddings().weight.shape[0]
        tok.add_tokens([AddedToken(t, single_word=False, normalized=False, special=False) for t in new])
        model.resize_token_embeddings(len(tok), mean_resizing=False)
        emb = model.get_input_embeddings().weight
        head = model.get_output_embeddings()
        untied = head is not None and head.weight.data_ptr() != emb.data_ptr()
        with torch.no_grad():
            mean = emb[:old_rows].mean(0)
            for t in new:
                row = tok.convert_tokens_to_ids(t)
                vec = mean
                if init == "text" and texts and texts.get(t):
                    ids = [i for i in tok(texts[t], add_special_tokens=False)["input_ids"] if i < old_rows]
                    vec = emb[ids].mean(0) if ids else mean
                emb[row] = vec
                if untied:
                    head.weight[row] = vec
    for t in tokens:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"add_sid_tokens: {t!r} encodes to {len(ids)} ids, expected one")
    return new


def alignment_examples(policy: Any, task: Any, count: int, seed: int = 0, batch: int = 64) -> list[SFTExample]:
    """``count`` examples of the task's alignment mix, responses tokenised + EOS."""
    tok, out, step = policy.tokenizer, [], 0
    while len(out) < count:
        for p in task.warmup_problems(step, min(batch, count - len(out)), seed):
            ids = tuple(tok(p.solution, add_special_tokens=False)["input_ids"]) + (tok.eos_token_id,)
            out.append(SFTExample(p.prompt, ids))
        step += 1
    return out


def alignment_sft(policy: Any, task: Any, optim: Any, count: int = 512, epochs: int = 1, batch_size: int = 32,
                  micro_batch_size: int = 16, seed: int = 0, log=None) -> dict[str, float]:
    """Multi-task alignment SFT (text ↔ ID, history → ID) through ``train.sft.sft``."""
    return sft(policy, alignment_examples(policy, task, count, seed), optim, epochs=epochs, batch_size=batch_size,
               micro_batch_size=micro_batch_size, seed=seed, log=log)


def prepare_sid_model(policy: Any, task: Any, out_dir: str | Path, optim: Any, *, init: Literal["mean", "text"] = "text",
                      count: int = 512, epochs: int = 1, seed: int = 0, log=None) -> dict[str, float]:
    """Stage 1 on any HF policy: add the task's SID tokens (``init="text"``: each code token's row
    from the descriptions of the labels that use it), run the alignment SFT, save to ``out_dir``."""
    texts: dict[str, list[str]] = {}
    if task.label_format == "sid" and task.sid_style == "token":
        from reasonrl.methods.caring.semantic_ids import sid_token

        for code, sid in task.sid_codes.items():
            for level, k in enumerate(sid):
                texts.setdefault(sid_token(level, k), []).append(task.names[code])
    added = add_sid_tokens(policy, task.sid_vocabulary(), init, {t: " ".join(v) for t, v in texts.items()})
    stats = alignment_sft(policy, task, optim, count=count, epochs=epochs, seed=seed, log=log)
    policy.save(out_dir)
    return {**stats, "sid/tokens_added": float(len(added))}
