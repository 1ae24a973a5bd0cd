"""vLLM as the rollout engine (``rollout.engine: vllm``): a sampler whose tokens come from vLLM.

:class:`VLLMSampler` stands where the learner's own sampler stands (``HFPolicy.sample`` for a
group of completions per prompt, ``sample_ids`` for an episode's next turn), in the ``sync``
source, in the ``async`` source's sampler process and in its Ray actors. It talks to one vLLM
engine in a process of its own (``reasonrl.rollout.vllm_worker``, JSON lines over two pipes):

- **Token ids in and out.** Prompts are tokenised once, here, by the learner's tokenizer (its
  chat template, its special tokens) and sent as ids; completions come back as ids with the
  log-prob of each under the distribution it was drawn from (vLLM's
  ``processed_logprobs``: after the temperature), and those are the batch's behaviour
  log-probs. Texts are decoded from the ids by the learner's tokenizer, cut at a stop string
  as our own sampler cuts them, so the trainer trains on exactly the ids the engine sampled
  and the rewards read the same texts. An episode's environment tokens are appended as ids.
- **Random stream.** Each prompt's request carries a seed drawn from the run's generator, so a
  resumed run asks the engine for the same draws (vLLM's per-request seeded sampling).
- **Its own process**, for three reasons: vLLM pins its own transformers (the CPU build wants
  ``<5.20``; reasonrl resolves newer), so it may run in another virtual environment
  (``REASONRL_VLLM_PYTHON``, ``make vllm-env``); a call that hangs can be ended — every call
  has a deadline (``rollout.engine_timeout_s``) after which the engine's process group is
  killed and the run stops with an :class:`EngineError` naming the call and showing the end of
  the engine's log; and vLLM's engine core is its own process anyway.
- **Weight sync by version** (:meth:`VLLMSampler.set_weights`): full weights are written as a
  safetensors folder and loaded in place by vLLM's ``reload_weights``; LoRA adapters (never
  merged weights) are written as a PEFT adapter folder and loaded as a new vLLM adapter, so
  an engine cannot keep sampling from the base model while the adapters train. On one
  machine the folder lives in memory-backed ``/dev/shm`` where there is one.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable

import torch

from reasonrl.policy.loading import resolve_model_path
from reasonrl.policy.openai_server import model_context
from reasonrl.policy.sampling import Samples, cut_at_stop, right_pad
from reasonrl.rollout.vllm_worker import SCRATCH_ENV
from reasonrl.isolation.worker_process import WorkerError, WorkerProcess

__all__ = ["EngineError", "EngineProcess", "VLLMSampler", "engine_python", "check_vllm", "uses_vllm",
           "VLLM_PYTHON_ENV", "VLLM_INSTALL"]

VLLM_PYTHON_ENV = "REASONRL_VLLM_PYTHON"
VLLM_INSTALL = ("pip install 'reasonrl[vllm]' on a GPU machine; on a CPU-only machine `make vllm-env` and "
                f"export {VLLM_PYTHON_ENV}=$PWD/.venv-vllm/bin/python (docs/vllm.md)")
WORKER = Path(__file__).with_name("vllm_worker.py")
# vLLM's LoRA kernels take these maximum ranks; an adapter of rank r needs the first one >= r.
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


class EngineError(WorkerError):
    """The vLLM engine failed, died or did not answer in time; the message says which call."""


def uses_vllm(recipe) -> bool:
    """Does a vLLM engine sample: ``rollout.engine: vllm``, or Ray actors with ``actor_engine: vllm``."""
    ro = recipe.rollout
    return ro.engine == "vllm" or (ro.engine == "ray" and ro.actor_engine == "vllm")


def engine_python() -> str | None:
    """The interpreter that runs the engine: ``$REASONRL_VLLM_PYTHON``, else this one when it has
    vLLM, else None."""
    explicit = os.environ.get(VLLM_PYTHON_ENV)
    if explicit:
        return explicit
    return sys.executable if find_spec("vllm") is not None else None


def check_vllm(recipe, need: Callable[[bool, str], None]) -> None:
    """Refuse, at load, a recipe a vLLM engine cannot serve (exit 2, no run folder)."""
    ro = recipe.rollout
    need(ro.actor_engine == "local" or ro.engine == "ray",
         "rollout.actor_engine chooses what samples inside Ray actors: it needs rollout.engine: ray "
         "(for a vLLM engine on this machine use rollout.engine: vllm)")
    if not uses_vllm(recipe):
        return
    need(recipe.model.backend == "hf", "rollout.engine: vllm serves a transformers model folder: it needs "
                                       "model.backend: hf (vLLM cannot load the embedded model's tokenizer)")
    need(ro.decoder == "hf", "rollout.decoder chooses reasonrl's own decode step; with a vLLM engine "
                             "the engine decodes: leave rollout.decoder at hf")
    need(not ro.simulated_staleness and not ro.simulated_partial,
         "rollout.simulated_staleness/simulated_partial replay old weights in reasonrl's own sampler; "
         "a vLLM engine samples with the weights last synced (rollout.sync_every)")
    if ro.source == "async":
        need(not ro.partial, "a vLLM engine finishes every generation with the weights it started "
                             "with (no weight change between tokens): set rollout.partial: false")
    python = engine_python()
    need(python is not None, f"a vLLM engine needs vLLM, which this Python ({sys.executable}) cannot "
                             f"import: {VLLM_INSTALL}")
    if python is not None:
        need(os.access(python, os.X_OK), f"{VLLM_PYTHON_ENV}={python} is not an executable file")


class EngineProcess(WorkerProcess):
    """The engine's process (``reasonrl.isolation.worker_process``); ``command`` defaults to
    ``[engine_python(), vllm_worker.py]``."""

    who = "the vLLM engine"
    timeout_key = "rollout.engine_timeout_s"
    error = EngineError

    def __init__(self, log_path: Path, timeout_s: float, command: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(log_path, timeout_s, command or [engine_python() or sys.executable, str(WORKER)], env)


def engine_args(recipe) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments: reasonrl's defaults under ``rollout.vllm_args``. The
    engine samples in ``rollout.dtype`` (else the model's dtype) with the run's seed; on a GPU
    it shares the learner's device, so it takes at most 40% of its memory; on a CPU it runs
    eagerly (no compile warm-up)."""
    defaults: dict[str, Any] = {"dtype": recipe.rollout.dtype or recipe.model.dtype, "seed": recipe.train.seed}
    if torch.cuda.is_available():
        defaults["gpu_memory_utilization"] = 0.4
    else:
        defaults["enforce_eager"] = True
    return {**defaults, **recipe.rollout.vllm_args}


def tied_aliases(model) -> list[tuple[str, str]]:
    """(first name, other name) for each tensor a model holds under several names (tied
    embeddings: ``lm_head.weight`` is ``model.embed_tokens.weight``)."""
    first: dict[int, str] = {}
    pairs = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first:
            pairs.append((first[id(tensor)], name))
        else:
            first[id(tensor)] = name
    return pairs


def _scratch_dir() -> Path:
    """Where synced weights are written: memory-backed /dev/shm when there is one."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="reasonrl-vllm-", dir=base))


class VLLMSampler:
    """What ``collect`` and the episode sampler call to sample (as they call ``HFPolicy``),
    backed by a vLLM engine. ``policy`` is a local copy of the model: its tokenizer encodes the
    prompts and decodes the completions, its LoRA configuration describes the adapters.
    ``version`` is the learner version whose weights the engine holds (None until the first
    :meth:`set_weights`: the model folder's weights)."""

    episodic = False

    def __init__(self, policy, recipe, log: Callable[[str], None] = print, command: list[str] | None = None) -> None:
        self.policy, self.tokenizer, self.recipe = policy, policy.tokenizer, recipe
        self.lora = recipe.model.lora
        self.version: int | None = None
        self.syncs = 0
        self.aliases = tied_aliases(policy.model)
        self.last_sync_s = 0.0
        self.last_call_overhead_s = 0.0
        self.dir = _scratch_dir()
        # What the engine can hold (its max_model_len defaults to the model's positions): the
        # endpoint over this sampler refuses longer requests up front, not with an engine error.
        self.max_context = int(recipe.rollout.vllm_args.get("max_model_len") or model_context(policy))
        m = recipe.model
        folder = resolve_model_path(m.path, m.gguf_file, m.dtype, m.cache_dir, log)
        rank = None if self.lora is None else next((r for r in LORA_RANKS if r >= self.lora.r), self.lora.r)
        env = {SCRATCH_ENV: str(self.dir)}  # the engine removes the synced weights if we cannot
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB
        started = time.perf_counter()
        self.engine = EngineProcess(self.dir / "engine.log", recipe.rollout.engine_timeout_s, command, env)
        try:
            reply = self.engine.call("start", model=str(folder), args=engine_args(recipe), lora_rank=rank)
        except EngineError:
            self.close()
            raise
        log(f"vLLM {reply.get('vllm', '?')} engine started in {time.perf_counter() - started:.1f} s "
            f"(pid {self.engine.proc.pid}; {folder}; log: {self.engine.log_path})")

    # -- sampling (the HFPolicy calls collect and the episodes make) -------------------
    def encode_prompts(self, prompts: list[str]):
        ids, mask = self.policy.encode_prompts(prompts)
        return ids.cpu(), mask.cpu()

    def sample(self, prompts: list[str], num_generations: int, max_new_tokens: int, temperature: float = 1.0,
               generator: torch.Generator | None = None, stop: list[str] | None = None, refresh=None,
               compact: bool = True, interrupt=None) -> Samples:
        """``num_generations`` completions per prompt, as ``HFPolicy.sample`` returns them."""
        if refresh is not None or interrupt is not None:
            raise ValueError("rollout.engine: vllm cannot change weights mid-generation (partial rollouts)")
        ids, mask = self.encode_prompts(prompts)
        return self._samples(ids, mask, num_generations, max_new_tokens, temperature, generator, stop)

    def sample_ids(self, ids, mask, max_new_tokens: int, temperature: float = 1.0,
                   generator: torch.Generator | None = None, stop: list[str] | None = None, refresh=None) -> Samples:
        """One completion per left-padded row of token ids (an episode's next turn)."""
        if refresh is not None:
            raise ValueError("rollout.engine: vllm cannot change weights mid-generation (partial rollouts)")
        return self._samples(ids.cpu(), mask.cpu(), 1, max_new_tokens, temperature, generator, stop)

    def _samples(self, ids, mask, g: int, max_new_tokens: int, temperature: float, generator, stop) -> Samples:
        rows = [ids[i][mask[i].bool()].tolist() for i in range(len(ids))]
        seeds = torch.randint(0, 2**31 - 1, (len(rows),), generator=generator).tolist()
        started = time.perf_counter()
        reply = self.engine.call("generate", prompts=rows, n=[g] * len(rows), seed=seeds,
                                 max_tokens=[max_new_tokens] * len(rows), temperature=temperature, stop=stop or [])
        # What the process boundary costs: the call's wall time beyond vLLM's own.
        self.last_call_overhead_s = time.perf_counter() - started - reply.get("seconds", 0.0)
        done = [c for per_prompt in reply["outputs"] for c in per_prompt]
        if len(done) != len(rows) * g:
            raise EngineError(f"the vLLM engine returned {len(done)} completions for {len(rows)} prompts × {g}")
        pad = self.tokenizer.pad_token_id
        completion, cmask = right_pad([torch.tensor(c[0], dtype=torch.long) for c in done], pad)
        logps, _ = right_pad([torch.tensor(c[1], dtype=torch.float32) for c in done])
        texts = self.tokenizer.batch_decode(completion.masked_fill(cmask == 0, pad), skip_special_tokens=True)
        if stop:
            texts = [cut_at_stop(t, stop) for t in texts]
        return Samples(prompt_ids=ids.repeat_interleave(g, 0), prompt_mask=mask.repeat_interleave(g, 0),
                       completion_ids=completion, completion_mask=cmask, sample_logprobs=logps * cmask,
                       truncated=torch.tensor([c[2] == "length" for c in done]), texts=texts)

    # -- weights ------------------------------------------------------------------------
    def set_weights(self, tensors: dict[str, torch.Tensor], version: int | None = None) -> None:
        """Load the learner's trainable state (``HFPolicy.weights()``: full weights, or the LoRA
        adapters) into the engine, as the weights of ``version``."""
        from safetensors.torch import save_file

        started = time.perf_counter()
        self.syncs += 1
        folder = self.dir / f"sync-{self.syncs}"
        folder.mkdir()
        plain = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        if self.lora is None:
            # ``weights()`` names a tied tensor once; the engine may hold it twice (an untied
            # LM head next to the embedding), and a name it is not sent keeps its old values.
            plain.update({alias: plain[name].clone() for name, alias in self.aliases if name in plain})
            save_file(plain, str(folder / "model.safetensors"))
            self.engine.call("reload", path=str(folder))
        else:
            save_file(plain, str(folder / "adapter_model.safetensors"))
            self.policy.model.peft_config["default"].save_pretrained(str(folder))
            self.engine.call("adapter", name=f"sync-{self.syncs}", id=self.syncs, path=str(folder))
        previous = self.dir / f"sync-{self.syncs - 1}"
        if previous.exists():
            shutil.rmtree(previous, ignore_errors=True)
        self.version = version
        self.last_sync_s = time.perf_counter() - started

    def metrics(self) -> dict[str, float]:
        """``vllm/sync_s``: the last weight sync's seconds (writing the folder and loading it);
        ``vllm/version``: the learner version the engine holds; ``vllm/call_overhead_s``: the last
        generation call's seconds beyond vLLM's own (the process boundary: JSON, pipes)."""
        return {"vllm/sync_s": self.last_sync_s, "vllm/version": float(-1 if self.version is None else self.version),
                "vllm/call_overhead_s": self.last_call_overhead_s}

    def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
        if engine is not None and engine.failed:  # the error names the log: leave it, drop the weights
            for p in self.dir.glob("sync-*"):
                shutil.rmtree(p, ignore_errors=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
