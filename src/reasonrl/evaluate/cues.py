"""Token cues: does prefilling ".\\n\\nOkay" (or any cue) at the start of the answer raise pass@1?

No paper found (token cues such as ".\\n\\nOkay" or "Alright," raising base-model pass@1: paper not
located); the protocol is our formalisation (INFERRED):
the cue is prefilled as the start of the completion (after the prompt, after a chat
template's generation prompt), the model continues after it, and the cue is part of the
text that is parsed and scored. Reported per cue c: Δpass@1(c) = pass@1(c) − pass@1(∅) with
a paired bootstrap interval over problems, the cue's log-probability log p(c | prompt) under
the model (one forward pass), and how often the model writes c by itself in its unprefilled
samples (at the start, and anywhere). The hypothesis under test: RLVR partly teaches a
"reasoning mode" that a cue can trigger in the base model. ``reasonrl eval --prefill CUE``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from reasonrl.evaluate.metrics import paired_difference
from reasonrl.policy.sampling import sample_completions

__all__ = ["Prefilled", "cue_logprobs", "emission_rates", "cue_report", "evaluate_cues", "unescape_cue"]


def _check_tokens(tokenizer, ids: list[int], cue: str) -> None:
    """A cue the model cannot read would measure nothing: refuse characters the tokenizer maps
    to its unknown token (the embedded one knows only its task's alphabet)."""
    if cue and not ids:
        raise ValueError(f"prefill cue {cue!r} has no tokens under this tokenizer")
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in ids:
        raise ValueError(f"prefill cue {cue!r} has characters this tokenizer does not know (they map to "
                         f"{tokenizer.unk_token!r}); use a cue in the model's vocabulary")


def evaluate_cues(evaluator, policy, plain: dict[str, Any], plain_texts: list[str], cues: list[str],
                  progress=None) -> dict[str, Any]:
    """Every cue's :func:`cue_report`: a sampled evaluation of ``Prefilled(policy, cue)`` with
    the evaluator's settings (same problems, seed and budget as ``plain``, its result without a
    cue, whose sampled texts are ``plain_texts``)."""
    prompts = [p.prompt for p in evaluator.problems]
    out = {}
    for cue in cues:
        cued = evaluator.sampled(Prefilled(policy, cue), progress=progress)
        out[cue] = cue_report(plain, cued, cue_logprobs(policy, prompts, cue), plain_texts, cue)
    return out


class Prefilled:
    """A policy whose completions start with ``cue``: the evaluator samples it like a policy.

    ``sample`` appends the cue's tokens (tokenised on their own, no special tokens) to every
    encoded prompt, so the model continues after them, and returns texts ``cue + continuation``:
    answer extraction and the verifier see the cue. Token counts, log-probs and the token
    budget are the continuation's. With ``cue=""`` it samples exactly as the policy does.
    ``sampled_texts`` keeps the texts of every sampled (temperature > 0) call, in order: the
    unprefilled samples a cue's spontaneous emission rate is counted in.
    """

    episodic = False

    def __init__(self, policy, cue: str = "") -> None:
        self.policy, self.cue, self.tokenizer = policy, cue, policy.tokenizer
        self.sampled_texts: list[str] = []
        self.cue_ids = torch.tensor(self.tokenizer(cue, add_special_tokens=False)["input_ids"], dtype=torch.long)
        _check_tokens(self.tokenizer, self.cue_ids.tolist(), cue)

    def sample(self, prompts, num_generations, max_new_tokens, temperature=1.0, generator=None, stop=None,
               **kwargs):
        if not self.cue:
            out = self.policy.sample(prompts, num_generations, max_new_tokens, temperature, generator=generator,
                                     stop=stop, **kwargs)
        else:
            ids, mask = self.policy.encode_prompts(prompts)
            cue = self.cue_ids.to(ids.device).expand(len(ids), -1)
            ids, mask = torch.cat([ids, cue], 1), torch.cat([mask, torch.ones_like(cue)], 1)  # left-padded: append
            model = self.policy.model
            was = model.training
            model.eval()
            try:
                with torch.no_grad():
                    out = sample_completions(model, self.tokenizer, ids, mask, num_generations, max_new_tokens,
                                             temperature, generator, stop, decoder=self.policy.decoder, **kwargs)
            finally:
                model.train(was)
            out = dataclasses.replace(out, texts=[self.cue + t for t in out.texts])
        if temperature > 0:
            self.sampled_texts.extend(out.texts)
        return out


@torch.no_grad()
def cue_logprobs(policy, prompts: list[str], cue: str, batch_size: int = 64) -> list[float]:
    """log p(cue | prompt) = Σ_t log p(c_t | prompt, c_<t) per prompt: one forward pass over
    prompt + cue tokens (the cue tokenised as :class:`Prefilled` appends it), at temperature 1."""
    ids = torch.tensor(policy.tokenizer(cue, add_special_tokens=False)["input_ids"], dtype=torch.long)
    _check_tokens(policy.tokenizer, ids.tolist(), cue)
    model = policy.model
    was = model.training
    model.eval()
    out: list[float] = []
    try:
        for start in range(0, len(prompts), batch_size):
            p_ids, p_mask = policy.encode_prompts(prompts[start:start + batch_size])
            c_ids = ids.to(p_ids.device).expand(len(p_ids), -1)
            logp, _ = policy.completion_logprobs(p_ids, p_mask, c_ids, torch.ones_like(c_ids))
            out.extend(float(x) for x in logp.float().sum(-1))
    finally:
        model.train(was)
    return out


def emission_rates(texts: list[str], cue: str) -> dict[str, float]:
    """How often unprefilled completions write the cue themselves: ``start`` (the completion
    begins with it, what prefilling forces) and ``anywhere`` (it occurs in the text)."""
    if not texts:
        raise ValueError("emission rate of no completions")
    return {"start": sum(t.startswith(cue) for t in texts) / len(texts),
            "anywhere": sum(cue in t for t in texts) / len(texts)}


def cue_report(plain: dict[str, Any], cued: dict[str, Any], logprobs: list[float],
               plain_texts: list[str], cue: str) -> dict[str, Any]:
    """One cue's numbers from two sampled evaluations on the same problems (``evaluate_sampling``
    results, no cue and with the cue): pass@1 per problem is c/n (the unbiased pass@1), and
    Δpass@1 = mean over problems of pass@1(c) − pass@1(∅), with its paired bootstrap interval."""
    a, b = plain["per_problem"], cued["per_problem"]
    if [r["prompt"] for r in a] != [r["prompt"] for r in b]:
        raise ValueError("the cued and the plain evaluation must cover the same problems in the same order")
    with_cue = [r["correct"] / r["n"] for r in b]
    without = [r["correct"] / r["n"] for r in a]
    return {
        "cue": cue,
        "pass@1": sum(with_cue) / len(with_cue),
        "pass@1_no_cue": sum(without) / len(without),
        "delta_pass@1": paired_difference(with_cue, without),
        "cue_logprob": sum(logprobs) / len(logprobs),
        "emitted": emission_rates(plain_texts, cue),
        "metrics": cued["metrics"],
    }


def unescape_cue(text: str) -> str:
    r"""A cue as typed on a command line: ``\n``, ``\t`` and ``\\`` become the characters."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
