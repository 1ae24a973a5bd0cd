"""The evaluation a recipe asks for (``eval:``), shared by training and ``reasonrl eval``.

Greedy accuracy always (overall and per problem form); with ``eval.n > 0`` also n
samples per problem: avg@n, pass@k, maj@k, response length, token entropy, format
failures, calibration and the task's own ``group_metrics``. Every headline number
comes with a bootstrap interval over problems.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from reasonrl.params import ConfigError

from reasonrl.sections import Recipe
from reasonrl.evaluate.accuracy import accuracy_by_form, greedy_samples, greedy_texts
from reasonrl.evaluate.metrics import bootstrap_ci
from reasonrl.evaluate.sampling_eval import evaluate_sampling
from reasonrl.policy.hf import HFPolicy
from reasonrl.registry import REWARDS, TASKS
from reasonrl.rollout.collect import stop_strings
from reasonrl.rollout.episodes import rollout_sampler


@dataclass
class EvalResult:
    metrics: dict[str, float]
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    """95% bootstrap interval of each headline metric, over problems."""
    per_problem: dict[str, list[float]] = field(default_factory=dict)
    """Per held-out problem (in the task's fixed order), the values a metric averages; what
    ``reasonrl report --baseline`` resamples."""
    completions: list[str] = field(default_factory=list)
    """The greedy completion of each held-out problem, in the same order (``samples.jsonl``)."""


def answer_extractor(reward_name: str, task: Any = None) -> Callable[[str, Any], str | None]:
    """How answers are read for majority voting and format failures: the task's own
    ``extract_answer(text, problem)`` if it has one, else the reward's extraction."""
    if hasattr(task, "extract_answer"):
        return task.extract_answer
    if reward_name == "math_verify":
        from reasonrl.rewards.math import extract_prediction as extract
    else:
        from reasonrl.rewards.basic import extract_answer as extract
    return lambda text, _problem: extract(text)


class Evaluator:
    def __init__(self, recipe: Recipe, train_task: Any) -> None:
        cfg = recipe.eval
        self.cfg = cfg
        self.recipe = recipe
        if cfg.task is not None:
            try:
                self.task = TASKS.get(cfg.task.name)(**cfg.task.params)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"eval.task '{cfg.task.name}': {exc}") from None
        else:
            self.task = train_task
        try:
            self.problems = self.task.eval_problems(cfg.size) if cfg.size else []
        except ValueError as exc:
            raise ConfigError(f"eval: {exc}") from None
        self.reward = REWARDS.get(cfg.reward)
        self.extract = answer_extractor(cfg.reward, self.task)
        self.stop = stop_strings(recipe, self.task)
        self.budget = cfg.max_new_tokens or recipe.rollout.max_new_tokens
        self.ks = sorted(set(cfg.k or [1, cfg.n])) if cfg.n else []
        # A task that runs (and scores) its own rollouts is judged by its reward, not by eval.reward.
        self.rubric = hasattr(self.task, "rollout_sampler")

    def is_correct(self, text: str, problem) -> bool:
        return self.reward(text, problem) == 1.0

    def sampled(self, policy: HFPolicy, greedy: bool = True,
                progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """The full n-sample result, per-problem rows included (what ``reasonrl eval`` saves)."""
        self.check_sampled()
        return evaluate_sampling(rollout_sampler(policy, self.recipe), self.problems, is_correct=self.is_correct, extract=self.extract,
                                 n=self.cfg.n, ks=self.ks, max_new_tokens=self.budget,
                                 temperature=self.cfg.temperature, seed=self.cfg.seed, stop=self.stop,
                                 batch_size=self.cfg.batch_size, greedy=greedy,
                                 group_metrics=getattr(self.task, "group_metrics", None), progress=progress)

    def check_sampled(self) -> None:
        """Refuse sampled evaluation where it cannot mean anything (before a model is loaded)."""
        if self.rubric:
            raise ConfigError(f"task '{self.task.name}' is scored by its environment's rubric: sampled evaluation "
                              "(eval.n, reasonrl eval) reads answers from text, which a rubric does not; its "
                              "greedy evaluation (eval.size) is in the run's metrics")

    def __call__(self, policy: HFPolicy) -> EvalResult:
        if not self.problems:
            return EvalResult({})
        if self.rubric:
            return self._rubric(policy)
        sampler = rollout_sampler(policy, self.recipe)  # with an env, greedy episodes
        texts = greedy_texts(sampler, self.problems, self.budget, self.cfg.batch_size, self.stop)
        correct = [self.reward(t, p) == 1.0 for t, p in zip(texts, self.problems)]
        outcomes = [float(c) for c in correct]
        result = EvalResult(accuracy_by_form(correct, self.problems), {"accuracy": bootstrap_ci(outcomes)},
                            {"accuracy": outcomes}, texts)
        if sampler is not policy:  # the greedy episodes' means, e.g. episode/tool_calls
            result.metrics.update(sampler.metrics())
        if self.cfg.n:
            for name, value in self.sampled(policy, greedy=False)["metrics"].items():
                if isinstance(value, dict):
                    result.metrics[name] = value["mean"]
                    result.intervals[name] = (value["ci_low"], value["ci_high"])
                else:
                    result.metrics[name] = value
        return result

    def _rubric(self, policy) -> EvalResult:
        """A task that scores its own rollouts (a verifiers environment's rubric): one greedy
        rollout per held-out task through the task's own rollout; ``accuracy`` is the share whose
        reward is 1 (the evaluator's rule everywhere), ``env_reward`` the mean reward."""
        sampler = self.task.rollout_sampler(policy, self.recipe)
        try:
            samples = greedy_samples(sampler, self.problems, self.budget, self.cfg.batch_size, self.stop)
            metrics = sampler.metrics()
        finally:
            sampler.close()
        rewards = [float(r) for s in samples for r in s.env_rewards]
        texts = [t for s in samples for t in s.texts]
        correct = [r == 1.0 for r in rewards]
        result = EvalResult(accuracy_by_form(correct, self.problems), per_problem={"accuracy": [float(c) for c in correct],
                                                                                   "env_reward": rewards},
                            completions=texts)
        result.intervals = {"accuracy": bootstrap_ci(result.per_problem["accuracy"]), "env_reward": bootstrap_ci(rewards)}
        result.metrics["env_reward"] = sum(rewards) / len(rewards)
        result.metrics.update(metrics)  # e.g. verifiers/errors, verifiers/turns of the greedy rollouts
        return result
