"""One federated client: E local GRPO steps from the broadcast weights, then a sparse update.

The client is the library's own ``Trainer``, driven step by step (``Trainer.setup`` builds its
pieces; ``train_step`` is one step of sample → score → ω-weighted GRPO update); its recipe is
the federation's recipe with

- ``sampler: {name: non_iid, client: c, num_clients: C, **split}`` (its own prompts);
- ``train.seed`` + 1000·(c + 1) (its own prompt stream and samples), ``train.steps`` = rounds·E
  (so an LR schedule spans the whole federation), no held-out evaluation (the server's job).

A round has two halves (the server allocates the round's upload slots across clients between
them, ``maths.client_budgets``):

1. ``train_round``: E local steps, then the error-compensated update u = e + Δ is kept as the
   client's *pending* update and the client reports (S_c, n_c, mean reward, ‖u‖₂, nnz(u));
2. ``send(budget)``: ``budget`` entries of u go out (``codec.encode``) and e ← u − sent.

Its optimiser state, random streams, method state, error-feedback residual and pending update
persist across rounds in ``<state_dir>/client_state.pt`` (the client's own disk: nothing of it
is sent), so a client rebuilt between rounds or between the halves (Flower's deployment runs
each ClientApp call in a new process; ``send_saved`` then works on the file alone) continues
exactly where the cached one would. A pending update never sent (the server lost the reply)
becomes the residual of the next round (with error feedback; without, it is lost). The state
is tagged with the round it ends and the one before it is kept (``client_state.prev.pt``): a
client asked for round r starts from its newest state of a round before r, so when a resumed
server repeats a round the client already trained, it trains it again from the same start, and
the federation equals an uninterrupted one. What leaves the client: the sparse update and the
scalars S_c, n_c, its mean reward, ‖u‖₂ and nnz(u).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from torch import Tensor

from reasonrl.params import ConfigError

from reasonrl.recipe import recipe_from_dict

from reasonrl.sections import Recipe
from reasonrl.methods.fed_grpo.codec import Layout, SparseUpdate, compensate, encode, update_stats
from reasonrl.methods.fed_grpo.method import METHOD, FedGRPOClient
from reasonrl.train.checkpoint import load_state, save_state

__all__ = ["FedClient", "RoundResult", "fed_settings", "client_recipe", "load_fed_recipe", "fed_run_recipe",
           "recipe_fingerprint", "send_saved", "STATE_FILE"]

STATE_FILE, PREV_STATE_FILE = "client_state.pt", "client_state.prev.pt"
CLIENT_SEED_STRIDE = 1000


def fed_settings(recipe: Recipe) -> dict[str, Any]:
    """The federation's settings: the recipe's ``fed_grpo`` entry of ``methods:``."""
    entries = [m for m in recipe.methods if m.name == METHOD]
    if len(entries) != 1:
        raise ConfigError(f"a federated recipe needs exactly one `{METHOD}` entry in `methods:` (the federation's "
                          f"settings), found {len(entries)}")
    return FedGRPOClient(**entries[0].params).settings


def load_fed_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """``load_recipe`` where ``--set fed.<key>=<value>`` sets a federation setting (in the
    ``fed_grpo`` entry of ``methods:``, a list ``--set`` cannot address), e.g. ``fed.kappa=128``."""
    import yaml

    from reasonrl.recipe import load_recipe

    fed_sets = [o for o in overrides or [] if o.strip().startswith("fed.")]
    recipe = load_recipe(path, [o for o in overrides or [] if o not in fed_sets])
    if not fed_sets:
        return recipe
    fed_settings(recipe)  # exactly one entry
    d = recipe.to_dict()
    entry = next(m for m in d["methods"] if m["name"] == METHOD)
    for item in fed_sets:
        if "=" not in item:
            raise ConfigError(f"--set expects key.sub=value, got '{item}'")
        key, value = item.split("=", 1)
        entry[key.strip()[len("fed."):]] = yaml.safe_load(value) if value.strip() else None
    return recipe_from_dict(d, f"{path} (with --set)")


def fed_run_recipe(recipe_path: str | None, overrides: list[str], out: str | Path, resume: bool) -> Recipe:
    """The recipe of a federation run in ``out``: a new run needs ``out`` empty (or absent) and a
    recipe file; ``resume`` continues the run there with the recipe it saved (no overrides)."""
    out = Path(out)
    if resume:
        saved = out / "recipe.json"
        if recipe_path or overrides:
            raise ConfigError("--resume continues the run in -o OUT with its saved recipe: give neither a RECIPE "
                              "nor --set")
        if not saved.is_file():
            raise ConfigError(f"--resume: {out} is not a federation's output folder (no recipe.json)")
        return recipe_from_dict(json.loads(saved.read_text()), str(saved))
    if not recipe_path:
        raise ConfigError("a federation needs a RECIPE.yaml (or --resume with -o OUT)")
    recipe = load_fed_recipe(recipe_path, overrides)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"output folder {out} is not empty; use --resume -o {out} to continue the run there")
    return recipe


def client_recipe(recipe: Recipe, client: int) -> Recipe:
    """Client ``client``'s recipe (see the module docstring)."""
    fed = fed_settings(recipe)
    if not 0 <= client < fed["clients"]:
        raise ConfigError(f"client id {client} is outside 0..{fed['clients'] - 1} ({METHOD}.clients = {fed['clients']})")
    if recipe.sampler.name != "stream":
        raise ConfigError(f"a federated recipe keeps `sampler: stream`; each client's non_iid split replaces it "
                          f"(got '{recipe.sampler.name}'); set the split in {METHOD}.split")
    d = recipe.to_dict()
    d["sampler"] = {"key": "form", "dominant": 0.8, **fed["split"], "name": "non_iid", "client": client,
                    "num_clients": fed["clients"]}
    d["train"] = {**d["train"], "seed": recipe.train.seed + CLIENT_SEED_STRIDE * (client + 1),
                  "steps": fed["rounds"] * fed["local_steps"]}
    d["eval"] = {**d["eval"], "size": 0, "every": 0}
    d["log"] = {**d["log"], "report_to": [], "progress": False, "plots": False}
    return recipe_from_dict(d, f"client {client} of the federated recipe")


@dataclass
class RoundResult:
    report: dict[str, float]  # signal (S_c), num-examples (n_c), reward-mean, update-norm (‖u‖₂), nonzeros
    metrics: list[dict[str, Any]]  # the local steps' training metrics (kept on the client)


def recipe_fingerprint(recipe: Recipe) -> str:
    """Which federation a client state belongs to (a hash of the federation's recipe)."""
    return hashlib.sha256(json.dumps(recipe.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


class FedClient:
    """Client ``client`` of the federation ``recipe``, its state in ``state_dir``; built to
    train round ``before_round`` (None: the next after its newest saved state)."""

    def __init__(self, recipe: Recipe, client: int, state_dir: str | Path,
                 log: Callable[[str], None] | None = None, before_round: int | None = None) -> None:
        from reasonrl.train.trainer import Trainer

        self.client = client
        self.fed = fed_settings(recipe)
        self.fingerprint = recipe_fingerprint(recipe)
        self.state_dir = Path(state_dir)
        self._saved_round: int | None = None  # the round client_state.pt ends (None: no such file)
        state = self._newest_state(before_round)  # first: a refused file leaves nothing started
        self.trainer = Trainer(client_recipe(recipe, client), self.state_dir, log=log or (lambda _m: None))
        self.trainer.setup()
        self.method = next(m for name, m in self.trainer.methods if name == METHOD)
        self.layout = Layout.of(self.trainer.policy.weights())
        self.residual: dict[str, Tensor] = {}
        self.pending: dict[str, Tensor] | None = None  # u = e + Δ of the last round, until sent
        self.round = 0  # the last round this client trained
        if state is not None:
            self.residual, self.round = state["residual"], state["round"]
            self.pending = state.get("pending")
            self.trainer.load_state_dict(state)

    def train_round(self, global_weights: dict[str, Tensor], global_reward: float | None,
                    server_round: int | None = None) -> RoundResult:
        """The round's first half: E local steps from ``global_weights``; the compensated update
        becomes the pending one (sent by :meth:`send`); returns the round's report."""
        t, fed = self.trainer, self.fed
        self._drop_unsent()
        t.policy.set_weights(global_weights)
        self.method.begin_round(global_reward)
        metrics = []
        for _ in range(fed["local_steps"]):
            metrics.append(t.train_step(t.state.step))
            t.state.step += 1
        local = t.policy.weights()
        delta = {n: local[n].float() - global_weights[n].float() for n in self.layout.names}
        self.pending = compensate(delta, self.layout, self.residual, fed["error_feedback"])
        self.residual = {}  # folded into the pending update
        self.round = self.round + 1 if server_round is None else server_round
        norm, nonzeros = update_stats(self.pending)
        report = {**self.method.report(), "update-norm": norm, "nonzeros": float(nonzeros)}
        self._save()
        return RoundResult(report, metrics)

    def send(self, budget: int, server_round: int | None = None) -> SparseUpdate:
        """The round's second half: ``budget`` entries of the pending update (``codec.encode``);
        the rest stays as the error-feedback residual."""
        if self.pending is None or (server_round is not None and server_round != self.round):
            raise ValueError(f"client {self.client}: no pending update of round {server_round} to send "
                             f"(last trained round {self.round})")
        update = _encode(self.pending, self.layout, budget, self.fed)
        self.residual, self.pending = update.residual, None
        self._save()
        return update

    def _drop_unsent(self) -> None:
        """A pending update the server never asked for: with error feedback all of it is carried
        into the next round's residual, without it is lost."""
        if self.pending is not None:
            self.residual = self.pending if self.fed["error_feedback"] else {}
            self.pending = None

    def _save(self) -> None:
        state = {"residual": self.residual, "pending": self.pending, "round": self.round,
                 "federation": self.fingerprint, **self.trainer.state_dict()}  # the Trainer's checkpoint state
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The state of an earlier round becomes prev (a repeated round replaces the current one);
        # a client killed after the move and before the write still has that state, as prev.
        if self._saved_round is not None and self._saved_round < self.round:
            os.replace(self.state_dir / STATE_FILE, self.state_dir / PREV_STATE_FILE)
        save_state(self.state_dir / STATE_FILE, state)
        self._saved_round = self.round

    def _newest_state(self, before_round: int | None) -> dict[str, Any] | None:
        """The newest saved state of a round before ``before_round``: client_state.pt, else the
        older client_state.prev.pt (read only when needed: each is a whole optimiser state)."""
        for name in (STATE_FILE, PREV_STATE_FILE):
            path = self.state_dir / name
            if not path.is_file():
                continue
            state = load_state(path)  # tensors and plain data only: the file runs no code
            if state.get("federation") != self.fingerprint:
                raise ValueError(f"{path} holds another federation's client state (its recipe differs); "
                                 f"give this client a fresh state folder")
            if name == STATE_FILE:
                self._saved_round = state["round"]
            if before_round is None or state["round"] < before_round:
                return state
        return None

    def close(self) -> None:
        self.trainer.close()


def _encode(pending: dict[str, Tensor], layout: Layout, budget: int, fed: dict[str, Any]) -> SparseUpdate:
    return encode(pending, layout, budget, dense=fed["kappa"] == 1, allocation=fed["allocation"],
                  error_feedback=fed["error_feedback"])


def send_saved(recipe: Recipe, state_dir: str | Path, budget: int, server_round: int) -> SparseUpdate:
    """:meth:`FedClient.send` on the state file alone (no Trainer is built): what a deployed
    client's second half does in its fresh process. The file must hold this federation's
    pending update of ``server_round``; it is rewritten with the new residual."""
    path = Path(state_dir) / STATE_FILE
    if not path.is_file():
        raise ValueError(f"{path}: no client state, so no pending update of round {server_round} to send")
    state = load_state(path)
    if state.get("federation") != recipe_fingerprint(recipe):
        raise ValueError(f"{path} holds another federation's client state (its recipe differs)")
    pending = state.get("pending")
    if pending is None or state["round"] != server_round:
        raise ValueError(f"{path}: no pending update of round {server_round} to send (last trained round "
                         f"{state['round']})")
    fed = fed_settings(recipe)
    layout = Layout(tuple(pending), tuple((t.numel(),) for t in pending.values()))
    update = _encode(pending, layout, budget, fed)
    state["residual"], state["pending"] = update.residual, None
    save_state(path, state)
    return update
