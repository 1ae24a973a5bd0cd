"""Evidence seeking over two long streams (OmniSeek-style, arXiv 2610.02181, on the embedded
model): the ``evidence`` environment, the ``evidence_seek`` task and the ``evidence_tool_use``
reward.

A problem hides two streams of ``length`` digits, stream A (an event log a_0..a_{L-1}) and
stream B (a sensor log b_0..b_{L-1}), in ``Problem.meta`` (never in the prompt). The prompt
names one position of each, ``A13+B7;``, and the answer is a_13 + b_7: it always needs one item
from each stream. The model reads a stream with a call ``A<start>-<end>]`` (``B…`` for B): the
environment answers with that segment's items, ``=417;`` (a_13 a_14 a_15), an observation of
channel ``"a"`` (``"b"`` for B), which the necessity reward (``methods.necessity``) masks. A
worked trajectory, the text the warm-up imitates::

    A13+B7;  ->  A13-15]=417;B7-7]=5;4+5=9;####9
    prompt       call   obs  call obs  answer

``]`` is the only stop string: it ends every call and appears nowhere else (not in answers, not
in observations), so a turn ending there is always a call. OmniSeek's tools are
get_audio_clip(t_s, t_e) / get_video_clip(t_s, t_e, ...): a segment of one modality by its
span; here the span is a range of positions, capped at ``max_segment`` items. An observation ends
in ``;``, a constant token: masking a channel's attention keys leaves the residual stream of the
observation's last position (which predicts the model's next token) holding only that
constant, not an item (see ``docs/methods/evidence_seeking.md``).

The warm-up (the SFT cold start, from synthetic trajectories): worked trajectories that call
both streams in a random order, each with a window of 1..``max_window`` items starting at the
asked position (so the item wanted is the first one answered). A share ``skip_fraction`` of them
calls only one stream and writes a guessed digit for the other (a self-consistent sum, usually
wrong): supervised learning copies the habit of answering without the evidence, and only a
reward on the answer (or on tool use, or on necessity) removes it, as the arithmetic task's
bracket mistake does.

Hints (``hint_accuracy`` p, off by default): the prompt also carries a noisy prior for each asked
item, ``A13=4+B7=5;``: each hint is the true item with probability p, else another digit. That is
the text-only shortcut OmniSeek's necessity reward is aimed at: answering from the hints alone is
right with probability p², calling one stream and trusting the other's hint with p, and only
calling both is always right. The warm-up's skipped stream then takes its hint (the shortcut)
instead of a blind guess.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Annotated

from reasonrl.envs.base import Environment, Step
from reasonrl.params import Range
from reasonrl.policy.char_tokenizer import ARITHMETIC_CHARS
from reasonrl.registry import ENVIRONMENTS, REWARDS, TASKS
from reasonrl.rewards.basic import exact_answer
from reasonrl.problem import Problem
from reasonrl.tasks.base import in_eval_split

__all__ = ["EvidenceEnv", "EvidenceSeekTask", "evidence_tool_use", "answer_call", "CALL_RE"]

STREAMS = ("A", "B")  # the call letters; stream "A" is channel "a", "B" is channel "b"
CLOSE = "]"
CALL_RE = re.compile(r"([AB])(\d{1,3})-(\d{1,3})\]")  # one call: stream, first and last position
_CALL_AT_END = re.compile(CALL_RE.pattern + r"$")


def answer_call(stream: str, start: int, end: int, max_segment: int) -> str | None:
    """The observation for a call of ``stream[start..end]`` (inclusive): ``=`` + those items +
    ``;``, or None when the range is not one the environment answers (``start > end``, past the
    stream's end, or more than ``max_segment`` items)."""
    if start > end or end >= len(stream) or end - start + 1 > max_segment:
        return None
    return f"={stream[start:end + 1]};"


@ENVIRONMENTS.register("evidence")
@dataclass
class EvidenceEnv(Environment):
    """Answers a turn that ends in a call ``A<i>-<j>]`` / ``B<i>-<j>]`` with items i..j of that
    stream (``=417;``, channel ``"a"`` / ``"b"``), or ``=;`` (no channel, counted in
    ``tool_errors``) for a range it does not answer; any other turn ends the episode.

    ``max_segment``: items per call (the segment-length cap). ``max_calls``: calls answered
    per episode; a further call ends it. ``call_cost``: a per-turn reward of −cost per call.

    An error reply ``=;`` is an observation of no channel: it holds no item of the stream, so
    masking a stream (the necessity reward) never hides it.

    Info (logged as ``episode/<key>``): ``calls_a``, ``calls_b``, ``used_both`` (1 once the
    episode has had an item of each stream answered), ``tool_errors``."""

    max_segment: Annotated[int, Range(ge=1)] = 4
    max_calls: Annotated[int, Range(ge=1)] = 8
    call_cost: Annotated[float, Range(ge=0)] = 0.0

    stop = (CLOSE,)
    channels = ("a", "b")
    info_keys = ("calls_a", "calls_b", "used_both", "tool_errors")

    def reset(self, problem, seed: int) -> str:
        meta = getattr(problem, "meta", None) or {}
        if not all(isinstance(meta.get(k), str) for k in self.channels):
            raise ValueError("the 'evidence' environment needs problems whose meta holds the streams 'a' and 'b' "
                             "(the 'evidence_seek' task's)")
        self.streams = {"A": meta["a"], "B": meta["b"]}
        self.calls, self.answered = {"A": 0, "B": 0}, {"A": 0, "B": 0}
        return ""

    def step(self, action: str) -> Step:
        call = _CALL_AT_END.search(action)
        if call is None or sum(self.calls.values()) >= self.max_calls:
            return Step(done=True)
        letter, start, end = call.group(1), int(call.group(2)), int(call.group(3))
        both_before = all(self.answered.values())
        self.calls[letter] += 1
        observation = answer_call(self.streams[letter], start, end, self.max_segment)
        self.answered[letter] += observation is not None
        info = {"calls_a": float(letter == "A"), "calls_b": float(letter == "B"),
                "used_both": float(all(self.answered.values()) and not both_before),
                "tool_errors": float(observation is None)}
        # An error reply carries no item of the stream, so it belongs to no channel: tagged as the
        # stream's, its constant "=;" was something the necessity reward could pay for (a policy
        # trained with it learned to make malformed calls and depend on the error reply's tokens).
        return Step(observation=observation or "=;", reward=-self.call_cost if self.call_cost else 0.0,
                    info=info, channel=letter.lower() if observation is not None else None)

    def state_dict(self):
        return {"calls": dict(self.calls), "answered": dict(self.answered)}

    def load_state_dict(self, state):
        self.calls, self.answered = dict(state["calls"]), dict(state["answered"])


@REWARDS.register("evidence_tool_use")
def evidence_tool_use(completion: str, problem: Problem, **_) -> float:
    """OmniSeek's tool-use reward: 1.0 when the transcript holds a call (``A3-5]`` / ``B7-7]``)
    *and* its ``####`` answer is right, else 0.0 (a call with a wrong answer earns nothing, so
    calling is never rewarded for itself)."""
    return float(CALL_RE.search(completion) is not None and exact_answer(completion, problem) == 1.0)


@TASKS.register("evidence_seek")
@dataclass
class EvidenceSeekTask:
    """Problems ``A<i>+B<j>;`` over two hidden streams of ``length`` digits (``meta["a"]``,
    ``meta["b"]``); answer a_i + b_j. The train/eval split is by a stable hash of the whole
    problem (both streams and both positions). See the module docstring for the warm-up
    (``skip_fraction``, ``max_window``)."""

    length: Annotated[int, Range(ge=2, le=999)] = 30
    eval_fraction: float = 0.1
    skip_fraction: Annotated[float, Range(ge=0, le=1)] = 0.6
    max_window: Annotated[int, Range(ge=1)] = 3
    hint_accuracy: Annotated[float | None, Range(ge=0, le=1)] = None
    name: str = "evidence_seek"
    alphabet = ARITHMETIC_CHARS + "AB" + CLOSE

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"task.eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if not 0.0 <= self.skip_fraction <= 1.0:
            raise ValueError(f"task.skip_fraction must be in [0, 1], got {self.skip_fraction}")
        if self.hint_accuracy is not None and not 0.0 <= self.hint_accuracy <= 1.0:
            raise ValueError(f"task.hint_accuracy must be in [0, 1] (or null for no hints), got {self.hint_accuracy}")
        if self.max_window < 1 or not 2 <= self.length <= 999:
            raise ValueError(f"task.max_window must be >= 1 and task.length in 2..999, got {self.max_window}, "
                             f"{self.length}")

    def _draw(self, rng: random.Random, held_out: bool) -> Problem:
        """A problem of the requested split (drawn until the hash puts it there)."""
        while True:
            a = "".join(rng.choice("0123456789") for _ in range(self.length))
            b = "".join(rng.choice("0123456789") for _ in range(self.length))
            i, j = rng.randrange(self.length), rng.randrange(self.length)
            if in_eval_split(f"{a}|{b}|{i}|{j}", self.eval_fraction) == held_out:
                break
        meta = {"a": a, "b": b, "i": i, "j": j}
        prompt = f"A{i}+B{j};"
        if self.hint_accuracy is not None:  # drawn only with hints, so the hint-free problems never change
            meta["hints"] = self._hint(rng, a[i]) + self._hint(rng, b[j])
            prompt = f"A{i}={meta['hints'][0]}+B{j}={meta['hints'][1]};"
        return Problem(prompt=prompt, answer=str(int(a[i]) + int(b[j])),
                       solution=f"A{i}-{i}]={a[i]};B{j}-{j}]={b[j]};{a[i]}+{b[j]}={int(a[i]) + int(b[j])};"
                                f"####{int(a[i]) + int(b[j])}",
                       meta=meta)

    def _hint(self, rng: random.Random, item: str) -> str:
        """The prompt's prior for ``item``: the item itself with probability ``hint_accuracy``,
        else one of the nine other digits uniformly."""
        if rng.random() < self.hint_accuracy:
            return item
        return rng.choice([d for d in "0123456789" if d != item])

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"evidence:{seed}:{step}")
        return [self._draw(rng, held_out=False) for _ in range(count)]

    def eval_problems(self, count: int) -> list[Problem]:
        rng = random.Random("evidence:eval")
        return [self._draw(rng, held_out=True) for _ in range(count)]

    def trajectory(self, problem: Problem, rng: random.Random) -> str:
        """A worked trajectory for ``problem`` (calls, the environment's answers as plain text,
        the sum and ``####N``), drawn as the module docstring describes."""
        meta = problem.meta
        streams, positions = {"A": meta["a"], "B": meta["b"]}, {"A": meta["i"], "B": meta["j"]}
        order = list(STREAMS) if rng.random() < 0.5 else list(reversed(STREAMS))
        if rng.random() < self.skip_fraction:
            order.remove(rng.choice(order))
        values, parts = {}, []
        for s in order:
            start = positions[s]
            end = min(start + rng.randrange(self.max_window), self.length - 1)
            parts.append(f"{s}{start}-{end}]={streams[s][start:end + 1]};")
            values[s] = int(streams[s][start])
        hints = meta.get("hints")
        for k, s in enumerate(STREAMS):
            # The skipped stream: its prompt hint (the text-only shortcut) where there is one, else a guess.
            values.setdefault(s, int(hints[k]) if hints else rng.randrange(10))
        total = values["A"] + values["B"]
        return "".join(parts) + f"{values['A']}+{values['B']}={total};####{total}"

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Training problems whose ``solution`` is a worked trajectory (the SFT cold start)."""
        rng = random.Random(f"evidence-warmup:{seed}:{step}")
        out = []
        for _ in range(count):
            p = self._draw(rng, held_out=False)
            out.append(Problem(p.prompt, p.answer, self.trajectory(p, rng), p.meta))
        return out
