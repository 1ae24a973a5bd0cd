"""Sample G completions per prompt, score them, and build a ``RolloutBatch``.

With dynamic sampling (DAPO), groups whose rewards all agree carry no
gradient under group-relative advantages; they are dropped and fresh prompts
are sampled, up to ``max_sampling_rounds`` rounds per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from reasonrl.algos.selection import zero_variance_groups
from reasonrl.batch import RolloutBatch
from reasonrl.sections import Recipe
from reasonrl.perf import Stopwatch
from reasonrl.policy.hf import HFPolicy
from reasonrl.rewards.scorer import Scorer
from reasonrl.dataflow import ENV_CHANNEL
from reasonrl.rollout.episodes import sample_problems
from reasonrl.rollout.samplers import PromptSampler
from reasonrl.problem import Problem
from reasonrl.tasks.base import Task


@dataclass
class CollectStats:
    sampled_groups: int = 0
    sampled_tokens: int = 0
    zero_variance_groups: int = 0
    rounds: int = 0
    reward_failures: dict[str, int] = field(default_factory=dict)
    # What a sampler in another process measured (the async source's prefix checks), for the log.
    sampler_metrics: dict[str, float] = field(default_factory=dict)
    # The prompt sampler's own metrics after this step's rounds (``PromptSampler.metrics``); they
    # travel with the batch, so an async source's prompt sampler is logged like a local one.
    prompt_sampler_metrics: dict[str, float] = field(default_factory=dict)


def stop_strings(recipe: Recipe, task) -> list[str] | None:
    """The recipe's stop strings, else the task's own (few-shot prompts need one)."""
    if recipe.rollout.stop is not None:
        return recipe.rollout.stop or None
    return getattr(task, "stop_strings", None) or None


def sample_and_score(policy: HFPolicy, scorer: Scorer, problems: list[Problem], recipe: Recipe,
                     generator: torch.Generator, group_offset: int,
                     policy_version: int, watch: Stopwatch,
                     stop: list[str] | None = None,
                     refresh: Callable[[], int] | None = None) -> tuple[RolloutBatch, dict[str, int]]:
    """One round: G samples per problem, scored. Returns the batch and reward-failure counts.
    With ``refresh`` (partial rollouts) the policy may receive new weights between tokens; each
    token then records its version and the batch's ``policy_version`` is the oldest of them."""
    g = recipe.rollout.num_generations
    with watch("sample"):
        samples = sample_problems(policy, problems, g, recipe.rollout.max_new_tokens, recipe.rollout.temperature,
                                  generator, stop, **({"refresh": refresh} if refresh is not None else {}))
    token_versions = getattr(samples, "token_versions", None)
    if token_versions is not None and bool(samples.completion_mask.any()):
        policy_version = int(token_versions[samples.completion_mask.bool()].min())
    rows = [p for p in problems for _ in range(g)]
    loss_mask = getattr(samples, "loss_mask", None)
    # The model's own tokens (an episode's environment tokens are not its length).
    written = samples.completion_mask if loss_mask is None else samples.completion_mask * loss_mask
    num_tokens = written.sum(-1).tolist()
    with watch("score"):
        # TRL-style rewards may read each completion's token ids (the model's own tokens).
        ids = {"completion_ids": [row[m.bool()].tolist() for row, m in zip(samples.completion_ids, written)]} \
            if "batched" in getattr(scorer, "styles", ()) else {}
        scores = scorer(samples.texts, rows, num_tokens, samples.truncated.tolist(), group_size=g, **ids)
    total = torch.tensor(scores.total, dtype=torch.float32)
    env_rewards = getattr(samples, "env_rewards", None)
    if env_rewards is not None:  # an episode's per-turn rewards add to its reward functions'
        total = total + env_rewards.float()
    meta = {
        "problem": rows,
        "prompt": [p.prompt for p in rows],
        "completion": samples.texts,
        "answer": [p.answer for p in rows],
        **{f"reward/{name}": values for name, values in scores.per_function.items()},
        **({"reward/env": env_rewards.tolist()} if env_rewards is not None else {}),
        **{f"meta/{k}": [p.meta.get(k) for p in rows] for k in (problems[0].meta if problems else {})},
    }
    batch = RolloutBatch(
        prompt_ids=samples.prompt_ids,
        prompt_mask=samples.prompt_mask,
        completion_ids=samples.completion_ids,
        completion_mask=samples.completion_mask,
        group_ids=torch.arange(len(problems)).repeat_interleave(g) + group_offset,
        rewards=total,
        truncated=samples.truncated,
        policy_version=policy_version,
        sample_logprobs=samples.sample_logprobs,
        token_versions=token_versions,
        loss_mask=loss_mask,
        meta=meta,
        aux={ENV_CHANNEL: samples.env_channels} if getattr(samples, "env_channels", None) is not None else {},
    )
    return batch, scores.failures


def collect(policy: HFPolicy, scorer: Scorer, task: Task, recipe: Recipe, step: int,
            generator: torch.Generator, policy_version: int,
            watch: Stopwatch, sampler: PromptSampler,
            refresh: Callable[[], int] | None = None) -> tuple[RolloutBatch, RolloutBatch, CollectStats]:
    """Returns (batch to train on, every sampled row for metrics, stats). The prompt sampler
    chooses each round's problems and observes every one of them with its G rewards."""
    n = recipe.train.prompts_per_step
    stats = CollectStats()
    kept: list[RolloutBatch] = []
    everything: list[RolloutBatch] = []
    kept_groups = 0
    rounds = recipe.rollout.max_sampling_rounds if recipe.rollout.dynamic_sampling else 1
    for rnd in range(rounds):
        problems = sampler.problems(step, n - kept_groups if rnd else n, rnd)
        if not problems:
            raise ValueError(f"task '{recipe.task.name}' returned no problems for step {step}")
        batch, failures = sample_and_score(policy, scorer, problems, recipe, generator,
                                           group_offset=stats.sampled_groups, policy_version=policy_version,
                                           watch=watch, stop=stop_strings(recipe, task), refresh=refresh)
        g = recipe.rollout.num_generations
        rewards = batch.rewards.tolist()
        sampler.observe(problems, [rewards[i * g:(i + 1) * g] for i in range(len(problems))], step)
        everything.append(batch)
        stats.rounds += 1
        stats.sampled_groups += len(problems)
        stats.sampled_tokens += int(batch.completion_mask.sum())
        for name, count in failures.items():
            stats.reward_failures[name] = stats.reward_failures.get(name, 0) + count
        flat = zero_variance_groups(batch.rewards, batch.group_ids)
        stats.zero_variance_groups += int(flat.sum()) // recipe.rollout.num_generations
        if recipe.rollout.dynamic_sampling:
            batch = batch.select(torch.nonzero(~flat).squeeze(-1))
        if len(batch):
            kept.append(batch)
            kept_groups += len(batch) // recipe.rollout.num_generations
        if kept_groups >= n:
            break
    stats.prompt_sampler_metrics = sampler.metrics()
    pad = policy.tokenizer.pad_token_id
    all_rows = RolloutBatch.concat(everything, pad_id=pad)
    train_batch = RolloutBatch.concat(kept, pad_id=pad) if kept else all_rows.select([])
    if len(train_batch) > n * recipe.rollout.num_generations:  # keep exactly n groups
        train_batch = train_batch.select(list(range(n * recipe.rollout.num_generations)))
    return train_batch, all_rows, stats


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None (no check)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_rollout_fits(recipe: Recipe, policy: HFPolicy, task: Task) -> None:
    """Refuse, before the run folder exists, a rollout whose sampling memory (KV cache plus the
    per-step logits of every row) exceeds the memory available: an absurd
    ``rollout.num_generations`` would otherwise fail as a terabyte allocation mid-run."""
    from reasonrl.params import ConfigError

    g, n = recipe.rollout.num_generations, recipe.train.prompts_per_step
    rows = g * n
    first = task.train_problems(0, 1, recipe.train.seed)
    prompt_len = len(policy.tokenizer(first[0].prompt)["input_ids"]) if first else 1
    need = policy.sampling_bytes(rows, prompt_len + recipe.rollout.max_new_tokens)
    have = available_memory_bytes()
    if have is not None and need > have:
        raise ConfigError(
            f"rollout.num_generations={g} × train.prompts_per_step={n} = {rows:,} sequences per step need about "
            f"{need / 2**30:,.1f} GiB to sample (KV cache and logits), more than the {have / 2**30:,.1f} GiB "
            "available; lower rollout.num_generations or train.prompts_per_step")
