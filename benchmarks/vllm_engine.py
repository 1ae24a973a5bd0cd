"""The vLLM rollout engine (``rollout.engine: vllm``) against reasonrl's own sampler, on SmolLM2.

In one run, for an engine in float32 and one in bfloat16:

(a) behaviour-learner agreement: the engine's log-probs of the tokens it sampled (8 prompts of
    the SmolLM2 recipe x 8 samples, temperature 1, its stop string) against the fp32 learner's
    scoring of the same ids: max |delta|, mean |delta| and the k3 KL over the tokens;
(b) a weight sync: seconds to write the full weights and load them in place, median of 3, and
    what the engine's own process costs a generation call (its wall time beyond vLLM's own);
(c) sampling tokens/s at batch 8 (1 prompt x 8, 128 new tokens, no stop string): the engine
    against the fused decoder (``rollout.decoder: fused``) in the same dtype, interleaved and
    repeated; the ratio is of medians from this run.

Absolute speeds depend on the machine and its load; on a CPU the engine is there for
correctness, on a GPU for speed (docs/vllm.md).

    REASONRL_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python benchmarks/vllm_engine.py [--repeats 3]

The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from reasonrl.algos.kl import kl_k3
from reasonrl.batch import RolloutBatch
from reasonrl.config import load_recipe
from reasonrl.policy.factory import build_policy
from reasonrl.rollout.vllm_engine import VLLMSampler
from reasonrl.train.objective import batch_logprobs

RECIPE = "recipes/smollm2_grpo.yaml"
LONG = "Give me three tips for learning to cook, with a sentence on each."


def agreement(learner, samples) -> dict[str, float]:
    n = len(samples.completion_ids)
    batch = RolloutBatch(prompt_ids=samples.prompt_ids, prompt_mask=samples.prompt_mask,
                         completion_ids=samples.completion_ids, completion_mask=samples.completion_mask,
                         group_ids=torch.arange(n), rewards=torch.zeros(n), truncated=samples.truncated,
                         sample_logprobs=samples.sample_logprobs)
    scored = batch_logprobs(learner, batch, 64, 1.0, True)
    mask = samples.completion_mask.bool()
    delta = (scored - samples.sample_logprobs)[mask]
    kl = kl_k3(samples.sample_logprobs[mask], scored[mask])  # KL(mu || pi) from mu's samples
    return {"max_abs": float(delta.abs().max()), "mean_abs": float(delta.abs().mean()), "k3_kl": float(kl.mean()),
            "tokens": int(mask.sum())}


def tokens_per_s(sampler, repeats: int) -> list[float]:
    out = []
    for r in range(repeats):
        started = time.perf_counter()
        s = sampler.sample([LONG], 8, 128, 1.0, torch.Generator().manual_seed(r), None)
        out.append(int(s.completion_mask.sum()) / (time.perf_counter() - started))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    recipe = load_recipe(RECIPE, ["rollout.engine=vllm", "model.device=cpu"])
    learner = build_policy(recipe.model, log=lambda m: None)
    learner.model.eval()
    from reasonrl.tasks.base import build_task

    prompts = [p.prompt for p in build_task(recipe).train_problems(0, 8, 0)]
    results = {}
    for dtype in ("float32", "bfloat16"):
        r = load_recipe(RECIPE, ["rollout.engine=vllm", "model.device=cpu", f"rollout.dtype={dtype}"])
        started = time.perf_counter()
        engine = VLLMSampler(learner, r, log=print)
        start_s = time.perf_counter() - started
        try:
            samples = engine.sample(prompts, 8, 16, 1.0, torch.Generator().manual_seed(0), ["\n"])
            agree = agreement(learner, samples)
            syncs = []
            for v in range(3):
                engine.set_weights(learner.weights(), v)
                syncs.append(engine.last_sync_s)
            fused = learner.sampling_copy(None if dtype == "float32" else dtype)
            fused.decoder = "fused"
            speeds = {"engine": [], "fused": []}
            overheads = []
            for _ in range(args.repeats):  # interleaved, so load drifts hit both alike
                speeds["engine"] += tokens_per_s(engine, 1)
                overheads.append(engine.last_call_overhead_s)
                speeds["fused"] += tokens_per_s(fused, 1)
        finally:
            engine.close()
        med = {k: statistics.median(v) for k, v in speeds.items()}
        results[dtype] = {"agreement": agree, "sync_s": statistics.median(syncs), "start_s": start_s,
                          "call_overhead_s": statistics.median(overheads),
                          "engine_tokens_per_s": med["engine"], "fused_tokens_per_s": med["fused"],
                          "engine_over_fused": med["engine"] / med["fused"]}
        a = agree
        print(f"{dtype:9s} max|d| {a['max_abs']:.2e}  mean|d| {a['mean_abs']:.2e}  k3 KL {a['k3_kl']:.2e} "
              f"over {a['tokens']} tokens; sync {results[dtype]['sync_s']:.2f} s; start {start_s:.0f} s; "
              f"process boundary {1000 * results[dtype]['call_overhead_s']:.1f} ms a call; "
              f"tokens/s engine {med['engine']:.1f} vs fused {med['fused']:.1f} "
              f"({results[dtype]['engine_over_fused']:.2f}x)", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
