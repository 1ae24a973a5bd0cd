"""Prompt samplers over a finite prompt pool: ``cero`` (CERO's budgeted admission) and ``pool``.

Revisiting a prompt across epochs only means something on a finite data set (GSM8K-like), so
both draw ``pool_size`` distinct problems once from the task's stream (:func:`finite_pool`, a pure
function of the task, ``pool_size`` and ``pool_seed``: the two samplers see the same pool).

``pool``: the uniform baseline, epochs over the pool in a fresh seeded order each epoch (a
shuffled data loader), ``count`` problems per call; with dynamic sampling its top-up rounds go on
down the same order. With ``total_rollouts`` (B) it never samples more than B rows over the run,
counting every sampled row, the groups dynamic sampling drops included (what CERO's budget counts):
round r of step k (R = ``rounds_per_step`` rounds a step, K steps) gets

    min(count, ⌊(B − spent − G·((R − r − 1) + R·(K − k − 1))) / G⌋)   problems,

i.e. every round still to come, of this step and of each later step, keeps one group in reserve,
so every round the pipeline asks for gets at least one group and the total never exceeds B
(B ≥ G·R·K is checked at load). It is a hard cap, not a pacing rule: a run that would spend less
than B is untouched, one that would spend more has its last rounds cut.

``cero`` (arXiv 2606.05606, INFERRED forms; ``methods/cero/maths.py``, ``docs/methods/cero.md``): each
prompt has a Beta posterior of its success rate, whose expected Bernoulli variance v_i is the
value of more rollouts; a concave saturating utility of cumulative exposure U_i(N) =
v_i c (1 − e^{−N/c}); prompt slopes λ_i and a budget price μ updated by projected online gradient
descent; each step admits the prompts with λ_i − μ > 0, best first, one fixed-size group each.
The whole run spends at most ``total_rollouts`` rows (B) over the K = ``train.steps`` steps, at a
pace of B/K per step:

    groups_k = clip(m_k, min(min_groups, h_k), h_k),   h_k = min(count, a_k),
    a_k = ⌊(B − spent − G·(K − k − 1)) / G⌋   (every later step keeps one group in reserve),

m_k the number of top-ranked prompts with λ_i − μ > 0 under the price the step's own spend
produces (``algos.cero.admitted_count``, the implicit form of the price step), so a step gets at
least one group (a step must train on something) and the budget is never exceeded: B ≥ G·K is
checked when the recipe loads. ``observe`` updates the posteriors from the
0/1-clipped rewards, then the slopes (served: n_i = 1, else 0) and the price (the step's groups
against the pace B/(G K) groups).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import torch

from reasonrl.methods.cero.maths import (admission_order, admitted_count, beta_update, posterior_value, price_step, slope_step,
                                 target_exposure)
from reasonrl.params import Range
from reasonrl.registry import PROMPT_SAMPLERS
from reasonrl.rollout.samplers import PromptSampler
from reasonrl.algos.selection import one_group_reward_std
from reasonrl.problem import Problem

__all__ = ["finite_pool", "PoolSampler", "CERO"]

PoolSize = Annotated[int, Range(ge=1, why="problems in the finite pool")]


def finite_pool(task: Any, size: int, seed: int) -> list[Problem]:
    """``size`` distinct training problems (by prompt), in the order the task's stream with
    ``seed`` first yields them; a ValueError if the task has fewer distinct ones in reach."""
    pool: dict[str, Problem] = {}
    for chunk in range(64):  # enough chunks of ``size`` draws unless the task has too few problems
        for problem in task.train_problems(chunk, size, seed):
            pool.setdefault(problem.prompt, problem)
            if len(pool) == size:
                return list(pool.values())
    raise ValueError(f"sampler.pool_size={size}: the task yielded only {len(pool)} distinct training problems "
                     f"in {64 * size} draws; lower pool_size")


@PROMPT_SAMPLERS.register("pool")
class PoolSampler(PromptSampler):
    """Uniform epochs over a finite pool (the baseline for ``cero``; see the module docstring)."""

    def __init__(self, task: Any, seed: int = 0, pool_size: PoolSize = 256, pool_seed: int = 0, *,
                 total_steps: int = 1, group_size: int = 1,
                 total_rollouts: Annotated[int, Range(ge=1, why="the run's rollout budget B, in rows")] | None = None,
                 rounds_per_step: Annotated[int, Range(ge=1, why="rollout.max_sampling_rounds")] = 1) -> None:
        """``pool_size``: the number of distinct problems; ``pool_seed``: which ones (the data
        set; independent of the training seed, so seeds vary training, not data).
        ``total_rollouts``: an optional hard budget B in sampled rows over the run (module
        docstring); ``rounds_per_step``: the sampling rounds a step may take (R; with dynamic
        sampling ``rollout.max_sampling_rounds``, else 1: checked at load). ``total_steps`` (K)
        and ``group_size`` (G) come from ``train.steps`` and ``rollout.num_generations``."""
        super().__init__(task, seed)
        if total_rollouts is not None:
            self.check_budget(total_rollouts, total_steps, group_size, rounds_per_step)
        self.K, self.G, self.B, self.R = total_steps, group_size, total_rollouts, rounds_per_step
        self.pool = finite_pool(task, pool_size, pool_seed)
        self.cursor = 0  # problems handed out so far
        self.seen: set[int] = set()
        self.rollouts = 0  # rows sampled so far: the DAPO arm's spend, against CERO's budget
        self.contrast: list[float] = []
        self.capped = 0  # rounds that got fewer problems than asked because of the budget

    @staticmethod
    def check_budget(total_rollouts: int, total_steps: int, group_size: int, rounds: int) -> None:
        if total_rollouts < group_size * rounds * total_steps:
            raise ValueError(f"sampler.total_rollouts={total_rollouts} cannot keep one group for every sampling round: "
                             f"rollout.num_generations ({group_size}) × rounds_per_step ({rounds}) × train.steps "
                             f"({total_steps}) = {group_size * rounds * total_steps}")

    @classmethod
    def check_recipe(cls, recipe: Any, need: Any) -> None:
        """Load-time rules of the budget: ``rounds_per_step`` is the rounds a step may really take,
        and B affords one group for each of them."""
        params = recipe.sampler.params
        if params.get("total_rollouts") is None:
            need("rounds_per_step" not in params,
                 "sampler 'pool': rounds_per_step only applies with total_rollouts (a budget)")
            return
        rounds = recipe.rollout.max_sampling_rounds if recipe.rollout.dynamic_sampling else 1
        need(params.get("rounds_per_step", 1) == rounds,
             f"sampler 'pool' with total_rollouts keeps one group in reserve for every sampling round, so "
             f"rounds_per_step must be the rounds a step may take: {rounds} (rollout.dynamic_sampling="
             f"{str(recipe.rollout.dynamic_sampling).lower()}, max_sampling_rounds={recipe.rollout.max_sampling_rounds}); "
             f"got {params.get('rounds_per_step', 1)}")
        try:
            cls.check_budget(params["total_rollouts"], recipe.train.steps, recipe.rollout.num_generations, rounds)
        except ValueError as exc:
            need(False, str(exc))

    def affordable(self, step: int, round: int) -> int:
        """The most problems round ``round`` of step ``step`` may get under the budget: what is left
        after one group is kept for every round still to come (this step's and the later steps')."""
        later = (self.R - round - 1) + self.R * max(0, self.K - step - 1)
        return (self.B - self.rollouts - self.G * later) // self.G

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.pool), generator=g).tolist()

    def problems(self, step: int, count: int, round: int = 0) -> list[Problem]:
        if self.B is not None:
            if round >= self.R:
                raise ValueError(f"sampler 'pool': asked for sampling round {round + 1} of step {step} but "
                                 f"rounds_per_step is {self.R}; set it to rollout.max_sampling_rounds")
            cap = self.affordable(step, round)
            if cap < 1:  # unreachable when the recipe's steps and rounds are the sampler's
                raise ValueError(f"sampler 'pool': the budget total_rollouts={self.B} is spent at step {step} "
                                 f"(planned {self.K} steps of at most {self.R} rounds)")
            if cap < count:
                self.capped += 1
                count = cap
        out, order, epoch = [], None, -1
        for position in range(self.cursor, self.cursor + count):
            if position // len(self.pool) != epoch:
                epoch = position // len(self.pool)
                order = self._order(epoch)
            index = order[position % len(self.pool)]
            self.seen.add(index)
            out.append(self.pool[index])
        self.cursor += count
        return out

    def observe(self, problems: list[Problem], rewards: list[list[float]], step: int) -> None:
        self.rollouts += sum(len(v) for v in rewards)
        self.contrast = [one_group_reward_std(v) for v in rewards]

    def metrics(self) -> dict[str, float]:
        # pool/contrast: the last round's mean within-group reward std (cero/contrast_admitted's twin).
        out = {"pool/epochs": self.cursor / len(self.pool), "pool/distinct_seen": float(len(self.seen)),
               "pool/rollouts": float(self.rollouts),
               "pool/contrast": sum(self.contrast) / len(self.contrast) if self.contrast else 0.0}
        if self.B is not None:  # the budget's state: rows left and the rounds it has cut so far
            out.update({"pool/budget_left": float(self.B - self.rollouts), "pool/capped_rounds": float(self.capped)})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "seen": sorted(self.seen), "rollouts": self.rollouts,
                "pool": [p.prompt for p in self.pool], "capped": self.capped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_pool(self.pool, state["pool"])
        self.cursor, self.seen, self.rollouts = state["cursor"], set(state["seen"]), state["rollouts"]
        self.capped = state.get("capped", 0)  # absent from checkpoints written before the budget


def _check_pool(pool: list[Problem], saved: list[str]) -> None:
    if [p.prompt for p in pool] != saved:
        raise ValueError("the checkpoint's prompt pool differs from the one this recipe builds "
                         "(task, sampler.pool_size or sampler.pool_seed changed); resume with the run's own recipe")


@PROMPT_SAMPLERS.register("cero")
class CERO(PromptSampler):
    """CERO's budgeted admission over a finite pool (see the module docstring)."""

    def __init__(self, task: Any, seed: int = 0, *, total_steps: int, group_size: int,
                 total_rollouts: Annotated[int, Range(ge=1, why="the run's rollout budget B, in rows")],
                 pool_size: PoolSize = 256, pool_seed: int = 0,
                 saturation: Annotated[float, Range(gt=0, why="c, in groups")] = 2.0,
                 slope_lr: Annotated[float, Range(gt=0, why="η_λ = slope_lr/√K")] = 0.2,
                 price_lr: Annotated[float, Range(gt=0, why="η_μ = price_lr/√K")] = 0.5,
                 discount: Annotated[float, Range(gt=0, le=1, why="γ per step; 1 keeps all evidence")] = 1.0,
                 prior: Annotated[float, Range(gt=0, why="the Beta(α₀, α₀) start")] = 1.0,
                 min_groups: Annotated[int, Range(ge=1, why="the fewest groups a step trains on")] = 1) -> None:
        """``total_steps`` (K) and ``group_size`` (G) come from ``train.steps`` and
        ``rollout.num_generations``; the rest from the recipe (``docs/methods/cero.md``)."""
        super().__init__(task, seed)
        self.check(total_rollouts, total_steps, group_size)
        self.K, self.G, self.B = total_steps, group_size, total_rollouts
        self.saturation, self.discount, self.prior, self.min_groups = saturation, discount, prior, min_groups
        self.eta_slope, self.eta_price = slope_lr / math.sqrt(self.K), price_lr / math.sqrt(self.K)
        self.pool = finite_pool(task, pool_size, pool_seed)
        self.index = {p.prompt: i for i, p in enumerate(self.pool)}
        n = len(self.pool)
        self.alpha = torch.full((n,), float(prior), dtype=torch.float64)
        self.beta = torch.full((n,), float(prior), dtype=torch.float64)
        self.slope = posterior_value(self.alpha, self.beta)  # λ_i = v_i, the initial marginal utility
        self.price = 0.0  # μ
        self.visits = torch.zeros(n, dtype=torch.long)  # groups each prompt has had
        self.spent = 0  # rows sampled so far
        self.steps_done = 0  # steps observed (the k of the pace)
        self.generator = torch.Generator().manual_seed(seed + 2606_05606)
        self.last: dict[str, float] = {}  # this step's decision-time figures, for metrics()
        self.admitted: list[int] = []

    @staticmethod
    def check(total_rollouts: int, total_steps: int, group_size: int) -> None:
        if total_rollouts < group_size * total_steps:
            raise ValueError(f"sampler.total_rollouts={total_rollouts} is below one group per step: "
                             f"rollout.num_generations ({group_size}) × train.steps ({total_steps}) = "
                             f"{group_size * total_steps}")

    @classmethod
    def check_recipe(cls, recipe: Any, need: Any) -> None:
        """Load-time rules (``config._check_semantics``): the budget affords one group per step,
        and CERO alone decides each step's groups (no dynamic sampling's top-up rounds)."""
        need(not recipe.rollout.dynamic_sampling,
             "sampler 'cero' decides each step's groups itself; set rollout.dynamic_sampling: false")
        need("total_rollouts" in recipe.sampler.params,
             "sampler 'cero' needs total_rollouts: the run's rollout budget B in rows (e.g. steps × 8 groups × G)")
        try:
            cls.check(recipe.sampler.params["total_rollouts"], recipe.train.steps, recipe.rollout.num_generations)
        except ValueError as exc:
            need(False, str(exc))

    def value(self) -> torch.Tensor:
        return posterior_value(self.alpha, self.beta)

    def pace(self, spent_before: int = 0) -> float:
        """b_k, this step's pace in groups: the budget left when the step began, spread evenly over
        the steps left (B/(G K) at the start). Pacing on what is left, not on B/K, spreads an early
        overspend (the first steps, before the price has risen) over the rest of the run instead
        of starving the last steps (INFERRED; adaptive pacing)."""
        left = self.B - self.spent + spent_before
        return max(left / (self.G * max(self.K - self.steps_done, 1)), 1e-9)

    def affordable(self) -> int:
        """a_k: the groups this step may use, keeping one group for every later step."""
        later = max(0, self.K - self.steps_done - 1)
        return (self.B - self.spent - self.G * later) // self.G

    def problems(self, step: int, count: int, round: int = 0) -> list[Problem]:
        if round:
            raise ValueError("sampler 'cero' decides each step's groups itself; set rollout.dynamic_sampling: false")
        cap = min(count, self.affordable())
        if cap < 1:
            raise ValueError(f"sampler 'cero': the budget total_rollouts={self.B} is spent after "
                             f"{self.steps_done} steps (planned {self.K}); raise total_rollouts")
        tiebreak = torch.randperm(len(self.pool), generator=self.generator)
        ranked, positive = admission_order(self.slope, self.price, tiebreak)
        m = admitted_count(self.slope[ranked], self.price, self.pace(), self.eta_price,
                           low=min(self.min_groups, cap), high=cap)
        self.admitted = ranked[:m].tolist()
        value = self.value()
        rest = torch.ones(len(self.pool), dtype=torch.bool)
        rest[self.admitted] = False
        self.last = {
            "cero/groups": float(len(self.admitted)),
            "cero/eligible": float(positive),
            "cero/slope_admitted": float(self.slope[self.admitted].mean()),
            "cero/value_admitted": float(value[self.admitted].mean()),
            "cero/value_rest": float(value[rest].mean()) if bool(rest.any()) else 0.0,
            "cero/revisited": float((self.visits[self.admitted] > 0).sum()),
        }
        return [self.pool[i] for i in self.admitted]

    def observe(self, problems: list[Problem], rewards: list[list[float]], step: int) -> None:
        served = torch.zeros(len(self.pool), dtype=torch.float64)
        successes, trials = torch.zeros_like(served), torch.zeros_like(served)
        for problem, values in zip(problems, rewards):
            i = self.index.get(problem.prompt)
            if i is None:
                raise ValueError("sampler 'cero' observed a problem outside its pool")
            served[i] += 1
            trials[i] += len(values)
            successes[i] += sum(min(1.0, max(0.0, v)) if math.isfinite(v) else 0.0 for v in values)
        rows = sum(len(v) for v in rewards)
        self.spent += rows
        self.visits += served.long()
        self.alpha, self.beta = beta_update(self.alpha, self.beta, successes, trials, self.discount, self.prior)
        value = self.value()
        target = target_exposure(value, self.slope, self.saturation, cap=float(self.K))
        self.slope = slope_step(self.slope, served, target, self.K, self.eta_slope, upper=value)
        self.price = price_step(self.price, rows / self.G, self.pace(spent_before=rows), self.eta_price)
        self.steps_done += 1
        contrast = [one_group_reward_std(v) for v in rewards]
        self.last["cero/contrast_admitted"] = sum(contrast) / max(len(contrast), 1)

    def metrics(self) -> dict[str, float]:
        return {
            **self.last,
            "cero/budget_spent": float(self.spent),
            "cero/budget_pace": self.B * self.steps_done / self.K,
            "cero/budget_left": float(self.B - self.spent),
            "cero/price": self.price,
            "cero/distinct_seen": float((self.visits > 0).sum()),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"pool": [p.prompt for p in self.pool], "alpha": self.alpha.clone(), "beta": self.beta.clone(),
                "slope": self.slope.clone(), "price": self.price, "visits": self.visits.clone(),
                "spent": self.spent, "steps_done": self.steps_done, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_pool(self.pool, state["pool"])
        self.alpha, self.beta = state["alpha"].clone(), state["beta"].clone()
        self.slope, self.price = state["slope"].clone(), state["price"]
        self.visits, self.spent, self.steps_done = state["visits"].clone(), state["spent"], state["steps_done"]
        self.generator.set_state(state["generator"])
