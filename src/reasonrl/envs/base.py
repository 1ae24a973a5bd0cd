"""The environment protocol of multi-turn episodes (``env:`` in a recipe).

An episode answers one problem in up to ``rollout.max_turns`` model turns::

    observation = env.reset(problem, seed)        # '' for none; shown after the prompt
    loop:
        the model writes a turn: sampled until EOS, a stop string of the recipe, one of
        ``env.stop`` (the end of an action, e.g. a tool call's closing tag) or its budget
        step = env.step(turn_text)                # Step(observation, reward, done, info)
        the observation's tokens are appended: attended by the next turn, never trained on

A turn that ends at EOS or at a recipe stop string ends the episode (after its ``step``, whose
observation is then dropped); so does ``done``, the turn limit, or the episode's token budget.
One instance serves one episode (the registered class is built per episode with the
recipe's ``env`` parameters), so an environment may keep whatever state it likes; ``seed`` is
drawn from the run's random stream, so a resumed run replays its episodes exactly.

The reward of an episode is the recipe's reward functions on the whole transcript (model and
environment text) plus the sum of the ``Step.reward`` values (per-turn rewards, e.g. a cost
per tool call). ``Step.info`` keys with numeric values are averaged over the episodes of a
step and logged as ``episode/<key>`` (e.g. ``tool_calls``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Environment", "Step"]


@dataclass
class Step:
    """What the environment returns for one model turn."""

    observation: str = ""
    reward: float = 0.0
    done: bool = False
    info: dict[str, float] = field(default_factory=dict)
    channel: str | None = None
    """Which of the environment's ``channels`` the observation comes from (e.g. one of two
    evidence streams); recorded per token in ``batch.aux["env_channel"]``."""


class Environment:
    """Base class (a protocol with defaults): override ``reset`` and ``step``.

    ``stop``: the strings that end a model turn as an action for this environment (they stay
    in the turn's text and tokens)."""

    stop: tuple[str, ...] = ()
    info_keys: tuple[str, ...] = ()  # the ``Step.info`` keys it reports (logged every step, 0 if unseen)
    # Named sources of observations; a token of channel ``channels[k]`` gets ``env_channel`` k + 1
    # (0: a model token, or an observation of no channel).
    channels: tuple[str, ...] = ()

    @classmethod
    def stops(cls, params: dict[str, Any]) -> tuple[str, ...]:
        """The stop strings of an environment built with ``params`` (default: ``stop``; an
        environment whose actions are configured, e.g. a remote one, reads them from its params)."""
        return cls.stop

    def close(self) -> None:
        """The episode is over (however it ended): release what it holds (a connection)."""

    def reset(self, problem, seed: int) -> str:
        """Start an episode on ``problem``; the first observation ('' for none)."""
        return ""

    def step(self, action: str) -> Step:
        """React to the model's turn ``action`` (its decoded text, stop string included)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
