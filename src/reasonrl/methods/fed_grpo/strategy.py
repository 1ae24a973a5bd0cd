"""The Flower strategy of Fed-GRPO: signal-weighted aggregation, R̄ broadcast, sparse uploads
allocated across clients.

A subclass of Flower's message-API ``FedAvg`` (``flwr.serverapp.strategy``), so node sampling,
``min_available_nodes``/``min_train_nodes`` and the handling of failed replies (a reply that
carries an error, or none before the round's timeout, is left out) are Flower's own. A round
is two exchanges with the clients:

1. ``configure_train``: the first round of a run (or of a resumed run) waits up to
   ``join_timeout_s`` for all ``clients`` to connect, every round needs ``min_clients``; then
   FedAvg's ``train`` messages (the global trainable weights and the config), plus
   ``global-reward`` = R̄ once known and calibration is on (β > 0). Each client trains and
   replies with scalars only (``TRAIN_KEYS``: S_c, n_c, mean reward, ‖u_c‖₂, nnz(u_c), its id);
2. ``aggregate_train``: the round's upload slots are split across the clients that replied
   (``maths.client_budgets``: K = C·⌊d/κ⌋ by ‖u_c‖₂, capped at nnz(u_c), the excess
   redistributed; or ⌊d/κ⌋ each with ``allocation: uniform``) and each gets a ``query``
   message with its budget; it replies with exactly ``update`` (int ``indices``, float32
   ``values``, as many as its budget, none zero) and ``metrics`` (``UPDATE_KEYS``), so no text
   can travel. Then (``aggregate``) θ ← θ + η_g Σ_c w_c Δ̂_c with w_c ∝ n_c S_c^α over the
   clients whose update arrived, and R̄ ← EMA of their n-weighted mean reward. Fewer such
   clients than ``min_clients``: the round keeps θ.

With α = 0, β = 0, κ = 1 and η_g = 1 this is FedAvg exactly (Σ_c (n_c/Σn) θ_c, what Flower's
``aggregate_arrayrecords`` computes; ``tests/test_fed_grpo.py`` checks the equality): the
``fed_avg`` recipe's baseline is this class so both arms share every other line.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Callable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from reasonrl.methods.fed_grpo.maths import (aggregation_weights, client_budgets, payload_bytes, per_client_budget,
                                             update_reward_ema)
from reasonrl.methods.fed_grpo.codec import Layout, decode

__all__ = ["FedGRPOStrategy", "TRAIN_KEYS", "UPDATE_KEYS", "check_reply"]

TRAIN_KEYS = {"signal", "num-examples", "reward-mean", "update-norm", "nonzeros", "client-id"}
UPDATE_KEYS = {"payload-bytes", "client-id"}


def check_reply(content: Any, kind: str) -> None:
    """Raise ValueError unless a reply holds exactly what a client may send (module docstring):
    ``kind`` "train" (``metrics`` with exactly ``TRAIN_KEYS``) or "update" (``update`` and
    ``metrics`` with exactly ``UPDATE_KEYS``)."""
    want, keys = ({"metrics"}, TRAIN_KEYS) if kind == "train" else ({"update", "metrics"}, UPDATE_KEYS)
    if set(content.keys()) != want or content.config_records:
        raise ValueError(f"a client's {kind} reply must hold exactly {sorted(want)}, got {sorted(content.keys())}")
    metrics = content["metrics"]
    if not isinstance(metrics, MetricRecord) or set(metrics.keys()) != keys:
        raise ValueError(f"a client's {kind} reply's 'metrics' must hold exactly {sorted(keys)}, got "
                         f"{sorted(metrics.keys())}")
    if kind == "train":
        return
    update = content["update"]
    if not isinstance(update, ArrayRecord) or set(update.keys()) != {"indices", "values"}:
        raise ValueError("a client reply's 'update' must be an ArrayRecord of 'indices' and 'values'")
    if update["indices"].dtype not in ("int32", "int64") or update["values"].dtype != "float32":
        raise ValueError(f"a client update must be int indices and float32 values, got "
                         f"{update['indices'].dtype}/{update['values'].dtype}")


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
        self._grid: Grid | None = None

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        server_round += self.round_offset
        self.current, self._grid = arrays, grid
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

    def budgets(self, reports: list[Any]) -> list[int]:
        """Each replying client's upload slots this round (module docstring): d each when dense
        (κ = 1), else ``maths.client_budgets`` of their ‖u_c‖₂ and nnz(u_c)."""
        if self.fed["kappa"] == 1:
            return [self.layout.dim] * len(reports)
        norms = torch.tensor([float(r["update-norm"]) for r in reports], dtype=torch.float64)
        nonzeros = [int(r["nonzeros"]) for r in reports]
        return client_budgets(norms, nonzeros, per_client_budget(self.layout.dim, self.fed["kappa"]),
                              self.fed.get("allocation", "adaptive"))

    def _valid(self, replies: Iterable[Message], kind: str) -> tuple[list[Message], int]:
        """The replies without an error, checked and sorted by client id; and how many failed."""
        replies = list(replies)
        for msg in replies:
            if self.on_reply is not None:
                self.on_reply(msg)
        valid = [m for m in replies if not m.has_error()]
        for m in valid:
            check_reply(m.content, kind)
        # Replies arrive in any order (real processes finish when they finish); summing them in
        # client order makes the float sums, hence the global weights, independent of it.
        valid.sort(key=lambda m: int(m.content["metrics"]["client-id"]))
        ids = [int(m.content["metrics"]["client-id"]) for m in valid]
        if len(set(ids)) != len(ids):
            raise ValueError(f"two nodes replied as the same client ({sorted(ids)}): start each fed-client with "
                             f"its own --client index")
        return valid, len(replies) - len(valid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's second exchange (each client's budget, its sparse update back), then
        :meth:`aggregate`."""
        rnd = server_round + self.round_offset
        trained, failed = self._valid(replies, "train")
        updates: list[Message] = []
        if len(trained) >= self.fed["min_clients"]:
            queries = [Message(RecordDict({"config": ConfigRecord({"server-round": rnd, "budget": k})}),
                               dst_node_id=m.metadata.src_node_id, message_type=MessageType.QUERY)
                       for m, k in zip(trained, self.budgets([m.content["metrics"] for m in trained]))]
            updates = list(self._grid.send_and_receive(queries, timeout=self.fed["round_timeout_s"]))
        return self.aggregate(rnd, trained, updates, failed)

    def aggregate(self, server_round: int, trained: list[Message], updates: Iterable[Message],
                  failed: int = 0) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate round ``server_round`` (the federation's numbering) from the valid train
        replies ``trained`` (sorted by client id) and the ``updates`` answering their queries;
        ``failed``: train replies that carried an error."""
        reports = [m.content["metrics"] for m in trained]
        budget_of = {int(r["client-id"]): k for r, k in zip(reports, self.budgets(reports))} if reports else {}
        node_of = {int(r["client-id"]): m.metadata.src_node_id for r, m in zip(reports, trained)}
        arrived, update_failed = self._valid(updates, "update")
        got = {int(m.content["metrics"]["client-id"]): m for m in arrived}
        for cid, m in got.items():
            if cid not in node_of or m.metadata.src_node_id != node_of[cid]:
                raise ValueError(f"an update arrived as client {cid} from a node that did not train as it")
        ok = [(r, got[int(r["client-id"])]) for r in reports if int(r["client-id"]) in got]
        sent, dense = self._down.get(server_round, (0, 0))
        out: dict[str, float] = {"clients/ok": len(ok), "clients/failed": failed + len(trained) - len(ok),
                                 "bytes/down": sent * dense}
        for r in reports if len(trained) >= self.fed["min_clients"] else []:  # the clients asked for updates
            cid = int(r["client-id"])
            out.update({f"budget/c{cid}": budget_of[cid], f"norm/c{cid}": float(r["update-norm"]),
                        f"nonzeros/c{cid}": float(r["nonzeros"])})
        if len(ok) < self.fed["min_clients"]:  # min_clients >= 1
            out["aggregated"] = 0
            self.round_metrics[server_round] = out
            return None, MetricRecord(out)
        counts = torch.tensor([r["num-examples"] for r, _ in ok], dtype=torch.float64)
        signals = torch.tensor([r["signal"] for r, _ in ok], dtype=torch.float64)
        means = torch.tensor([r["reward-mean"] for r, _ in ok], dtype=torch.float64)
        weights = aggregation_weights(counts, signals, self.fed["alpha"])
        state = self.current.to_torch_state_dict()
        step = {n: torch.zeros(s) for n, s in zip(self.layout.names, self.layout.shapes)}
        up = 0
        for w, (report, m) in zip(weights.tolist(), ok):
            cid = int(report["client-id"])
            upd = m.content["update"]
            indices, values = torch.from_numpy(upd["indices"].numpy()), torch.from_numpy(upd["values"].numpy())
            want = budget_of[cid]
            if values.numel() != want or (indices.numel() and bool((values == 0).any())):
                raise ValueError(f"client {cid} sent {values.numel()} values "
                                 f"({int((values == 0).sum())} of them zero) for a budget of {want} non-zero slots")
            for n, d in decode(indices, values, self.layout).items():
                step[n] += w * d
            nbytes = payload_bytes(indices, values)
            if int(m.content["metrics"]["payload-bytes"]) != nbytes:  # the client's own count must match what arrived
                raise ValueError(f"client {cid} reported {int(m.content['metrics']['payload-bytes'])} "
                                 f"payload bytes, sent {nbytes}")
            up += nbytes
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
