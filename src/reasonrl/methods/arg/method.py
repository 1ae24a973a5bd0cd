"""ARG (Adaptive Reference Guidance) on the method hooks: for each GRPO group that all failed, G
continuations from a prefix of a verified reference solution, whose length a bandit shared by all
questions learns from the paper's criterion; a continuation that fails verification falls back to
the reference itself; plus an exact per-token KL to the initial policy.

**Confidence: INFERRED** from the abstract's argument (paper: "Adaptive Reference Guidance"; full
text and code not located). The maths and its sources are in ``reasonrl.methods.arg.maths``, the
selectors in ``reasonrl.methods.arg.selectors``. Named in the recipe's ``methods:`` list::

    methods:
      - name: arg
        bins: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
        selector: surprisal    # the paper's criterion (EXP3); success_target: the ablation
        gamma: 0.1             # EXP3's exploration
        fallback: true         # a failing continuation is replaced by the reference
        mix_failed: true       # the group's failed rollouts stay beside its guided rows
        prefix_mode: context   # prefix attended, not trained | weighted: trained with w_t
        beta: 1.0e-3           # the exact KL(π_θ‖π_ref) per token (replaces loss.kl)

Each step (``extend_batch``, after selection and before advantages):

1. groups none of whose rows scored above ``success_threshold`` are the all-failure groups;
   each needs a reference solution (``Problem.solution``) that the run's own scorer accepts and
   that fits the completion budget with its EOS (checked once per problem, cached);
2. one no-grad forward of the policy over prompt ⊕ reference gives π_old's log-probs of every
   reference token: S(ℓ) for every ℓ, and the behaviour log-probs of prefix and fallback tokens
   (forced, not sampled); with π_ref, the weights w_t = clip(π_old/π_ref, 0, c) on them;
3. a bin per group from the selector (the run's generator), ℓ = ⌊ρ L⌋ reference tokens appended
   to the prompt's token ids, G' continuations sampled by the current policy within
   ``rollout.max_new_tokens − ℓ`` tokens;
4. each continuation, prefix ⊕ ŷ, is scored as text by the run's scorer; it passes when its
   reward is above ``success_threshold`` and differs when its text is not the reference's (up to
   whitespace); the group's observation u = mean_j 1[passes ∧ differs] · S(ℓ) updates the
   selector (``success_target``: the pass rate does);
5. the guided rows: a passing continuation (prefix attended, out of the loss under ``context``),
   or, for one that fails, the reference y* (with ``fallback``): every token trained, its
   behaviour log-probs π_old's, its per-token loss multiplied by w_t (``batch.is_weights``), its
   reward the reference's own. With ``mix_failed`` the group's failed rollouts stay beside them
   under the same group id, so the group's advantage compares correct and failed trajectories.

Prefix and fallback tokens carry π_old's log-probs, so every PPO anchor sees ratio 1 on them at
the start of the update, as on sampled tokens. w_t is detached and fixed for the step like an
off-policy correction's weight, which is why ``fallback`` and ``prefix_mode: weighted`` refuse a
recipe's ``off_policy`` (``prepare_behaviour`` would overwrite the weights).

π_ref is a frozen copy of the initial policy (``recipe.model`` built again), built only when
``beta > 0``, ``fallback`` or ``prefix_mode: weighted``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

import torch
from torch import Tensor

from reasonrl.algos.distill import token_divergence
from reasonrl.algos.masked import masked_sum
from reasonrl.batch import RolloutBatch
from reasonrl.hooks import Method, MethodContext, learner_scorer, need_learner_scorer
from reasonrl.methods.arg.maths import (DEFAULT_BINS, all_failure_groups, check_bins, expected_ratio, prefix_length,
                                        prefix_weights, same_text, selector_entropy, suffix_surprisal,
                                        surprisal_reward)
from reasonrl.methods.arg.selectors import SELECTORS, Observation
from reasonrl.params import Range
from reasonrl.policy.sampling import cut_at_stop, left_pad, right_pad, sample_completions
from reasonrl.policy.teacher import build_teacher_policy
from reasonrl.registry import METHODS
from reasonrl.rollout.collect import stop_strings
from reasonrl.train.objective import batch_logprobs
from reasonrl.train.opd import teacher_logits

__all__ = ["AdaptiveReferenceGuidance"]

TOKEN = "token/"


@dataclass(frozen=True)
class Reference:
    """A verified reference solution: its text, token ids (EOS appended when the tokenizer has
    one) and the scorer's verdict on it (the reward a fallback row gets)."""
    text: str
    ids: list[int]
    total: float
    per_function: dict[str, float]


@METHODS.register("arg")
class AdaptiveReferenceGuidance(Method):
    def __init__(self, bins: tuple[float, ...] = DEFAULT_BINS,
                 selector: Literal["surprisal", "success_target"] = "surprisal",
                 gamma: Annotated[float, Range(gt=0, le=1, why="EXP3's exploration rate")] = 0.1,
                 target: Annotated[float, Range(ge=0, le=1, why="a success rate")] = 0.5,
                 num_guided: Optional[Annotated[int, Range(ge=1)]] = None,
                 fallback: bool = True,
                 prefix_mode: Literal["context", "weighted"] = "context",
                 clip: Annotated[float, Range(gt=0, why="c in w = clip(π/π_ref, 0, c)")] = 1.0,
                 beta: Annotated[float, Range(ge=0, why="the weight of the exact KL to π_ref")] = 1e-3,
                 selector_lr: Annotated[float, Range(ge=0)] = 5.0,
                 baseline_decay: Annotated[float, Range(ge=0, le=1)] = 0.9,
                 mix_failed: bool = True,
                 success_threshold: float = 0.0) -> None:
        """``bins``: prefix ratios ρ in [0, 1), increasing. ``selector``: ``surprisal`` (the
        paper's criterion q(ℓ)·S(ℓ), EXP3 with exploration ``gamma``) or ``success_target`` (the
        ablation: REINFORCE on −(p̂ − ``target``)² with ``selector_lr`` and ``baseline_decay``).
        ``num_guided``: G' (None: rollout.num_generations). ``fallback``: a continuation that
        fails is replaced by the reference. ``prefix_mode``: ``context`` (prefix attended, not
        trained) or ``weighted`` (trained with w_t, clip ``clip``). ``beta``: weight of the exact
        KL(π_θ‖π_ref) on every trained token (0: none). ``mix_failed``: keep a guided group's
        failed rollouts beside its guided rows. ``success_threshold``: a row passes when its
        reward is above it (a group all-fails when none does)."""
        self.check_params(bins=bins)
        self.bins, self.selector_name, self.num_guided = tuple(float(b) for b in bins), selector, num_guided
        self.fallback, self.prefix_mode, self.clip, self.beta = fallback, prefix_mode, clip, beta
        self.mix_failed, self.success_threshold = mix_failed, success_threshold
        self.selector = SELECTORS[selector](len(self.bins), gamma=gamma, target=target, lr=selector_lr,
                                            baseline_decay=baseline_decay)
        self.references: dict[tuple[str, str, str], Optional[Reference]] = {}  # a cache: rebuilt identically on resume
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
        weighted = [why for why, on in (("fallback: true", config.get("fallback", True)),
                                        ("prefix_mode: weighted", config.get("prefix_mode") == "weighted")) if on]
        if weighted:
            need(recipe.off_policy is None, f"ARG's {' and '.join(weighted)} put w_t in batch.is_weights, which the "
                                            f"recipe's off_policy correction overwrites: drop off_policy, or set "
                                            f"fallback: false and prefix_mode: context")

    def setup(self, ctx: MethodContext) -> None:
        learner_scorer(ctx, "arg", "its guided rollouts")
        r = ctx.recipe
        self.policy, self.scorer, self.generator, self.recipe = ctx.policy, ctx.scorer, ctx.generator, r
        self.g = self.num_guided or r.rollout.num_generations
        self.stop = stop_strings(r, ctx.task) if ctx.task is not None else (r.rollout.stop or None)
        if self.beta > 0 or self.fallback or self.prefix_mode == "weighted":
            self.ref = build_teacher_policy(r.model, ctx.policy, ctx.log, role="arg")

    def _cut(self, text: str) -> str:
        return cut_at_stop(text, self.stop) if self.stop else text

    # -- the reference solutions ------------------------------------------------
    def _references(self, problems: list[Any]) -> list[Optional[Reference]]:
        """Each problem's reference solution if the run's scorer accepts it and it fits the
        completion budget with its EOS, else None (no problem, no solution, a solution that fails
        its own verifier, or one too long to be a completion)."""
        keys = [(p.prompt, p.solution, p.answer) if getattr(p, "solution", "") else None for p in problems]
        todo = list({k: p for k, p in zip(keys, problems) if k is not None and k not in self.references}.items())
        if todo:
            tok, eos = self.policy.tokenizer, self.policy.tokenizer.eos_token_id
            ids = [tok(p.solution, add_special_tokens=False)["input_ids"] + ([] if eos is None else [eos])
                   for _, p in todo]
            scores = self.scorer([p.solution for _, p in todo], [p for _, p in todo], [len(i) for i in ids],
                                 [False] * len(todo), group_size=1)
            for j, ((k, p), total) in enumerate(zip(todo, scores.total)):
                fits = len(ids[j]) <= self.recipe.rollout.max_new_tokens
                ok = total > self.success_threshold and fits
                self.references[k] = Reference(p.solution, ids[j], float(total),
                                               {name: v[j] for name, v in scores.per_function.items()}) if ok else None
        return [None if k is None else self.references[k] for k in keys]

    # -- the hook ---------------------------------------------------------------
    def extend_batch(self, batch: RolloutBatch, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        gids = list(dict.fromkeys(batch.group_ids.tolist()))
        failed = all_failure_groups(batch.rewards, batch.group_ids, self.success_threshold)
        metrics = {"arg/all_fail_fraction": len(failed) / max(1, len(gids))}
        rows = {g: [] for g in gids}
        for i, g in enumerate(batch.group_ids.tolist()):
            rows[g].append(i)
        problems = batch.meta.get("problem")
        refs = self._references([problems[rows[g][0]] for g in failed]) if problems is not None and failed else []
        todo = [(g, ref) for g, ref in zip(failed, refs) if ref is not None]
        metrics.update({"arg/guided_groups": float(len(todo)), "arg/unverified_groups": float(len(failed) - len(todo))})
        if todo:
            batch, guided_metrics = self._guide(batch, rows, todo, problems)
            metrics.update(guided_metrics)
        return batch, metrics  # the selector's state is logged by ``metrics()`` each step

    def _reference_logprobs(self, batch: RolloutBatch, firsts: list[int],
                            refs: list[Reference]) -> tuple[Tensor, Optional[Tensor]]:
        """π_old's log-probs of every reference token after its prompt (one no-grad forward), and
        with π_ref the weights w_t = clip(π_old/π_ref, 0, c) on them."""
        r, dev = self.recipe, batch.prompt_ids.device
        ids, mask = right_pad([torch.tensor(ref.ids, dtype=torch.long, device=dev) for ref in refs],
                              self.policy.tokenizer.pad_token_id)
        n = len(refs)
        rb = RolloutBatch(prompt_ids=batch.prompt_ids[firsts], prompt_mask=batch.prompt_mask[firsts],
                          completion_ids=ids, completion_mask=mask, group_ids=torch.arange(n),
                          rewards=torch.zeros(n), truncated=torch.zeros(n, dtype=torch.bool))
        mb, temp, share = r.train.micro_batch_size, r.rollout.temperature, r.train.share_prompt
        with torch.no_grad():
            logp = batch_logprobs(self.policy, rb, mb, temp, share)
            w = None if self.ref is None else prefix_weights(logp, batch_logprobs(self.ref, rb, mb, temp, share),
                                                             self.clip)
        return logp, w

    def _guide(self, batch: RolloutBatch, rows: dict[int, list[int]], todo: list[tuple[int, Reference]],
               problems: list[Any]) -> tuple[RolloutBatch, dict[str, float]]:
        r, tok, g = self.recipe, self.policy.tokenizer, self.g
        if batch.aux:
            raise ValueError(f"method 'arg' cannot fill batch.aux keys {sorted(batch.aux)} for its guided rows")
        if batch.token_versions is not None:  # refused by check(); a hand-built batch may still carry them
            raise ValueError("method 'arg' cannot give token versions to its guided rows (rollout.simulated_partial)")
        budget, dev = r.rollout.max_new_tokens, batch.prompt_ids.device
        refs = [ref for _, ref in todo]
        firsts = [rows[gid][0] for gid, _ in todo]
        ref_logp, ref_w = self._reference_logprobs(batch, firsts, refs)
        chosen = self.selector.draw(len(todo), self.generator)
        solution_len = [len(ref.ids) - (tok.eos_token_id is not None) for ref in refs]
        ells = [prefix_length(self.bins[b], n, budget - 1) for b, n in zip(chosen, solution_len)]
        s_ell = [suffix_surprisal(ref_logp[k, :len(ref.ids)], ell) for k, (ref, ell) in enumerate(zip(refs, ells))]
        s_full = [suffix_surprisal(ref_logp[k, :len(ref.ids)], 0) for k, ref in enumerate(refs)]
        prefixes = [torch.tensor(ref.ids[:ell], dtype=torch.long, device=dev) for ref, ell in zip(refs, ells)]
        heads = [torch.cat([batch.prompt_ids[i][batch.prompt_mask[i].bool()], p]) for i, p in zip(firsts, prefixes)]
        ids, mask = left_pad(heads, tok.pad_token_id)
        was = self.policy.model.training
        self.policy.model.eval()
        try:
            cont = sample_completions(self.policy.model, tok, ids, mask, g, budget - min(ells), r.rollout.temperature,
                                      self.generator, self.stop, decoder=self.policy.decoder)
        finally:
            self.policy.model.train(was)
        # The continuations, prefix ⊕ ŷ, scored as text.
        comp, logps, trunc = [], [], []
        for c in range(len(todo) * g):
            k = c // g
            take = min(int(cont.completion_mask[c].sum()), budget - ells[k])
            comp.append(torch.cat([prefixes[k], cont.completion_ids[c, :take].to(dev)]))
            logps.append(torch.cat([ref_logp[k, :ells[k]].float(), cont.sample_logprobs[c, :take].float().to(dev)]))
            trunc.append(int(cont.completion_mask[c].sum()) > take or bool(cont.truncated[c]))
        texts = [self._cut(t) for t in tok.batch_decode(right_pad(comp, tok.pad_token_id)[0], skip_special_tokens=True)]
        probs = [problems[i] for i in firsts for _ in range(g)]
        scores = self.scorer(texts, probs, [len(x) for x in comp], trunc, group_size=g)
        passed = [t > self.success_threshold for t in scores.total]
        differs = [not same_text(t, self._cut(refs[c // g].text)) for c, t in enumerate(texts)]
        # The selector learns from each group's continuations.
        obs, u_raw = [], []
        for k, b in enumerate(chosen):
            sl = slice(k * g, (k + 1) * g)
            u, x = surprisal_reward(passed[sl], differs[sl], s_ell[k], s_full[k])
            obs.append(Observation(bin=b, x=x, success=sum(passed[sl]) / g))
            u_raw.append(u)
        selector_u = self.selector.update(obs)
        # The guided rows: each continuation, or (fallback) the reference in place of a failed one.
        trained = 0 if self.prefix_mode == "context" else 1
        weighted = self.fallback or self.prefix_mode == "weighted"
        lmask, weights, rewards, per_fn, falls = [], [], [], {name: [] for name in scores.per_function}, []
        for c in range(len(todo) * g):
            k, ell = c // g, ells[c // g]
            fall = self.fallback and not passed[c]
            falls.append(fall)
            n = len(refs[k].ids)
            if fall:
                comp[c] = torch.tensor(refs[k].ids, dtype=torch.long, device=dev)
                logps[c] = ref_logp[k, :n].float()
                texts[c] = tok.decode(comp[c], skip_special_tokens=True)
                trunc[c] = False
                lmask.append(torch.ones(n, dtype=torch.long, device=dev))
                weights.append(ref_w[k, :n].float())
                rewards.append(refs[k].total)
            else:
                lmask.append(torch.tensor([trained] * ell + [1] * (len(comp[c]) - ell), dtype=torch.long, device=dev))
                w = torch.ones(len(comp[c]), device=dev)
                if self.prefix_mode == "weighted":
                    w[:ell] = ref_w[k, :ell].float()
                weights.append(w)
                rewards.append(scores.total[c])
            for name in per_fn:
                per_fn[name].append(refs[k].per_function.get(name, 0.0) if fall else scores.per_function[name][c])
        comp_ids, comp_mask = right_pad(comp, tok.pad_token_id)
        src = [i for i in firsts for _ in range(g)]
        meta = {}
        for key, values in batch.meta.items():
            if key == "completion":
                meta[key] = texts
            elif key.startswith("reward/") and key[len("reward/"):] in per_fn:
                meta[key] = per_fn[key[len("reward/"):]]
            else:
                meta[key] = [values[i] for i in src]
        guided = RolloutBatch(
            prompt_ids=batch.prompt_ids[src], prompt_mask=batch.prompt_mask[src],
            completion_ids=comp_ids, completion_mask=comp_mask,
            group_ids=batch.group_ids[src].clone(),
            rewards=torch.tensor(rewards, dtype=batch.rewards.dtype, device=batch.rewards.device),
            truncated=torch.tensor(trunc, dtype=torch.bool, device=batch.truncated.device),
            policy_version=batch.policy_version, sample_logprobs=right_pad(logps)[0], loss_mask=right_pad(lmask)[0],
            is_weights=right_pad(weights, 1.0)[0] if weighted else None, meta=meta)
        n_rows = len(todo) * g
        metrics = {
            "arg/rho_mean": sum(self.bins[b] for b in chosen) / len(chosen),
            "arg/prefix_tokens": sum(ells) / len(ells),
            "arg/continuation_success": sum(passed) / n_rows,
            "arg/pass_and_differ": sum(p and d for p, d in zip(passed, differs)) / n_rows,
            "arg/fallback_share": sum(falls) / n_rows,
            "arg/surprisal": sum(s_ell) / len(s_ell),
            "arg/surprisal_full": sum(s_full) / len(s_full),
            "arg/criterion_u": sum(u_raw) / len(u_raw),
            "arg/selector_u": selector_u,
            "arg/guided_reward": float(guided.rewards.mean()),
            "arg/guided_rows": float(n_rows),
        }
        for b in sorted(set(chosen)):  # S(ℓ) by bin, for the bins drawn this step
            picked = [s for s, c in zip(s_ell, chosen) if c == b]
            metrics[f"arg/surprisal/{self.bins[b]:g}"] = sum(picked) / len(picked)
        if self.prefix_mode == "weighted" and any(ells):
            metrics["arg/prefix_weight"] = float(torch.cat([ref_w[k, :ell] for k, ell in enumerate(ells)]).mean())
        if any(falls):
            metrics["arg/fallback_weight"] = float(torch.cat([weights[c] for c in range(n_rows) if falls[c]]).mean())
        return self._merge(batch, guided, rows, {gid for gid, _ in todo}), metrics

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
        q = self.selector.probs()
        out = {"arg/expected_rho": expected_ratio(q, self.bins), "arg/selector_entropy": selector_entropy(q)}
        out.update({f"arg/q/{rho:g}": float(p) for rho, p in zip(self.bins, q)})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"selector": self.selector_name, **self.selector.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        saved = state.get("selector", "success_target")  # checkpoints before the rebuild held only ψ and b̄
        if saved != self.selector_name:
            raise ValueError(f"method 'arg': the checkpoint holds the '{saved}' selector's state but the recipe asks "
                             f"for selector '{self.selector_name}'; resume with selector: {saved}")
        self.selector.load_state_dict(state)
