"""``fed_grpo``: a federated client's extras on the method hooks, and the federation's settings.

On every local step (``annotate``, before advantages) the method

- reads each prompt group's rewards: mean r̄_{c,q} and std σ_{c,q} (``algos.selection.one_group_reward_std``);
- re-weights the group's per-token policy loss by ω_{c,q} (``algos.federated.calibration_weights``
  from the broadcast global mean reward R̄), written to ``batch.is_weights``, which the
  objective multiplies into the policy term (the seam off-policy corrections use; so the
  recipe may not also have an ``off_policy`` correction). ω > 0 scales a PPO-clip term exactly
  (min(ωρA, ω clip(ρ)A) = ω min(ρA, clip(ρ)A)): L_c = Σ_q ω_{c,q} L_q^GRPO;
- adds the groups to the round's report: S_c (``client_signal``), n_c (groups trained on) and
  the client's mean reward.

Before the server has any report (round 1, or a plain ``reasonrl train`` of the recipe) R̄ is
unknown and ω = 1: the recipe then trains as plain GRPO (the centralised baseline).

The constructor also takes the federation's settings (rounds, local steps, α, κ, ...), which
``reasonrl.methods.fed_grpo`` reads from this entry of ``methods:``, so one recipe file holds both and every
value is checked when the recipe loads (as ExpDis keeps its loop settings in its method entry).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch

from reasonrl.methods.fed_grpo.maths import calibration_weights, client_signal
from reasonrl.batch import RolloutBatch
from reasonrl.hooks import Method
from reasonrl.params import Range
from reasonrl.registry import METHODS

__all__ = ["FedGRPOClient", "METHOD"]

METHOD = "fed_grpo"


@METHODS.register(METHOD)
class FedGRPOClient(Method):
    def __init__(self,
                 clients: Annotated[int, Range(ge=1, why="clients in the federation")] = 3,
                 rounds: Annotated[int, Range(ge=1)] = 10,
                 local_steps: Annotated[int, Range(ge=1, why="E: local GRPO steps per round")] = 2,
                 alpha: Annotated[float, Range(ge=0, why="w_c ∝ n_c S_c^α; 0: FedAvg's n_c")] = 1.0,
                 beta: Annotated[float, Range(ge=0, why="calibration strength; 0: ω = 1")] = 1.0,
                 omega_min: Annotated[float, Range(gt=0)] = 0.5,
                 omega_max: Annotated[float, Range(gt=0)] = 2.0,
                 calibration: Literal["clip", "softmax"] = "clip",
                 reward_momentum: Annotated[float, Range(ge=0, lt=1, why="the EMA of R̄")] = 0.9,
                 kappa: Annotated[float, Range(ge=1, why="compression ratio d/k; 1: dense")] = 32.0,
                 error_feedback: bool = True,
                 allocation: Literal["adaptive", "uniform"] = "adaptive",
                 server_lr: Annotated[float, Range(gt=0, why="η_g in θ ← θ + η_g Σ w_c Δ_c")] = 1.0,
                 min_clients: Annotated[int, Range(ge=1, why="replies a round needs to aggregate")] = 1,
                 split: dict | None = None,
                 round_timeout_s: Annotated[float, Range(gt=0)] = 3600.0,
                 join_timeout_s: Annotated[float, Range(ge=0, why="the first round's wait for all clients")] = 600.0
                 ) -> None:
        """The settings are documented in ``docs/methods/fed_grpo.md``; ``split``: the
        ``non_iid`` sampler's parameters other than ``client``/``num_clients`` (default
        ``{key: form, dominant: 0.8}``)."""
        if omega_min > omega_max:
            raise ValueError(f"omega_min ({omega_min}) must be <= omega_max ({omega_max})")
        if min_clients > clients:
            raise ValueError(f"min_clients ({min_clients}) must be <= clients ({clients})")
        self.settings = dict(clients=clients, rounds=rounds, local_steps=local_steps, alpha=alpha, beta=beta,
                             omega_min=omega_min, omega_max=omega_max, calibration=calibration,
                             reward_momentum=reward_momentum, kappa=kappa, error_feedback=error_feedback,
                             allocation=allocation, server_lr=server_lr, min_clients=min_clients, split=dict(split or {}),
                             round_timeout_s=round_timeout_s, join_timeout_s=join_timeout_s)
        self.global_reward: float | None = None
        self._reset_round()

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        need(recipe.off_policy is None, f"method '{METHOD}' writes its calibration weights to batch.is_weights, "
             "which an off_policy correction also writes: remove off_policy")

    def _reset_round(self) -> None:
        self.group_rewards: list[list[float]] = []
        self.reward_sum, self.rows = 0.0, 0

    def begin_round(self, global_reward: float | None) -> None:
        """A new round from the server: its R̄ (None: not known yet) and an empty report."""
        self.global_reward = global_reward
        self._reset_round()

    def report(self) -> dict[str, float]:
        """The round's (S_c, n_c, mean reward): scalars only, never a prompt or completion."""
        return {"signal": client_signal(self.group_rewards), "num-examples": float(len(self.group_rewards)),
                "reward-mean": self.reward_sum / self.rows if self.rows else 0.0}

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        ids, row_group = torch.unique(batch.group_ids, return_inverse=True)
        groups = [batch.rewards[row_group == g].tolist() for g in range(len(ids))]
        means = torch.tensor([sum(g) / len(g) for g in groups], dtype=torch.float64)
        s = self.settings
        omega = calibration_weights(self.global_reward, means, s["beta"], s["omega_min"], s["omega_max"],
                                    s["calibration"])
        weights = omega[row_group].unsqueeze(-1).to(batch.completion_mask.device) * torch.ones_like(
            batch.completion_mask, dtype=torch.float32)
        batch.is_weights = weights if batch.is_weights is None else batch.is_weights * weights
        self.group_rewards.extend(groups)
        self.reward_sum += float(batch.rewards.sum())
        self.rows += len(batch)
        return {"fed/omega_mean": float(omega.mean()), "fed/omega_max": float(omega.max()),
                "fed/signal": client_signal(groups)}

    def state_dict(self) -> dict[str, Any]:
        return {"global_reward": self.global_reward, "group_rewards": [list(g) for g in self.group_rewards],
                "reward_sum": self.reward_sum, "rows": self.rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.global_reward = state["global_reward"]
        self.group_rewards = [list(g) for g in state["group_rewards"]]
        self.reward_sum, self.rows = state["reward_sum"], state["rows"]
