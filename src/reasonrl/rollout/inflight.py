"""Real partial rollouts with a prefix check: ``rollout.source: async``, ``partial: true`` and a
``rollout.prefix_check`` (RollVerify, paper not located, INFERRED).

Without a check, the async sampler loads newer weights between two decode steps and goes on
from its stale KV cache (``refresh`` in ``sample_completions``). With one, newer weights that
arrive mid-generation *interrupt* the decode loop instead, before they are loaded: the rows
still running hold prefixes sampled by the old weights μ, which are still loaded, so μ's
distributions for the check come from one forward; then the new weights π are loaded, the
check decides each prefix (``reasonrl.rollout.partial.PrefixSwitches``, the same code as the
simulated partial rollouts), and the kept rows continue under π from a fresh prefill of prompt +
kept prefix (the stale KV cache is not reused: π's continuation sees π's keys and values). A
continuation that is interrupted again switches again, so a row can cross several versions;
under a ``rollverify_*`` check every token kept at a switch counts as sampled by the newest
weights (their ``sample_logprobs`` become π's, ``token_versions`` π's version), so the next
switch compares the whole row against the weights that produced it.

The cost of the check is two prefix forwards per switch (μ's only for ``rollverify_token``) and
the regenerated tokens; ``partial/*`` and ``rollverify/*`` metrics report both per step.
Timing decides where the switches fall, as for every asynchronous run: no exact resume claim
beyond the async source's own for partial rollouts (``max_staleness: 0``, where no weights
arrive mid-batch; a checkpoint still stores the batch sampled ahead, switches included).
"""

from __future__ import annotations

from typing import Callable

import torch

from reasonrl.policy.sampling import Samples, sample_completions
from reasonrl.rollout.partial import PrefixSwitches

__all__ = ["InFlightRollout"]


class InFlightRollout(PrefixSwitches):
    """A sampler ``collect`` can call like a policy, over one model whose weights change.

    ``pending()``: have newer weights arrived (not yet loaded)? ``load()``: load them and return
    the version now loaded (the loaded version if none is pending)."""

    def __init__(self, policy, recipe, pending: Callable[[], bool], load: Callable[[], int]) -> None:
        super().__init__(policy.tokenizer, recipe)
        self.policy, self.pending, self.load = policy, pending, load

    def sample(self, prompts, num_generations, max_new_tokens, temperature=1.0, generator=None, stop=None,
               **_) -> Samples:
        version = int(self.load())  # weights that came before the first token need no check
        first = self.policy.sample(prompts, num_generations, max_new_tokens, temperature, generator=generator,
                                   stop=stop, interrupt=self.pending)
        running = torch.nonzero(first.running).squeeze(-1).tolist() if first.running is not None else []

        def sample(ids, mask, budget):
            self.policy.model.eval()
            return sample_completions(self.policy.model, self.tokenizer, ids, mask, 1, budget, temperature,
                                      generator, stop, decoder=self.policy.decoder, interrupt=self.pending)

        was = self.policy.model.training
        try:
            return self.run(first, self.rows_of(first, version), running, self.policy, self.policy, self.load,
                            sample, max_new_tokens, temperature, generator, stop)
        finally:
            self.policy.model.train(was)
