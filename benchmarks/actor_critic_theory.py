"""On-policy actor-critic against offline reward modelling on a hierarchical reward (a simulation).

Formalised from the theory paper's abstract (on-policy actor-critic with a transformer critic on
hierarchical rewards; paper not located, no code): the claim is that alternating (i) sampling from the current KL-regularised policy,
(ii) fitting a transformer critic to the observed rewards, (iii) setting the policy against the
critic, drives the regret down polynomially in the query budget n, while sampling only from the
reference policy (offline reward modelling) can be limited to a logarithmic rate.

Everything except the critic is exact, by enumeration of the whole response space:

* responses y in V^L (defaults L = 6, |V| = 4: 4096 sequences);
* hierarchical reward r(y) = sum_l w_l prod_{j<=l} 1[y_j = y*_j], w_l = decay^-l (decay 2;
  ``--weights flat``: w_l = 1/L), y* drawn per seed; optional Gaussian noise on the *observed* rewards (``--noise``, default 0);
* pi_ref uniform over V^L, so matching the first l tokens of y* has probability |V|^-l;
* pi*_beta ∝ pi_ref exp(r/beta); J_beta(pi) = E_pi[r] - beta KL(pi || pi_ref);
  regret(pi) = J_beta(pi*_beta) - J_beta(pi), which equals beta KL(pi || pi*_beta) (the form
  computed, in float64 log space, for accuracy at small regrets).

The critic r_hat is a ``transformers.LlamaModel`` (the architecture of the library's embedded tiny
model, 2 layers, ``--hidden`` wide) reading [BOS, y_1..y_L], with a linear head on the last
position, fitted by minibatch MSE with Adam. Policies are set exactly: pi ∝ pi_ref exp(r_hat/beta)
over the enumeration.

* On-policy arm: K rounds; round k samples n/K responses from pi_k (pi_1 = pi_ref), refits r_hat on
  all data so far (warm-started from the previous round's critic and optimiser: ``--first-steps``
  Adam steps in round 1, ``--round-steps`` in each later round), and sets pi_{k+1} from r_hat.
  The regret is that of pi_{K+1}.
* Offline arm: all n responses from pi_ref, one fit with the same total number of Adam steps
  (``first + (K-1) * round``), pi ∝ pi_ref exp(r_hat/beta). Its data and critic do not depend on
  beta, so one fit per (n, seed) serves every beta.

Deterministic given the seeds (single-threaded CPU). Outputs in ``--out``: ``actor_critic_theory.json``
(every (arm, beta, n, seed, regret) and the slopes) and ``actor_critic_theory.png`` / ``.svg``
(regret against n, log-log, mean ± sd over seeds, one panel per beta). The fitted slope is the
least-squares slope of log regret on log n over every (n, seed) point of an arm and beta.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/actor_critic_theory.py --out docs/reports
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/actor_critic_theory.py --quick --out /tmp/act

The last stdout line is machine-readable:
``theory slope_onpolicy_b<beta>=<x> slope_offline_b<beta>=<y> ...`` for every beta.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaModel

ARMS = ("onpolicy", "offline")

# ---------------------------------------------------------------------------------------------
# The exact part: response space, reward, policies, objective, regret.
# ---------------------------------------------------------------------------------------------


def enumerate_space(length: int, vocab: int) -> torch.Tensor:
    """All of V^L as a (vocab**length, length) long tensor, in lexicographic order."""
    return torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.long)


def level_weights(length: int, decay: float = 2.0, kind: str = "geometric") -> torch.Tensor:
    """w_l for l = 1..L (float64): ``geometric`` decay^-l (the spec's default, decay 2), or ``flat`` 1/L
    each (no decay: the deep components matter as much as the shallow ones)."""
    if kind == "flat":
        return torch.full((length,), 1.0 / length, dtype=torch.float64)
    return torch.tensor([decay ** -(level + 1) for level in range(length)], dtype=torch.float64)


def hierarchical_reward(space: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """r(y) = sum_l w_l prod_{j<=l} 1[y_j = y*_j]: component l pays only once 1..l-1 are resolved."""
    matched_prefix = torch.cumprod((space == target.view(1, -1)).to(torch.float64), dim=1)
    return matched_prefix @ weights


def uniform_log_ref(size: int) -> torch.Tensor:
    return torch.full((size,), -math.log(size), dtype=torch.float64)


def tilted_log_policy(log_ref: torch.Tensor, reward: torch.Tensor, beta: float) -> torch.Tensor:
    """log of pi ∝ pi_ref exp(reward / beta), normalised over the enumeration (float64)."""
    logits = log_ref + reward.to(torch.float64) / beta
    return logits - torch.logsumexp(logits, dim=0)


def objective(log_pi: torch.Tensor, log_ref: torch.Tensor, reward: torch.Tensor, beta: float) -> float:
    """J_beta(pi) = E_pi[r] - beta KL(pi || pi_ref)."""
    p = log_pi.exp()
    return float((p * reward).sum() - beta * (p * (log_pi - log_ref)).sum())


def optimal_objective(log_ref: torch.Tensor, reward: torch.Tensor, beta: float) -> float:
    """J_beta(pi*_beta) = beta log E_ref exp(r / beta)."""
    return float(beta * torch.logsumexp(log_ref + reward / beta, dim=0))


def regret(log_pi: torch.Tensor, log_ref: torch.Tensor, reward: torch.Tensor, beta: float) -> float:
    """J_beta(pi*_beta) - J_beta(pi), computed as its identity beta KL(pi || pi*_beta) (no cancellation)."""
    log_opt = tilted_log_policy(log_ref, reward, beta)
    p = log_pi.exp()
    return float(beta * (p * (log_pi - log_opt)).sum())


# ---------------------------------------------------------------------------------------------
# The critic: a tiny Llama with a scalar head.
# ---------------------------------------------------------------------------------------------


class Critic(torch.nn.Module):
    """``LlamaModel`` over [BOS, y_1..y_L] (BOS = token id |V|) and a linear head on the last position."""

    def __init__(self, vocab: int, length: int, hidden: int, layers: int, heads: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=vocab + 1, hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
            max_position_embeddings=length + 1, tie_word_embeddings=False,
            pad_token_id=None, bos_token_id=vocab, eos_token_id=None,
        )
        self.bos = vocab
        self.body = LlamaModel(config)
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        ids = torch.cat([torch.full((y.shape[0], 1), self.bos, dtype=torch.long), y], dim=1)
        return self.head(self.body(input_ids=ids).last_hidden_state[:, -1]).squeeze(-1)


class CriticFitter:
    """A critic and its Adam state; ``fit`` continues training (warm start) on the data given."""

    def __init__(self, args, seed: int):
        self.critic = Critic(args.vocab, args.length, args.hidden, args.layers, args.heads, seed)
        self.opt = torch.optim.Adam(self.critic.parameters(), lr=args.lr)
        self.batch = args.batch
        self.gen = torch.Generator().manual_seed(seed + 7919)

    def fit(self, ys: torch.Tensor, rs: torch.Tensor, steps: int) -> float:
        """``steps`` Adam steps of MSE on minibatches drawn uniformly (with replacement) from the data."""
        self.critic.train()
        targets = rs.to(torch.float32)
        loss = torch.tensor(float("nan"))
        for _ in range(steps):
            idx = torch.randint(0, ys.shape[0], (min(self.batch, ys.shape[0]),), generator=self.gen)
            loss = ((self.critic(ys[idx]) - targets[idx]) ** 2).mean()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        return float(loss.detach())

    @torch.no_grad()
    def predict(self, space: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
        self.critic.eval()
        return torch.cat([self.critic(space[i:i + chunk]) for i in range(0, space.shape[0], chunk)]).to(torch.float64)


# ---------------------------------------------------------------------------------------------
# The two arms.
# ---------------------------------------------------------------------------------------------


class Problem:
    """One seed's instance: the space, y*, the true reward and pi_ref."""

    def __init__(self, args, seed: int):
        self.space = enumerate_space(args.length, args.vocab)
        g = torch.Generator().manual_seed(10_000 + seed)
        self.target = torch.randint(0, args.vocab, (args.length,), generator=g)
        self.reward = hierarchical_reward(self.space, self.target, level_weights(args.length, args.decay, args.weights))
        self.log_ref = uniform_log_ref(self.space.shape[0])
        self.noise = args.noise

    def query(self, log_pi: torch.Tensor, count: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` responses drawn from pi (exact categorical over the enumeration) and their observed rewards."""
        idx = torch.multinomial(log_pi.exp(), count, replacement=True, generator=gen)
        observed = self.reward[idx].clone()
        if self.noise > 0:
            observed += self.noise * torch.randn(count, generator=gen, dtype=torch.float64)
        return self.space[idx], observed


def cell_seed(*parts) -> int:
    h = 0
    for p in parts:
        h = (h * 1_000_003 + int(round(float(p) * 1000))) % (2 ** 31 - 1)
    return h


def run_onpolicy(prob: Problem, args, n: int, beta: float, seed: int) -> dict:
    gen = torch.Generator().manual_seed(cell_seed(1, n, beta, seed))
    fitter = CriticFitter(args, seed)
    per_round = [n // args.rounds + (1 if k < n % args.rounds else 0) for k in range(args.rounds)]
    log_pi, ys, rs, round_regrets = prob.log_ref, [], [], []
    for k, count in enumerate(per_round):
        y, r = prob.query(log_pi, count, gen)
        ys.append(y)
        rs.append(r)
        loss = fitter.fit(torch.cat(ys), torch.cat(rs), args.first_steps if k == 0 else args.round_steps)
        log_pi = tilted_log_policy(prob.log_ref, fitter.predict(prob.space), beta)
        round_regrets.append(regret(log_pi, prob.log_ref, prob.reward, beta))
    return {"regret": round_regrets[-1], "round_regrets": round_regrets, "final_loss": loss,
            "unique_queries": int(torch.unique(torch.cat(ys), dim=0).shape[0])}


def run_offline(prob: Problem, args, n: int, betas: list[float], seed: int) -> dict[float, dict]:
    gen = torch.Generator().manual_seed(cell_seed(2, n, seed))
    fitter = CriticFitter(args, seed)
    ys, rs = prob.query(prob.log_ref, n, gen)
    loss = fitter.fit(ys, rs, args.first_steps + (args.rounds - 1) * args.round_steps)
    r_hat = fitter.predict(prob.space)
    unique = int(torch.unique(ys, dim=0).shape[0])
    return {b: {"regret": regret(tilted_log_policy(prob.log_ref, r_hat, b), prob.log_ref, prob.reward, b),
                "final_loss": loss, "unique_queries": unique} for b in betas}


def coverage_heuristic(args, betas: list[float], ns: list[int], seed: int = 0) -> dict[str, list[float]]:
    """A reference curve, not an arm: the regret of pi ∝ pi_ref exp(r_m / beta), r_m the true reward
    truncated after depth m = floor(log_|V| n), the deepest level that n draws from the uniform pi_ref
    are expected to reach at least once. An offline learner that recovers every level its data covers,
    and nothing deeper, sits on this curve (y* does not matter: the space is symmetric)."""
    prob = Problem(args, seed)
    full = prob.reward
    out = {}
    for b in betas:
        vals = []
        for n in ns:
            depth = min(args.length, int(math.floor(math.log(n) / math.log(args.vocab) + 1e-9)))
            w = level_weights(args.length, args.decay, args.weights)
            w[depth:] = 0
            truncated = hierarchical_reward(prob.space, prob.target, w)
            vals.append(regret(tilted_log_policy(prob.log_ref, truncated, b), prob.log_ref, full, b))
        out[f"{b:g}"] = vals
    return out


def fitted_slope(ns: list[int], regrets: list[float]) -> float:
    """Least-squares slope of log regret on log n."""
    xs = [math.log(n) for n in ns]
    ys = [math.log(max(r, 1e-300)) for r in regrets]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return float("nan") if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def slopes(rows: list[dict], betas: list[float]) -> dict[str, float]:
    out = {}
    for b in betas:
        for arm in ARMS:
            sel = [r for r in rows if r["arm"] == arm and r["beta"] == b]
            out[f"slope_{arm}_b{b:g}"] = fitted_slope([r["n"] for r in sel], [r["regret"] for r in sel])
    return out


def plot(rows: list[dict], betas: list[float], path: Path, heuristic: dict[str, list[float]] | None = None,
         ns: list[int] | None = None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(betas), figsize=(4.2 * len(betas), 3.6), squeeze=False, sharey=True)
    styles = {"onpolicy": ("C0", "o", "on-policy actor-critic"), "offline": ("C3", "s", "offline (pi_ref data)")}
    for ax, b in zip(axes[0], betas):
        for arm in ARMS:
            color, marker, label = styles[arm]
            ns = sorted({r["n"] for r in rows if r["arm"] == arm and r["beta"] == b})
            means, lo, hi = [], [], []
            for n in ns:
                vals = [r["regret"] for r in rows if r["arm"] == arm and r["beta"] == b and r["n"] == n]
                m = sum(vals) / len(vals)
                sd = (sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
                means.append(m)
                lo.append(max(m - sd, m * 1e-2))
                hi.append(m + sd)
            ax.plot(ns, means, marker=marker, color=color, label=label)
            ax.fill_between(ns, lo, hi, color=color, alpha=0.2)
        if heuristic is not None and ns is not None:
            ax.plot(ns, heuristic[f"{b:g}"], ls=":", color="0.4", label="coverage heuristic (exact r to depth log_|V| n)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"beta = {b:g}")
        ax.set_xlabel("query budget n")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("regret  J(pi*) - J(pi)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Regret vs n (mean ± sd over seeds)", fontsize=10)
    fig.tight_layout()
    written = []
    for ext in ("png", "svg"):
        out = path.with_suffix("." + ext)
        fig.savefig(out, dpi=120)
        written.append(str(out))
    plt.close(fig)
    return written


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("docs/reports"))
    p.add_argument("--quick", action="store_true", help="a tiny grid that runs end to end in seconds")
    p.add_argument("--length", type=int, default=6, help="L")
    p.add_argument("--vocab", type=int, default=4, help="|V|")
    p.add_argument("--decay", type=float, default=2.0, help="w_l = decay^-l")
    p.add_argument("--weights", choices=["geometric", "flat"], default="geometric",
                   help="w_l = decay^-l (geometric) or 1/L each (flat)")
    p.add_argument("--tag", default="", help="suffix of the output file names")
    p.add_argument("--noise", type=float, default=0.0, help="sd of Gaussian noise on observed rewards")
    p.add_argument("--log2-ns", type=int, nargs="+", default=list(range(6, 14)), help="n = 2^k for each k")
    p.add_argument("--betas", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=8, help="K")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--first-steps", type=int, default=60, help="Adam steps of the first fit")
    p.add_argument("--round-steps", type=int, default=30, help="Adam steps of each later (warm-started) fit")
    args = p.parse_args(argv)
    if args.quick:
        args.length, args.vocab, args.log2_ns, args.betas, args.seeds = 4, 3, [5, 7], [0.1], [0]
        args.rounds, args.hidden, args.first_steps, args.round_steps = 4, 16, 20, 10
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    ns = [2 ** k for k in args.log2_ns]
    rows: list[dict] = []
    start, cpu_start = time.time(), time.process_time()
    for seed in args.seeds:
        prob = Problem(args, seed)
        for n in ns:
            t = time.time()
            for b, res in run_offline(prob, args, n, args.betas, seed).items():
                rows.append({"arm": "offline", "beta": b, "n": n, "seed": seed, **res})
                print(f"[{time.time() - start:7.1f}s] offline  seed={seed} n={n:5d} beta={b:g} "
                      f"regret={res['regret']:.3e} unique={res['unique_queries']} ({time.time() - t:.1f}s)", flush=True)
            for b in args.betas:
                t = time.time()
                res = run_onpolicy(prob, args, n, b, seed)
                rows.append({"arm": "onpolicy", "beta": b, "n": n, "seed": seed, **res})
                print(f"[{time.time() - start:7.1f}s] onpolicy seed={seed} n={n:5d} beta={b:g} "
                      f"regret={res['regret']:.3e} unique={res['unique_queries']} ({time.time() - t:.1f}s)", flush=True)
    fit = slopes(rows, args.betas)
    heuristic = coverage_heuristic(args, args.betas, ns)
    heuristic_slopes = {}  # over the n where the heuristic is not exactly 0 (depth < L)
    for b in args.betas:
        pos = [(n, v) for n, v in zip(ns, heuristic[f"{b:g}"]) if v > 0]
        heuristic_slopes[f"slope_heuristic_b{b:g}"] = (fitted_slope([n for n, _ in pos], [v for _, v in pos])
                                                       if len(pos) >= 2 else None)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {"config": config, "reference_policy": "uniform", "regret_definition": "J(pi*) - J(pi) = beta KL(pi||pi*)",
              "slopes": fit, "coverage_heuristic": {"n": ns, "regret": heuristic, "slopes": heuristic_slopes},
              "targets": {str(s): Problem(args, s).target.tolist() for s in args.seeds},
              "runtime_s": time.time() - start, "cpu_s": time.process_time() - cpu_start, "rows": rows}
    name = "actor_critic_theory" + ("_quick" if args.quick else "") + (f"_{args.tag}" if args.tag else "")
    json_path = args.out / f"{name}.json"
    json_path.write_text(json.dumps(result, indent=1))
    written = plot(rows, args.betas, args.out / name, heuristic, ns)
    print(f"wrote {json_path} and {', '.join(written)} in {time.time() - start:.0f}s", flush=True)
    print("fitted log-log slopes (log regret on log n):")
    for b in args.betas:
        print(f"  beta={b:g}: on-policy {fit[f'slope_onpolicy_b{b:g}']:+.3f}   offline {fit[f'slope_offline_b{b:g}']:+.3f}"
              f"   (coverage heuristic {heuristic_slopes[f'slope_heuristic_b{b:g}'] or float('nan'):+.3f})")
    print("theory " + " ".join(f"{k}={v:.4f}" for k, v in fit.items()), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
