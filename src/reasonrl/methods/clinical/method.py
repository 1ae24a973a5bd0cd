"""The clinical soft verifier's entropy-normalised judge, α·J̃ of Eq. 1 (paper: "Ontology Concept
Overlap as a Training Signal", https://arxiv.org/abs/2610.06360; the normalisation is INFERRED from the abstract).

A frozen judge model reads a grading prompt (the question, the reference, the candidate answer)
and the next-token distribution over its K score tokens ("1".."K") is read, not sampled::

    p = softmax(logits of the K score tokens)
    J̃ = (E_p[score] − 1)/(K − 1) · (1 − H(p)/log K)

the expected score in [0, 1], shrunk by the judge's uncertainty: a judge torn between all levels
gives 0, a sure "K" gives 1. Named in ``methods:`` with a ``judge`` model section (any backend;
it need not share the policy's tokenizer: it reads text)::

    methods:
      - name: clinical_judge
        weight: 0.6                      # α
        judge: {backend: hf, path: smollm2-135m}
        levels: ["1", "2", "3", "4", "5"]   # the default; each one token of the judge's tokenizer

In ``annotate`` (after the reward functions, before the advantages): ``batch.rewards += α·J̃``,
so with ``concept_f1`` (weight β) and ``consistency_penalty`` (weight −γ) the reward is Eq. 1.
The judge is deterministic (one no-grad forward, no sampling), so a resumed run judges alike and
the method has no state to save. Metrics: ``judge/score`` (J̃), ``judge/expected`` (the
normalised expectation before the shrink) and ``judge/entropy`` (H(p)/log K), batch means.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Optional

import torch
from torch import Tensor

from reasonrl.batch import RolloutBatch
from reasonrl.dataflow import REWARDS, meta_reward
from reasonrl.hooks import Method, MethodContext
from reasonrl.params import Range
from reasonrl.registry import METHODS

__all__ = ["ClinicalJudge", "entropy_normalised_score", "JUDGE_TEMPLATE"]

JUDGE_TEMPLATE = ("Grade the candidate answer to a clinical question against the reference answer, from 1 "
                  "(wrong or unsafe) to {k} (correct, complete and safe).\nQuestion: {question}\n"
                  "Reference answer: {reference}\nCandidate answer: {answer}\nGrade: ")


def entropy_normalised_score(level_logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(J̃, the normalised expectation (E_p[s] − 1)/(K − 1), H(p)/log K) per row of ``level_logits``
    ``[N, K]``, the logits of the score tokens 1..K (module docstring)."""
    k = level_logits.shape[-1]
    if k < 2:
        raise ValueError(f"the judge needs at least 2 score levels, got {k}")
    logp = torch.log_softmax(level_logits.float(), dim=-1)
    p = logp.exp()
    scores = torch.arange(1, k + 1, dtype=p.dtype, device=p.device)
    expected = ((p * scores).sum(-1) - 1) / (k - 1)
    entropy = -(p * logp).nan_to_num().sum(-1) / math.log(k)  # 0·log 0 = 0
    return expected * (1 - entropy), expected, entropy


@METHODS.register("clinical_judge")
class ClinicalJudge(Method):
    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        return {"annotate": ((REWARDS, meta_reward("clinical_judge")), ())}

    def __init__(self, judge: dict, weight: Annotated[float, Range(ge=0, why="α of Eq. 1")] = 0.6,
                 levels: Optional[list[str]] = None, template: str = JUDGE_TEMPLATE,
                 max_answer_chars: Annotated[int, Range(ge=1)] = 1000,
                 micro_batch_size: Optional[Annotated[int, Range(ge=1)]] = None) -> None:
        """``judge``: a ``model:`` section of the frozen judge. ``weight``: α. ``levels``: the K
        score strings, worst first, each one token of the judge's tokenizer (default "1".."5").
        ``template``: the grading prompt, with ``{question}``, ``{reference}``, ``{answer}`` and
        ``{k}``; it should end where the score token comes. ``max_answer_chars``: the candidate is
        cut to this many characters (a runaway answer cannot blow up the judge's forward).
        ``micro_batch_size``: rows per forward (default ``train.micro_batch_size``)."""
        levels = list(levels) if levels is not None else [str(i) for i in range(1, 6)]
        if len(levels) < 2 or len(set(levels)) != len(levels):
            raise ValueError(f"methods[clinical_judge].levels must be 2 or more distinct strings, got {levels!r}")
        for key in ("{answer}",):
            if key not in template:
                raise ValueError(f"methods[clinical_judge].template must contain {key}")
        self.judge_cfg, self.weight, self.levels, self.template = judge, weight, levels, template
        self.max_answer_chars, self.micro_batch_size = max_answer_chars, micro_batch_size
        self.judge = None
        self._metrics: dict[str, float] = {}

    def setup(self, ctx: MethodContext) -> None:
        from reasonrl.policy.teacher import build_teacher_policy

        # The judge reads its own prompt in its own tokenizer: no shared vocabulary needed.
        self.judge = build_teacher_policy(self.judge_cfg, ctx.policy, ctx.log, role="clinical_judge",
                                          same_vocab=False, key="judge")
        self.judge.chat_template = False  # the template is the whole prompt
        self.level_ids = self.score_token_ids(self.judge.tokenizer, self.levels)
        self.micro = self.micro_batch_size or ctx.recipe.train.micro_batch_size

    @staticmethod
    def score_token_ids(tokenizer: Any, levels: list[str]) -> list[int]:
        """The token id of each score level; a ValueError when one is not a single token."""
        ids = []
        for level in levels:
            enc = tokenizer(level, add_special_tokens=False)["input_ids"]
            if len(enc) != 1 or enc[0] == tokenizer.unk_token_id:
                raise ValueError(f"methods[clinical_judge].levels: {level!r} is {len(enc)} token(s) {enc} of the judge's "
                                 "tokenizer; each level must be exactly one known token (digits are, in SmolLM2's "
                                 "and the tiny model's; end the template with the space before the score)")
            ids.append(enc[0])
        return ids

    def prompts(self, problems: list[Any], completions: list[str]) -> list[str]:
        return [self.template.format(question=p.prompt, reference=p.answer, answer=c[: self.max_answer_chars],
                                     k=len(self.levels)) for p, c in zip(problems, completions)]

    @torch.no_grad()
    def level_logits(self, prompts: list[str]) -> Tensor:
        """``[N, K]`` logits of the score tokens at the position after each prompt."""
        from reasonrl.policy.sampling import position_ids_from_mask

        out = []
        for s in range(0, len(prompts), self.micro):
            ids, mask = self.judge.encode_prompts(prompts[s:s + self.micro])  # left-padded: the last column is next
            logits = self.judge.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                                      use_cache=False, logits_to_keep=1).logits[:, -1]
            out.append(logits[:, self.level_ids].float().cpu())
        return torch.cat(out)

    def scores(self, problems: list[Any], completions: list[str]) -> tuple[Tensor, Tensor, Tensor]:
        """(J̃, expectation, normalised entropy) of each completion."""
        return entropy_normalised_score(self.level_logits(self.prompts(problems, completions)))

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        score, expected, entropy = self.scores(batch.meta["problem"], batch.meta["completion"])
        batch.rewards = batch.rewards + self.weight * score.to(batch.rewards.device, batch.rewards.dtype)
        batch.meta["reward/clinical_judge"] = score.tolist()
        return {"judge/score": float(score.mean()), "judge/expected": float(expected.mean()),
                "judge/entropy": float(entropy.mean())}
