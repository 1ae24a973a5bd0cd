"""Multi-turn episodes (``env:`` in a recipe): the model's turns and the environment's
observations in one completion block, with a loss mask.

Each of the ``num_prompts × G`` rows is one episode with an environment of its own
(``reasonrl.envs.base``). A turn is sampled for every episode still running, from its prompt
plus everything so far, by one ``sample_ids`` call of the sampler (``HFPolicy``, or the vLLM
engine) over the left-padded contexts (one completion each); the environment answers each
turn, and its observation is tokenised and appended. The completion block of a row is then

    [turn 1 tokens][observation 1 tokens][turn 2 tokens] … [last turn tokens]
     loss 1          loss 0                loss 1              loss 1

``completion_mask`` is 1 on all of it (everything is attended), ``loss_mask`` 1 on the model's
tokens only, so the batch's ``response_mask`` trains the model's tokens, and every advantage,
loss and method works on episodes unchanged.

**No re-tokenisation.** The model's tokens are kept as sampled, ids and log-probs; only the
environment's text is tokenised (on its own, ``add_special_tokens=False``). The next turn's
context is the concatenation of these ids, never ``tokenize(decode(...))``: a BPE tokenizer
would merge characters across a turn boundary into other tokens than the ones sampled, and
the trained ids would not be the sampled ones (TRL #5224, verl #3960).

**Budgets.** ``rollout.max_new_tokens`` per model turn, ``rollout.max_turns`` turns, and
``rollout.max_episode_tokens`` completion tokens in all (model and environment; 0: max_turns ×
max_new_tokens). A row that runs out of turns or tokens while the environment still waits is
marked truncated. Its last model turn may be cut at the episode budget.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch

from reasonrl.policy.sampling import Samples, cut_at_stop, left_pad, right_pad
from reasonrl.registry import ENVIRONMENTS

# batch.aux key of the per-token environment channel (Environment.channels index + 1; 0 elsewhere).

__all__ = ["EpisodeRollout", "episode_budget", "rollout_sampler", "sample_problems"]


def sample_problems(sampler, problems, num_generations: int, max_new_tokens: int, temperature: float,
                    generator=None, stop=None, **kwargs) -> Samples:
    """``sampler.sample`` on the prompts of ``problems``; an episode sampler (``episodic``) also
    gets the problems, whose environments start from them."""
    if getattr(sampler, "episodic", False):
        kwargs["problems"] = problems
    return sampler.sample([p.prompt for p in problems], num_generations, max_new_tokens, temperature,
                          generator=generator, stop=stop, **kwargs)


def rollout_sampler(policy, recipe, task=None):
    """What samples rollouts (and evaluations) for ``recipe``: the task's own rollout when it
    runs its episodes itself (``task.rollout_sampler``: a verifiers environment), the episode
    sampler over ``policy`` when the recipe has an ``env``, else ``policy`` itself."""
    if task is not None and hasattr(task, "rollout_sampler"):
        return task.rollout_sampler(policy, recipe)
    return EpisodeRollout(policy, recipe) if recipe.env is not None else policy


def episode_budget(recipe) -> int:
    ro = recipe.rollout
    return ro.max_episode_tokens or ro.max_turns * ro.max_new_tokens


class EpisodeRollout:
    """A sampler ``collect`` and the evaluator call like a policy (``sample``, ``tokenizer``),
    given the problems (``episodic``); ``metrics()`` returns (and resets) the episodes' means
    since the last call: ``episode/turns``, ``episode/env_tokens``, ``episode/env_reward``,
    ``episode/truncated`` and each ``Step.info`` key."""

    episodic = True

    def __init__(self, policy, recipe) -> None:
        self.policy, self.tokenizer = policy, policy.tokenizer
        self.env_cls, self.env_params = ENVIRONMENTS.get(recipe.env.name), dict(recipe.env.params)
        self.max_turns, self.budget = recipe.rollout.max_turns, episode_budget(recipe)
        self._sums: dict[str, float] = defaultdict(float)
        self._episodes = 0
        self._refreshed = False

    def sample(self, prompts, num_generations, max_new_tokens, temperature=1.0, generator=None, stop=None,
               refresh: Callable[[], int] | None = None, problems=None, **_) -> Samples:
        if problems is None or len(problems) != len(prompts):
            raise ValueError("an episode sampler needs the problems of its prompts (problems=[...])")
        g = num_generations
        n = len(prompts) * g
        enc_ids, enc_mask = (t.cpu() for t in self.policy.encode_prompts(prompts))  # batches live on the CPU
        prompt_ids, prompt_mask = enc_ids.repeat_interleave(g, 0), enc_mask.repeat_interleave(g, 0)
        heads = [prompt_ids[i][prompt_mask[i].bool()] for i in range(n)]
        seeds = torch.randint(0, 2**31 - 1, (n,), generator=generator).tolist()
        version = int(refresh()) if refresh is not None else 0
        self._refreshed = refresh is not None  # versions are recorded only where they may differ
        envs = [self.env_cls(**self.env_params) for _ in range(n)]
        try:  # every environment is closed however its episode (or the sampling) ended
            return self._episodes_of(envs, problems, g, prompt_ids, prompt_mask, heads, seeds, max_new_tokens,
                                     temperature, generator, stop, refresh, version)
        finally:
            for env in envs:
                env.close()

    def _episodes_of(self, envs, problems, g, prompt_ids, prompt_mask, heads, seeds, max_new_tokens, temperature,
                     generator, stop, refresh, version) -> Samples:
        tok, n = self.tokenizer, len(envs)
        eos, pad = tok.eos_token_id, tok.pad_token_id
        parts: list[list[tuple]] = [[] for _ in range(n)]
        used, env_reward = [0] * n, [0.0] * n
        info: list[dict[str, float]] = [defaultdict(float) for _ in range(n)]
        turns, truncated = [0] * n, [False] * n
        running = []
        for i, (env, problem) in enumerate(zip(envs, (p for p in problems for _ in range(g)))):
            first = env.reset(problem, seeds[i])
            if first:
                self._observe(parts[i], used, i, first, version, None)
            running.append(i)
        stops = list(dict.fromkeys([*(stop or []), *self.env_cls.stops(self.env_params)]))
        while running:
            rows = [i for i in running if used[i] < self.budget]
            for i in set(running) - set(rows):
                truncated[i] = True
            if not rows:
                break
            budgets = [min(max_new_tokens, self.budget - used[i]) for i in rows]
            ids, mask = left_pad([torch.cat([heads[i], *[p[0] for p in parts[i]]]) for i in rows], pad)
            out = self.policy.sample_ids(ids, mask, max(budgets), temperature, generator, stops or None, refresh=refresh)
            running = []
            for c, (i, b) in enumerate(zip(rows, budgets)):
                length = int(out.completion_mask[c].sum())
                take = min(length, b)
                t = out.completion_ids[c, :take]
                v = out.token_versions[c, :take] if out.token_versions is not None \
                    else torch.full_like(t, version)
                parts[i].append((t, out.sample_logprobs[c, :take], torch.ones_like(t), v, torch.zeros_like(t)))
                used[i] += take
                turns[i] += 1
                version = int(v.max()) if take else version
                text = tok.decode(t, skip_special_tokens=True)
                ended = (take > 0 and int(t[-1]) == eos) or (stop and cut_at_stop(text, stop) != text)
                if length > b or bool(out.truncated[c]):  # no EOS, no stop string: out of budget
                    truncated[i] = True
                    continue
                step = envs[i].step(text)
                env_reward[i] += float(step.reward)
                for key, value in step.info.items():
                    info[i][key] += float(value)
                if ended or step.done:
                    continue
                if turns[i] >= self.max_turns:
                    truncated[i] = True  # the environment still waits for a turn
                    continue
                if step.observation:
                    self._observe(parts[i], used, i, step.observation, version, step.channel)
                running.append(i)
        return self._assemble(prompt_ids, prompt_mask, parts, truncated, env_reward, info, turns, stop)

    def _observe(self, row_parts, used, i, text: str, version: int, channel: str | None) -> None:
        """Append the environment's ``text`` to row ``i``: tokenised on its own, not trained on;
        cut at the episode budget; its tokens labelled with ``channel``'s number."""
        channels = self.env_cls.channels
        if channel is not None and channel not in channels:
            raise ValueError(f"environment '{self.env_cls.__name__}' returned an observation of channel "
                             f"'{channel}'; its channels are {list(channels)}")
        ids = torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        ids = ids[: max(0, self.budget - used[i])]
        tag = 0 if channel is None else channels.index(channel) + 1
        row_parts.append((ids, torch.zeros(len(ids)), torch.zeros_like(ids), torch.full_like(ids, version),
                          torch.full_like(ids, tag)))
        used[i] += len(ids)

    def _assemble(self, prompt_ids, prompt_mask, parts, truncated, env_reward, info, turns, stop) -> Samples:
        n = len(parts)
        rows = [[torch.cat([p[k] for p in ps]) if ps else torch.zeros(0, dtype=torch.long if k != 1 else torch.float)
                 for k in range(5)] for ps in parts]
        ids, mask = right_pad([r[0] for r in rows], self.tokenizer.pad_token_id)
        logps, loss, versions, channel = (right_pad([r[k] for r in rows])[0] for k in range(1, 5))
        texts = [self.tokenizer.decode(r[0], skip_special_tokens=True) for r in rows]
        if stop:
            texts = [cut_at_stop(t, stop) for t in texts]
        self._episodes += n
        for key in self.env_cls.info_keys:  # logged every step, 0 where no episode reported it
            self._sums[f"episode/{key}"] += 0.0
        self._sums["episode/turns"] += sum(turns)
        self._sums["episode/env_tokens"] += float(((1 - loss) * mask).sum())
        self._sums["episode/env_reward"] += sum(env_reward)
        self._sums["episode/truncated"] += sum(truncated)
        for row in info:
            for key, value in row.items():
                self._sums[f"episode/{key}"] += value
        return Samples(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
                       sample_logprobs=logps * loss, truncated=torch.tensor(truncated), texts=texts,
                       token_versions=versions if self._refreshed else None, loss_mask=loss,
                       env_rewards=torch.tensor(env_reward), env_channels=channel if self.env_cls.channels else None)

    def metrics(self) -> dict[str, float]:
        sums, episodes = self._sums, self._episodes
        self._sums, self._episodes = defaultdict(float), 0
        return {k: v / episodes for k, v in sums.items()} if episodes else {}

