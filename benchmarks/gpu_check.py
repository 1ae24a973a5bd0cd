"""The GPU check of issue 30: one prepared run on a machine with one NVIDIA GPU (``gpu_check.sh``).

Run on one H200 on 2026-12-04; its results are in ``docs/scaling.md`` ("Checked on a GPU").

Stages (run in this order: env, agreement, grpo, so the quick correctness check is not the one
a slow GRPO arm pushes past the time limit):

1. ``env``: Python, torch, CUDA, NCCL, transformers (peft, accelerate) versions, the GPU's name,
   ``torch.cuda.is_available()``, bf16 support; every dependency of ``pyproject.toml`` importable
   (a missing one is named and fails the check; nothing is installed).
2. ``grpo``: recipes/grpo.yaml on ``model.device: cuda`` with ``train.precision: bf16`` for 20
   steps (8 prompts × G 8, 32 new tokens, no evaluation) on the embedded model and on a random
   model of SmolLM2-135M's architecture (written here, nothing carried), each ``plain`` (one
   process, the ``Trainer``) and ``fsdp`` (one rank under ``torch.distributed.run``, which
   ``reasonrl.train.launch.run_rank`` trains through the FSDP2 learner). Per arm: median step
   time (the first 2 steps skipped), train and sample tokens/s, peak GPU memory
   (``torch.cuda.max_memory_allocated`` in the run's own process), the dtype the learner's and the
   sampler's decoder layers' matmuls actually computed in, and the sample-vs-learner log-prob mismatch:
   mean |sample_logprobs − learner logprobs| over the completion tokens, where the learner's
   log-probs are the very ones the loss used (captured from the learner policy's
   ``completion_logprobs`` inside the optimisation call, so whatever precision the library
   applies there is what is measured).
3. ``agreement``: one optimisation step of the same recipe and seed in fp32 on ``cpu`` and on
   ``cuda`` (embedded model). The GPU run takes the CPU run's sampled and scored batch instead of
   sampling (then computes advantages and the update itself), so the two steps see the same
   input and differ only by the device's arithmetic; a second GPU run samples its own batch, to
   report whether the devices sample the same tokens from the same seed. The recipe is
   grpo.yaml with no warm-up and ``loss.entropy_coef: 0.01``, so the step moves every weight
   (tolerances and their measured margins: ``stage_agreement``). In the dry run the "other
   device" is the CPU with ``train.threads: 1``.

Each training run is its own process (clean peak memory; a crash or hang costs one arm, not the
check). The last line printed is ``GPU_CHECK {json}``, also when a stage fails (``ok: false``,
``failed`` names the stages, each stage its ``error``).

    bash benchmarks/gpu_check.sh            # the GPU check (under 8 minutes)
    bash benchmarks/gpu_check.sh --cpu      # dry run on CPUs: same stages, device cpu, 2 steps, tiny sizes
    bash benchmarks/gpu_check.sh --only agreement --out DIR   # one stage (after env); keep the run folders
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# torch and reasonrl are imported inside the functions that use them, so a missing or broken
# dependency becomes the env stage's error in the report line instead of a crash at import.
REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "grpo.yaml"
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception)|reasonrl: error)\b")
SKIP_STEPS = 2  # steps left out of the step-time medians: CUDA context, allocator and kernel warm-up

# The agreement stage's tolerances (fp32 on both devices; justified in ``agreement``).
GRAD_NORM_RTOL = 1e-4
UPDATE_RTOL = 1e-2
WEIGHT_RTOL = 1e-3

# pyproject's dependencies → the module each imports as; ``needed``: the check's runs import it
# (matplotlib only draws plots, which the arms switch off).
DEPENDENCIES = {"torch": ("torch", True), "transformers": ("transformers", True), "tokenizers": ("tokenizers", True),
                "safetensors": ("safetensors", True), "numpy": ("numpy", True), "pyyaml": ("yaml", True),
                "tqdm": ("tqdm", True), "matplotlib": ("matplotlib", False), "peft": ("peft", False),
                "accelerate": ("accelerate", False)}


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:600]


# -- stage 1: the environment ------------------------------------------------------------------
def stage_env(cpu: bool) -> dict:
    out: dict = {"python": platform.python_version(), "mode": "cpu-dry-run" if cpu else "gpu"}
    missing_needed, missing = [], []
    for dist_name, (module, needed) in DEPENDENCIES.items():
        try:
            mod = importlib.import_module(module)
            out[dist_name] = getattr(mod, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 — a broken install reads as missing, with its reason
            (missing_needed if needed else missing).append(f"{dist_name} ({error_text(exc)})")
    out["missing_optional"] = missing
    if missing_needed:
        out["error"] = ("missing dependencies (nothing is installed from the network): " + "; ".join(missing_needed))
        return out
    import torch
    import torch.distributed as dist

    out.update(torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
               device_count=torch.cuda.device_count(), nccl_available=dist.is_available() and dist.is_nccl_available(),
               threads=torch.get_num_threads())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=torch.cuda.get_device_name(0), capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), bf16_supported=torch.cuda.is_bf16_supported())
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # noqa: BLE001
            out["nccl"] = error_text(exc)
    try:
        import reasonrl.components  # noqa: F401  (the registrations; PYTHONPATH=src has no entry points)
        import reasonrl.train.launch  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"cannot import reasonrl: {error_text(exc)}"
        return out
    if not cpu and not torch.cuda.is_available():
        out["error"] = (f"torch.cuda.is_available() is False (torch {torch.__version__}, built for CUDA "
                        f"{torch.version.cuda}): this is the GPU check; use --cpu for the dry run")
    return out


# -- one training run (an "arm"), in its own process ---------------------------------------------
def first_matmul(model):
    """The first ``nn.Linear`` inside the first decoder layer: the dtype its output has is the
    dtype the layer's matmuls ran in. (The layer's own output is no witness: under autocast the
    residual adds promote the bf16 matmul results back to the fp32 stream, which the first GPU
    run of this check reported as "bf16 asked, the learner computed in float32".)"""
    names = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in names or type(module).__name__.endswith("DecoderLayer"):
            return next((m for m in module.modules() if type(m).__name__ == "Linear"), None)
    return None


class Probe:
    """What an arm measures inside the library's own calls (see the module docstring)."""

    def __init__(self) -> None:
        self.step = -1
        self.per_step: dict[int, list[float]] = {}  # step -> [sum |Δ|, tokens, max |Δ|]
        self.dtypes: dict[str, set[str]] = {"learner": set(), "sampler": set()}

    def watch_dtypes(self, model, role: str) -> None:
        """Record the dtype the first decoder layer's matmuls computed in: ``learner`` in forwards
        with gradients, ``sampler`` in those without (``role`` names the model for the other case)."""
        layer = first_matmul(model)
        if layer is None:
            return

        def hook(_module, _inputs, output):
            import torch

            hidden = output[0] if isinstance(output, (tuple, list)) else output
            if isinstance(hidden, torch.Tensor):
                self.dtypes["learner" if torch.is_grad_enabled() else role].add(str(hidden.dtype).replace("torch.", ""))

        layer.register_forward_hook(hook)

    def wrap_loss(self, policy, loss_fn):
        """``loss_fn`` that also compares the learner's log-probs of the micro-batch (captured
        from ``policy.completion_logprobs`` during the call) with the sampler's."""

        def probed(micro, mini, pass_, j):
            if pass_ > 0 or micro.sample_logprobs is None:
                return loss_fn(micro, mini, pass_, j)
            seen = []
            original = policy.completion_logprobs

            def capture(*args, **kwargs):
                out = original(*args, **kwargs)
                seen.append(out[0].detach())
                return out

            policy.completion_logprobs = capture  # an instance attribute, removed below
            try:
                result = loss_fn(micro, mini, pass_, j)
            finally:
                del policy.completion_logprobs
            if seen:
                learner = seen[0].float().cpu()
                sample = micro.sample_logprobs.float()
                width = min(learner.shape[1], sample.shape[1])
                mask = micro.completion_mask[:, :width].bool()
                diff = (learner[:, :width] - sample[:, :width]).abs()[mask]
                acc = self.per_step.setdefault(self.step, [0.0, 0, 0.0])
                acc[0] += float(diff.sum())
                acc[1] += int(diff.numel())
                acc[2] = max(acc[2], float(diff.max()) if diff.numel() else 0.0)
            return result

        return probed

    def results(self) -> dict:
        rows = [v for _, v in sorted(self.per_step.items()) if v[1]]
        total = sum(v[1] for v in rows)
        return {
            "logprob_mismatch_mean": sum(v[0] for v in rows) / total if total else None,
            "logprob_mismatch_first_step": rows[0][0] / rows[0][1] if rows else None,
            "logprob_mismatch_max": max((v[2] for v in rows), default=None),
            "mismatch_tokens": total,
            "learner_compute_dtype": sorted(self.dtypes["learner"]),
            "sampler_compute_dtype": sorted(self.dtypes["sampler"]),
        }


def probe_trainer_class(probe: Probe, capture: str | None, replay: str | None):
    """The library's ``Trainer`` with the probe attached after set-up; ``capture``/``replay``: save
    the step's sampled and scored batch, or take a saved one instead of sampling (the agreement
    stage: every later stage, the update included, then runs on the same input)."""
    import torch

    from reasonrl.train.trainer import Trainer

    class ProbeTrainer(Trainer):
        def _setup(self) -> None:
            super()._setup()
            probe.watch_dtypes(self.learner.policy.model, "sampler")
            if self.learner.policy.model is not self.policy.model:  # FSDP: rank 0 samples with its full copy
                probe.watch_dtypes(self.policy.model, "sampler")
            optimise, policy = self.learner.optimise, self.learner.policy

            def optimise_probed(batch, loss_fn, **kw):
                return optimise(batch, probe.wrap_loss(policy, loss_fn), **kw)

            self.learner.optimise = optimise_probed

        def _rollout(self, s) -> None:
            if replay:  # the saved run's sampled and scored batch, in place of sampling one here
                s.batch, s.stats, s.metrics = torch.load(replay, weights_only=False)
                return
            super()._rollout(s)
            if capture:
                torch.save((s.batch, s.stats, s.metrics), capture)

        def _update(self, s) -> None:
            probe.step = s.step
            super()._update(s)

    return ProbeTrainer


def run_arm(spec_path: str) -> int:
    """One training run from a spec file (see ``arm_spec``); writes ``result.json`` in its run
    folder. Under ``torch.distributed.run`` (RANK and WORLD_SIZE set) it trains through
    ``reasonrl.train.launch.run_rank``, i.e. the FSDP2 learner."""
    import torch

    import reasonrl.components  # noqa: F401  (the registrations; PYTHONPATH=src has no entry points)
    import reasonrl.train.launch as launch
    from reasonrl.config import load_recipe
    from reasonrl.devices import resolve_device
    from reasonrl.metrics_log import read_metrics

    spec = json.loads(Path(spec_path).read_text())
    run_dir = Path(spec["run_dir"])
    recipe = load_recipe(spec["recipe"], spec["sets"])
    probe = Probe()
    trainer_cls = probe_trainer_class(probe, spec.get("capture"), spec.get("replay"))
    ranked = launch.launched_rank()
    started = time.perf_counter()
    if ranked is not None:
        recipe.train.nproc = ranked[1]  # as `reasonrl train` does under a launcher
        launch.Trainer = trainer_cls  # run_rank's rank 0 builds the probed Trainer; nothing else changes
        summary = launch.run_rank(recipe, run_dir, resume=False)
        if summary is None:
            return 0  # not rank 0
    else:
        summary = trainer_cls(recipe, run_dir).run()
    wall = time.perf_counter() - started
    device = resolve_device(recipe.model.device)
    rows = [row for row in read_metrics(run_dir) if row.get("perf/step_s") is not None]
    timed = rows[SKIP_STEPS:] if len(rows) > SKIP_STEPS else rows[-1:]

    def median(key):
        values = [row[key] for row in timed if row.get(key) is not None]
        return round(statistics.median(values), 4) if values else None

    result = {
        "steps": len(rows), "launched_ranks": ranked[1] if ranked else 0, "device": str(device),
        "step_s_median": median("perf/step_s"), "train_tokens_per_s": median("perf/train_tokens_per_s"),
        "sample_tokens_per_s": median("perf/sample_tokens_per_s"),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "wall_s": round(wall, 1), "final_loss": rows[-1].get("loss") if rows else None,
        "grad_norm_first": rows[0].get("grad_norm") if rows else None, "summary_steps": summary.get("steps"),
        **probe.results(),
    }
    if device.type == "cuda":
        result["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        result["peak_gpu_reserved_mib"] = round(torch.cuda.max_memory_reserved(device) / 2**20, 1)
    (run_dir / "result.json").write_text(json.dumps(result))
    return 0


# -- the orchestrator ---------------------------------------------------------------------------
class Clock:
    def __init__(self, budget_s: float) -> None:
        self.start, self.budget_s = time.monotonic(), budget_s
        self.stopped = False  # set on SIGTERM (gpu_check.sh's timeout): start nothing more

    def left(self) -> float:
        return 0.0 if self.stopped else self.budget_s - (time.monotonic() - self.start)


class Terminated(Exception):
    """SIGTERM: the shell's time limit; the running arm is stopped and the report printed."""


def arm_spec(work: Path, name: str, sets: list[str], **extra) -> Path:
    run_dir = work / "runs" / name.replace("/", "-")
    spec = {"recipe": str(RECIPE), "sets": sets, "run_dir": str(run_dir), **extra}
    path = work / "specs" / f"{name.replace('/', '-')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec))
    return path


def launch_arm(work: Path, name: str, sets: list[str], fsdp: bool, clock: Clock, timeout_s: float,
               **extra) -> dict:
    """Run one arm in a subprocess; its result.json, or ``error`` with the tail of its output."""
    if clock.left() < 20:
        return {"error": f"skipped: {clock.left():.0f}s left of the check's time budget"}
    spec = arm_spec(work, name, sets, **extra)
    run_dir = Path(json.loads(spec.read_text())["run_dir"])
    me = str(Path(__file__).resolve())
    argv = [sys.executable, me, "arm", str(spec)]
    if fsdp:  # one learner rank under torch's launcher: RANK/WORLD_SIZE set, so the FSDP2 learner
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", me, "arm", str(spec)]
    limit = min(timeout_s, clock.left() - 5)
    out_file = work / "logs" / f"{name.replace('/', '-')}.log"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    log(f"arm {name}: {'torch.distributed.run, 1 rank' if fsdp else 'one process'}, limit {limit:.0f}s (log {out_file})")
    started = time.monotonic()
    with open(out_file, "w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        code = None
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            pass
        finally:  # timed out, or SIGTERM: the arm's own session (torchrun and its rank included)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = round(time.monotonic() - started, 1)
    result_file = run_dir / "result.json"
    if code == 0 and result_file.is_file():
        result = json.loads(result_file.read_text())
        result["process_s"] = seconds
        log(f"arm {name}: done in {seconds}s: " + json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}))
        return result
    lines = out_file.read_text(errors="replace").strip().splitlines()
    print("\n".join(f"    | {line}" for line in lines[-25:]), flush=True)
    # The exception that ended the run (torchrun's own ChildFailedError comes after it, naming nothing).
    raised = [line.strip() for line in lines if EXCEPTION_LINE.match(line) and "ChildFailedError" not in line]
    why = "timed out" if code is None else f"exit {code}"
    return {"error": f"{why} after {seconds}s: " + (raised[-1] if raised else (lines[-1] if lines else "no output"))[:500],
            "log": str(out_file)}


def stage_grpo(work: Path, cpu: bool, steps: int, clock: Clock) -> dict:
    from reasonrl.policy.tiny import write_smollm2_architecture

    if cpu:  # the dry run: the same arms, tiny sizes
        common = ["model.device=cpu", "train.precision=bf16", f"train.steps={steps}", "train.prompts_per_step=2",
                  "rollout.num_generations=4", "rollout.max_new_tokens=8"]
        arch = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16}
    else:
        common = ["model.device=cuda", "train.precision=bf16", f"train.steps={steps}", "train.prompts_per_step=8",
                  "rollout.num_generations=8", "rollout.max_new_tokens=32"]
        arch = {}  # full size: 30 layers, 576 hidden, ~135M parameters
    common += ["eval.size=0", "eval.every=0", "log.plots=false", "log.progress=false", f"train.checkpoint_every={steps}",
               "train.keep_checkpoints=1"]
    started = time.monotonic()
    folder = write_smollm2_architecture(work / "smollm2-architecture-random", seed=0, **arch)
    out: dict = {"smollm2_architecture": {"written_s": round(time.monotonic() - started, 1), **arch}}
    models = {"embedded": [], "smollm2_arch": ["model.backend=hf", f"model.path={folder}"]}
    timeout = 90 if cpu else 150
    for model, sets in models.items():
        for mode in ("plain", "fsdp"):
            name = f"{model}/{mode}"
            out[name] = launch_arm(work, f"grpo/{name}", common + sets, mode == "fsdp", clock, timeout)
    failed = [k for k, v in out.items() if isinstance(v, dict) and "error" in v]
    if failed:
        out["error"] = "arms failed: " + ", ".join(failed)
    # Reported, not failed: what the recipe asked for against what the learner's layers computed in.
    out["warnings"] = [f"{k}: train.precision bf16 asked, the learner computed in {v['learner_compute_dtype']}"
                       for k, v in out.items() if isinstance(v, dict) and "learner_compute_dtype" in v
                       and v["learner_compute_dtype"] != ["bfloat16"]]
    return out


def load_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}


def compare_steps(before: dict, ref: dict, other: dict) -> dict:
    """How far ``other``'s weights after the step are from ``ref``'s: per tensor, the largest
    difference relative to the tensor's largest weight (max over tensors), and the difference of
    the updates (after − before) relative to the reference update, in L2 over every weight."""
    import torch

    worst, worst_name, num, den, changed, elements = 0.0, None, 0.0, 0.0, 0, 0
    for name, w_ref in ref.items():
        w_other, w0 = other[name], before[name]
        rel = float((w_other - w_ref).abs().max() / w_ref.abs().max().clamp_min(1e-12))
        if rel > worst:
            worst, worst_name = rel, name
        d_ref, d_other = w_ref - w0, w_other - w0
        num += float(((d_other - d_ref) ** 2).sum())
        den += float((d_ref ** 2).sum())
        changed += int((d_ref != 0).sum())
        elements += d_ref.numel()
    return {"weights_max_rel": worst, "weights_worst_tensor": worst_name,
            "update_rel_l2": (num ** 0.5) / max(den ** 0.5, 1e-30), "update_l2": den ** 0.5,
            "updated_fraction": changed / max(elements, 1), "update_max_abs": max(
                float((ref[n] - before[n]).abs().max()) for n in ref), "identical": all(torch.equal(ref[n], other[n]) for n in ref)}


def stage_agreement(work: Path, cpu: bool, clock: Clock) -> dict:
    """One fp32 step on the CPU and on the GPU (see the module docstring). Tolerances:

    - ``grad_norm`` (before clipping), relative, ≤ ``GRAD_NORM_RTOL`` = 1e-4: fp32 forward and
      backward on two devices differ by reduction order (blocked matmuls, attention kernels,
      log-softmax), a relative error of about 1e-6 per op that stays near 1e-6..1e-5 through a
      few layers; a silent lower precision (TF32 or bf16 matmuls, ~1e-3) fails it.
    - the update (weights after − before), relative L2 over all weights, ≤ ``UPDATE_RTOL`` = 1e-2:
      AdamW's first step is lr·g/(|g|+ε), i.e. ±lr wherever |g| ≫ ε; an element whose gradient
      is within rounding of 0 can flip sign between devices (a difference of 2·lr there), so a
      few flips among millions of weights are expected: k flips give 2·sqrt(k/N) ≈ 1e-3 for
      k/N = 3e-7. The bound 1e-2 allows ~25 flips per million weights; a wrong gradient moves
      most of them.
    - weights after the step, per tensor relative to its largest weight, ≤ ``WEIGHT_RTOL`` = 1e-3
      (the brief's figure). It is loose by construction — the step itself moves a weight by at
      most lr = 3e-4 — so it catches corruption (a wrong device copy, NaNs) and not small drift;
      the two criteria above are the sharp ones.

    Measured on the CPU (2026-12-03, this stage's CPU batch, the other run's model cast to another
    dtype as a stand-in for another device's rounding): float64 vs fp32 gives grad_norm_rel 2.4e-7,
    update_rel_l2 3.1e-5, weights_max_rel 1.2e-5 (no update element off by more than lr), i.e.
    80-400x inside the tolerances; bfloat16 vs fp32 gives 1.5e-2, 0.45 and 7.0e-3 (25,727 of
    659,328 updates off by more than lr): every criterion fails it.
    """
    sets = ["train.steps=1", "train.prompts_per_step=8", "rollout.num_generations=8",
            "rollout.max_new_tokens=16" if cpu else "rollout.max_new_tokens=32", "train.precision=fp32",
            # A full-size first step (no warm-up), so the update is lr-sized and the test sensitive;
            # an entropy bonus, so every sampled token has a gradient even when every group's
            # reward agrees (GRPO's advantages are then all 0 and the step would change nothing).
            "optim.warmup_steps=0", "loss.entropy_coef=0.01", "eval.size=0", "log.plots=false", "log.progress=false"]
    other = ["model.device=cpu", "train.threads=1"] if cpu else ["model.device=cuda"]
    batch = work / "agreement-batch.pt"
    out: dict = {"other_device": "cpu with train.threads=1 (dry run)" if cpu else "cuda",
                 "tolerances": {"grad_norm_rel": GRAD_NORM_RTOL, "update_rel_l2": UPDATE_RTOL, "weights_max_rel": WEIGHT_RTOL}}
    timeout = 90
    arms = {"cpu": launch_arm(work, "agreement/cpu", sets + ["model.device=cpu"], False, clock, timeout, capture=str(batch))}
    if "error" not in arms["cpu"]:
        arms["other_replayed"] = launch_arm(work, "agreement/other-replayed", sets + other, False, clock, timeout,
                                            replay=str(batch))
    arms["other_sampled"] = launch_arm(work, "agreement/other-sampled", sets + other, False, clock, timeout,
                                       capture=str(work / "agreement-batch-other.pt"))
    bad = [k for k, v in arms.items() if "error" in v]
    out["arms"] = {k: {key: v.get(key) for key in ("error", "grad_norm_first", "final_loss", "device", "process_s") if key in v}
                   for k, v in arms.items()}
    out["ok"] = False
    if bad:
        out["error"] = "arms failed: " + ", ".join(bad)
    if "error" in arms["cpu"] or "error" in arms.get("other_replayed", {"error": 1}):
        return out
    import torch

    from reasonrl.policy.tiny import EMBEDDED_DIR

    before = load_weights(EMBEDDED_DIR)
    ref = load_weights(work / "runs" / "agreement-cpu" / "final_model")
    replayed = load_weights(work / "runs" / "agreement-other-replayed" / "final_model")
    out.update(compare_steps(before, ref, replayed))
    g_ref, g_other = arms["cpu"]["grad_norm_first"], arms["other_replayed"]["grad_norm_first"]
    out["grad_norm_cpu"], out["grad_norm_other"] = g_ref, g_other
    out["grad_norm_rel"] = abs(g_other - g_ref) / max(abs(g_ref), 1e-30) if g_ref is not None and g_other is not None else None
    # Did the other device sample the same tokens from the same seed? (Reported, not judged: a
    # last-bit difference in a probability can change a draw.)
    if "error" not in arms["other_sampled"]:
        a = torch.load(batch, weights_only=False)[0]
        b = torch.load(work / "agreement-batch-other.pt", weights_only=False)[0]
        out["sampled_same_tokens"] = a.completion_ids.shape == b.completion_ids.shape and bool(torch.equal(a.completion_ids, b.completion_ids))
        sampled = load_weights(work / "runs" / "agreement-other-sampled" / "final_model")
        out["sampled_run_weights_max_rel"] = compare_steps(before, ref, sampled)["weights_max_rel"]
    agree = bool(out["grad_norm_rel"] is not None and out["grad_norm_rel"] <= GRAD_NORM_RTOL
                 and out["update_rel_l2"] <= UPDATE_RTOL and out["weights_max_rel"] <= WEIGHT_RTOL)
    moved = bool(g_ref) and out["update_l2"] > 0  # a step that changes nothing would agree vacuously
    out["ok"] = agree and moved and not bad
    if not moved:
        out["error"] = "the reference step changed no weight: the comparison would be vacuous"
    elif not agree:
        out["error"] = "CPU and the other device disagree beyond the tolerances"
    return out


def orchestrate(args) -> int:
    clock = Clock(args.budget_s)

    def terminate(_signum, _frame):
        clock.stopped = True
        raise Terminated("stopped by SIGTERM (the time limit of gpu_check.sh)")

    signal.signal(signal.SIGTERM, terminate)
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="reasonrl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (2 if args.cpu else 20)
    result: dict = {"ok": False, "mode": "cpu-dry-run" if args.cpu else "gpu", "work": str(work)}
    stages = [("env", lambda: stage_env(args.cpu)), ("agreement", lambda: stage_agreement(work, args.cpu, clock)),
              ("grpo", lambda: stage_grpo(work, args.cpu, steps, clock))]
    if args.only:
        stages = [(n, f) for n, f in stages if n == "env" or n in args.only.split(",")]
    for name, stage in stages:
        if clock.stopped:
            result[name] = {"error": "not run: stopped by SIGTERM"}
            continue
        log(f"stage {name}")
        try:
            result[name] = stage()
        except Exception as exc:  # noqa: BLE001 — the report must still come out
            traceback.print_exc()
            result[name] = {"error": error_text(exc)}
        if name == "env" and "error" in result["env"]:
            log(f"env: {result['env']['error']}")
            break  # nothing else can run
    result["failed"] = [name for name, _ in stages if name not in result or "error" in result[name]]
    result["ok"] = not result["failed"]
    result["wall_s"] = round(time.monotonic() - clock.start, 1)
    print("GPU_CHECK " + json.dumps(result, default=str), flush=True)
    return 0 if result["ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    arm = sub.add_parser("arm", help="one training run from a spec file (used by the check itself)")
    arm.add_argument("spec")
    parser.add_argument("--cpu", action="store_true", help="dry run on CPUs: device cpu, 2 steps, tiny sizes")
    parser.add_argument("--out", help="work folder (default: a new temporary folder)")
    parser.add_argument("--steps", type=int, help="GRPO steps per arm (default 20; 2 with --cpu)")
    parser.add_argument("--only", help="comma-separated stages after env: agreement, grpo (default: both)")
    parser.add_argument("--budget-s", type=float, default=440.0, help="stop starting arms after this many seconds")
    args = parser.parse_args()
    if args.command == "arm":
        return run_arm(args.spec)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
