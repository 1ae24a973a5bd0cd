"""The embedded default model: a tiny Llama with a character tokenizer.

It is a standard ``LlamaForCausalLM`` (so every code path is the real one),
created here and warmed up by a short supervised run on the embedded
arithmetic task's worked solutions, which carry a systematic bracket mistake
(see ``reasonrl.tasks.arithmetic``).

The warmed-up weights of the default spec (``TinySpec()``, the model of
``recipes/grpo.yaml``) ship inside the package, in ``embedded/`` next to this
file, so every machine trains the same model: ``load_tiny_policy()`` loads
them when the spec's key equals the shipped key, without building or writing
to the cache. Any other spec is built on first use (float reduction order
differs between machines, so a build is reproducible on one machine only)
and cached on disk keyed by its full configuration.

Regenerate the shipped weights after changing the default spec or
``WARMUP_VERSION`` (about a minute on 2 cores; prints the new build's
held-out greedy accuracy next to the shipped one's)::

    python -m reasonrl.policy.tiny --rebuild-embedded     # or: make embedded
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from reasonrl.sections import TinyConfig
from reasonrl.fsutil import atomic_directory
from reasonrl.policy.char_tokenizer import ARITHMETIC_CHARS, build_char_tokenizer
from reasonrl.policy.hf import HFPolicy, position_ids_from_mask
from reasonrl.policy.loading import default_cache_dir, load_hf_policy
from reasonrl.tasks.arithmetic import ArithmeticTask

# Bump when the warm-up procedure changes in a way the config does not capture
# (then regenerate the shipped weights: python -m reasonrl.policy.tiny --rebuild-embedded).
WARMUP_VERSION = 1

# The shipped warmed-up weights of the default spec, and the file that names their spec and key.
EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
SPEC_FILE = "tiny_spec.json"
REBUILD_COMMAND = "python -m reasonrl.embedded --rebuild-embedded"
# The held-out problems the rebuild command (and its test) measure a build on.
EVAL_PROBLEMS, EVAL_MAX_NEW_TOKENS = 200, 32


@dataclass(frozen=True)
class TinySpec(TinyConfig):
    """The embedded model's configuration (``TinyConfig``, declared with the recipe) plus what
    building it needs: its cache key and its warm-up task."""

    def key(self) -> str:
        fields_ = asdict(self)
        if self.task == "arithmetic" and not self.task_params:
            del fields_["task"], fields_["task_params"]  # keeps the default model's cache key stable
        blob = json.dumps({**fields_, "v": WARMUP_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def warmup_task(self):
        if self.task == "arithmetic":
            return ArithmeticTask(max_operand=self.max_operand, careless_fraction=self.careless_fraction,
                                  **self.task_params)
        import reasonrl.tasks  # noqa: F401  (registration)
        from reasonrl.registry import TASKS

        task = TASKS.get(self.task)(**self.task_params)
        if not hasattr(task, "warmup_problems"):
            raise ValueError(f"task '{self.task}' has no warmup_problems(); the embedded model cannot imitate it")
        return task


def new_tiny_model(spec: TinySpec, vocab_size: int, pad_id: int, bos_id: int, eos_id: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(config)


def supervised_batch(tokenizer, prompts: list[str], targets: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompt+target ids, attention mask, and labels (-100 outside targets)."""
    eos = tokenizer.eos_token
    enc = tokenizer([p + t + eos for p, t in zip(prompts, targets)], return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    labels = ids.clone()
    prompt_lens = [len(tokenizer(p)["input_ids"]) for p in prompts]
    seq_lens = mask.sum(-1).tolist()
    width = ids.shape[1]
    for i, (plen, slen) in enumerate(zip(prompt_lens, seq_lens)):
        labels[i, : width - slen + plen] = -100
    return ids, mask, labels


def warm_up(policy: HFPolicy, task, spec: TinySpec, log=print) -> None:
    """Cross-entropy on the (partly careless) worked solutions."""
    model, tok = policy.model, policy.tokenizer
    opt = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / spec.warmup_steps)
    )
    model.train()
    start = time.time()
    for step in range(spec.warmup_steps):
        problems = task.warmup_problems(step, spec.warmup_batch, spec.seed)
        ids, mask, labels = supervised_batch(tok, [p.prompt for p in problems], [p.solution for p in problems])
        loss = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == spec.warmup_steps - 1:
            log(f"  warm-up step {step + 1}/{spec.warmup_steps}  loss {loss.item():.3f}  ({time.time() - start:.0f}s)")


def build_tiny_policy(spec: TinySpec, log=print) -> HFPolicy:
    """A new embedded model for ``spec``, warmed up in memory (nothing read from or written to disk)."""
    task = spec.warmup_task()
    tok = build_char_tokenizer(getattr(task, "alphabet", ARITHMETIC_CHARS))
    model = new_tiny_model(spec, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    policy = HFPolicy(model, tok)
    warm_up(policy, task, spec, log=log)
    return policy


def embedded_key(folder: Path = EMBEDDED_DIR) -> str | None:
    """The spec key of the weights shipped in ``folder`` (None when there are none)."""
    meta = folder / SPEC_FILE
    if not (meta.is_file() and (folder / "config.json").is_file()):
        return None
    return json.loads(meta.read_text()).get("key")


def load_tiny_policy(spec: TinySpec | None = None, cache_dir: str | Path | None = None, log=None,
                     use_embedded: bool = True) -> HFPolicy:
    """The embedded model: the shipped weights when ``spec`` is the shipped spec (its key
    matches; ``use_embedded=False`` ignores them), else the cached build, building and warming
    it up on first use."""
    spec = spec or TinySpec()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if use_embedded and embedded_key() == spec.key():
        return load_hf_policy(EMBEDDED_DIR)
    prefix = "arith" if spec.task == "arithmetic" else spec.task
    path = Path(cache_dir or default_cache_dir()) / f"tiny-{prefix}-{spec.key()}"
    if not (path / "config.json").exists():
        log(f"building the embedded tiny model (one-off, cached at {path})")
        policy = build_tiny_policy(spec, log=log)
        with atomic_directory(path) as tmp:
            policy.save(tmp)
            (tmp / SPEC_FILE).write_text(json.dumps(asdict(spec), indent=1))
    return load_hf_policy(path)


# SmolLM2-135M's architecture (its config.json): a Llama with grouped-query attention (9 query
# heads of 64 over 3 key/value heads), SiLU MLPs, RMSNorm, RoPE θ = 1e5 and tied embeddings.
SMOLLM2_ARCHITECTURE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                            num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
                            rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=True)


def write_smollm2_architecture(folder: str | Path, seed: int = 0, **overrides) -> Path:
    """A randomly initialised model of SmolLM2-135M's architecture with the embedded character
    tokenizer, saved as a Hugging Face folder (``model: {backend: hf, path: folder}``): for
    checks of the real architecture's code paths where SmolLM2's weights are absent (tests, a
    GPU machine that cannot carry them). ``overrides``: config values, e.g. fewer layers."""
    tok = build_char_tokenizer(ARITHMETIC_CHARS)
    config = LlamaConfig(**{**SMOLLM2_ARCHITECTURE, **overrides}, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with atomic_directory(Path(folder), overwrite=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    return Path(folder)
