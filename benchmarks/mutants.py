"""Hand-written mutation testing of the objective's wiring and the pure maths under it.

Each mutant in ``CATALOGUE`` is one exact snippet of ``src/`` replaced by a plausible bug
(a dropped term, a flipped sign, a mask or a total taken from the wrong place, a hook that
is never called). For each one the script copies the repository's ``src/`` into a temporary
folder (the working tree is never touched: other people edit and run it), applies the
replacement there, and runs the mutant's test files with ``PYTHONPATH=<copy>/src`` prepended
(a pytest plugin checks in every run that ``reasonrl`` really is imported from the copy).
A mutant is *killed* when a test fails, *survived* when they all pass, *stale* when its
snippet is not found exactly once (the code moved on: update the catalogue), *timeout*
when the tests run past ``--timeout``.

Before the mutants, a baseline run of every listed test file on an unmutated copy must
pass; otherwise a "kill" would mean nothing.

    .venv/bin/python benchmarks/mutants.py                 # the whole catalogue
    .venv/bin/python benchmarks/mutants.py --only k3_sign  # one mutant (repeatable)
    .venv/bin/python benchmarks/mutants.py -j 2 --list
    .venv/bin/python benchmarks/mutants.py --without tests/test_objective_wiring.py  # what the rest kills
    .venv/bin/python benchmarks/mutants.py --only kl_loss_removed --tests tests/test_pinned_runs.py

The last line is machine-readable: ``mutants_killed=<k> mutants_total=<n> kill_rate=<r>``
(stale mutants count in the total, not as killed). Exit status 1 when a mutant is stale,
2 when the baseline fails or a test run errors out without running a test.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEW = "tests/test_objective_wiring.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    original: str  # must occur exactly once in the file
    replacement: str
    description: str
    tests: tuple[str, ...]  # test files or node ids, run with -x


OBJ = "src/reasonrl/train/objective.py"
OPT = "src/reasonrl/train/optim.py"
TRN = "src/reasonrl/train/trainer.py"
COL = "src/reasonrl/rollout/collect.py"
LOSSES = "src/reasonrl/algos/losses.py"
ADV = "src/reasonrl/algos/advantages.py"
KL = "src/reasonrl/algos/kl.py"
MASKED = "src/reasonrl/algos/masked.py"
SEL = "src/reasonrl/algos/selection.py"

T_LOSSES = "tests/test_algos_losses.py"
T_ADV = "tests/test_algos_advantages.py"
T_KL = "tests/test_algos_kl.py"
T_SEL = "tests/test_algos_selection.py"
T_PIECES = "tests/test_trainer_pieces.py"
T_DYNAMIC = "tests/test_trainer.py::test_dynamic_sampling_drops_uninformative_groups"

CATALOGUE: tuple[Mutant, ...] = (
    # --- the objective (train/objective.py) ----------------------------------------------------
    Mutant("kl_loss_removed", OBJ,
           "            loss = loss + cfg.kl.coef * aggregate(kl, mask, **agg)",
           "            loss = loss",
           "the KL term is never added to the loss (kl.coef > 0, kl.in_reward: false)", (NEW,)),
    Mutant("kl_in_reward_also_in_loss", OBJ,
           "if not cfg.kl.in_reward and cfg.kl.coef > 0:",
           "if cfg.kl.coef > 0:",
           "KL in the reward is also added to the loss (counted twice)", (NEW,)),
    Mutant("entropy_sign_flipped", OBJ,
           "loss = loss - cfg.entropy_coef * aggregate(entropy, mask, **agg)",
           "loss = loss + cfg.entropy_coef * aggregate(entropy, mask, **agg)",
           "the entropy bonus becomes an entropy penalty", (NEW,)),
    Mutant("mask_truncated_ignored", OBJ,
           "    if cfg.mask_truncated:",
           "    if False:",
           "loss.mask_truncated has no effect", (NEW,)),
    Mutant("loss_on_completion_mask", OBJ,
           "mask = batch.response_mask.float()",
           "mask = batch.completion_mask.float()",
           "the loss trains on tokens the loss mask excludes (environment tokens)", (NEW,)),
    Mutant("stored_old_logprobs_ignored", OBJ,
           "old = micro.old_logprobs if micro.old_logprobs is not None else logp.detach()",
           "old = logp.detach()",
           "the loss always takes π_old = π_θ, ignoring the recomputed old log-probs", (NEW,)),
    Mutant("stats_tokens_count_padding", OBJ,
           'stats = {"tokens": float(mask.sum()),',
           'stats = {"tokens": float(mask.numel()),',
           "logged token means divide by every position, padding included", (NEW,)),
    Mutant("reduce_stats_loss_not_averaged", OBJ,
           'out = {"loss": sums.get("loss", 0.0) / max(optimizer_steps, 1)}',
           'out = {"loss": sums.get("loss", 0.0)}',
           "the logged loss is the sum over optimiser steps, not their mean", (NEW,)),
    # --- the loop (train/trainer.py) -------------------------------------------------------------
    Mutant("old_logprobs_not_recomputed", TRN,
           "if r.train.num_iterations > 1 or 0 < r.train.mini_batch_size < len(batch):",
           "if 0 < r.train.mini_batch_size < len(batch):",
           "π_old is not recomputed for num_iterations > 1 (the ratio stays 1, the clip never acts)", (NEW,)),
    Mutant("ref_logprobs_not_computed", TRN,
           "        if self.ref_policy is not None:\n            batch.ref_logprobs =",
           "        if False:\n            batch.ref_logprobs =",
           "the reference model's log-probs are never computed (no KL at all)", (NEW,)),
    Mutant("kl_in_reward_ignored", TRN,
           "if self.ref_policy is not None and r.loss.kl.in_reward:",
           "if False:",
           "kl.in_reward: true puts no KL in the reward", (NEW,)),
    Mutant("micro_batch_local_totals", TRN,
           "totals(mini, r.loss, r.rollout.max_new_tokens)",
           "totals(micro, r.loss, r.rollout.max_new_tokens)",
           "each micro-batch aggregates with its own token/sequence totals (the split changes the step)", (NEW,)),
    Mutant("advantages_on_completion_mask", TRN,
           "        mask = batch.response_mask\n        batch.token_rewards",
           "        mask = batch.completion_mask\n        batch.token_rewards",
           "advantages (and KL-in-reward) use completion_mask, not response_mask, under a loss mask", (NEW,)),
    Mutant("outcome_reward_on_completion_mask", TRN,
           "last_token_mask(batch.response_mask)",
           "last_token_mask(batch.completion_mask)",
           "the outcome reward sits on the last attended token even when the loss mask excludes it", (NEW,)),
    Mutant("policy_version_not_advanced", TRN,
           "self.state.policy_version += len(norms)",
           "self.state.policy_version += 0",
           "policy_version never advances (staleness cannot be bounded)", (NEW,)),
    Mutant("num_iterations_ignored", TRN,
           "passes=r.train.num_iterations,",
           "passes=1,",
           "one optimisation pass whatever train.num_iterations says", (NEW,)),
    Mutant("after_update_not_called", TRN,
           "                metrics.update(method.after_update(batch, step))",
           "                pass",
           "methods' after_update hook is never called", (NEW,)),
    # --- the optimisation loop (train/optim.py) ---------------------------------------------------
    Mutant("scheduler_never_stepped", OPT,
           "        self.scheduler.step()\n        return lr",
           "        return lr",
           "the LR schedule never advances (stuck at the first warm-up value)", (NEW, T_PIECES)),
    Mutant("warmup_off_by_one", OPT,
           "        return (step + 1) / warmup",
           "        return step / warmup",
           "warm-up starts at LR 0 (the first step learns nothing)", (T_PIECES, NEW)),
    Mutant("schedule_counts_warmup", OPT,
           "    return schedule(step - warmup, total - warmup)",
           "    return schedule(step, total)",
           "the decay after warm-up is computed over the whole run, not the steps after warm-up", (T_PIECES, NEW)),
    Mutant("grad_clip_removed", OPT,
           "norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.cfg.max_grad_norm)",
           'norm = torch.nn.utils.clip_grad_norm_(self.parameters, float("inf"))',
           "gradient clipping removed (the norm is still measured and logged)", (NEW,)),
    Mutant("zero_grad_removed", OPT,
           "                self.optimizer.zero_grad(set_to_none=True)",
           "                pass",
           "gradients accumulate across optimiser steps", (NEW,)),
    # --- rollout (rollout/collect.py) -------------------------------------------------------------
    Mutant("sampler_observe_not_called", COL,
           "        sampler.observe(problems, [rewards[i * g:(i + 1) * g] for i in range(len(problems))], step)",
           "        pass",
           "the prompt sampler never observes the rewards (curricula cannot learn)", (NEW,)),
    Mutant("dynamic_sampling_keeps_flat_groups", COL,
           "batch = batch.select(torch.nonzero(~flat).squeeze(-1))",
           "batch = batch.select(torch.nonzero(flat).squeeze(-1))",
           "dynamic sampling keeps the zero-variance groups and drops the informative ones", (T_DYNAMIC,)),
    # --- the pure maths (algos/) ------------------------------------------------------------------
    Mutant("ppo_clip_bounds_swapped", LOSSES,
           "return 1.0 - epsilon, 1.0 + eps_high",
           "return 1.0 - eps_high, 1.0 + epsilon",
           "clip-higher's widths swapped (ε_high on the low side)", (T_LOSSES, NEW)),
    Mutant("ppo_took_clip_inverted", LOSSES,
           "loss = torch.where(took_clip, clipped_branch, unclipped)",
           "loss = torch.where(took_clip, unclipped, clipped_branch)",
           "the pessimistic max becomes a min (the clip branch inverted)", (T_LOSSES, NEW)),
    Mutant("dual_clip_condition", LOSSES,
           "dual_active = (adv < 0) & (loss > bound)",
           "dual_active = (adv > 0) & (loss > bound)",
           "dual clip applied to positive advantages instead of negative ones", (T_LOSSES, NEW)),
    Mutant("gspo_sequence_ratio_not_detached", LOSSES,
           "masked_mean((logp - old).detach(), valid, dim=-1)",
           "masked_mean((logp - old), valid, dim=-1)",
           "GSPO's sequence ratio carries gradient (per-token gradient s_i(∇logp_t + mean ∇logp))", (T_LOSSES, NEW)),
    Mutant("token_mean_total_tokens_ignored", LOSSES,
           "n_tok = mask_count(valid).clamp_min(1.0) if total_tokens is None else float(total_tokens)",
           "n_tok = mask_count(valid).clamp_min(1.0)",
           "token-mean divides by the local token count even when given the mini-batch total", (T_LOSSES, NEW)),
    Mutant("seq_total_ignored", LOSSES,
           "n_seq = float(loss.shape[0]) if total_seqs is None else float(total_seqs)",
           "n_seq = float(loss.shape[0])",
           "sequence-mean modes divide by the local row count even when given the total", (T_LOSSES, NEW)),
    Mutant("grpo_std_eps_removed", ADV,
           "adv = centered / (std + eps)",
           "adv = centered / std",
           "GRPO divides by the group std without eps (0/0 on flat groups)", (T_ADV, NEW)),
    Mutant("grpo_group_mean_removed", ADV,
           "centered = scores - mean",
           "centered = scores",
           "GRPO does not subtract the group mean", (T_ADV, NEW)),
    Mutant("k3_sign", KL,
           "log_ratio = (as_float(ref_logprobs) - as_float(logprobs))",
           "log_ratio = (as_float(logprobs) - as_float(ref_logprobs))",
           "k3 estimates KL(π_ref ‖ π_θ) instead (log-ratio sign flipped)", (T_KL, NEW)),
    Mutant("masked_mean_denominator_off_by_one", MASKED,
           "return masked_sum(x, mask, dim) / mask_count(mask, dim).clamp_min(1.0)",
           "return masked_sum(x, mask, dim) / (mask_count(mask, dim) + 1.0)",
           "masked_mean divides by Σm + 1", (T_ADV, T_LOSSES, NEW)),
    Mutant("zero_variance_range_is_min_minus_min", SEL,
           'hi = hi.scatter_reduce(0, inverse, rewards, reduce="amax")',
           'hi = hi.scatter_reduce(0, inverse, rewards, reduce="amin")',
           "every group looks flat to dynamic sampling (max taken as min)", (T_SEL,)),
)


PROBE = '''
"""pytest plugin (-p _mutant_probe): refuse to run unless reasonrl comes from the mutated copy."""
import os

import pytest


def pytest_configure(config):
    import reasonrl

    root = os.path.realpath(os.environ["REASONRL_MUTANT_ROOT"])
    where = os.path.realpath(reasonrl.__file__)
    if not where.startswith(root + os.sep):
        raise pytest.UsageError(f"mutant probe: reasonrl imported from {where}, not from the copy {root}")
    out = os.environ.get("REASONRL_MUTANT_PROBE_OUT")
    if out:
        with open(out, "w") as fh:
            fh.write(where)
'''


@dataclass
class Result:
    name: str
    status: str  # killed | survived | stale | timeout | error
    seconds: float
    detail: str  # the first failing test, or why


def copy_src(dest: Path) -> Path:
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    (dest / "src" / "_mutant_probe.py").write_text(PROBE)
    return dest / "src"


def apply(mutant: Mutant, src_copy: Path) -> str | None:
    """Mutate the copy; returns None, or why the mutant is stale."""
    path = src_copy.parent / mutant.file
    if not path.is_file():
        return f"{mutant.file} does not exist"
    text = path.read_text()
    count = text.count(mutant.original)
    if count != 1:
        return f"snippet found {count} times in {mutant.file}: {mutant.original.strip()[:70]!r}"
    path.write_text(text.replace(mutant.original, mutant.replacement, 1))
    return None


def run_tests(src_copy: Path, tests: list[str], timeout: float, probe_out: Path | None = None) -> tuple[str, str, float]:
    """Run ``tests`` against ``src_copy``: (status, detail, seconds) with status passed/failed/timeout/error."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src_copy)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["REASONRL_MUTANT_ROOT"] = str(src_copy)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no bytecode of the mutated copy in the shared tree
    if probe_out is not None:
        env["REASONRL_MUTANT_PROBE_OUT"] = str(probe_out)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "_mutant_probe",
           "-o", "addopts=", "-rfE", *tests]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", f"over {timeout:.0f} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if proc.returncode == 0:
        return "passed", "", seconds
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M)
    if proc.returncode == 1 and failed:
        return "failed", failed[0], seconds
    tail = " | ".join(line for line in out.strip().splitlines()[-3:])
    return "error", f"pytest exit {proc.returncode}: {tail[:300]}", seconds


def run_mutant(mutant: Mutant, timeout: float, without: set[str]) -> Result:
    tests = [t for t in mutant.tests if t.split("::")[0] not in without]
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        src_copy = copy_src(Path(tmp))
        stale = apply(mutant, src_copy)
        if stale:
            return Result(mutant.name, "stale", 0.0, stale)
        if not tests:
            return Result(mutant.name, "survived", 0.0, "no test file left to run")
        status, detail, seconds = run_tests(src_copy, tests, timeout)
    if status == "failed":
        return Result(mutant.name, "killed", seconds, detail)
    if status == "passed":
        return Result(mutant.name, "survived", seconds, "all tests passed")
    if status == "error" and "exit 2" in detail and "error" in detail.lower():
        # A collection error (an import that fails under the mutant) also kills it; say so.
        return Result(mutant.name, "killed", seconds, "collection error: " + detail)
    return Result(mutant.name, status, seconds, detail)


def baseline(mutants: list[Mutant], timeout: float, without: set[str]) -> bool:
    tests = sorted({t for m in mutants for t in m.tests if t.split("::")[0] not in without})
    if not tests:
        return True
    with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as tmp:
        src_copy = copy_src(Path(tmp))
        probe_out = Path(tmp) / "probe.txt"
        status, detail, seconds = run_tests(src_copy, tests, timeout, probe_out)
        where = probe_out.read_text() if probe_out.exists() else "(probe did not run)"
    print(f"baseline (unmutated copy, {len(tests)} test targets): {status} in {seconds:.1f} s; "
          f"reasonrl imported from {where}", flush=True)
    if status != "passed":
        print(f"BASELINE FAILED: {detail}", file=sys.stderr)
        return False
    return True


def table(results: list[Result], by_name: dict[str, Mutant]) -> str:
    rows = [("mutant", "file", "status", "s", "killed by / detail")]
    for r in results:
        rows.append((r.name, by_name[r.name].file.removeprefix("src/reasonrl/"), r.status, f"{r.seconds:.1f}", r.detail))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    lines.insert(1, "-" * min(160, len(lines[0]) + 20))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="run only this mutant (repeatable)")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at a time (default 1)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's test run (default 300)")
    ap.add_argument("--without", action="append", default=[], metavar="FILE",
                    help="drop this test file from every mutant's list (to see what the others kill)")
    ap.add_argument("--tests", action="append", default=[], metavar="TARGET",
                    help="run every mutant against these test files or node ids instead of its own (repeatable)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the baseline run on an unmutated copy")
    ap.add_argument("--list", action="store_true", help="print the catalogue and exit")
    args = ap.parse_args()

    by_name = {m.name: m for m in CATALOGUE}
    assert len(by_name) == len(CATALOGUE), "duplicate mutant names"
    unknown = [n for n in args.only if n not in by_name]
    if unknown:
        ap.error(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    mutants = [by_name[n] for n in args.only] if args.only else list(CATALOGUE)
    if args.tests:
        mutants = [replace(m, tests=tuple(args.tests)) for m in mutants]
    if args.list:
        for m in mutants:
            print(f"{m.name:38s} {m.file.removeprefix('src/reasonrl/'):22s} {m.description}  [{', '.join(m.tests)}]")
        return 0
    without = set(args.without)

    started = time.perf_counter()
    if not args.no_baseline and not baseline(mutants, args.timeout * 2, without):
        return 2

    def one(m: Mutant) -> Result:
        r = run_mutant(m, args.timeout, without)
        print(f"  {r.name}: {r.status} ({r.seconds:.1f} s) {r.detail}", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one, mutants))

    print()
    print(table(results, by_name))
    killed = sum(r.status == "killed" for r in results)
    stale = [r.name for r in results if r.status == "stale"]
    errors = [r.name for r in results if r.status == "error"]
    survivors = [r.name for r in results if r.status in ("survived", "timeout")]
    print(f"\nsurvived: {', '.join(survivors) or 'none'}; wall {time.perf_counter() - started:.0f} s")
    if stale:
        print(f"STALE MUTANTS (their snippet no longer matches the code; update the catalogue): {', '.join(stale)}",
              file=sys.stderr)
    if errors:
        print(f"ERRORS (the test run failed without a failing test): {', '.join(errors)}", file=sys.stderr)
    n = len(results)
    print(f"mutants_killed={killed} mutants_total={n} kill_rate={killed / n if n else 0.0:.3f}")
    return 1 if stale else (2 if errors else 0)


if __name__ == "__main__":
    sys.exit(main())
