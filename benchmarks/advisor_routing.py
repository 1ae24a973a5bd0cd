"""Problem-level routing baselines for the advisor method (docs/methods/advisor.md).

On the held-out problems of the advisor recipe's task, each baseline gives (accuracy, advisor
calls per problem), and its stage-1 reward accuracy − cost × calls:

- never call: the student alone (greedy, the query mark ``{`` banned);
- always call: the advisor answers every whole problem (its value, as the environment gives it);
- oracle routing: call exactly on the problems the student gets wrong alone and the advisor
  gets right, when the cost is below 1 (the best problem-level router at that cost);
- learned routing: logistic regression (numpy) on cheap prompt features and the student's own
  confidence (mean log-prob of its lone greedy answer), fit on training problems, its threshold
  chosen there for the best reward at the recipe's cost; then applied to the held-out set;
- the student in the environment (greedy episodes, asking when it likes), as warmed up, and
  the trained policy of ``--run DIR`` (its ``final_model`` with its ``recipe.json``).

    .venv/bin/python benchmarks/advisor_routing.py [--recipe recipes/advisor.yaml] [--run RUN ...]
        [--cost C ...] [--size 200] [--train-size 400] [--json routing.json] [--set key=value ...] [--mini]

Routers are chosen and scored at each ``--cost`` (default the recipe's ``env.cost``); each
``--run`` is scored at the cost its own recipe trained with.

The first run builds the recipe's student and advisor models (cached afterwards; a few minutes
on 2 cores). ``--mini`` swaps both for the tests' mini models: a smoke run in seconds, numbers
meaningless.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

import reasonrl.envs  # noqa: F401  (registers the advisor env, its task and its advisors)
from reasonrl.config import load_recipe, recipe_from_dict
from reasonrl.methods.advisor import ASK_OPEN, advice_value, get_advisor
from reasonrl.policy.hf import position_ids_from_mask
from reasonrl.rewards.basic import exact_answer
from reasonrl.rollout.episodes import EpisodeRollout, sample_problems
from reasonrl.tasks.base import build_task

ROOT = Path(__file__).resolve().parents[1]
MINI = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "warmup_steps": 30,
        "warmup_batch": 16}


# -- the student alone, and the advisor alone ---------------------------------------------------

@torch.no_grad()
def solve_alone(policy, problems, max_new_tokens: int, banned: str = ASK_OPEN, batch_size: int = 256):
    """The student's greedy answers with the characters of ``banned`` never chosen (no query),
    and its confidence: the mean log-prob of the tokens it chose. (Plain forward passes, no
    cache: for the embedded models' short problems.)"""
    tok, model = policy.tokenizer, policy.model
    was = model.training
    model.eval()
    unk = tok.unk_token_id
    ban = [i for i in (tok.convert_tokens_to_ids(c) for c in banned) if i is not None and i != unk]
    texts, confidence = [], []
    try:
        for start in range(0, len(problems), batch_size):
            chunk = problems[start:start + batch_size]
            ids, mask = policy.encode_prompts([p.prompt for p in chunk])
            n = len(chunk)
            chosen, logps = [[] for _ in range(n)], [[] for _ in range(n)]
            done = torch.zeros(n, dtype=torch.bool)
            for _ in range(max_new_tokens):
                logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
                lp = torch.log_softmax(logits[:, -1].float(), -1)
                lp[:, ban] = -math.inf
                nxt = lp.argmax(-1)
                for i in range(n):
                    if not done[i]:
                        chosen[i].append(int(nxt[i]))
                        logps[i].append(float(lp[i, nxt[i]]))
                        done[i] = int(nxt[i]) == tok.eos_token_id
                if bool(done.all()):
                    break
                ids = torch.cat([ids, nxt[:, None]], 1)
                mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype)], 1)
            texts += [tok.decode(c, skip_special_tokens=True) for c in chosen]
            confidence += [sum(lp) / len(lp) for lp in logps]
    finally:
        model.train(was)
    return texts, confidence


def advisor_alone(advisor, problems) -> list[bool]:
    """Whether the advisor's value for each whole problem (its ``meta["expr"]``) is the answer."""
    replies = advisor.answer_batch([p.meta["expr"] for p in problems], problems)
    return [advice_value(r) == p.answer for r, p in zip(replies, problems)]


# -- routers -------------------------------------------------------------------------------------

def route_point(alone_ok, advisor_ok, route) -> tuple[float, float]:
    """(accuracy, calls per problem) when the problems where ``route`` is true go to the advisor."""
    alone_ok, advisor_ok, route = (np.asarray(x, dtype=bool) for x in (alone_ok, advisor_ok, route))
    correct = np.where(route, advisor_ok, alone_ok)
    return float(correct.mean()), float(route.mean())


def features(problems, confidence) -> np.ndarray:
    """Cheap per-problem features a router sees before anyone answers: the form (one-hot), the
    largest and smallest operand (log), the expression's length, and the student's confidence."""
    forms = sorted({p.meta["form"] for p in problems} | {"a+b*c", "c*b+a", "(a+b)*c", "c*(a+b)"})
    rows = []
    for p, conf in zip(problems, confidence):
        numbers = [int(x) for x in "".join(ch if ch.isdigit() else " " for ch in p.meta["expr"]).split()]
        rows.append([float(p.meta["form"] == f) for f in forms]
                    + [math.log1p(max(numbers)), math.log1p(min(numbers)), float(len(p.meta["expr"])), conf])
    return np.asarray(rows, dtype=np.float64)


class LogisticRouter:
    """p(the student is wrong alone | features) by L2-regularised logistic regression (gradient
    descent on standardised features, numpy only); route when p ≥ ``threshold``."""

    def __init__(self, l2: float = 1e-2, steps: int = 2000, lr: float = 0.5) -> None:
        self.l2, self.steps, self.lr, self.threshold = l2, steps, lr, 0.5

    def fit(self, x: np.ndarray, y: np.ndarray) -> "LogisticRouter":
        self.mean, self.std = x.mean(0), x.std(0) + 1e-8
        z = np.c_[np.ones(len(x)), (x - self.mean) / self.std]
        self.w = np.zeros(z.shape[1])
        for _ in range(self.steps):
            p = 1 / (1 + np.exp(-z @ self.w))
            grad = z.T @ (p - y) / len(y) + self.l2 * np.r_[0.0, self.w[1:]]
            self.w -= self.lr * grad
        return self

    def prob(self, x: np.ndarray) -> np.ndarray:
        z = np.c_[np.ones(len(x)), (x - self.mean) / self.std]
        return 1 / (1 + np.exp(-z @ self.w))

    def choose_threshold(self, x, alone_ok, advisor_ok, cost: float) -> float:
        """The threshold with the best accuracy − cost × calls on (x, outcomes); fewer calls on ties."""
        p = self.prob(x)
        best = None
        for t in sorted(set(p.tolist()) | {1.01}, reverse=True):
            acc, calls = route_point(alone_ok, advisor_ok, p >= t)
            if best is None or acc - cost * calls > best[0] + 1e-12:
                best = (acc - cost * calls, t)
        self.threshold = best[1]
        return self.threshold


# -- the student in the environment --------------------------------------------------------------

def episode_point(policy, recipe, problems, batch_size: int = 256) -> tuple[float, float, float]:
    """(accuracy, calls per problem, over-budget queries per problem) of greedy episodes of
    ``policy`` in ``recipe``'s advisor environment."""
    sampler = EpisodeRollout(policy, recipe)
    correct, calls, over = [], 0.0, 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        out = sample_problems(sampler, chunk, 1, recipe.rollout.max_new_tokens, 0.0, stop=recipe.rollout.stop or None)
        correct += [exact_answer(t, p) == 1.0 for t, p in zip(out.texts, chunk)]
        m = sampler.metrics()
        calls += m.get("episode/calls", 0.0) * len(chunk)
        over += m.get("episode/over_budget", 0.0) * len(chunk)
    n = max(len(problems), 1)
    return sum(correct) / n, calls / n, over / n


def load_student(recipe):
    from reasonrl.policy.factory import build_policy

    return build_policy(recipe.model, trainable=False)


def run(recipe, size: int, train_size: int, run_dirs: list[str] = (), costs: list[float] | None = None,
        log=print) -> dict:
    """The table: one row per (policy, cost). Routers are chosen and scored at each of ``costs``
    (default: the recipe's ``env.cost``); a trained run is scored at its own recipe's cost."""
    env = recipe.env
    if env is None or env.name != "advisor":
        raise SystemExit(f"the recipe's env must be the advisor environment, got {env}")
    costs = list(costs) if costs else [float(env.params.get("cost", 0.1))]
    task = build_task(recipe)
    held_out, train = task.eval_problems(size), task.train_problems(0, train_size, recipe.train.seed + 7919)
    advisor = get_advisor(env.params.get("advisor", "tiny"), env.params.get("advisor_params", {}))
    student = load_student(recipe)
    budget = recipe.rollout.max_new_tokens
    log(f"student alone on {len(train)} training and {len(held_out)} held-out problems ...")
    tr_texts, tr_conf = solve_alone(student, train, budget)
    ho_texts, ho_conf = solve_alone(student, held_out, budget)
    tr_alone = np.array([exact_answer(t, p) == 1.0 for t, p in zip(tr_texts, train)])
    ho_alone = np.array([exact_answer(t, p) == 1.0 for t, p in zip(ho_texts, held_out)])
    log("the advisor on every whole problem ...")
    tr_adv, ho_adv = np.array(advisor_alone(advisor, train)), np.array(advisor_alone(advisor, held_out))
    router = LogisticRouter().fit(features(train, tr_conf), (~tr_alone).astype(float))
    rows = []

    def add(policy, cost, point, over=None):
        acc, calls = point
        rows.append({"policy": policy, "cost": cost, "accuracy": acc, "calls": calls, "reward": acc - cost * calls,
                     **({"over_budget": over} if over is not None else {})})

    log("the student in the advisor environment (greedy episodes) ...")
    untrained = episode_point(student, recipe, held_out)
    thresholds = {}
    for cost in costs:
        add("never call (student alone)", cost, route_point(ho_alone, ho_adv, np.zeros(len(held_out), bool)))
        add("always call (advisor answers)", cost, route_point(ho_alone, ho_adv, np.ones(len(held_out), bool)))
        # The best any problem-level router can do: call exactly where the student alone is wrong
        # and the advisor is right, as long as a right answer is worth the call (cost < 1).
        add("oracle routing", cost, route_point(ho_alone, ho_adv, ~ho_alone & ho_adv & (cost < 1)))
        thresholds[cost] = router.choose_threshold(features(train, tr_conf), tr_alone, tr_adv, cost)
        add("learned routing (logistic)", cost,
            route_point(ho_alone, ho_adv, router.prob(features(held_out, ho_conf)) >= thresholds[cost]))
        add("student + advisor env (warm-up, untrained)", cost, untrained[:2], untrained[2])
    for run_dir in run_dirs:
        from reasonrl.policy.loading import load_hf_policy

        run_recipe = recipe_from_dict(json.loads((Path(run_dir) / "recipe.json").read_text()), f"{run_dir}/recipe.json")
        log(f"the trained policy of {run_dir} (greedy episodes) ...")
        acc, calls, over = episode_point(load_hf_policy(Path(run_dir) / "final_model"), run_recipe, held_out)
        add(f"trained policy ({run_dir})", float(run_recipe.env.params.get("cost", 0.1)), (acc, calls), over)
    return {"costs": costs, "held_out": len(held_out), "train": len(train),
            "advisor_accuracy": float(ho_adv.mean()), "student_accuracy": float(ho_alone.mean()),
            "router": {"thresholds": {str(c): t for c, t in thresholds.items()}, "weights": router.w.tolist()},
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "advisor.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override")
    ap.add_argument("--run", action="append", default=[],
                    help="a run folder of the recipe: its trained policy's point (repeatable)")
    ap.add_argument("--cost", action="append", type=float, default=[],
                    help="a per-call cost to choose and score the routers at (repeatable; default the recipe's)")
    ap.add_argument("--size", type=int, default=200, help="held-out problems")
    ap.add_argument("--train-size", type=int, default=400, help="training problems the learned router is fit on")
    ap.add_argument("--json", default=None, help="write the table here")
    ap.add_argument("--mini", action="store_true", help="the tests' mini student and advisor (a smoke run)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = list(args.set)
    if args.mini:
        overrides = [f"model.tiny.{k}={v}" for k, v in MINI.items()] + overrides
        if load_recipe(args.recipe).env.params.get("advisor", "tiny") == "tiny":
            overrides = [f"env.advisor_params.tiny.{k}={v}" for k, v in MINI.items()] + overrides
    recipe = load_recipe(args.recipe, overrides)
    result = run(recipe, args.size, args.train_size, args.run, args.cost,
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    width = max(len(r["policy"]) for r in result["rows"])
    print(f"{'held-out ' + str(result['held_out']):<{width}}  cost  accuracy  calls/problem  reward")
    for row in result["rows"]:
        print(f"{row['policy']:<{width}}  {row['cost']:4g}  {row['accuracy']:8.3f}  {row['calls']:13.3f}  "
              f"{row['reward']:6.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
