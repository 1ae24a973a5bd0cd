"""ARG (Adaptive Reference Guidance) on the method hooks: guided continuations for the groups
that all failed, from a prefix of a verified reference solution whose length a shared bandit
learns, plus an exact per-token KL to the initial policy.

**Confidence: INFERRED** (``specs/methods-a.md`` §6; the maths and its sources are in
``reasonrl.methods.arg.maths``). Named in the recipe's ``methods:`` list::

    methods:
      - name: arg
        bins: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
        target: 0.5            # p*: the continuation success rate the selector aims at
        prefix_mode: context   # (i) prefix attended, not trained | weighted: (ii) trained with w_t
        beta: 1.0e-3           # the exact KL(π_θ‖π_ref) per token (replaces loss.kl)

Each step (``extend_batch``, after selection and before advantages):

1. groups none of whose rows scored above ``success_threshold`` are the all-failure groups;
   each needs a reference solution (``Problem.solution``, from ``batch.meta["problem"]``) that
   the run's own scorer accepts (checked once per problem, cached); others are skipped;
2. for each such group a bin b ∼ q_ψ is drawn with the run's generator, ℓ = ⌊ρ_b L⌋ tokens of
   the tokenised solution are appended to the prompt's token ids (ids, never re-tokenised
   text), and G' continuations are sampled by the current policy (the run's generator again,
   so a resumed run samples the same), within ``rollout.max_new_tokens − ℓ`` tokens;
3. each guided row's completion block is prefix ⊕ continuation, scored as text by the run's
   scorer; the group's rows are replaced by its guided rows (``mix_failed``: added to them),
   under the same group id and prompt block, so the advantage stage normalises them as one group;
4. the selector is updated with the groups' success rates (REINFORCE on u = −(p̂ − p*)²).

Prefix tokens were forced, not sampled, so they have no behaviour probability. Their
``sample_logprobs`` are the current policy's log-probs of them (π_old, one no-grad forward):
every PPO anchor (sg(π_θ), the recomputed proximal, the behaviour) then sees ratio 1 there
at the start of the update, as on sampled tokens. Under option (i) (``context``) their
``loss_mask`` is 0: attended, out of the loss, advantages and KL. Under option (ii)
(``weighted``) they are trained like the continuation (same advantage) with their per-token
loss multiplied by ``batch.is_weights`` = w_t = clip(π_old(y*_t)/π_ref(y*_t), 0, c) (1 on
every other token) — the weight is detached and fixed for the step, like an off-policy
correction's, which is why ``weighted`` refuses a recipe's ``off_policy`` (``prepare_behaviour``
would overwrite the weights).

π_ref is a frozen copy of the initial policy (``recipe.model`` built again), built only when
``beta > 0`` or ``prefix_mode: weighted``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

import torch
from torch import Tensor

from reasonrl.methods.arg.maths import (DEFAULT_BINS, all_failure_groups, check_bins, expected_ratio, prefix_length,
                                prefix_weights, reinforce_update, sample_bin, selector_entropy, selector_probs,
                                selector_reward, update_baseline)
from reasonrl.algos.distill import token_divergence
from reasonrl.algos.masked import masked_sum
from reasonrl.batch import RolloutBatch
from reasonrl.hooks import Method, MethodContext, learner_scorer, need_learner_scorer
from reasonrl.train.opd import teacher_logits
from reasonrl.params import Range
from reasonrl.policy.sampling import cut_at_stop, left_pad, right_pad, sample_completions
from reasonrl.registry import METHODS

__all__ = ["AdaptiveReferenceGuidance"]

TOKEN = "token/"


@METHODS.register("arg")
class AdaptiveReferenceGuidance(Method):
    def __init__(self, bins: tuple[float, ...] = DEFAULT_BINS,
                 target: Annotated[float, Range(ge=0, le=1, why="a success rate")] = 0.5,
                 num_guided: Optional[Annotated[int, Range(ge=1)]] = None,
                 prefix_mode: Literal["context", "weighted"] = "context",
                 clip: Annotated[float, Range(gt=0, why="c in w = clip(π/π_ref, 0, c)")] = 1.0,
                 beta: Annotated[float, Range(ge=0, why="the weight of the exact KL to π_ref")] = 1e-3,
                 selector_lr: Annotated[float, Range(ge=0)] = 5.0,
                 baseline_decay: Annotated[float, Range(ge=0, le=1)] = 0.9,
                 mix_failed: bool = False,
                 success_threshold: float = 0.0) -> None:
        """``bins``: prefix ratios ρ in [0, 1), increasing. ``target``: p*. ``num_guided``: G'
        (None: rollout.num_generations). ``prefix_mode``: ``context`` (option i) or ``weighted``
        (option ii, with ``clip`` = c). ``beta``: weight of the exact KL(π_θ‖π_ref) added to the
        loss on every trained token (0: none, no reference model). ``selector_lr``: η of the
        REINFORCE step; ``baseline_decay``: λ of its moving-average baseline. ``mix_failed``:
        keep a guided group's failed rows beside its guided rows. ``success_threshold``: a row
        succeeds when its reward is above it (a group all-fails when none does)."""
        self.check_params(bins=bins)
        self.bins, self.target, self.num_guided = tuple(float(b) for b in bins), target, num_guided
        self.prefix_mode, self.clip, self.beta = prefix_mode, clip, beta
        self.selector_lr, self.baseline_decay = selector_lr, baseline_decay
        self.mix_failed, self.success_threshold = mix_failed, success_threshold
        self.logits = torch.zeros(len(self.bins), dtype=torch.float64)  # ψ: uniform at the start
        self.baseline: Optional[float] = None
        self.verdicts: dict[tuple[str, str, str], bool] = {}  # a cache: rebuilt identically after a resume
        self.ref = None

    @staticmethod
    def check_params(bins: Any = DEFAULT_BINS, **_) -> None:
        check_bins(list(bins))

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        ro = recipe.rollout
        need_learner_scorer(recipe, need, "methods[arg] samples and scores guided rollouts")
        need(not ro.dynamic_sampling, "rollout.dynamic_sampling drops the all-failure groups ARG guides: turn it off")
        need(recipe.env is None, "guided continuations are single completions; an env's episodes are not: drop the env")
        need(not ro.simulated_partial, "rollout.simulated_partial gives tokens versions that guided rows lack: drop it")
        if config.get("beta", 1e-3) > 0:
            need(recipe.loss.kl.coef == 0, f"ARG's exact KL (beta) replaces the sampled estimator; loss.kl.coef is "
                                           f"{recipe.loss.kl.coef}: set it to 0, or beta: 0")
        if config.get("prefix_mode") == "weighted":
            need(recipe.off_policy is None, "prefix_mode 'weighted' puts w_t in batch.is_weights, which the recipe's "
                                            "off_policy correction overwrites: drop off_policy, or use prefix_mode: context")

    def setup(self, ctx: MethodContext) -> None:
        learner_scorer(ctx, "arg", "its guided rollouts")
        r = ctx.recipe
        self.policy, self.scorer, self.generator, self.recipe = ctx.policy, ctx.scorer, ctx.generator, r
        self.g = self.num_guided or r.rollout.num_generations
        from reasonrl.rollout.collect import stop_strings

        self.stop = stop_strings(r, ctx.task) if ctx.task is not None else (r.rollout.stop or None)
        if self.beta > 0 or self.prefix_mode == "weighted":
            from reasonrl.policy.teacher import build_teacher_policy

            self.ref = build_teacher_policy(r.model, ctx.policy, ctx.log, role="arg")

    # -- the reference solutions ------------------------------------------------
    def _solutions(self, problems: list[Any]) -> list[Optional[list[int]]]:
        """Token ids of each problem's reference solution if the run's scorer accepts it, else
        None (no problem, no solution, or a solution that fails its own verifier)."""
        keys = [(p.prompt, p.solution, p.answer) if getattr(p, "solution", "") else None for p in problems]
        todo = list({k: p for k, p in zip(keys, problems) if k is not None and k not in self.verdicts}.items())
        if todo:
            tok = self.policy.tokenizer
            texts = [p.solution for _, p in todo]
            lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
            scores = self.scorer(texts, [p for _, p in todo], lengths, [False] * len(todo), group_size=1)
            for (k, _), total in zip(todo, scores.total):
                self.verdicts[k] = total > self.success_threshold
        tok = self.policy.tokenizer
        return [tok(p.solution, add_special_tokens=False)["input_ids"] if k is not None and self.verdicts[k] else None
                for k, p in zip(keys, problems)]

    # -- the hook ---------------------------------------------------------------
    def extend_batch(self, batch: RolloutBatch, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        gids = list(dict.fromkeys(batch.group_ids.tolist()))
        failed = all_failure_groups(batch.rewards, batch.group_ids, self.success_threshold)
        metrics = {"arg/all_fail_fraction": len(failed) / max(1, len(gids))}
        rows = {g: [] for g in gids}
        for i, g in enumerate(batch.group_ids.tolist()):
            rows[g].append(i)
        problems = batch.meta.get("problem")
        sols = self._solutions([problems[rows[g][0]] for g in failed]) if problems is not None and failed else []
        todo = [(g, s) for g, s in zip(failed, sols) if s]
        metrics.update({"arg/guided_groups": float(len(todo)), "arg/unverified_groups": float(len(failed) - len(todo))})
        if todo:
            batch, guided_metrics = self._guide(batch, rows, todo, problems)
            metrics.update(guided_metrics)
        return batch, metrics  # the selector's state is logged by ``metrics()`` each step

    def _guide(self, batch: RolloutBatch, rows: dict[int, list[int]], todo: list[tuple[int, list[int]]],
               problems: list[Any]) -> tuple[RolloutBatch, dict[str, float]]:
        r, tok, g = self.recipe, self.policy.tokenizer, self.g
        if batch.aux:
            raise ValueError(f"method 'arg' cannot fill batch.aux keys {sorted(batch.aux)} for its guided rows")
        if batch.token_versions is not None:  # refused by check(); a hand-built batch may still carry them
            raise ValueError("method 'arg' cannot give token versions to its guided rows (rollout.simulated_partial)")
        budget = r.rollout.max_new_tokens
        chosen = [sample_bin(self.logits, self.generator) for _ in todo]
        ells = [prefix_length(self.bins[b], len(sol), budget - 1) for b, (_, sol) in zip(chosen, todo)]
        firsts = [rows[gid][0] for gid, _ in todo]
        prefixes = [torch.tensor(sol[:ell], dtype=torch.long, device=batch.prompt_ids.device)
                    for (_, sol), ell in zip(todo, ells)]
        heads = [torch.cat([batch.prompt_ids[i][batch.prompt_mask[i].bool()], p]) for i, p in zip(firsts, prefixes)]
        ids, mask = left_pad(heads, tok.pad_token_id)
        was = self.policy.model.training
        self.policy.model.eval()
        try:
            cont = sample_completions(self.policy.model, tok, ids, mask, g, budget - min(ells), r.rollout.temperature,
                                      self.generator, self.stop, decoder=self.policy.decoder)
        finally:
            self.policy.model.train(was)
        dev = batch.prompt_ids.device
        trained = 0 if self.prefix_mode == "context" else 1  # option (i): attended, not trained
        comp, logps, lmask, trunc, plens = [], [], [], [], []
        for c in range(len(todo) * g):
            k = c // g
            room, length = budget - ells[k], int(cont.completion_mask[c].sum())
            take = min(length, room)
            comp.append(torch.cat([prefixes[k], cont.completion_ids[c, :take].to(dev)]))
            # Prefix log-probs are placeholders here, set to π_old's in _prefix_logprobs.
            logps.append(torch.cat([torch.zeros(ells[k], device=dev), cont.sample_logprobs[c, :take].float().to(dev)]))
            lmask.append(torch.tensor([trained] * ells[k] + [1] * take, dtype=torch.long, device=dev))
            trunc.append(length > room or bool(cont.truncated[c]))  # cut at its own budget, or ran out
            plens.append(ells[k])
        comp_ids, comp_mask = right_pad(comp, tok.pad_token_id)
        texts = tok.batch_decode(comp_ids, skip_special_tokens=True)
        if self.stop:
            texts = [cut_at_stop(t, self.stop) for t in texts]
        probs = [problems[i] for i in firsts for _ in range(g)]
        scores = self.scorer(texts, probs, comp_mask.sum(-1).tolist(), trunc, group_size=g)
        src = [i for i in firsts for _ in range(g)]
        meta = {}
        for key, values in batch.meta.items():
            if key == "completion":
                meta[key] = texts
            elif key.startswith("reward/") and key[len("reward/"):] in scores.per_function:
                meta[key] = scores.per_function[key[len("reward/"):]]
            else:
                meta[key] = [values[i] for i in src]
        guided = RolloutBatch(
            prompt_ids=batch.prompt_ids[src], prompt_mask=batch.prompt_mask[src],
            completion_ids=comp_ids, completion_mask=comp_mask,
            group_ids=batch.group_ids[src].clone(),
            rewards=torch.tensor(scores.total, dtype=batch.rewards.dtype, device=batch.rewards.device),
            truncated=torch.tensor(trunc, dtype=torch.bool, device=batch.truncated.device),
            policy_version=batch.policy_version, sample_logprobs=right_pad(logps)[0], loss_mask=right_pad(lmask)[0],
            meta=meta)
        prefix = (torch.arange(guided.completion_len).unsqueeze(0) < torch.tensor(plens).unsqueeze(-1)).to(dev)
        metrics = self._prefix_logprobs(guided, prefix)
        # The selector learns from each group's continuation success rate.
        success = (guided.rewards > self.success_threshold).double().view(len(todo), g).mean(-1)
        u = selector_reward(success, self.target)
        base = float(u.mean()) if self.baseline is None else self.baseline
        self.logits = reinforce_update(self.logits, chosen, u, base, self.selector_lr)
        self.baseline = update_baseline(self.baseline, float(u.mean()), self.baseline_decay)
        metrics.update({
            "arg/rho_mean": sum(self.bins[b] for b in chosen) / len(chosen),
            "arg/prefix_tokens": sum(ells) / len(ells),
            "arg/continuation_success": float(success.mean()),
            "arg/guided_reward": float(guided.rewards.mean()),
            "arg/selector_u": float(u.mean()),
            "arg/guided_rows": float(len(guided)),
        })
        return self._merge(batch, guided, rows, {gid for gid, _ in todo}), metrics

    @torch.no_grad()
    def _prefix_logprobs(self, guided: RolloutBatch, prefix: Tensor) -> dict[str, float]:
        """Fill the prefix tokens' ``sample_logprobs`` with π_old's log-probs and, under option
        (ii), set ``is_weights`` to w_t on them (see the module docstring)."""
        from reasonrl.train.objective import batch_logprobs

        r = self.recipe
        mb, temp, share = r.train.micro_batch_size, r.rollout.temperature, r.train.share_prompt
        if not bool(prefix.any()):
            if self.prefix_mode == "weighted":
                guided.is_weights = torch.ones_like(guided.sample_logprobs)
            return {}
        logp = batch_logprobs(self.policy, guided, mb, temp, share)
        guided.sample_logprobs = torch.where(prefix, logp, guided.sample_logprobs)
        if self.prefix_mode != "weighted":
            return {}
        w = prefix_weights(logp, batch_logprobs(self.ref, guided, mb, temp, share), self.clip)
        guided.is_weights = torch.where(prefix, w, torch.ones_like(w))
        return {"arg/prefix_weight": float(w[prefix].mean())}

    def _merge(self, batch: RolloutBatch, guided: RolloutBatch, rows: dict[int, list[int]],
               guided_groups: set[int]) -> RolloutBatch:
        """The batch with each guided group's rows replaced by (or, ``mix_failed``, followed by)
        its guided rows, groups kept contiguous in their original order."""
        batch.loss_mask = torch.ones_like(batch.completion_mask) if batch.loss_mask is None else batch.loss_mask
        if guided.is_weights is not None and batch.is_weights is None:
            batch.is_weights = torch.ones_like(batch.sample_logprobs)
        n, order, next_guided = len(batch), [], 0
        for gid, idx in rows.items():
            if gid not in guided_groups or self.mix_failed:
                order += idx
            if gid in guided_groups:
                order += list(range(n + next_guided, n + next_guided + self.g))
                next_guided += self.g
        return RolloutBatch.concat([batch, guided], pad_id=self.policy.tokenizer.pad_token_id).select(order)

    # -- the exact KL ----------------------------------------------------------
    def loss_term(self, inputs: Any) -> tuple[Tensor, dict[str, float]]:
        """β · KL(π_θ‖π_ref) per trained token, exact over the vocabulary, reduced like the policy
        loss (mini-batch totals: split-invariant)."""
        if self.beta == 0:
            return torch.zeros((), device=inputs.logits.device), {}
        micro = inputs.micro
        ref_logits = teacher_logits(self.ref, micro, self.recipe.train.share_prompt)
        kl = token_divergence(inputs.logits, ref_logits, "reverse_kl", temperature=inputs.temperature)
        return self.beta * inputs.aggregate(kl), {TOKEN + "arg/kl": float(masked_sum(kl.detach(), inputs.mask))}

    # -- metrics and state ---------------------------------------------------------
    def after_update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        q = selector_probs(self.logits)
        out = {"arg/expected_rho": expected_ratio(self.logits, self.bins), "arg/selector_entropy": selector_entropy(self.logits)}
        out.update({f"arg/q/{rho:g}": float(p) for rho, p in zip(self.bins, q)})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"logits": self.logits.clone(), "baseline": self.baseline}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.logits = state["logits"].clone().to(torch.float64)
            self.baseline = state["baseline"]
