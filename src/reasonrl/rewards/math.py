"""Math-answer reward: extract the final answer, check equivalence with math-verify.

math-verify (HuggingFace) decides whether two answers are mathematically equal
(``\\frac{1}{2}`` vs ``0.5``, ``2\\sqrt{2}`` vs ``\\sqrt{8}``, ``50\\%`` vs ``0.5``).
Its own timeouts use ``signal.alarm``, which only works in the main thread: from a
worker thread it raises (Math-Verify#50) and in Ray workers it silently scored
every sample 0 (verl PR #5635). So we switch those timeouts off
(``parsing_timeout=None``, ``timeout_seconds=None``) and run parse + verify in a
``TimeoutRunner`` worker process instead, which kills a runaway sympy computation
from any thread or process.

Install with ``pip install 'reasonrl[math]'`` (the ``math-verify`` package).
"""

from __future__ import annotations

import importlib.util
import re
from typing import TYPE_CHECKING

from reasonrl.registry import REWARDS
from reasonrl.isolation.timeout import Status, TimeoutRunner

if TYPE_CHECKING:  # keeps the verifier worker from importing the tasks package
    from reasonrl.problem import Problem

__all__ = ["VerifierError", "VerifierTimeout", "extract_prediction", "answers_equivalent",
           "math_verify_reward"]

INSTALL_HINT = "math_verify reward needs the math-verify package: pip install 'reasonrl[math]'"


class VerifierError(RuntimeError):
    """The verifier could not give a verdict (worker crashed, could not start...)."""


class VerifierTimeout(VerifierError):
    """Verification took longer than its timeout; the worker was killed.

    Raised rather than returning 0.0 so the scorer counts it as a failure and warns."""


# -- extraction ----------------------------------------------------------------------

_BOXED_RE = re.compile(r"\\boxed\s*\{")
# A '-' is a sign only when it is not a binary minus ("10-3" ends in 3, not -3).
# Thousands groups must be exactly three digits ("1,234" yes; "1,2" is a list).
_NUMBER_RE = re.compile(
    r"(?:(?<![\w)\]}.])(?P<sign>[-\u2212]))?"
    r"(?<![\w.])"
    r"(?P<body>\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?P<den>/\d+(?!\.\d|,\d))?"
)


def _balanced_from(text: str, start: int) -> str | None:
    """The text from ``start`` to the brace closing the one just before it, or None."""
    depth, i = 1, start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # \{ and \} are literal braces in LaTeX, not grouping
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


def _last_boxed(text: str) -> str | None:
    for match in reversed(list(_BOXED_RE.finditer(text))):
        content = _balanced_from(text, match.end())
        if content is not None:
            return content
    return None


def _normalize_number(match: re.Match) -> str:
    sign = "-" if match.group("sign") else ""
    return sign + match.group("body").replace(",", "") + (match.group("den") or "")


def extract_prediction(text: str) -> str | None:
    """The final answer of a completion, as a string, or None when it gives none.

    Rules, first that applies: (1) the content of the last complete ``\\boxed{...}``
    (braces balanced, so ``\\boxed{\\frac{1}{2}}`` works; an unclosed one at a
    truncation point is ignored); an empty box means "no answer" and does not fall
    through to the number rules; (2) the first number after the last ``####``
    (GSM8K style; nothing numeric after it means no answer); (3) the last number in
    the text. Numbers lose thousands separators (``1,234`` -> ``1234``), keep a
    sign when it is not a binary minus, decimals, and ``a/b`` fractions; a trailing
    period is not part of the number.
    """
    if not text:
        return None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip() or None
    marker = text.rfind("####")
    if marker != -1:
        match = _NUMBER_RE.search(text, marker + 4)
        return _normalize_number(match) if match else None
    last = None
    for last in _NUMBER_RE.finditer(text):
        pass
    return _normalize_number(last) if last else None


# -- equivalence ---------------------------------------------------------------------

# One worker per process for this verifier. Skipping reasonrl.rewards' __init__ keeps
# torch (imported by rewards.basic) out of it: ~60 MB and ~0.5 s to start instead of
# ~220 MB and ~2 s, which matters because a timeout means a restart.
_RUNNER = TimeoutRunner(preload=("math_verify", __name__), skip_package_init=("reasonrl.rewards",))
_checked_install = False
_quieted = False


def _require_math_verify() -> None:
    global _checked_install
    if not _checked_install:
        # The import itself happens in the worker; here we only fail early and clearly.
        if importlib.util.find_spec("math_verify") is None:
            raise ImportError(INSTALL_HINT)
        _checked_install = True


def _quiet_disabled_timeout_warning() -> None:
    """math-verify warns once per process that its timeout is off; in our worker that
    is by design (the runner enforces it), and each restart would repeat it."""
    global _quieted
    if _quieted:
        return
    import logging

    class _DropDisabledTimeout(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith("Timeout is disabled")

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropDisabledTimeout())
    _quieted = True


def _verify_in_worker(pred: str, gold: str) -> bool:
    # Runs inside the runner's worker process (module-level so it pickles by name).
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    _quiet_disabled_timeout_warning()
    # Wrapping both sides in \boxed{} makes math-verify read them as LaTeX answers
    # (so "1/2", "\frac12", "50\%" and "1,234" all parse) rather than search for one.
    gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None)
    pred_parsed = parse("\\boxed{" + pred + "}", parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    # math-verify's verify is not symmetric: gold first.
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def answers_equivalent(pred: str, gold: str, timeout: float = 5.0) -> bool:
    """Whether answer ``pred`` equals ``gold`` mathematically, per math-verify.

    Runs math-verify's parse + verify in a killable worker process, with its own
    ``signal.alarm`` timeouts disabled, because those break off the main thread
    (Math-Verify#50) and silently scored 0 in Ray workers (verl PR #5635). Works from
    any thread and inside multiprocessing pool workers; calls from several threads
    are serialised on one worker.

    Returns False when either side does not parse. Raises ``VerifierTimeout`` when
    the check takes longer than ``timeout`` seconds (the worker is killed and the
    next call restarts it), ``VerifierError`` when the worker fails otherwise, and
    ``ImportError`` when math-verify is not installed.
    """
    _require_math_verify()
    if not pred.strip() or not gold.strip():
        return False
    result = _RUNNER.call(_verify_in_worker, (pred, gold), timeout=timeout)
    if result.status is Status.OK:
        return bool(result.value)
    if result.status is Status.TIMEOUT:
        raise VerifierTimeout(f"math-verify took longer than {timeout} s on answer {pred[:80]!r}")
    if result.error and result.error.startswith(("ImportError", "ModuleNotFoundError")):
        raise ImportError(INSTALL_HINT + f" ({result.error})")
    raise VerifierError(f"math-verify failed: {result.error}")


@REWARDS.register("math_verify")
def math_verify_reward(completion: str, problem: "Problem", *, timeout: float = 5.0, **_) -> float:
    """1.0 when the completion's final answer equals ``problem.answer`` per math-verify, else 0.0.

    The answer is found by :func:`extract_prediction` (last ``\\boxed{}``, else the
    number after ``####``, else the last number); equivalence is
    :func:`answers_equivalent`, which runs in a killable worker process because
    math-verify's own ``signal.alarm`` timeout breaks outside the main thread
    (Math-Verify#50) and silently scored 0 in Ray workers (verl PR #5635).

    A missing or unparseable answer scores 0.0. A check slower than ``timeout``
    seconds raises ``VerifierTimeout`` (a worker crash ``VerifierError``); the scorer
    turns either into 0.0 for that sample, counts it in ``Scores.failures`` and warns
    once, so a pathological answer never stalls or kills training.
    """
    _require_math_verify()
    pred = extract_prediction(completion)
    if pred is None:
        return 0.0
    return float(answers_equivalent(pred, problem.answer, timeout))
