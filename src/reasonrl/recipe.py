"""The typed, validated recipe: YAML file + ``--set key.sub=value`` overrides.

This is the loader; it resolves names in the registries as they are when it runs. Which
components exist is decided above it: ``reasonrl.components`` imports every package that
registers one (``reasonrl.config``, the CLI and the API import it first), and a registry that
misses a name loads that list through the ``reasonrl.components`` entry-point group
(``reasonrl.registry``), so a spawned sampler or a Flower app resolves the same names.

Every section is a dataclass of ``reasonrl.sections`` whose fields are documented where declared.
Loading fails early, naming the key, the expected type or allowed values and
the closest known key, so a typo never silently falls back to a default.
Components chosen by name (task, rewards, advantage, policy loss, selectors)
keep their own parameters, checked against the registered function's
signature.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import yaml

from reasonrl import registry
from reasonrl.dataflow import check_data_flow
from reasonrl.hooks import method_specs
from reasonrl.params import (PIPELINE_ARGS, ConfigError, build_section, check_component_params, registered,
                             reward_style)
from reasonrl.registry import UnknownNameError
from reasonrl.sections import (  # noqa: F401  (the sections are part of this module's API)
    EvalConfig, KLConfig, LogConfig, LoraConfig, LossConfig, ModelConfig, OptimConfig, Recipe,
    RewardConfig, RolloutConfig, TeacherConfig, TinyConfig, TrainConfig, check_episodes, check_model, need,
)

__all__ = ["ConfigError", "Recipe", "load_recipe", "recipe_from_dict", "apply_override", "build_section", "flatten"]


# --- loading -------------------------------------------------------------

def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None) -> Recipe:
    """Read a YAML recipe (or the defaults when ``path`` is None) and apply ``key=value`` overrides."""
    raw: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read recipe {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: a recipe is a mapping of sections, got {type(raw).__name__}")
        if not raw:
            # An empty file would silently train on every default: almost certainly a mistake.
            raise ConfigError(f"{path}: the recipe is empty; name at least one section (e.g. `task:`), "
                              "or run without a recipe file to use the defaults on purpose")
    for item in overrides or []:
        apply_override(raw, item)
    return recipe_from_dict(raw, where)


def recipe_from_dict(raw: dict[str, Any], where: str = "recipe") -> Recipe:
    raw = _user_code(raw, where)
    recipe = build_section(Recipe, raw, where, "")
    _check_semantics(recipe, where)
    return recipe


def _user_code(raw: Any, where: str) -> Any:
    """Import the recipe's ``plugins``; then, anywhere in the recipe, register a Python callable
    given in place of a name under a generated name (``registry.register_passed_object``) and
    make the file of each ``file.py:symbol`` name absolute (so recipe.json resumes from any folder)."""
    if not isinstance(raw, dict):
        return raw
    plugins = raw.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise ConfigError(f"{where}: 'plugins' must be a list of .py files or module names, got {plugins!r}")
    for i, plugin in enumerate(plugins):
        try:
            registry.import_plugin(plugin)
        except UnknownNameError as exc:
            raise ConfigError(f"{where}: plugins[{i}]: {exc}") from None
    taken: dict[str, Any] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, tuple):
            return tuple(walk(v) for v in node)
        if callable(node):
            return registry.register_passed_object(node, taken)
        return registry.canonical_name(node)

    named = walk({k: v for k, v in raw.items() if k != "plugins"})
    if "plugins" in raw:
        named["plugins"] = [registry.canonical_plugin(p) for p in plugins]
    return named


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one ``--set key.sub=value`` to the raw recipe. A number steps into a list
    (``methods.0.teacher.path=DIR``: the first method's teacher), so a list entry's parameter
    can be set without restating the whole list."""
    if "=" not in item:
        raise ConfigError(f"--set expects key.sub=value, got '{item}'")
    dotted, value_text = item.split("=", 1)
    keys = dotted.strip().split(".")
    value = yaml.safe_load(value_text) if value_text.strip() else None
    node: Any = raw
    for depth, k in enumerate(keys):
        if isinstance(node, list):
            if not (k.isdigit() and int(k) < len(node)):
                raise ConfigError(f"--set {dotted}: '{'.'.join(keys[:depth])}' is a list of {len(node)}; "
                                  f"'{k}' is not an index of it (0 to {len(node) - 1})")
            k = int(k)
        if depth == len(keys) - 1:
            node[k] = value
            return
        if isinstance(node, dict) and node.get(k) is None:
            node[k] = {}
        node = node[k]
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"--set {dotted}: '{keys[depth]}' is not a section")


def _check_whole_groups(r: Recipe, where: str) -> None:
    """A loss declaring ``group_ids`` normalises over whole prompt groups, so no mini- or
    micro-batch boundary may cut a group. Batches hold groups contiguously, at most
    prompts_per_step × G rows, and ``RolloutBatch.split`` cuts every ``size`` rows: a size that
    is a multiple of G, or covers the (mini-)batch, keeps full groups whole. (A selection stage
    that drops rows inside groups can still misalign them: the objective checks every
    micro-batch at run time.)"""
    g, rows = r.rollout.num_generations, r.train.prompts_per_step * r.rollout.num_generations
    mini = r.train.mini_batch_size
    need(mini == 0 or mini >= rows or mini % g == 0, where,
         f"loss.policy '{r.loss.policy}' normalises over whole prompt groups: train.mini_batch_size must be 0 "
         f"(the whole batch), at least the batch's {rows} rows, or a multiple of rollout.num_generations ({g}); "
         f"got {mini}")
    micro, span = r.train.micro_batch_size, (mini if 0 < mini < rows else rows)
    need(micro >= span or micro % g == 0, where,
         f"loss.policy '{r.loss.policy}' normalises over whole prompt groups: train.micro_batch_size must be at "
         f"least the {span} rows of a mini-batch or a multiple of rollout.num_generations ({g}); got {micro}")


def _check_semantics(r: Recipe, where: str) -> None:
    check_model(r.model, where, "model")
    loss_fn = registered(registry.POLICY_LOSSES, r.loss.policy, where, "loss.policy")
    accepted = inspect.signature(loss_fn).parameters
    takes = ", ".join(k for k in ("epsilon", "epsilon_high", "dual_clip") if k in accepted)
    for key in ("epsilon", "epsilon_high", "dual_clip"):
        need(getattr(r.loss, key) is None or key in accepted, where,
             f"loss.{key} does not apply to loss.policy '{r.loss.policy}' (it takes: {takes})")
    # The clip widths and any further parameter are checked against the loss's own signature.
    check_component_params(loss_fn, r.loss.policy_params(), where, "loss", PIPELINE_ARGS["loss"])
    if "group_ids" in accepted:
        _check_whole_groups(r, where)
    optimizer = registered(registry.OPTIMIZERS, r.optim.name, where, "optim.name")
    check_component_params(optimizer, r.optim.params, where, "optim.params", PIPELINE_ARGS["optim"])
    if hasattr(optimizer, "check_recipe"):  # e.g. logra: no LoRA, no LR settings
        optimizer.check_recipe(r, lambda cond, msg: need(cond, where, msg))
    registered(registry.SCHEDULES, r.optim.schedule, where, "optim.schedule")
    eval_reward = registered(registry.REWARDS, r.eval.reward, where, "eval.reward")
    need(reward_style(eval_reward) == "completion", where,
         f"eval.reward '{r.eval.reward}' scores groups or batches, not single answers; use a per-answer reward")
    if isinstance(r.eval.k, int):
        r.eval.k = [r.eval.k]
    need(all(1 <= k <= r.eval.n for k in r.eval.k), where,
         f"eval.k must lie in 1..eval.n (n={r.eval.n}); got {r.eval.k}")
    names = [rw.name for rw in r.rewards]
    need(len(names) == len(set(names)), where, f"rewards: each reward function may appear once, got {names}")
    task_cls = registered(registry.TASKS, r.task.name, where, "task.name")
    need(bool(names) or hasattr(task_cls, "rollout_sampler") or r.env is not None, where,
         "rewards: at least one reward function is required (only rollouts that bring their own reward may "
         "have none: an env's per-turn rewards, a verifiers environment's)")
    if hasattr(task_cls, "rollout_sampler"):  # the task runs its episodes itself (verifiers)
        ro = r.rollout
        need(ro.engine in ("local", "vllm") and not ro.simulated_staleness and not ro.simulated_partial
             and not (ro.source == "async" and ro.partial), where,
             f"task '{r.task.name}' runs its own rollouts through an endpoint over the policy: it needs "
             "rollout.engine: local or vllm, without simulated staleness, and with rollout.source: async "
             "rollout.partial: false (an environment's episode cannot change weights mid-turn)")
        need(r.env is None, where, f"task '{r.task.name}' runs its environment's own episodes: drop env")
        need(not r.eval.size or r.eval.task is None, where,
             f"task '{r.task.name}' is evaluated by its environment's rubric on greedy rollouts: drop eval.task")
    # The evaluated task (eval.task, else the training task) decides how answers are judged.
    eval_name = r.eval.task.name if r.eval.task is not None else r.task.name
    eval_cls = registered(registry.TASKS, eval_name, where, "eval.task.name") if r.eval.task is not None else task_cls
    if hasattr(eval_cls, "rollout_sampler"):
        need(not r.eval.size or not r.eval.n, where,
             f"task '{eval_name}' is evaluated by its environment's rubric on greedy rollouts (accuracy: the "
             "share of held-out tasks whose reward is 1; eval/env_reward: the mean reward); eval.n reads answers "
             "from text, which a rubric does not: set eval.n: 0")
    if r.env is not None:
        check_episodes(r, lambda cond, msg: need(cond, where, msg))
    need(r.rollout.dtype != "int8" or r.rollout.decoder == "fused", where,
         "rollout.dtype: int8 is the fused decode step over int8 weights: set rollout.decoder: fused")
    source = registered(registry.ROLLOUT_SOURCES, r.rollout.source, where, "rollout.source")
    source.check(r, lambda cond, msg: need(cond, where, msg))
    # A component whose meaning depends on another section says so with ``check_recipe``.
    advantage = registered(registry.ADVANTAGES, r.advantage.name, where, "advantage.name")
    if hasattr(advantage, "check_recipe"):
        advantage.check_recipe(r, lambda cond, msg: need(cond, where, msg))
    sampler = registered(registry.PROMPT_SAMPLERS, r.sampler.name, where, "sampler.name")
    if hasattr(sampler, "check_recipe"):  # e.g. a budget over the run's steps (cero)
        sampler.check_recipe(r, lambda cond, msg: need(cond, where, msg))
    # A method whose meaning depends on other sections (an env with channels) says so with ``check``.
    for name, cls, config in method_specs(r):
        if hasattr(cls, "check"):  # a user's method class need not derive from Method
            cls.check(r, lambda cond, msg, name=name: need(cond, where, f"method '{name}': {msg}"), config)
    check_data_flow(r, where)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A plain recipe as dotted keys: {"optim": {"lr": 1e-4}} → {"optim.lr": 1e-4}. Lists stay
    whole values. Used wherever recipes are compared or logged as flat parameters."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out

