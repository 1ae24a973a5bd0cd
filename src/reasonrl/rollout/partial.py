"""Partial rollouts' weight switches: the prefix checks (``PREFIX_CHECKS``), the switching code both
modes share (``PrefixSwitches``; the async source's real partial rollouts use it through
``reasonrl.rollout.inflight``), and the simulated mode (``rollout.simulated_partial: j``).

A deterministic stand-in for a weight update arriving mid-generation (the async source's
partial rollouts, made reproducible): with ``rollout.simulated_staleness: k`` each completion's
first j tokens are sampled by the stale snapshot μ, and every row still running after j tokens
continues under the learner's current weights π. Rows that ended within j tokens stay as
sampled (fully stale). At the switch, a ``rollout.prefix_check`` decides each running row's
stale prefix (RollVerify, paper not located, INFERRED; math in ``reasonrl.methods.rollverify.maths``):

- ``keep``: continue from the whole prefix; its tokens keep μ's log-probs and version;
- ``discard``: regenerate every running row from its prompt under π;
- ``rollverify_sequence``: discard a prefix whose OPS > τ_seq, keep the rest;
- ``rollverify_token``: speculative acceptance min(1, π/μ), cut at the first rejection t* and
  draw y_{t*} from norm(max(0, π − μ)); the resumed rollout is then distributed as π;
- ``rollverify_deterministic``: cut at the first |d_t| > τ_tok (π resamples the cut token).

Prefixes kept by a ``rollverify_*`` check are treated as on-policy (the spec's ρ ≈ 1): their
``sample_logprobs`` become π's and their ``token_versions`` the current version. All
distributions are the temperature-scaled ones the sampler draws from; every random draw uses
the recipe's generator, so a resumed run samples what the straight run sampled.

A check is ``fn(<pipeline args it names>, **params) -> PrefixDecision``; the pipeline args are
``current_logprobs``/``behaviour_logprobs`` [R,j] (π from a no-grad forward, μ as sampled),
``current_probs``/``behaviour_probs`` [R,j,V] (both from forwards; computed only if named),
``prefix_tokens``, ``prefix_mask`` [R,j] and ``generator``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from reasonrl.algos.prefix_shift import ops, verification_metrics
from reasonrl.policy.sampling import Samples, cut_at_stop, left_pad, right_pad, sample_completions
from reasonrl.registry import PREFIX_CHECKS

__all__ = ["PrefixDecision", "PartialRollout", "check_partial", "keep", "discard"]

PIPELINE = ("current_logprobs", "behaviour_logprobs", "current_probs", "behaviour_probs", "prefix_tokens",
            "prefix_mask", "generator")


@dataclass
class PrefixDecision:
    """What a prefix check decides per running row: keep ``kept`` [R] of its stale tokens,
    then (``replacement`` [R], −1 for none) one token drawn by the check; ``on_policy``: the
    kept tokens count as sampled by π; ``sequence_keep`` [R] (metrics): the prefix passed."""

    kept: Tensor
    replacement: Optional[Tensor] = None
    on_policy: bool = False
    sequence_keep: Optional[Tensor] = None


@PREFIX_CHECKS.register("keep")
def keep(prefix_mask: Tensor) -> PrefixDecision:
    """Continue under π from the whole stale prefix (μ's log-probs and version stay)."""
    return PrefixDecision(kept=prefix_mask.long().sum(-1))


@PREFIX_CHECKS.register("discard")
def discard(prefix_mask: Tensor) -> PrefixDecision:
    """Drop every stale prefix and regenerate from the prompt under π (costs the prefix)."""
    none = torch.zeros(prefix_mask.shape[0], dtype=torch.long, device=prefix_mask.device)
    return PrefixDecision(kept=none, sequence_keep=none.bool())


def check_partial(recipe, need, real: bool = False) -> None:
    """The recipe rules of ``rollout.simulated_partial`` / ``rollout.prefix_check``: the sync
    source's simulated partial rollouts, or (``real``) the async source's."""
    ro = recipe.rollout
    if real:
        need(ro.simulated_partial == 0, "rollout.simulated_partial simulates partial rollouts in the sync source; the "
                                        "async source's are real (rollout.partial: true, with rollout.prefix_check)")
        if ro.prefix_check is None:
            return
        need(ro.partial, "rollout.prefix_check checks the stale prefixes of partial rollouts: set rollout.partial: true")
        need(not ro.simulated_staleness, "rollout.prefix_check needs weights arriving mid-generation; with "
                                         "rollout.simulated_staleness each batch is sampled by one version (to "
                                         "simulate a switch use rollout.source: sync with rollout.simulated_partial)")
    elif not ro.simulated_partial:
        need(ro.prefix_check is None, "rollout.prefix_check decides stale prefixes at the switch of "
                                      "rollout.simulated_partial (or, with rollout.source: async, of real partial "
                                      "rollouts); set rollout.simulated_partial > 0 or drop it")
        return
    else:
        need(ro.simulated_staleness > 0, "rollout.simulated_partial needs rollout.simulated_staleness > 0 (the first "
                                         "tokens come from the stale weights, the rest from the current ones)")
        need(ro.simulated_partial < ro.max_new_tokens,
             f"rollout.simulated_partial={ro.simulated_partial} must be below rollout.max_new_tokens="
             f"{ro.max_new_tokens}, or no token is left to sample with the current weights")
    name = ro.prefix_check.name if ro.prefix_check is not None else "keep"
    need(ro.temperature > 0 or not getattr(PREFIX_CHECKS.get(name), "compares_policies", False),
         f"rollout.prefix_check '{name}' compares the stale and current sampling distributions; greedy "
         "decoding (rollout.temperature: 0) has none: use keep or discard, or a temperature > 0")


@torch.no_grad()
def _logits(policy, prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor, temperature: float) -> Tensor:
    """Log-softmax [R,j,V] (float32) of the distributions ``policy`` samples tokens from,
    temperature-scaled as in ``sample_completions``, at every prefix position (right-padded
    ``tokens``, ``mask``)."""
    was = policy.model.training
    policy.model.eval()
    try:
        logits = policy.completion_logits(prompt_ids, prompt_mask, tokens, mask).float()
    finally:
        policy.model.train(was)
    return F.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)


def _stop_cut(tokenizer, tokens: Tensor, stop: list[str]) -> Optional[int]:
    """The length at which the sampler would have ended a completion: its first token at which
    the text so far contains a stop string (one may span the stale prefix and π's tokens)."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if cut_at_stop(text, stop) == text:
        return None
    return next(n for n in range(1, len(tokens) + 1)
                if any(s in tokenizer.decode(tokens[:n], skip_special_tokens=True) for s in stop))


class PrefixSwitches:
    """The weight switches of partial rollouts, shared by the simulated ones (``PartialRollout``)
    and the async source's real ones (``reasonrl.rollout.inflight``).

    A completion is a row ``[tokens, behaviour log-probs, versions]``. At a switch the rows still
    running hold prefixes (of any lengths) sampled by μ; ``run`` checks them with the recipe's
    prefix check, cuts each to its kept length (plus the check's drawn token), and continues
    the rest under π from prompt + kept prefix, as often as the continuation is interrupted by
    a further switch. ``metrics()`` returns (and resets) what the switches since the last call
    measured; ``last`` is the latest switch's record."""

    def __init__(self, tokenizer, recipe) -> None:
        self.tokenizer = tokenizer
        spec = recipe.rollout.prefix_check
        self.check = PREFIX_CHECKS.get(spec.name if spec is not None else "keep")
        self.params = dict(spec.params) if spec is not None else {}
        self.wants = set(inspect.signature(self.check).parameters) & set(PIPELINE)
        self.last: dict | None = None
        self._records: list[dict] = []
        self._batches = 0

    @staticmethod
    def rows_of(samples: Samples, version: int) -> list[list[Tensor]]:
        lengths, dev = samples.completion_mask.sum(-1).tolist(), samples.completion_ids.device
        return [[samples.completion_ids[i, :m], samples.sample_logprobs[i, :m],
                 torch.full((m,), version, dtype=torch.long, device=dev)] for i, m in enumerate(lengths)]

    def run(self, first: Samples, rows, running: list[int], mu, pi, load, sample, max_new_tokens: int,
            temperature: float, generator, stop) -> Samples:
        """Switch ``running`` rows of ``first`` (sampled by μ) to π and return the finished batch.

        ``mu``/``pi``: policies for the check's forwards (μ's before ``load()``, π's after);
        ``load()`` makes π the loaded weights and returns its version; ``sample(ids, mask,
        budget)`` continues left-padded prompt + prefix rows (one completion each) under π, and
        may stop early at a further switch (its ``Samples.running`` then names the rows)."""
        self._batches += 1
        truncated, texts = first.truncated.clone(), list(first.texts)
        touched: set[int] = set()
        if not running:
            self.last = {"rows": len(rows), "running": torch.zeros(0, dtype=torch.long), "kept": torch.zeros(0),
                         "replacement": None, "sequence_keep": None}
        while running:
            go, heads, budgets, version = self._switch(first, rows, running, truncated, mu, pi, load, max_new_tokens,
                                                       temperature, generator)
            touched |= set(running)
            running = []
            if not go:
                break
            ids, mask = left_pad(heads, self.tokenizer.pad_token_id)
            cont = sample(ids, mask, max(budgets))
            for c, (i, b) in enumerate(zip(go, budgets)):
                length = int(cont.completion_mask[c].sum())
                take = min(length, b)
                t, lp, v = rows[i]
                rows[i] = [torch.cat([t, cont.completion_ids[c, :take]]), torch.cat([lp, cont.sample_logprobs[c, :take]]),
                           torch.cat([v, torch.full_like(cont.completion_ids[c, :take], version)])]
                truncated[i] = length > b or bool(cont.truncated[c])  # cut at its own budget, or ran out
                if cont.running is not None and bool(cont.running[c]) and length < b:
                    running.append(i)  # interrupted by newer weights: switch again
        for i in sorted(touched):
            cut = _stop_cut(self.tokenizer, rows[i][0], stop) if stop else None
            if cut is not None:
                rows[i] = [x[:cut] for x in rows[i]]
                truncated[i] = False
            text = self.tokenizer.decode(rows[i][0], skip_special_tokens=True)
            texts[i] = cut_at_stop(text, stop) if stop else text
        ids, mask = right_pad([r[0] for r in rows], self.tokenizer.pad_token_id)
        logps, versions = (right_pad([r[k] for r in rows])[0] for k in (1, 2))
        return Samples(prompt_ids=first.prompt_ids, prompt_mask=first.prompt_mask, completion_ids=ids,
                       completion_mask=mask, sample_logprobs=logps, truncated=truncated, texts=texts,
                       token_versions=versions)

    def _switch(self, first, rows, running, truncated, mu, pi, load, max_new_tokens, temperature, generator):
        """Check the running rows' prefixes and cut them (in place); returns the rows to continue,
        their prompt + prefix heads, token budgets, and π's version."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        idx = torch.tensor(running, device=first.prompt_ids.device)
        p_ids, p_mask = first.prompt_ids[idx], first.prompt_mask[idx]
        lens = torch.tensor([len(rows[i][0]) for i in running], device=idx.device)
        prefix = torch.full((len(running), int(lens.max())), pad, dtype=torch.long, device=idx.device)
        prefix_mask, mu_lp = torch.zeros_like(prefix), torch.zeros(prefix.shape, device=idx.device)
        for r, i in enumerate(running):
            prefix[r, :lens[r]], mu_lp[r, :lens[r]], prefix_mask[r, :lens[r]] = rows[i][0], rows[i][1], 1
        # μ's distributions before the switch: in the async source μ and π are one model.
        mu_probs = _logits(mu, p_ids, p_mask, prefix, prefix_mask, temperature).exp() \
            if "behaviour_probs" in self.wants else None
        version = int(load())
        pi_all = _logits(pi, p_ids, p_mask, prefix, prefix_mask, temperature)
        pi_lp = pi_all.gather(-1, prefix.unsqueeze(-1)).squeeze(-1) * prefix_mask
        given = {"current_logprobs": pi_lp, "behaviour_logprobs": mu_lp, "behaviour_probs": mu_probs,
                 "prefix_tokens": prefix, "prefix_mask": prefix_mask, "generator": generator}
        if "current_probs" in self.wants:
            given["current_probs"] = pi_all.exp()
        decision = self.check(**{k: given[k] for k in self.wants}, **self.params)
        kept = torch.minimum(decision.kept.long().clamp(min=0), lens)
        repl = decision.replacement if decision.replacement is not None else torch.full_like(kept, -1)
        seq = decision.sequence_keep
        record = {"rows": len(rows), "running": idx.cpu(), "j": lens.cpu(), "kept": kept.cpu(), "replacement": repl.cpu(),
                  "sequence_keep": None if seq is None else seq.cpu(), "ops": ops(pi_lp, mu_lp, prefix_mask)["mean_abs"].cpu()}
        self.last = record
        self._records.append(record)
        go, heads, budgets = [], [], []
        for r, i in enumerate(running):
            k, y = int(kept[r]), int(repl[r])
            lp, v = (pi_lp[r, :k], torch.full_like(prefix[r, :k], version)) if decision.on_policy \
                else (rows[i][1][:k], rows[i][2][:k])
            t = prefix[r, :k]
            if y >= 0:
                if k >= int(lens[r]):
                    raise ValueError(f"prefix check '{self.check.__name__}' drew a replacement for a prefix it "
                                     "kept whole; a replacement replaces the token at the cut (kept < length)")
                # The token at t* is μ's accepted draw or the residual's: marginally π's law, so its
                # behaviour log-prob is log π(y), not the residual's.
                t, lp, v = torch.cat([t, t.new_tensor([y])]), torch.cat([lp, pi_all[r, k, y:y + 1]]), \
                    torch.cat([v, v.new_tensor([version])])
            rows[i] = [t, lp, v]
            truncated[i] = False
            if y == eos:
                continue  # the drawn token ends the row
            heads.append(torch.cat([p_ids[r][p_mask[r].bool()], t]))
            budgets.append(max_new_tokens - len(t))
            go.append(i)
        return go, heads, budgets, version

    def metrics(self) -> dict[str, float]:
        records, self._records = self._records, []
        batches, self._batches = self._batches, 0
        if not records:
            return {"partial/switches": 0.0} if batches else {}
        j = torch.cat([r["j"] for r in records])
        kept = torch.cat([r["kept"] for r in records])
        seq = None
        if any(r["sequence_keep"] is not None for r in records):
            seq = torch.cat([r["sequence_keep"].bool() if r["sequence_keep"] is not None
                             else torch.ones(len(r["kept"]), dtype=torch.bool) for r in records])
        out = verification_metrics(j, kept, seq)
        shift = torch.cat([r["ops"] for r in records])
        out.update({
            "partial/switches": float(len(records)),
            "partial/running_fraction": len(j) / max(1, sum(r["rows"] for r in records)),
            "partial/prefix_tokens": float(j.sum()),
            "partial/regenerated_tokens": float((j - kept).sum()),
            "partial/ops_mean_abs": float(shift.mean()) if len(shift) else 0.0,
        })
        return out


class PartialRollout(PrefixSwitches):
    """A sampler ``collect`` can call like a policy (``sample``, ``tokenizer``): μ (``behaviour``)
    samples the first j tokens, the prefix check runs, π (``learner``) continues. ``at(stale,
    current)`` sets the versions of the next batch."""

    def __init__(self, behaviour, learner, recipe) -> None:
        super().__init__(behaviour.tokenizer, recipe)
        self.behaviour, self.learner = behaviour, learner
        self.j = recipe.rollout.simulated_partial
        self.versions = (0, 0)

    def at(self, stale_version: int, current_version: int) -> "PartialRollout":
        self.versions = (stale_version, current_version)
        return self

    def sample(self, prompts, num_generations, max_new_tokens, temperature=1.0, generator=None, stop=None,
               **_) -> Samples:
        stale_v, cur_v = self.versions
        first = self.behaviour.sample(prompts, num_generations, self.j, temperature, generator=generator, stop=stop)
        running = torch.nonzero(first.truncated).squeeze(-1).tolist()  # still running after j tokens
        rows = self.rows_of(first, stale_v)

        def sample(ids, mask, budget):
            was = self.learner.model.training
            self.learner.model.eval()
            try:
                return sample_completions(self.learner.model, self.tokenizer, ids, mask, 1, budget, temperature,
                                          generator, stop, decoder=self.learner.decoder)
            finally:
                self.learner.model.train(was)

        return self.run(first, rows, running, self.behaviour, self.learner, lambda: cur_v, sample, max_new_tokens,
                        temperature, generator, stop)
