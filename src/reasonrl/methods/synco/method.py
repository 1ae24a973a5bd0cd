"""SynCo on the method hooks: a Synthesizer that proposes tasks, co-trained with the Reasoner
(the run's policy) that solves them.

**Confidence: INFERRED** (SynCo, paper not located; formalised from its abstract; the rewards and their sources are in
``reasonrl.methods.synco.maths``, the proposal format and parser in ``reasonrl.methods.synco.task``).
Named in the recipe's ``methods:`` list::

    methods:
      - name: synco
        seeds: 1          # seed problems per step (the first groups of the real batch)
        group_size: 8     # G_S proposals per seed (the Synthesizer's GRPO group)
        solves: null      # M Reasoner samples per proposal (null: rollout.num_generations)
        weights: [0.2, 0.3, 0.5]
        tau_rel: 0.5

The Trainer's policy is the Reasoner, trained by GRPO on the real task as usual; this method
owns the Synthesizer π_S (its own model and ``Learner``). Each step:

1. ``extend_batch`` (on the scored real batch, before advantages): the first ``seeds`` real
   problems are the seeds; π_S samples G_S proposals ``<q>;####<a_S>`` for each (the run's
   generator, so a resumed run samples the same). A proposal is valid when it parses, ended
   before its token budget, and its question is not in the real task's held-out split
   (``decontaminate``).
2. The Reasoner (the current policy, before its update) answers every valid proposal M times,
   prompt ``task.template`` with ``{expr}`` = q, through ``reasonrl.rollout.collect.sample_and_score``
   with the run's scorer and a_S as the reference answer: the rows, their ``meta`` and their
   rewards (``exact_answer``: 1[â = a_S]) are exactly those of a real group. Answers â are read
   with the evaluation's extraction (the task's own ``extract_answer`` if it has one).
3. R_q, R_rel, R_teach and R_S per proposal; the proposals with R_rel ≥ τ_rel are reliable and
   their M rows are appended to the batch as new groups (new group ids), at most
   ``mix`` × (real groups) of them, in proposal order. The Reasoner's GRPO step then sees
   real and synthetic groups together.
4. ``after_update``: one GRPO step of the Synthesizer on R_S, advantages normalised over the
   G_S proposals of the same seed (``grpo``, scale ``group``), the PPO-clip surrogate against
   the sampling log-probs, token-mean, through its ``Learner``.

The novelty buffer holds the last ``buffer_size`` valid questions of earlier steps (the seed's
own question also counts as seen, so copying the seed is not novel). The checkpoint holds the
Synthesizer's weights, its optimiser and the buffer: a resumed run equals the straight one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Optional

import torch

from reasonrl.algos.advantages import grpo_advantages
from reasonrl.algos.losses import aggregate, ppo_clip_loss
from reasonrl.algos.masked import last_token_mask, masked_sum
from reasonrl.methods.synco.maths import (DEFAULT_WEIGHTS, agreement, canonical_answer, is_reliable, novelty,
                                  synthesizer_reward, task_quality, teachability)
from reasonrl.batch import RolloutBatch
from reasonrl.hooks import Method, MethodContext, learner_scorer, need_learner_scorer
from reasonrl.params import Range
from reasonrl.perf import Stopwatch
from reasonrl.registry import METHODS
from reasonrl.tasks.arithmetic import BRACKETED
from reasonrl.methods.synco.task import parse_proposal
from reasonrl.problem import Problem
from reasonrl.tasks.base import in_eval_split

__all__ = ["SynCo", "DEFAULT_SYNTHESIZER"]

DEFAULT_SYNTHESIZER = {"backend": "tiny", "tiny": {"warmup_steps": 1500, "task": "arithmetic_proposals",
                                                  "task_params": {"wrong_fraction": 0.3}}}
"""The embedded Synthesizer: the default tiny architecture warmed up for 1500 steps (600 leave
its own worked steps wrong too often: 14% of its a_S right at temperature 1) on seed → proposal
pairs, 30% of them with a slipped answer. Built once and cached (about 10 minutes on a loaded
2-core machine)."""

Fraction = Annotated[float, Range(ge=0, le=1)]


@METHODS.register("synco")
class SynCo(Method):
    def __init__(self, model: Optional[dict] = None,
                 seeds: Annotated[int, Range(ge=1)] = 1,
                 group_size: Annotated[int, Range(ge=2, why="a GRPO group needs a baseline")] = 8,
                 solves: Optional[Annotated[int, Range(ge=1)]] = None,
                 weights: tuple[float, float, float] = DEFAULT_WEIGHTS,
                 tau_rel: Fraction = 0.5,
                 novelty_weight: Fraction = 0.5,
                 novelty_n: Annotated[int, Range(ge=1)] = 3,
                 buffer_size: Annotated[int, Range(ge=0)] = 512,
                 mix: Optional[Annotated[float, Range(ge=0)]] = 1.0,
                 temperature: Annotated[float, Range(gt=0, why="equal greedy proposals have no GRPO signal")] = 1.0,
                 max_new_tokens: Annotated[int, Range(ge=1)] = 40,
                 max_question_chars: Annotated[int, Range(ge=3)] = 20,
                 decontaminate: bool = True,
                 lr: Annotated[float, Range(gt=0)] = 1e-4,
                 epochs: Annotated[int, Range(ge=1)] = 1,
                 clip: Annotated[float, Range(gt=0)] = 0.2,
                 max_grad_norm: Annotated[float, Range(gt=0)] = 1.0,
                 micro_batch_size: Optional[Annotated[int, Range(ge=1)]] = None) -> None:
        """``model``: the Synthesizer's model section (None: ``DEFAULT_SYNTHESIZER``). ``seeds``:
        seed problems per step; ``group_size``: G_S; ``solves``: M (None: rollout.num_generations).
        ``weights``: (w_q, w_rel, w_teach); ``tau_rel``: τ_rel; ``novelty_weight``: ν in R_q;
        ``novelty_n``: the n of the n-gram overlap; ``buffer_size``: questions remembered.
        ``mix``: at most this many synthetic groups per real group (None: every reliable task).
        ``temperature``/``max_new_tokens``: the Synthesizer's sampling. ``decontaminate``: a
        question in the real task's held-out split is invalid. ``lr``, ``epochs``, ``clip``,
        ``max_grad_norm``, ``micro_batch_size``: the Synthesizer's update (constant-LR AdamW)."""
        self.check_params(weights=weights)
        self.model_cfg = model
        self.seeds, self.group_size, self.solves = seeds, group_size, solves
        self.weights = tuple(float(w) for w in weights)
        self.tau_rel, self.novelty_weight, self.novelty_n = tau_rel, novelty_weight, novelty_n
        self.buffer_size, self.mix = buffer_size, mix
        self.temperature, self.max_new_tokens, self.max_question_chars = temperature, max_new_tokens, max_question_chars
        self.decontaminate = decontaminate
        self.lr, self.epochs, self.clip, self.max_grad_norm = lr, epochs, clip, max_grad_norm
        self.micro_batch_size = micro_batch_size
        self.buffer: list[str] = []
        self._pending: Optional[RolloutBatch] = None

    @staticmethod
    def check_params(weights: Any = DEFAULT_WEIGHTS, **_) -> None:
        w = list(weights)
        if len(w) != 3 or any(not isinstance(x, (int, float)) or x < 0 for x in w):
            raise ValueError(f"weights are (w_q, w_rel, w_teach), three numbers >= 0; got {w}")

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        ro = recipe.rollout
        need_learner_scorer(recipe, need, "methods[synco] samples and scores the Reasoner's answers to synthetic tasks")
        need(recipe.env is None, "SynCo's synthetic tasks are single completions; an env's episodes are not: drop the env")
        need(not ro.simulated_partial, "rollout.simulated_partial gives tokens versions that synthetic rows lack: drop it")
        need(recipe.task.name == "arithmetic", f"SynCo's Synthesizer proposes arithmetic problems; the Reasoner's "
                                               f"task is '{recipe.task.name}': use task 'arithmetic'")
        need(not recipe.task.params.get("few_shot"), "SynCo's synthetic prompts carry no few-shot exemplars: "
                                                     "set task.few_shot to 0")

    # -- set-up ------------------------------------------------------------------
    def setup(self, ctx: MethodContext) -> None:
        learner_scorer(ctx, "synco", "the Reasoner's answers")
        from reasonrl.sections import OptimConfig
        from reasonrl.evaluate.evaluator import answer_extractor
        from reasonrl.policy.teacher import build_teacher_policy
        from reasonrl.rollout.collect import stop_strings

        r = ctx.recipe
        self.recipe, self.policy, self.scorer, self.task = r, ctx.policy, ctx.scorer, ctx.task
        self.generator, self.log = ctx.generator, ctx.log
        # The Synthesizer writes text the Reasoner reads as text: no shared vocabulary needed.
        self.synth = build_teacher_policy(self.model_cfg or DEFAULT_SYNTHESIZER, ctx.policy, ctx.log, trainable=True,
                                          role="synco", same_vocab=False)
        self.synth.decoder = ctx.policy.decoder
        optim = OptimConfig(lr=self.lr, weight_decay=0.0, warmup_steps=0, schedule="constant",
                            max_grad_norm=self.max_grad_norm)
        self.learner = ctx.learner(self.synth.parameters(), optim)
        self.m = self.solves or r.rollout.num_generations
        self.solve_recipe = dataclasses.replace(r, rollout=dataclasses.replace(r.rollout, num_generations=self.m))
        self.extract = answer_extractor(r.eval.reward, ctx.task)
        self.stop = stop_strings(r, ctx.task)
        template = getattr(ctx.task, "template", "{expr};")
        self.prefix, self.suffix = template.split("{expr}", 1)
        self.max_operand = getattr(ctx.task, "max_operand", None)
        self.eval_fraction = getattr(ctx.task, "eval_fraction", None)
        self.micro = self.micro_batch_size or r.train.micro_batch_size
        vocab = self.synth.tokenizer.get_vocab()
        unknown = {c for c in "0123456789+-*();#" if c not in vocab}
        if unknown:
            raise ValueError(f"the Synthesizer's tokenizer lacks the characters {sorted(unknown)} of the proposal format")

    # -- prompts -----------------------------------------------------------------
    def expression(self, prompt: str) -> str:
        """The seed's expression: its prompt without the task template's text around ``{expr}``."""
        end = len(prompt) - len(self.suffix) if self.suffix else len(prompt)
        return prompt[len(self.prefix):end]

    def reasoner_prompt(self, question: str) -> str:
        return f"{self.prefix}{question}{self.suffix}"

    # -- the round ---------------------------------------------------------------
    def extend_batch(self, batch: RolloutBatch, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        self._pending = None
        problems = batch.meta.get("problem")
        first: dict[int, int] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            first.setdefault(g, i)
        if not first or problems is None:
            return batch, {"synco/proposals": 0.0}
        if batch.aux:
            raise ValueError(f"method 'synco' cannot fill batch.aux keys {sorted(batch.aux)} for its synthetic rows")
        if batch.token_versions is not None:
            raise ValueError("method 'synco' cannot give token versions to its synthetic rows (rollout.simulated_partial)")
        watch = Stopwatch()
        seeds = [problems[i] for i in list(first.values())[:self.seeds]]
        seed_questions = [self.expression(p.prompt) for p in seeds]
        gs = self.group_size
        with watch("propose"):
            proposed = self.synth.sample([q + ";" for q in seed_questions], gs, self.max_new_tokens, self.temperature,
                                         generator=self.generator)
        parsed = []
        contaminated = 0
        for text, cut in zip(proposed.texts, proposed.truncated.tolist()):
            p = None if cut else parse_proposal(text, self.max_question_chars, self.max_operand)
            if p is not None and self.decontaminate and self.eval_fraction is not None \
                    and in_eval_split(p.question, self.eval_fraction):
                p, contaminated = None, contaminated + 1
            parsed.append(p)
        valid = [k for k, p in enumerate(parsed) if p is not None]

        # The Reasoner answers every valid proposal M times, scored like a real group.
        real_meta = [k[len("meta/"):] for k in batch.meta if k.startswith("meta/")]
        solved = None
        if valid:
            from reasonrl.rollout.collect import sample_and_score

            synthetic = [self._problem(parsed[k], real_meta) for k in valid]
            solved, _failures = sample_and_score(self.policy, self.scorer, synthetic, self.solve_recipe, self.generator,
                                                 group_offset=int(batch.group_ids.max()) + 1,
                                                 policy_version=batch.policy_version, watch=watch, stop=self.stop)
            answers = [self.extract(text, prob) for text, prob in zip(solved.meta["completion"], solved.meta["problem"])]

        # The rewards of every proposal.
        m, seen = self.m, list(self.buffer)
        rewards = [0.0] * len(parsed)
        stats: dict[str, list[float]] = {k: [] for k in ("r_q", "r_rel", "r_teach", "p_hat", "novelty", "in_form",
                                                         "answer_correct", "reasoner_true")}
        reliable: list[int] = []  # positions in ``valid``
        for j, k in enumerate(valid):
            p = parsed[k]
            ans = answers[j * m:(j + 1) * m]
            agree = agreement(ans, p.answer)
            nov = novelty(p.question, seen + [seed_questions[k // gs]], self.novelty_n)
            r_q = task_quality(p.form is not None, nov, self.novelty_weight)
            r_teach = teachability(agree.p_hat)
            rewards[k] = synthesizer_reward(True, r_q, agree.reliability, r_teach, self.weights)
            for key, v in (("r_q", r_q), ("r_rel", agree.reliability), ("r_teach", r_teach), ("p_hat", agree.p_hat),
                           ("novelty", nov), ("in_form", float(p.form is not None)),
                           ("answer_correct", float(p.correct))):
                stats[key].append(v)
            stats["reasoner_true"] += [float(canonical_answer(a) == str(p.value)) for a in ans]
            if is_reliable(agree.reliability, self.tau_rel):
                reliable.append(j)
        cap = len(reliable) if self.mix is None else min(len(reliable), math.floor(self.mix * len(first)))
        kept = reliable[:cap]
        out = batch
        if kept:
            rows = [j * m + i for j in kept for i in range(m)]
            out = self._append(batch, solved.select(rows))
        if self.buffer_size:
            self.buffer = (self.buffer + [parsed[k].question for k in valid])[-self.buffer_size:]
        self._pending = self._synth_batch(proposed, rewards, len(seeds))

        def mean(xs):
            return sum(xs) / len(xs) if xs else 0.0

        wrong = [j for j, k in enumerate(valid) if not parsed[k].correct]
        metrics = {
            "synco/proposals": float(len(parsed)),
            "synco/valid_fraction": len(valid) / len(parsed),
            "synco/contaminated": float(contaminated),
            "synco/R_S": mean(rewards),
            "synco/R_q": mean(stats["r_q"]), "synco/R_rel": mean(stats["r_rel"]),
            "synco/R_teach": mean(stats["r_teach"]), "synco/p_hat": mean(stats["p_hat"]),
            "synco/novelty": mean(stats["novelty"]), "synco/in_form_fraction": mean(stats["in_form"]),
            # The Synthesizer's a_S checked against the true value (measurable in this domain).
            "synco/synth_answer_accuracy": mean(stats["answer_correct"]),
            "synco/reliable_fraction": len(reliable) / len(valid) if valid else 0.0,
            # The Reasoner's answers to every valid synthetic task against the true value.
            "synco/reasoner_synthetic_accuracy": mean(stats["reasoner_true"]),
            "synco/synthetic_groups": float(len(kept)),
            "synco/synthetic_rows": float(len(kept) * m),
            "synco/reasoner_rows": float(len(valid) * m),
            "synco/synthetic_reward": float(out.rewards[len(batch):].mean()) if kept else 0.0,
            "synco/buffer": float(len(self.buffer)),
        }
        # How clean the filter's output is, and how many wrong a_S it caught (only when defined).
        if reliable:
            metrics["synco/reliable_answer_accuracy"] = mean([float(parsed[valid[j]].correct) for j in reliable])
        if wrong:
            metrics["synco/wrong_rejected_fraction"] = mean([float(j not in reliable) for j in wrong])
        metrics.update({f"perf/synco_{k}_s": round(v, 4) for k, v in watch.seconds.items()})
        return out, metrics

    def _problem(self, proposal: Any, meta_keys: list[str]) -> Problem:
        derived = {"form": proposal.form, "bracketed": proposal.form in BRACKETED, "synthetic": True}
        return Problem(prompt=self.reasoner_prompt(proposal.question), answer=proposal.answer,
                       meta={k: derived.get(k) for k in meta_keys})

    def _append(self, batch: RolloutBatch, extra: RolloutBatch) -> RolloutBatch:
        """``batch`` followed by ``extra``'s groups, optional per-token fields aligned (a ``loss_mask``
        or ``is_weights`` that only one side has is all ones on the other) and metadata keys made
        equal (a key ``extra`` lacks is None on its rows; one ``batch`` lacks is dropped)."""
        extra.meta = {k: extra.meta.get(k, [None] * len(extra)) for k in batch.meta}
        for name in ("loss_mask", "is_weights"):
            a, b = getattr(batch, name), getattr(extra, name)
            if (a is None) != (b is None):
                side = extra if a is not None else batch  # the side that lacks it
                like = side.completion_mask if name == "loss_mask" else side.sample_logprobs
                setattr(side, name, torch.ones_like(like, dtype=(a if a is not None else b).dtype))
        return RolloutBatch.concat([batch, extra], pad_id=self.policy.tokenizer.pad_token_id)

    def _synth_batch(self, samples: Any, rewards: list[float], num_seeds: int) -> RolloutBatch:
        n = len(rewards)
        return RolloutBatch(prompt_ids=samples.prompt_ids, prompt_mask=samples.prompt_mask,
                            completion_ids=samples.completion_ids, completion_mask=samples.completion_mask,
                            group_ids=torch.arange(num_seeds).repeat_interleave(self.group_size),
                            rewards=torch.tensor(rewards, dtype=torch.float32), truncated=samples.truncated,
                            sample_logprobs=samples.sample_logprobs, meta={"completion": list(samples.texts)}) \
            if n else None

    # -- the Synthesizer's update ------------------------------------------------
    def after_update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        sb, self._pending = self._pending, None
        if sb is None:
            return {}
        mask = sb.response_mask
        token_rewards = sb.rewards.unsqueeze(-1) * last_token_mask(mask).float()
        sb.advantages = grpo_advantages(token_rewards, mask, sb.group_ids, scale="group")
        metrics = {"synco/synth_lr": self.learner.end_step()}
        if not bool(sb.advantages.abs().gt(0).any()):
            metrics["synco/synth_skipped"] = 1.0  # every seed's proposals earned the same R_S
            return metrics
        total = max(1.0, float(mask.sum()))
        share = self.recipe.train.share_prompt

        def loss_fn(micro: RolloutBatch, _mini: RolloutBatch, _pass: int, _j: int):
            m = micro.response_mask.float()
            logp, _ = self.synth.completion_logprobs(micro.prompt_ids, micro.prompt_mask, micro.completion_ids,
                                                     micro.completion_mask, micro.group_ids if share else None,
                                                     temperature=self.temperature)
            out = ppo_clip_loss(logp, micro.sample_logprobs, micro.advantages, m, epsilon=self.clip)
            loss = aggregate(out.loss, m, "token-mean", total_tokens=total)
            return loss, {"loss": float(loss.detach()), "clipped": float(masked_sum(out.clipped, m))}

        self.synth.model.train()
        sums, norms = self.learner.optimise(sb, loss_fn, passes=self.epochs, micro_batch_size=self.micro)
        metrics.update({"synco/synth_loss": sums.get("loss", 0.0) / self.epochs,
                        "synco/synth_clip_fraction": sums.get("clipped", 0.0) / (total * self.epochs),
                        "synco/synth_grad_norm": sum(norms) / len(norms), "synco/synth_skipped": 0.0})
        return metrics

    # -- state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        weights = {k: v.detach().clone() for k, v in self.synth.model.state_dict().items()}
        return {"synthesizer": weights, **self.learner.state_dict(), "buffer": list(self.buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.synth.model.load_state_dict(state["synthesizer"])
        self.learner.load_state_dict(state)
        self.buffer = list(state["buffer"])
