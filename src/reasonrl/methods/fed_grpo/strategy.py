"""The Flower strategy of Fed-GRPO: signal-weighted aggregation, R̄ broadcast, sparse decode.

A subclass of Flower's message-API ``FedAvg`` (``flwr.serverapp.strategy``), so node sampling,
``min_available_nodes``/``min_train_nodes`` and the handling of failed replies (a reply that
carries an error, or none before the round's timeout, is left out) are Flower's own. Per round:

1. ``configure_train``: the first round of a run (or of a resumed run) waits up to
   ``join_timeout_s`` for all ``clients`` to connect, every round needs ``min_clients``; then
   FedAvg's messages (the global trainable weights and the config), plus
   ``global-reward`` = R̄ once known and calibration is on (β > 0);
2. ``aggregate_train``: each valid reply is checked against the one schema a client may send
   (``update``: int ``indices`` and float32 ``values``; ``metrics``: the scalars in
   ``REPORT_KEYS``; nothing else, so no text can travel), decoded (``codec.decode``), and
   θ ← θ + η_g Σ_c w_c Δ̂_c with w_c ∝ n_c S_c^α (``algos.federated.aggregation_weights``); then
   R̄ ← EMA of the clients' n-weighted mean reward. Fewer valid replies than ``min_clients``: the
   round keeps θ.

With α = 0, β = 0, κ = 1 and η_g = 1 this is FedAvg exactly (Σ_c (n_c/Σn) θ_c, what Flower's
``aggregate_arrayrecords`` computes; ``tests/test_fed_grpo.py`` checks the equality): the
``fed_avg`` recipe's baseline is this class so both arms share every other line.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Callable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from reasonrl.methods.fed_grpo.maths import aggregation_weights, payload_bytes, update_reward_ema
from reasonrl.methods.fed_grpo.codec import Layout, decode

__all__ = ["FedGRPOStrategy", "REPORT_KEYS", "check_reply"]

REPORT_KEYS = {"signal", "num-examples", "reward-mean", "payload-bytes", "client-id"}


def check_reply(content: Any) -> None:
    """Raise ValueError unless a reply holds exactly what a client may send (module docstring)."""
    if set(content.keys()) != {"update", "metrics"} or content.config_records:
        raise ValueError(f"a client reply must hold exactly 'update' and 'metrics', got {sorted(content.keys())}")
    update, metrics = content["update"], content["metrics"]
    if not isinstance(update, ArrayRecord) or set(update.keys()) != {"indices", "values"}:
        raise ValueError("a client reply's 'update' must be an ArrayRecord of 'indices' and 'values'")
    if update["indices"].dtype not in ("int32", "int64") or update["values"].dtype != "float32":
        raise ValueError(f"a client update must be int indices and float32 values, got "
                         f"{update['indices'].dtype}/{update['values'].dtype}")
    if not isinstance(metrics, MetricRecord) or not set(metrics.keys()) <= REPORT_KEYS:
        raise ValueError(f"a client reply's 'metrics' may hold only {sorted(REPORT_KEYS)}, got {sorted(metrics.keys())}")


class FedGRPOStrategy(FedAvg):
    def __init__(self, layout: Layout, fed: dict[str, Any],
                 on_reply: Callable[[Message], None] | None = None) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=fed["min_clients"],
                         min_evaluate_nodes=0, min_available_nodes=fed["min_clients"],
                         weighted_by_key="num-examples")
        self.layout, self.fed = layout, fed
        self.on_reply = on_reply  # sees every reply as received (the privacy test records them)
        self.global_reward: float | None = None
        self.current: ArrayRecord | None = None
        self.round_metrics: dict[int, dict[str, float]] = {}
        self.round_offset = 0  # rounds done before this start (a resumed run): Flower's round 1 is offset + 1
        self._down: dict[int, tuple[int, int]] = {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        server_round += self.round_offset
        self.current = arrays
        # The first round of a start (1, or the first after a resume) waits for every client (real
        # processes join or reconnect late: a round that started with fewer would train on a partial
        # federation), up to join_timeout_s; every round needs >= min_clients (Flower's sample_nodes
        # waits for that many), so a client that died does not stall the server.
        if server_round == self.round_offset + 1:
            self._wait_for_clients(grid)
        self.min_available_nodes = self.fed["min_clients"]
        if self.fed["beta"] > 0 and self.global_reward is not None:
            config["global-reward"] = float(self.global_reward)
        messages = list(super().configure_train(server_round, arrays, config, grid))
        dense = self.layout.dim * 4  # float32 trainable weights
        self._down[server_round] = (len(messages), dense)
        return messages

    def _wait_for_clients(self, grid: Grid) -> None:
        """Up to ``join_timeout_s`` for all ``clients`` to be connected (then the round goes on
        with those there, at least ``min_clients``: a client gone for good does not stop a resume)."""
        want, deadline = self.fed["clients"], time.monotonic() + self.fed["join_timeout_s"]
        while len(list(grid.get_node_ids())) < want and time.monotonic() < deadline:
            time.sleep(1.0)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round += self.round_offset
        replies = list(replies)
        for msg in replies:
            if self.on_reply is not None:
                self.on_reply(msg)
        valid = [m for m in replies if not m.has_error()]
        for m in valid:
            check_reply(m.content)
        # Replies arrive in any order (real processes finish when they finish); summing them in
        # client order makes the float sums, hence the global weights, independent of it.
        valid.sort(key=lambda m: int(m.content["metrics"]["client-id"]))
        ids = [int(m.content["metrics"]["client-id"]) for m in valid]
        if len(set(ids)) != len(ids):
            raise ValueError(f"two nodes replied as the same client ({sorted(ids)}): start each fed-client with "
                             f"its own --client index")
        sent, dense = self._down.get(server_round, (0, 0))
        out: dict[str, float] = {"clients/ok": len(valid), "clients/failed": len(replies) - len(valid),
                                 "bytes/down": sent * dense}
        if len(valid) < self.fed["min_clients"]:  # min_clients >= 1
            out["aggregated"] = 0
            self.round_metrics[server_round] = out
            return None, MetricRecord(out)
        reports = [m.content["metrics"] for m in valid]
        counts = torch.tensor([r["num-examples"] for r in reports], dtype=torch.float64)
        signals = torch.tensor([r["signal"] for r in reports], dtype=torch.float64)
        means = torch.tensor([r["reward-mean"] for r in reports], dtype=torch.float64)
        weights = aggregation_weights(counts, signals, self.fed["alpha"])
        state = self.current.to_torch_state_dict()
        step = {n: torch.zeros(s) for n, s in zip(self.layout.names, self.layout.shapes)}
        up = 0
        for w, m, report in zip(weights.tolist(), valid, reports):
            upd = m.content["update"]
            indices, values = torch.from_numpy(upd["indices"].numpy()), torch.from_numpy(upd["values"].numpy())
            for n, d in decode(indices, values, self.layout).items():
                step[n] += w * d
            nbytes = payload_bytes(indices, values)
            if int(report["payload-bytes"]) != nbytes:  # the client's own count must match what arrived
                raise ValueError(f"client {int(report['client-id'])} reported {int(report['payload-bytes'])} "
                                 f"payload bytes, sent {nbytes}")
            up += nbytes
            cid = int(report["client-id"])
            out.update({f"signal/c{cid}": float(report["signal"]), f"weight/c{cid}": float(w),
                        f"reward/c{cid}": float(report["reward-mean"]), f"bytes_up/c{cid}": nbytes,
                        f"n/c{cid}": float(report["num-examples"])})
        lr = self.fed["server_lr"]
        new = {n: (t + lr * step[n].to(t.dtype)) if n in step else t for n, t in state.items()}
        self.global_reward = update_reward_ema(self.global_reward, means, counts, self.fed["reward_momentum"])
        out.update({"bytes/up": up, "bytes/total": up + sent * dense, "global_reward": self.global_reward,
                    "reward/mean": float((counts * means).sum() / counts.sum()), "aggregated": 1})
        self.round_metrics[server_round] = out
        return ArrayRecord(new), MetricRecord(out)
