"""What the OpenAI-compatible endpoint costs per episode: the calculator task's episodes
(``recipes/calculator.yaml``: the embedded model warmed up with calculator calls, up to 4 turns,
40 tokens) sampled in process by ``EpisodeRollout``, against the same number of episodes driven
by clients over HTTP through ``reasonrl.policy.openai_server`` (one thread per episode, as an
environment framework runs them: ``/v1/completions`` with the calculator's stop string, the
environment's answer appended to the prompt text, the conversation's ids kept by the server).

Arms alternate, ``--repeats`` times each; the draws differ (the endpoint batches requests as
they arrive), so the comparison is time per episode and per model token, not the same tokens.

    .venv/bin/python benchmarks/endpoint_overhead.py [--prompts 16] [--repeats 3]

The last line is JSON: ``{"in_process_s_per_episode", "endpoint_s_per_episode", "ratio", ...}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import torch

from reasonrl.config import load_recipe
from reasonrl.envs.calculator import Calculator
from reasonrl.policy.factory import build_policy
from reasonrl.policy.openai_server import PolicyServer
from reasonrl.registry import TASKS
from reasonrl.rollout.episodes import EpisodeRollout

ROOT = Path(__file__).resolve().parents[1]


class Counting:
    """The policy, counting its ``sample_ids`` calls (batches) and the rows they sampled."""

    def __init__(self, policy):
        self.policy, self.tokenizer, self.calls, self.rows = policy, policy.tokenizer, 0, 0

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def sample_ids(self, ids, *args, **kwargs):
        self.calls += 1
        self.rows += len(ids)
        return self.policy.sample_ids(ids, *args, **kwargs)


def in_process(policy, recipe, problems, g, seed) -> tuple[float, int]:
    rollout = EpisodeRollout(policy, recipe)
    start = time.perf_counter()
    s = rollout.sample([p.prompt for p in problems], g, recipe.rollout.max_new_tokens, recipe.rollout.temperature,
                       torch.Generator().manual_seed(seed), problems=problems)
    return time.perf_counter() - start, int((s.completion_mask * s.loss_mask).sum())


def episode(url: str, problem, recipe, seed: int, tokens: list[int]) -> None:
    """One calculator episode over HTTP, with the environment in this thread."""
    env, ro = Calculator(), recipe.rollout
    env.reset(problem, seed)
    text, used = problem.prompt, 0
    for _ in range(ro.max_turns):
        budget = min(ro.max_new_tokens, ro.max_episode_tokens - used)
        if budget <= 0:
            return
        body = {"model": "reasonrl-policy", "prompt": text, "max_tokens": budget, "temperature": ro.temperature,
                "stop": list(Calculator.stop)}
        req = urllib.request.Request(url + "/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            choice = json.loads(r.read())["choices"][0]
        used += len(choice["token_ids"])
        tokens.append(len(choice["token_ids"]))
        action = choice["text"] + (choice["stop_reason"] or "")
        if choice["finish_reason"] != "stop" or not choice["stop_reason"]:
            return  # EOS or out of tokens: the episode ends (as in EpisodeRollout)
        step = env.step(action)
        if step.done:
            return
        text += action + step.observation
        used += len(step.observation)


def over_endpoint(policy, recipe, problems, g, seed, window) -> tuple[float, int]:
    tokens: list[int] = []
    with PolicyServer(policy, batch_window_s=window, generator=torch.Generator().manual_seed(seed)) as server:
        threads = [threading.Thread(target=episode, args=(server.base_url, p, recipe, seed + k, tokens))
                   for k, p in enumerate(p for p in problems for _ in range(g))]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start, sum(tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", type=float, default=0.02, help="the endpoint's batch_window_s")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    recipe = load_recipe(ROOT / "recipes" / "calculator.yaml")
    policy = Counting(build_policy(recipe.model, log=print))
    task = TASKS.get(recipe.task.name)(**recipe.task.params)
    problems = task.train_problems(0, args.prompts, 0)
    g = recipe.rollout.num_generations
    arms: dict[str, dict[str, list[float]]] = {"in_process": {}, "endpoint": {}}
    for rep in range(args.repeats + 1):  # the first round warms both up and is not counted
        for name, run in (("in_process", lambda: in_process(policy, recipe, problems, g, rep)),
                          ("endpoint", lambda: over_endpoint(policy, recipe, problems, g, rep, args.window))):
            policy.calls = policy.rows = 0
            seconds, tokens = run()
            if rep:
                for key, value in (("s", seconds), ("tokens", tokens), ("batches", policy.calls), ("rows", policy.rows)):
                    arms[name].setdefault(key, []).append(value)
            print(f"{name:10s} round {rep}: {seconds:.2f} s, {tokens} model tokens, {policy.calls} sampler calls "
                  f"({policy.rows} rows){'  (warm-up)' if not rep else ''}", flush=True)
    n = len(problems) * g
    med = {a: {k: statistics.median(v) for k, v in m.items()} for a, m in arms.items()}
    out = {"episodes": n, "repeats": args.repeats, "window_s": args.window,
           "in_process_s_per_episode": med["in_process"]["s"] / n, "endpoint_s_per_episode": med["endpoint"]["s"] / n,
           "ratio": med["endpoint"]["s"] / med["in_process"]["s"],
           "in_process_tokens": med["in_process"]["tokens"], "endpoint_tokens": med["endpoint"]["tokens"],
           "ratio_per_token": (med["endpoint"]["s"] / med["endpoint"]["tokens"]) / (med["in_process"]["s"] / med["in_process"]["tokens"]),
           "in_process_batches": med["in_process"]["batches"], "endpoint_batches": med["endpoint"]["batches"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
