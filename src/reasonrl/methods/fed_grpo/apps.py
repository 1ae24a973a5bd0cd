"""Flower's ServerApp and ClientApp for Fed-GRPO, the simulation, and the deployment apps.

- ``simulate(recipe, out)``: Flower's Simulation Runtime (``flwr.simulation.run_simulation``)
  on this machine: the ServerApp in this process, the C ClientApps on Ray (which Flower starts
  and shuts down). One Ray actor gets every core, so clients train one after another with all
  the cores torch can use, and each client's Trainer stays built between rounds.
- ``server_app`` / ``client_app`` (module level): the same apps for Flower's deployment runtime
  (``reasonrl fed-server`` / ``fed-client``, ``reasonrl.methods.fed_grpo.deploy``): they read the recipe (as
  JSON) and the output folder from the run config, and the client's index and state folder from
  its node config (``partition-id``, Flower's convention, and ``state-dir``).

A ClientApp answers two messages a round: ``train`` (``client_train``: the local steps; replies
with the round's scalars) and ``query`` (``client_send``: the update at the budget the server
allocated; replies with the sparse update).

The server's output folder holds ``recipe.json``, ``metrics.jsonl`` (one row per round, step =
round, round 0 the initial model: the global model's held-out ``eval/*``, S_c, w_c, budgets, R̄,
bytes), ``final_model/``, ``summary.json`` (the keys a training run's summary has —
``final_eval`` is the global model's held-out evaluation after the last round, with its
intervals and per-problem values, ``base_eval`` round 0's — so ``reasonrl report`` reads the
folder as a run, plus the rounds' accuracy and bytes) and ``server_state.pt`` (the last finished
round, for ``--resume``); each client keeps its own state in its own folder.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # Flower phones home otherwise; this machine need not

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from reasonrl.recipe import recipe_from_dict

from reasonrl.sections import Recipe  # noqa: E402
from reasonrl.methods.fed_grpo.client import (FedClient, RoundResult, STATE_FILE, fed_settings,  # noqa: E402
                                              recipe_fingerprint, send_saved)
from reasonrl.methods.fed_grpo.codec import Layout, SparseUpdate  # noqa: E402
from reasonrl.methods.fed_grpo.strategy import FedGRPOStrategy  # noqa: E402
from reasonrl.fsutil import atomic_write_text  # noqa: E402
from reasonrl.isolation.parent_watch import watch_parent  # noqa: E402
from reasonrl.train.checkpoint import load_state, save_state  # noqa: E402

__all__ = ["simulate", "run_server", "client_train", "client_send", "reply_content", "update_content",
           "make_server_app", "make_client_app", "server_app", "client_app"]

RECIPE_KEY, OUT_KEY = "recipe-json", "out"
SERVER_STATE = "server_state.pt"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_server(grid: Grid, recipe: Recipe, out: str | Path, log: Callable[[str], None] = _log,
               on_reply: Callable[[Message], None] | None = None) -> dict[str, Any]:
    """The federation's rounds on ``grid`` (Flower's ``Strategy.start``) with the global model's
    held-out evaluation after each round (and before the first, as round 0).

    After each round the server's state (global weights, R̄, the rounds' metrics) goes to
    ``OUT/server_state.pt`` (atomically); when that file exists the run resumes after its round:
    Flower's rounds 1, 2, ... are rounds r+1, r+2, ... of the federation (the strategy's offset),
    ``metrics.jsonl`` drops any row after r, and each client starts from its state before the
    repeated round (``FedClient``), so the result equals an uninterrupted run's."""
    import torch

    from reasonrl.evaluate.evaluator import Evaluator
    from reasonrl.policy.factory import build_policy
    from reasonrl.tasks.base import build_task
    from reasonrl.metrics_log import MetricsWriter, finite_or_none

    fed = fed_settings(recipe)
    out = Path(out)
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    policy = build_policy(recipe.model, log=log)
    evaluator = Evaluator(recipe, build_task(recipe))
    layout = Layout.of(policy.weights())
    strategy = FedGRPOStrategy(layout, fed, on_reply=on_reply)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "recipe.json", json.dumps(recipe.to_dict(), indent=1))
    fingerprint, state_path = recipe_fingerprint(recipe), out / SERVER_STATE
    evals: dict[int, dict[str, float]] = {}
    # round -> (intervals, per-problem values) of the first and the latest evaluation: the
    # summary's base_eval_ci / final_eval_ci and *_per_problem, as a training run writes them
    details: dict[int, tuple[dict, dict]] = {}
    wall_before, started = 0.0, time.perf_counter()
    start = policy.weights()
    if state_path.is_file():
        state = load_state(state_path)  # tensors and plain data only: the file runs no code
        if state["federation"] != fingerprint:
            raise ValueError(f"{state_path} belongs to another federation (its recipe differs from {out}/recipe.json)")
        strategy.round_offset, strategy.global_reward = state["round"], state["global_reward"]
        strategy.round_metrics, evals, start = state["round_metrics"], state["evals"], state["arrays"]
        details, wall_before = state.get("details", {}), state.get("wall_seconds", 0.0)
        log(f"resuming after round {strategy.round_offset} of {fed['rounds']}")
    done = strategy.round_offset
    writer = MetricsWriter(out, resume_step=done + 1 if done else None)
    latest = [start]

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        rnd = server_round + done
        if server_round == 0 and done:  # Flower's initial evaluation of a resumed run: already done
            return MetricRecord({k: float(v) for k, v in evals[done].items() if isinstance(v, (int, float))})
        weights = arrays.to_torch_state_dict()
        latest[0] = weights
        policy.set_weights(weights)
        result = evaluator(policy) if evaluator.problems else None
        metrics = result.metrics if result is not None else {}
        evals[rnd] = metrics
        if result is not None:
            kept = {r: d for r, d in details.items() if r == 0}
            details.clear()
            details.update(kept)
            details[rnd] = ({k: list(v) for k, v in result.intervals.items()}, dict(result.per_problem))
        row = {f"eval/{k}": v for k, v in metrics.items()}
        row.update({f"fed/{k}": v for k, v in strategy.round_metrics.get(rnd, {}).items()})
        writer.write(rnd, row)
        if rnd > 0:
            save_state(state_path, {"round": rnd, "arrays": weights, "global_reward": strategy.global_reward,
                                    "evals": evals, "round_metrics": strategy.round_metrics,
                                    "federation": fingerprint, "details": details,
                                    "wall_seconds": wall_before + time.perf_counter() - started})
        log(f"round {rnd}: held-out accuracy {metrics.get('accuracy', float('nan')):.3f}")
        return MetricRecord({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})

    try:
        strategy.start(grid, ArrayRecord(start), num_rounds=fed["rounds"] - done,
                       timeout=fed["round_timeout_s"], evaluate_fn=evaluate)
    finally:
        writer.close()
    policy.set_weights(latest[0])
    policy.save(out / "final_model")
    last = fed["rounds"]
    base_ci, base_pp = details.get(0, ({}, {}))
    final_ci, final_pp = details.get(last, ({}, {}))
    # The keys a training run's summary has (what `reasonrl report` reads: the final global
    # model's held-out evaluation is the run's final evaluation), then the federation's own.
    summary = {"run_dir": str(out), "steps": last,
               "base_accuracy": evals.get(0, {}).get("accuracy"),
               "final_accuracy": evals.get(last, {}).get("accuracy"),
               "base_eval": {k: finite_or_none(v) for k, v in evals.get(0, {}).items()},
               "final_eval": {k: finite_or_none(v) for k, v in evals.get(last, {}).items()},
               "base_eval_ci": base_ci, "final_eval_ci": final_ci,
               "base_eval_per_problem": base_pp, "final_eval_per_problem": final_pp,
               "wall_seconds": round(wall_before + time.perf_counter() - started, 2),
               "rounds": last, "clients": fed["clients"],
               "accuracy_by_round": {r: finite_or_none(m.get("accuracy")) for r, m in sorted(evals.items())},
               "bytes_by_round": {r: m.get("bytes/total") for r, m in sorted(strategy.round_metrics.items())}}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    return summary


# Built clients by state folder, so a simulation's actor keeps each client's Trainer between
# rounds; an entry is used only while the state file is the one it wrote (else rebuilt from it).
_CLIENTS: dict[str, tuple[FedClient, int]] = {}


def client_train(msg: Message, context: Context, recipe_dict: dict, out: str | Path) -> Message:
    """A ``train`` message: the round's local steps; the reply is the round's scalars only."""
    cid, state_dir, key, state_file = _client_paths(context, out)
    config = msg.content["config"]
    rnd = int(config["server-round"])
    cached = _CLIENTS.pop(key, None)
    mtime = state_file.stat().st_mtime_ns if state_file.is_file() else 0
    if cached is not None and cached[1] == mtime and cached[0].round < rnd:
        client = cached[0]
    else:  # first round here, another process wrote the state, or a resumed server repeats a round
        if cached is not None:
            cached[0].close()
        client = FedClient(recipe_from_dict(recipe_dict, "the federated recipe"), cid, state_dir, before_round=rnd)
    rbar = float(config["global-reward"]) if "global-reward" in config else None
    # An exception leaves the entry out of the cache: the next round rebuilds from the last saved state.
    result = client.train_round(msg.content["arrays"].to_torch_state_dict(), rbar, rnd)
    _CLIENTS[key] = (client, state_file.stat().st_mtime_ns)
    return Message(reply_content(result, cid), reply_to=msg)


def client_send(msg: Message, context: Context, recipe_dict: dict, out: str | Path) -> Message:
    """A ``query`` message (the round's second half): its ``budget`` entries of the pending update."""
    cid, state_dir, key, state_file = _client_paths(context, out)
    config = msg.content["config"]
    rnd, budget = int(config["server-round"]), int(config["budget"])
    cached = _CLIENTS.pop(key, None)
    mtime = state_file.stat().st_mtime_ns if state_file.is_file() else 0
    if cached is not None and cached[1] == mtime and cached[0].round == rnd:
        update = cached[0].send(budget, rnd)
        _CLIENTS[key] = (cached[0], state_file.stat().st_mtime_ns)
    else:  # a deployed client's fresh process: the state file alone, no Trainer
        if cached is not None:
            cached[0].close()
        update = send_saved(recipe_from_dict(recipe_dict, "the federated recipe"), state_dir, budget, rnd)
    return Message(update_content(update, cid), reply_to=msg)


def _client_paths(context: Context, out: str | Path) -> tuple[int, Path, str, Path]:
    cid = int(context.node_config["partition-id"])
    state_dir = Path(str(context.node_config.get("state-dir") or Path(out) / "clients" / f"client_{cid}"))
    return cid, state_dir, str(state_dir.resolve()), state_dir / STATE_FILE


def reply_content(result: RoundResult, cid: int) -> RecordDict:
    """What a client sends after training (the only shape ``strategy.check_reply(..., "train")``
    accepts): the round's scalars."""
    return RecordDict({"metrics": MetricRecord({**result.report, "client-id": cid})})


def update_content(update: SparseUpdate, cid: int) -> RecordDict:
    """What a client sends when asked for its update (``check_reply(..., "update")``): the
    sparse update's ``indices`` and ``values``, and their byte count."""
    return RecordDict({
        "update": ArrayRecord({"indices": Array(update.indices.numpy()), "values": Array(update.values.numpy())}),
        "metrics": MetricRecord({"payload-bytes": update.nbytes, "client-id": cid}),
    })


def make_server_app(recipe_dict: dict, out: str | Path, on_reply: Callable[[Message], None] | None = None) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, recipe_from_dict(recipe_dict, "the federated recipe"), out, on_reply=on_reply)

    return app


def make_client_app(recipe_dict: dict, out: str | Path) -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return client_train(msg, context, recipe_dict, out)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return client_send(msg, context, recipe_dict, out)

    return app


def simulate(recipe: Recipe, out: str | Path, client_app: ClientApp | None = None,
             on_reply: Callable[[Message], None] | None = None) -> dict[str, Any]:
    """Run the federation in Flower's simulation runtime; returns the server's summary.
    ``client_app``: another ClientApp (a test's failing client); ``on_reply``: sees every reply."""
    from flwr.simulation import run_simulation

    fed = fed_settings(recipe)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    raw = recipe.to_dict()
    cores = os.cpu_count() or 1
    run_simulation(server_app=make_server_app(raw, out, on_reply),
                   client_app=client_app or make_client_app(raw, out),
                   num_supernodes=fed["clients"],
                   backend_config={"client_resources": {"num_cpus": cores, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": cores, "include_dashboard": False}})
    summary_path = out / "summary.json"
    if not summary_path.is_file():
        raise RuntimeError(f"the federated simulation ended without a summary in {out}: see the log above")
    return json.loads(summary_path.read_text())


# -- the deployment apps (``flwr run``): recipe and output folder from the run config --------

_WATCHED_PARENT: list[int] = []


def _exit_with_superexec() -> None:
    """End this deployed app's process (flwr-serverapp / flwr-clientapp) within
    ``PARENT_POLL_S`` of its SuperExec's death. Flower's own watch (``--parent-pid``) raises
    SIGINT instead, whose graceful exit pushes outputs and logs to the SuperLink with retries
    and backoff: tens of seconds when the SuperLink died too (a killed fed-server/fed-client)."""
    if not _WATCHED_PARENT:
        _WATCHED_PARENT.append(os.getppid())
        watch_parent(_WATCHED_PARENT[0])


server_app = ServerApp()


@server_app.main()
def _deployed_server(grid: Grid, context: Context) -> None:
    _exit_with_superexec()
    raw = json.loads(str(context.run_config[RECIPE_KEY]))
    run_server(grid, recipe_from_dict(raw, "the federated recipe"), str(context.run_config[OUT_KEY]))


client_app = ClientApp()


def _deployed(handler: Callable[[Message, Context, dict, str | Path], Message], msg: Message,
              context: Context) -> Message:
    _exit_with_superexec()
    raw = json.loads(str(context.run_config[RECIPE_KEY]))
    if "state-dir" not in context.node_config:  # fed-client always sets it; a bare flower-supernode may not
        raise ValueError("a deployed Fed-GRPO client needs its node config's state-dir (reasonrl fed-client sets it)")
    return handler(msg, context, raw, str(context.node_config["state-dir"]))


@client_app.train()
def _deployed_client(msg: Message, context: Context) -> Message:
    return _deployed(client_train, msg, context)


@client_app.query()
def _deployed_client_send(msg: Message, context: Context) -> Message:
    return _deployed(client_send, msg, context)
