"""RL-ARC on the method hooks: calibration-aware RL with reasoning and answer confidence.

**Formalised from the abstract (INFERRED)**: paper not located; the maths is in
``reasonrl.methods.rl_arc.maths`` (the docstring there has the formulas and the verified relatives,
RLCR arXiv 2507.16806 and RLCM arXiv 2604.23333). Named in the recipe's ``methods:`` list::

    rewards: [{name: exact_answer, weight: 1.0}]
    methods: [{name: rl_arc, lambda1: 0.5, lambda2: 0.0, lambda3: 0.5}]

Every step, in ``annotate`` (after scoring and selection, before the advantages):

1. c_r and c_a of every row from its behaviour log-probs (``batch.sample_logprobs``, the tokens'
   log-probs under the weights that sampled them; no extra forward) over the reasoning and the
   answer span (``evaluate.answer_spans.split_spans``: the task's ``answer_spans``, else ``\\boxed{}``,
   else the number after ``####``). With ``answer_confidence: stated`` c_a is the confidence the
   completion writes (``evaluate.sampling_eval.stated_confidence``).
2. R = 1[score > 0.5] of ``correct_reward`` (its unweighted score, ``batch.meta``).
3. ``batch.rewards += r − R`` (``methods.rl_arc.maths.arc_adjustment``): with the correctness reward at
   weight 1 and alone, each row's reward is the spec's r; other rewards keep their share.
   GRPO's advantages then see r.

Fallbacks (counted in the metrics): a row without an answer span (nothing after ``####``) takes
the whole completion's geometric-mean token probability as c_r and c_a = 1 (``no_answer:
certain``; such a row is wrong, so it gets the full overconfidence penalty: abstaining never
pays; ``no_answer: sequence`` takes the completion's confidence as c_a instead); a row with an answer
but no reasoning before it takes c_r = c_a (the regulariser has nothing to compare: 0). With
``answer_confidence: stated`` a completion that states none is taken as fully confident
(c_a = 1), so leaving the confidence out never pays; ``stated_or_tokens`` uses the token c_a there.

The log-probs are those of the sampling distribution (at ``rollout.temperature``; the recipes
sample at 1.0). The method keeps no state: an exact resume needs nothing from it.

Metrics: ``rl_arc/c_answer``, ``rl_arc/c_reasoning``, ``rl_arc/gap`` (c_a − c_r), means over
rows; ``rl_arc/c_answer_correct`` and ``rl_arc/c_answer_wrong``; ``rl_arc/adjustment`` (mean of
r − R); ``rl_arc/ece``, ``rl_arc/brier``, ``rl_arc/auroc`` of c_a on the batch
(``evaluate.calibration``); ``rl_arc/no_answer`` and ``rl_arc/no_reasoning`` (fallback shares);
``rl_arc/stated_rate`` with a stated confidence.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch

from reasonrl.evaluate.answer_spans import span_confidence, span_confidences
from reasonrl.methods.rl_arc.maths import Penalty, Regulariser, arc_adjustment
from reasonrl.batch import RolloutBatch
from reasonrl.dataflow import REWARDS, meta_reward
from reasonrl.evaluate.calibration import auroc, brier_score, expected_calibration_error
from reasonrl.hooks import Method, MethodContext
from reasonrl.train.channel_mask import reward_gate
from reasonrl.params import Range
from reasonrl.registry import METHODS

__all__ = ["RLARC"]

AnswerConfidence = Literal["tokens", "stated", "stated_or_tokens"]


@METHODS.register("rl_arc")
class RLARC(Method):
    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        return {"annotate": ((REWARDS,), (meta_reward(config.get("correct_reward", "exact_answer")),))}

    def __init__(self,
                 lambda1: Annotated[float, Range(ge=0, why="the weight of the reasoning-guided regulariser")] = 0.5,
                 lambda2: Annotated[float, Range(ge=0, why="the weight of the squared under-confidence term")] = 0.0,
                 lambda3: Annotated[float, Range(ge=0, why="the weight of the overconfidence penalty")] = 0.5,
                 regulariser: Regulariser = "hinge", penalty: Penalty = "brier",
                 answer_confidence: AnswerConfidence = "tokens",
                 correct_reward: str = "exact_answer",
                 no_answer: Literal["certain", "sequence"] = "certain") -> None:
        """``lambda1``, ``lambda2``: the regulariser of correct rows, λ_1 (c_a − c_r)_+ + λ_2 ((c_a − c_r)_−)²
        (``regulariser: abs``: λ_1 |c_a − c_r|). ``lambda3``: the penalty of wrong rows, λ_3 c_a²
        (``penalty: linear``: λ_3 c_a; ``max_brier``: λ_3 max(c_a, c_r)²). ``answer_confidence``:
        ``tokens`` (c_a from the answer span's log-probs), ``stated`` (the completion's own
        "confidence: q"), ``stated_or_tokens``. ``correct_reward``: the recipe reward whose score
        > 0.5 means correct. ``no_answer``: the c_a of a row without an answer: ``certain`` (1:
        not answering costs as much as a confidently wrong answer, so it never pays) or
        ``sequence`` (the whole completion's token confidence: then an unconfident non-answer
        is penalised less than a confident wrong one, and one of three 100-step seeds learned
        to stop answering: commit rate 0.01). Defaults: the spec's (λ_3 at the low end of its 0.5–1.0)."""
        self.kwargs = dict(lambda1=lambda1, lambda2=lambda2, lambda3=lambda3, regulariser=regulariser,
                           penalty=penalty)
        self.answer_confidence, self.correct_reward, self.no_answer = answer_confidence, correct_reward, no_answer
        self.tokenizer = self.task = None

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        reward = (config or {}).get("correct_reward", "exact_answer")
        names = [rw.name for rw in recipe.rewards]
        need(reward in names, f"methods[rl_arc]: correct_reward '{reward}' (what R = 1 means) is not among the "
                              f"recipe's rewards {names}; add it to rewards: or name one of them")

    def setup(self, ctx: MethodContext) -> None:
        self.tokenizer, self.task = ctx.policy.tokenizer, ctx.task

    def confidences(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(c_a, c_r) per row with the module docstring's fallbacks, and the fallbacks' shares."""
        if batch.sample_logprobs is None:
            raise ValueError("rl_arc: the batch has no behaviour log-probs (batch.sample_logprobs); "
                             "its rollout source must keep the sampled tokens' log-probs")
        live = batch.response_mask.bool().cpu()
        logp = batch.sample_logprobs.cpu()
        c_a, has_a, c_r, has_r = span_confidences(self.tokenizer, batch.completion_ids.cpu(),
                                                  batch.completion_mask.cpu(), logp, self.task, live)
        c_seq, _ = span_confidence(logp, live)
        c_a = torch.where(has_a, c_a, c_seq if self.no_answer == "sequence" else torch.ones_like(c_seq))
        stats = {"rl_arc/no_answer": float((~has_a).float().mean()),
                 "rl_arc/no_reasoning": float((has_a & ~has_r).float().mean())}
        if self.answer_confidence != "tokens":
            # Imported here: sampling_eval imports the tasks, whose rewards import the methods package.
            from reasonrl.evaluate.sampling_eval import stated_confidence

            stated = [stated_confidence(text) for text in batch.meta["completion"]]
            c_a = torch.tensor([s if s is not None and a else (1.0 if self.answer_confidence == "stated" else t)
                                for s, t, a in zip(stated, c_a.tolist(), has_a.tolist())], dtype=c_a.dtype)
            stats["rl_arc/stated_rate"] = sum(s is not None for s in stated) / max(len(stated), 1)
        # No reasoning before the answer: c_r = c_a (nothing to compare); no answer: the sequence's.
        c_r = torch.where(has_a, torch.where(has_r, c_r, c_a), c_seq)
        return c_a, c_r, stats

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        if len(batch) == 0:
            return {}
        correct = reward_gate(batch, self.correct_reward, "rl_arc", "correctness reward").cpu()
        c_a, c_r, metrics = self.confidences(batch)
        adjust = arc_adjustment(correct, c_a, c_r, **self.kwargs)
        batch.rewards = batch.rewards + adjust.to(batch.rewards.device, batch.rewards.dtype)
        conf, ok = c_a.tolist(), correct.tolist()
        metrics.update({
            "rl_arc/c_answer": float(c_a.mean()), "rl_arc/c_reasoning": float(c_r.mean()),
            "rl_arc/gap": float((c_a - c_r).mean()), "rl_arc/adjustment": float(adjust.mean()),
            "rl_arc/ece": expected_calibration_error(conf, ok), "rl_arc/brier": brier_score(conf, ok),
        })
        if correct.any():
            metrics["rl_arc/c_answer_correct"] = float(c_a[correct].mean())
        if not correct.all():
            metrics["rl_arc/c_answer_wrong"] = float(c_a[~correct].mean())
        if correct.any() and not correct.all():  # AUROC needs both classes (NaN otherwise)
            metrics["rl_arc/auroc"] = auroc(conf, ok)
        return metrics
