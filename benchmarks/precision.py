"""bf16 schemes and gradient checkpointing on the learner's real path, measured on SmolLM2-135M.

The learner's path is ``HFPolicy.completion_logprobs(..., with_entropy=True)``, a scalar loss
``(logp * adv).mean()`` and ``.backward()``. Part 1 times one forward+backward per precision
scheme, interleaved (arm order rotates every round, so machine noise hits every arm), and reports
the median, the ratio to fp32 and the max |logp - logp_fp32|:

  fp32        the baseline;
  autocast    ``torch.autocast(device, bfloat16)`` around the forward, backward outside;
  bf16_params a bfloat16 copy of the model runs forward+backward; fp32 master weights live on the
              optimiser side, so every step also pays ``master.grad = p.grad.float()`` and, after
              the (unchanged, fp32) AdamW step, ``p.copy_(master)``: that copy cost is timed apart
              ("copy_ms") and included in the arm's total;
  fp32_onednn_bf16  fp32 model with ``torch.backends.mkldnn.matmul.fp32_precision = "bf16"``: oneDNN
              may run fp32 matmuls in bf16 where the CPU has bf16 units (AVX512-BF16 / AMX); where it
              has not, the flag changes nothing (the logp diff then reads 0).

A bf16 arm whose first (warm-up) step takes more than ``--slow-cutoff`` times the fp32 steps run
just before and after it is not repeated: on a CPU without bf16 hardware one step can take
minutes. Its single sample is reported with ``n=1`` and its ratio is to those neighbouring fp32
steps (the machine's load drifts over minutes), so the table stays honest about what was measured.

Part 2 (gradient checkpointing, fp32, ``model.train()``): each arm runs in a fresh subprocess;
the peak RSS growth of one forward+backward is VmHWM minus VmRSS after the peak was reset
through ``/proc/self/clear_refs`` just before the step (Linux), i.e. activations + gradients +
temporaries, not the weights. It also checks the shared-prompt path (``group_ids``, which
passes ``use_cache=True`` in training) under checkpointing against the plain path.

    python benchmarks/precision.py               # 8 x (64 + 64), 5 repeats, part 1 on 4 layers (~6 min)
    python benchmarks/precision.py --layers 30 --gc-shapes ''   # part 1 on the full model (~15 min on AVX2)

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore")
MODEL_DIR = os.path.expanduser(os.environ.get("SMOLLM2_DIR", "~/.cache/reasonrl/smollm2-135m-float32"))
ARMS = ("fp32", "autocast", "bf16_params", "fp32_onednn_bf16")


def load(layers: int | None, dtype=torch.float32):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasonrl.policy.hf import HFPolicy

    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=dtype)
    if layers is not None and layers < model.config.num_hidden_layers:
        # Fewer decoder layers, same shapes: per-layer cost ratios and the LM head stay as in the full model.
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
    model.train()
    return HFPolicy(model, AutoTokenizer.from_pretrained(MODEL_DIR))


def batch(rows: int, prompt: int, completion: int, groups: int | None = None, seed: int = 0):
    """Token ids from SmolLM2's vocabulary, full masks, per-row advantages; with ``groups`` the rows
    of a group share their prompt (as GRPO batches do) and get ``group_ids``."""
    g = torch.Generator().manual_seed(seed)
    n_prompts = groups or rows
    p_ids = torch.randint(100, 49000, (n_prompts, prompt), generator=g)
    gid = torch.arange(rows) * n_prompts // rows
    p_ids = p_ids[gid]
    c_ids = torch.randint(100, 49000, (rows, completion), generator=g)
    adv = torch.randn(rows, 1, generator=g)
    return dict(prompt_ids=p_ids, prompt_mask=torch.ones_like(p_ids), completion_ids=c_ids,
                completion_mask=torch.ones_like(c_ids), group_ids=gid if groups else None), adv


def fwd_bwd(policy, b, adv, autocast: bool = False) -> torch.Tensor:
    dev = policy.device.type
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
        logp, _ = policy.completion_logprobs(**b, temperature=1.0, with_entropy=True)
    loss = (logp.float() * adv).mean()
    loss.backward()
    return logp.detach().float()


class MasterCopy:
    """fp32 master weights for a bf16 model: what an optimiser wrapper does around AdamW."""

    def __init__(self, model):
        self.pairs = [(p, p.detach().float().clone()) for p in model.parameters() if p.requires_grad]

    def grads_to_master(self):
        for p, m in self.pairs:
            m.grad = p.grad.float()

    def master_to_model(self):
        with torch.no_grad():
            for p, m in self.pairs:
                p.copy_(m)


def timing(args) -> dict:
    base = load(args.layers)
    bf16 = copy.deepcopy(base)
    bf16.model.to(torch.bfloat16)
    master = MasterCopy(bf16.model)
    b, adv = batch(args.rows, args.prompt, args.completion)

    def run(arm):
        policy = bf16 if arm == "bf16_params" else base
        torch.backends.mkldnn.matmul.fp32_precision = "bf16" if arm == "fp32_onednn_bf16" else "ieee"
        policy.model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        logp = fwd_bwd(policy, b, adv, autocast=arm == "autocast")
        t1 = time.perf_counter()
        if arm == "bf16_params":
            master.grads_to_master()
            master.master_to_model()
        t2 = time.perf_counter()
        torch.backends.mkldnn.matmul.fp32_precision = "ieee"
        return logp, t2 - t0, t2 - t1

    times = {a: [] for a in ARMS}
    copies: dict[str, list[float]] = {a: [] for a in ARMS}
    logps, warm, warm_copy, fp32_around = {}, {}, {}, {}
    _, prev, _ = run("fp32")  # first-call costs (allocator, oneDNN primitives) land here
    for arm in ARMS:  # warm-up, the log-probs compared with fp32's, and an fp32 step after each arm
        logps[arm], warm[arm], warm_copy[arm] = run(arm)
        _, after, _ = run("fp32")
        # The machine's load drifts over minutes: a slow arm's single step is compared with the fp32
        # steps just before and after it, not with fp32 steps taken at another time.
        fp32_around[arm], prev = (prev + after) / 2, after
        print(f"  warm-up {arm}: {warm[arm]:.2f} s (fp32 around it: {fp32_around[arm]:.2f} s)", flush=True)
    slow = {a for a in ARMS if a != "fp32" and warm[a] > args.slow_cutoff * fp32_around[a]}
    for a in slow:
        times[a].append(warm[a])
        copies[a].append(warm_copy[a])
    for r in range(args.repeats):
        order = [a for a in ARMS if a not in slow]
        k = r % len(order)
        for arm in order[k:] + order[:k]:
            _, dt, dc = run(arm)
            times[arm].append(dt)
            copies[arm].append(dc)
    ref = statistics.median(times["fp32"])
    out = {}
    for a in ARMS:
        med = statistics.median(times[a])
        out[a] = dict(median_s=round(med, 3), ratio=round(med / (fp32_around[a] if a in slow else ref), 2),
                      n=len(times[a]), copy_ms=round(1e3 * statistics.median(copies[a]), 1),
                      max_logp_diff=float((logps[a] - logps["fp32"]).abs().max()))
    return out


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def gc_child(rows: int, prompt: int, completion: int, on: bool, layers: int | None) -> dict:
    """One memory arm of part 2, in a fresh process: the peak RSS growth of one forward+backward
    (activations, parameter gradients, temporaries; not the weights), checkpointing off or on."""
    torch.set_num_threads(2)
    policy = load(layers)
    if on:
        policy.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    b, adv = batch(rows, prompt, completion)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = rss_kib("VmRSS")
    fwd_bwd(policy, b, adv)
    return dict(peak_growth_mib=round((rss_kib("VmHWM") - before) / 1024, 1))


def gc_timing(rows: int, prompt: int, completion: int, layers: int | None, repeats: int) -> dict:
    """Forward+backward time with checkpointing off and on, in one process, interleaved (off/on,
    then on/off, ...) after one warm-up step of each, so load drift hits both arms."""
    policy = load(layers)
    b, adv = batch(rows, prompt, completion)
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(repeats + 1):
        for arm in (("off", "on") if r % 2 == 0 else ("on", "off")):
            if arm == "on":
                policy.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                policy.model.gradient_checkpointing_disable()
            policy.model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            fwd_bwd(policy, b, adv)
            if r > 0:
                times[arm].append(time.perf_counter() - t0)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    return dict(off_s=round(off, 2), on_s=round(on, 2), time_ratio=round(on / off, 2), n=repeats)


def shared_prompt_logits(model, b):
    """The shared-prompt forward as ``HFPolicy.completion_logits`` ran it before any checkpointing
    guard: one prompt pass with ``use_cache=True``, its cache expanded to the group's rows, then
    the completion pass on that cache. Called on the model directly, so the library's guard (which
    falls back to the row-by-row path under checkpointing) does not hide what transformers does."""
    from reasonrl.algos.masked import group_first_rows, group_inverse
    from reasonrl.policy.sampling import position_ids_from_mask
    from reasonrl.policy.prefix import cache_kw, cache_of

    inverse, num_groups = group_inverse(b["group_ids"])
    first = group_first_rows(inverse, num_groups)
    p_ids, p_mask = b["prompt_ids"][first], b["prompt_mask"][first]
    pos = position_ids_from_mask(p_mask)
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache = cache_of(out)
    cached = cache.get_seq_length() if cache is not None else None
    cache.batch_select_indices(inverse)
    t = b["completion_ids"].shape[1]
    mask = torch.cat([p_mask[inverse], b["completion_mask"]], dim=1)
    c_pos = pos[inverse, -1:] + 1 + torch.arange(t)
    rest = model(input_ids=b["completion_ids"], attention_mask=mask, position_ids=c_pos, **cache_kw(cache),
                 use_cache=True, logits_to_keep=t)
    return torch.cat([out.logits[inverse, -1:], rest.logits[:, :-1]], dim=1), cached


def cache_check(layers: int) -> dict:
    """The shared-prompt path (``group_ids``, ``use_cache=True`` in training) under gradient
    checkpointing vs the plain per-row path: raw transformers, and through ``HFPolicy``."""
    from reasonrl.policy.hf import token_logprobs_and_entropy

    policy = load(layers)
    b, _ = batch(4, 16, 8, groups=2)
    plain = dict(b, group_ids=None)
    out = {}
    for on in (False, True):
        if on:
            policy.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ref, _ = policy.completion_logprobs(**plain)
        via_policy, _ = policy.completion_logprobs(**b)
        arm = out["gc_on" if on else "gc_off"] = dict(policy_max_diff=float((via_policy - ref).abs().max()))
        try:
            logits, cached = shared_prompt_logits(policy.model, b)
            raw, _ = token_logprobs_and_entropy(logits, b["completion_ids"], 1.0, False)
            arm.update(raw_max_diff=float((raw - ref).abs().max()), prompt_tokens_cached=cached)
        except Exception as exc:  # noqa: BLE001 - the outcome itself is what is reported
            arm["raw_error"] = f"{type(exc).__name__}: {exc}"[:300]
    policy.model.gradient_checkpointing_disable()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    # Part 1 defaults to 4 of the 30 decoder layers so that it ends in minutes where bf16 has no hardware
    # (one full-model bf16 step at 8x(64+64) took 300 s on an AVX2-only EPYC); --layers 30 is the full model.
    ap.add_argument("--layers", type=int, default=4, help="part 1: keep the first N decoder layers (30 = all)")
    ap.add_argument("--slow-cutoff", type=float, default=3.0,
                    help="a bf16 arm whose warm-up takes more than this times fp32's is not repeated")
    ap.add_argument("--gc-shapes", default="8x128+128,16x128+128", help="rows x prompt + completion, comma-separated; '' skips part 2")
    ap.add_argument("--gc-layers", type=int, default=None, help="part 2: keep the first N decoder layers (default: all)")
    ap.add_argument("--gc-repeats", type=int, default=2, help="part 2: timed steps per arm after a warm-up")
    ap.add_argument("--gc-time-all", action="store_true", help="part 2: time every shape, not only the first")
    ap.add_argument("--skip-timing", action="store_true", help="skip part 1")
    ap.add_argument("--_gc-child", dest="gc_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.gc_child:
        print(json.dumps(gc_child(**json.loads(args.gc_child))))
        return

    result = dict(cpu_capability=torch.backends.cpu.get_cpu_capability(), torch=torch.__version__,
                  shape=f"{args.rows}x({args.prompt}+{args.completion})", layers=args.layers)
    if not args.skip_timing:
        print(f"part 1: precision schemes at {result['shape']}, {result['layers']} layers "
              f"(cpu capability {result['cpu_capability']})", flush=True)
        result["precision"] = timing(args)
        print(f"{'arm':<18}{'median s':>10}{'ratio':>8}{'n':>4}{'copy ms':>9}{'max|dlogp|':>12}")
        for a, r in result["precision"].items():
            copy_ms = "" if r["copy_ms"] is None or a != "bf16_params" else f"{r['copy_ms']:.1f}"
            print(f"{a:<18}{r['median_s']:>10.3f}{r['ratio']:>8.2f}{r['n']:>4}{copy_ms:>9}{r['max_logp_diff']:>12.2e}")

    if args.gc_shapes:
        print("part 2: gradient checkpointing (fp32, train mode): peak RSS growth of one fwd+bwd in a fresh "
              "process per arm; time interleaved in one process", flush=True)
        result["checkpointing"] = {}
        print(f"{'shape':<14}{'off MiB':>9}{'on MiB':>9}{'saved':>8}{'off s':>8}{'on s':>8}{'time x':>8}")
        for i, shape in enumerate(args.gc_shapes.split(",")):
            rows, rest = shape.split("x")
            prompt, completion = rest.split("+")
            dims = dict(rows=int(rows), prompt=int(prompt), completion=int(completion), layers=args.gc_layers)
            mem = {}
            for on in (False, True):
                proc = subprocess.run([sys.executable, __file__, "--_gc-child", json.dumps(dict(dims, on=on))],
                                      capture_output=True, text=True, check=True)
                mem["on" if on else "off"] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_growth_mib"]
            saved = mem["off"] - mem["on"]
            row = dict(off_mib=mem["off"], on_mib=mem["on"], saved_mib=round(saved, 1),
                       saved_pct=round(100 * saved / mem["off"], 1))
            # Time only at the first shape by default: the recompute costs about one more forward at any size.
            if i == 0 or args.gc_time_all:
                row.update(gc_timing(**dims, repeats=args.gc_repeats))
            result["checkpointing"][shape] = row
            timing_cols = (f"{row['off_s']:>8.2f}{row['on_s']:>8.2f}{row['time_ratio']:>8.2f}" if "off_s" in row
                           else f"{'':>8}{'':>8}{'':>8}")
            print(f"{shape:<14}{mem['off']:>9.0f}{mem['on']:>9.0f}{row['saved_pct']:>7.0f}%{timing_cols}", flush=True)
        result["shared_prompt_under_checkpointing"] = cache_check(layers=4)
        print("shared-prompt path (group_ids, use_cache=True) vs plain path:",
              json.dumps(result["shared_prompt_under_checkpointing"]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
