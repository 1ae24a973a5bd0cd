"""Stage 2 of the student–advisor method: the information gain of the advice, on the method hooks
("Learning to Ask", https://arxiv.org/abs/2610.01236; ``docs/methods/advisor.md``). The pure math is
``reasonrl.methods.advisor.maths``; the forward with a channel hidden is the one ``necessity_reward``
uses (``methods.channel_mask.masked_logprobs``).

Named in the recipe's ``methods:`` list, with the ``advisor`` environment (whose answers are
observations of channel ``advisor``) and a ``token_cost`` for the query length::

    env: {name: advisor, advisor: tiny, budget: 1, cost: 0.0, token_cost: 0.005}
    methods: [{name: advice_gain, eta: 0.5}]

so that an episode earns R₂ = 1[correct] + η·(p(correct | advice) − p(correct | no advice)) −
λ_tok·|query|/L: ``exact_answer`` pays 1[correct], the environment charges the query length, and
this method adds η·gain in ``annotate`` (after scoring and selection, before the advantages).

**p(correct | ·)**, for each row with an answered advisor call, with the current policy in eval
mode and no gradient (INFERRED, the spec does not say how p is measured):

- the transcript x: the prompt and the episode's completion as sampled (token ids, never
  re-tokenised) up to where its final answer starts: the last ``####`` (the text of
  ``answer_format`` before ``{answer}``) in the model's tokens after the last observation; where
  the last turn writes none (a truncated episode, a last turn without an answer), the whole
  completion, less a final EOS;
- y*: ``answer_format`` with the gold answer (``batch.meta["answer"]``; ``####472`` by default,
  how the arithmetic tasks write answers), tokenised on its own, then EOS (``answer_eos``);
- ℓ_with = log π(y* | x), teacher-forced; ℓ_without = the same with the tokens of channel
  ``channel`` hidden: their attention keys are masked and every other token keeps its position id,
  exactly as ``necessity_reward`` hides a channel; where x *ends* in advice tokens (the last turn
  is only the answer, or the episode stopped right after the advice), that trailing run is dropped
  from the sequence instead (the answer keeps its positions), because the first answer token is
  predicted *at* the last token of x, and a masked key there would still pass that token's own
  embedding. Either way the no-advice view equals deleting the advice tokens with all positions
  kept (tested);
- p, gain and the gate: ``algos.advice_gain.advice_gain`` (``aggregate``: ``sequence``, the
  probability exp Σ ℓ of writing y*, or ``token_mean``; ``gated``: multiply by 1[correct], read as
  score > 0.5 of ``correct_reward``; off by default, as in the spec's formula).

A row whose advisor-channel tokens are only bare ``=`` observations (a call refused over the
budget, or an advisor reply with no number in ``advice: value`` mode) has no answered call: gain
0, and rows without an answered call get no forward at all. The no-advice view keeps the
student's own tokens after the advice: a value it copied from the advice into its own text is
still seen, so the gain measures what the advice tokens add beyond what the student wrote down.

Metrics: ``advice_gain/gain`` (the gain before η, mean over all rows, 0 where no advice),
``advice_gain/p_with`` and ``advice_gain/p_without`` (means over the rows with an answered call;
0 when there are none), ``advice_gain/rows`` (the share of rows with an answered call). The
method keeps no state beyond the policy, so an exact resume is unaffected. Cost: 2 no-grad
forwards over the rows with advice, with LM-head logits at the answer positions only.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

import torch
from torch import Tensor

from reasonrl.methods.advisor.maths import advice_gain
from reasonrl.batch import RolloutBatch
from reasonrl.dataflow import ENV_CHANNEL, REWARDS, meta_reward
from reasonrl.methods.advisor.env import ANSWER_MARK
from reasonrl.hooks import Method, MethodContext
from reasonrl.train.channel_mask import env_channels, eval_mode, masked_logprobs, reward_gate
from reasonrl.params import Range
from reasonrl.policy.sampling import left_pad, right_pad
from reasonrl.registry import METHODS

__all__ = ["AdviceGain", "DEFAULT_ANSWER_FORMAT"]

DEFAULT_ANSWER_FORMAT = "####{answer}"
DEFAULT_CORRECT = "exact_answer"
EMPTY_ADVICE = ("", ANSWER_MARK)  # what an observation without advice decodes to (stripped)


def _format_error(fmt: Any) -> Optional[str]:
    if not isinstance(fmt, str) or fmt.count("{answer}") != 1:
        return f"answer_format must hold '{{answer}}' exactly once (e.g. '{DEFAULT_ANSWER_FORMAT}'), got {fmt!r}"
    try:
        fmt.format(answer="1")
    except (KeyError, IndexError, ValueError) as e:
        return f"answer_format {fmt!r} is not a format string with only {{answer}} ({e}); double other braces"
    return None


@METHODS.register("advice_gain")
class AdviceGain(Method):
    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        gate = (meta_reward(config.get("correct_reward", DEFAULT_CORRECT)),) if config.get("gated") else ()
        return {"annotate": ((REWARDS,), (ENV_CHANNEL, *gate))}

    def __init__(self, eta: Annotated[float, Range(ge=0)] = 0.5, channel: str = "advisor",
                 aggregate: Literal["sequence", "token_mean"] = "sequence", gated: bool = False,
                 correct_reward: str = DEFAULT_CORRECT, answer_format: str = DEFAULT_ANSWER_FORMAT,
                 answer_eos: bool = True, micro_batch_size: Optional[Annotated[int, Range(ge=1)]] = None) -> None:
        """``eta``: η, the weight of the gain in the reward (INFERRED: the spec gives no default).
        ``channel``: the env channel whose tokens are the advice. ``aggregate``: how p is made of
        the answer tokens' log-probs (``sequence``: exp of their sum; ``token_mean``: the mean
        token probability). ``gated``: pay the gain on correct episodes only (score of
        ``correct_reward`` > 0.5). ``answer_format`` / ``answer_eos``: the gold answer as the
        task writes it (``{answer}`` is the gold answer), followed by EOS. ``micro_batch_size``:
        rows per forward (default ``train.micro_batch_size``)."""
        self.eta, self.channel, self.aggregate, self.gated = eta, channel, aggregate, gated
        self.correct_reward, self.answer_format, self.answer_eos = correct_reward, answer_format, answer_eos
        self.micro_batch_size = micro_batch_size
        error = _format_error(answer_format)
        if error:
            raise ValueError(f"advice_gain: {error}")
        self.marker = answer_format.split("{answer}")[0].replace("{{", "{").replace("}}", "}")
        self.policy = None

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        config = config or {}
        need(recipe.env is not None,
             "compares the policy with and without the advisor's answers, so it needs an env whose observations "
             "carry them in a channel (e.g. env: {name: advisor}); this recipe has no env")
        channel = config.get("channel", "advisor")
        channels = env_channels(recipe)
        need(channel in channels,
             f"channel '{channel}' is not an observation channel of env '{recipe.env.name}' (its channels: "
             f"{list(channels) or 'none'}); use env 'advisor' or name one of its channels")
        error = _format_error(config.get("answer_format", DEFAULT_ANSWER_FORMAT))
        need(error is None, error or "")
        if config.get("gated", False):
            reward = config.get("correct_reward", DEFAULT_CORRECT)
            names = [rw.name for rw in recipe.rewards]
            need(reward in names, f"correct_reward '{reward}' (the gate) is not among the recipe's rewards {names}; "
                                  f"add it to rewards: or name one of them")

    def setup(self, ctx: MethodContext) -> None:
        self.policy, self.tokenizer = ctx.policy, ctx.policy.tokenizer
        self.index = env_channels(ctx.recipe).index(self.channel) + 1  # the channel's number in env_channel
        self.temperature = ctx.recipe.rollout.temperature
        self.micro = self.micro_batch_size or ctx.recipe.train.micro_batch_size

    # -- the transcript and the answer -----------------------------------------------------------

    def answered(self, ids: Tensor, channel: Tensor) -> bool:
        """Whether a row's completion ``ids`` (live tokens) holds an advice observation that is
        more than a bare ``=``: one answered call."""
        tagged = (channel == self.index).tolist()
        runs, current = [], []
        for token, on in zip(ids.tolist(), tagged):
            if on:
                current.append(token)
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        return any(self.tokenizer.decode(run, skip_special_tokens=True).strip() not in EMPTY_ADVICE for run in runs)

    def answer_start(self, ids: Tensor, observed: Tensor) -> int:
        """Where the row's final answer starts in its live completion ``ids``: the last
        ``marker`` in the model's tokens after the last observation (``observed``: the
        environment's tokens), else the end less a final EOS."""
        end = len(ids)
        if end and int(ids[end - 1]) == self.tokenizer.eos_token_id:
            end -= 1
        obs = observed[:end].nonzero().flatten()
        start = int(obs[-1]) + 1 if len(obs) else 0
        if not self.marker or start >= end:
            return end
        decode = lambda k: self.tokenizer.decode(ids[start:k], skip_special_tokens=True)  # noqa: E731
        at = decode(end).rfind(self.marker)
        if at < 0:
            return end
        lo, hi = start, end  # the longest prefix that decodes to no more than the text before the marker
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(decode(mid)) <= at:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def answer_ids(self, gold: str, device) -> Tensor:
        ids = self.tokenizer(self.answer_format.format(answer=gold), add_special_tokens=False)["input_ids"]
        return torch.tensor(list(ids) + ([self.tokenizer.eos_token_id] if self.answer_eos else []),
                            dtype=torch.long, device=device)

    def views(self, batch: RolloutBatch, rows: list[int]) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per row: (the transcript x with the prompt, its advice mask, the answer y*)."""
        channel = batch.aux[ENV_CHANNEL]
        observed = batch.completion_mask.bool() & ~batch.response_mask.bool()
        out = []
        for r in rows:
            n = int(batch.completion_mask[r].sum())
            ids = batch.completion_ids[r, :n]
            cut = self.answer_start(ids, observed[r, :n])
            prompt = batch.prompt_ids[r][batch.prompt_mask[r].bool()]
            head = torch.cat([prompt, ids[:cut]])
            hidden = torch.cat([torch.zeros_like(prompt, dtype=torch.bool), channel[r, :cut] == self.index])
            out.append((head, hidden, self.answer_ids(str(batch.meta["answer"][r]), ids.device)))
        return out

    # -- the forwards ----------------------------------------------------------------------------

    def answer_logprobs(self, views: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
        """log π(y* | x) and log π(y* | x without the advice), ``[R, m]`` right-padded, and the
        answers' mask, micro-batch by micro-batch."""
        pad, model = self.tokenizer.pad_token_id, self.policy.model
        with_, without, masks = [], [], []
        for i in range(0, len(views), self.micro):
            chunk = views[i:i + self.micro]
            answers, amask = right_pad([a for _, _, a in chunk], pad)
            ids, pmask = left_pad([h for h, _, _ in chunk], pad)
            with_.append(masked_logprobs(model, ids, pmask, answers, amask, self.temperature))
            # Without: the advice's keys masked; a run of advice that ends x is dropped instead (the
            # answer is predicted at x's last token), every position id kept.
            heads, hides, positions = [], [], []
            for head, hidden, answer in chunk:
                m = len(head)
                while m and bool(hidden[m - 1]):
                    m -= 1
                heads.append(head[:m])
                hides.append(hidden[:m].long())
                positions.append(torch.cat([torch.arange(m), len(head) + torch.arange(answers.shape[1])]))
            ids, pmask = left_pad(heads, pad)
            hide = torch.cat([left_pad(hides, 0)[0].bool(), torch.zeros_like(answers, dtype=torch.bool)], dim=1)
            width = ids.shape[1]
            pos = torch.stack([torch.cat([torch.zeros(width - (len(p) - answers.shape[1]), dtype=torch.long), p])
                               for p in positions]).to(ids.device)
            without.append(masked_logprobs(model, ids, pmask, answers, amask, self.temperature, hide, pos))
            masks.append(amask)
        width = max(t.shape[1] for t in masks)
        widen = lambda ts, v: torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)  # noqa: E731
                                         for t in ts])
        return widen(with_, 0.0), widen(without, 0.0), widen(masks, 0)

    @torch.no_grad()
    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        n, device = len(batch), batch.rewards.device
        correct = reward_gate(batch, self.correct_reward, "advice_gain", "gate reward") if self.gated else None
        channel = batch.aux.get(ENV_CHANNEL)
        rows = [] if channel is None else [
            r for r in range(n) if bool((channel[r] == self.index).any())
            and self.answered(batch.completion_ids[r][batch.completion_mask[r].bool()],
                              channel[r][batch.completion_mask[r].bool()])]
        has = torch.zeros(n, dtype=torch.bool, device=device)
        gain = p_with = p_without = torch.zeros(n, device=device)
        if rows:
            if "answer" not in batch.meta:
                raise ValueError("advice_gain: the batch has no gold answers (batch.meta['answer'])")
            with eval_mode(self.policy.model):
                lp_with, lp_without, amask = self.answer_logprobs(self.views(batch, rows))
            index = torch.tensor(rows, device=device)
            has[index] = True
            full = lambda t, v: torch.full((n, t.shape[1]), v, dtype=t.dtype, device=device).index_copy(  # noqa: E731
                0, index, t.to(device))
            gain, p_with, p_without = advice_gain(full(lp_with, float("nan")), full(lp_without, float("nan")),
                                                  full(amask, 0), has, self.aggregate, correct)
        batch.rewards = batch.rewards + self.eta * gain.to(batch.rewards.dtype)
        count = max(len(rows), 1)
        return {"advice_gain/gain": float(gain.mean()) if n else 0.0,
                "advice_gain/p_with": float(p_with.sum()) / count, "advice_gain/p_without": float(p_without.sum()) / count,
                "advice_gain/rows": len(rows) / max(n, 1)}
