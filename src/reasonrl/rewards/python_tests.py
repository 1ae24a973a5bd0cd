"""The ``python_tests`` reward: run the completion's code with the problem's tests in the sandbox.

The code is the last fenced ```python block of the completion (``py``/``python3`` and a
bare ``` fence count too), or the whole completion when it has no fenced block. It runs
in :func:`reasonrl.isolation.sandbox.run_python` followed by ``problem.meta["tests"]`` (a
string of ``assert`` statements) and then a line that writes a random token to stderr: the
reward is 1.0 iff the program ended with status ``"ok"`` *and* wrote the token (stderr,
so that a solution's own prints cannot push it past the output bound), so code that
exits early with status 0 (``sys.exit(0)``, ``os._exit(0)``) before the tests ran scores
0. It does not stop deliberate tampering from the same process (an object whose ``==``
is always true, rewriting the program file to learn the token): see docs/sandbox.md.

The reward protocol returns a float, so the run's reason (``"exit code 1:
AssertionError"``...) is not recorded per sample; :func:`check` returns the whole
:class:`~reasonrl.isolation.sandbox.SandboxResult` for callers that want it.
"""

from __future__ import annotations

import re
import secrets

from reasonrl.registry import REWARDS
from reasonrl.isolation.sandbox import SandboxResult, run_python
from reasonrl.problem import Problem

FENCE_RE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The last ```python fenced block (else the last bare ``` block), else the whole text."""
    blocks = FENCE_RE.findall(completion)
    tagged = [body for lang, body in blocks if lang]
    if tagged:
        return tagged[-1]
    return blocks[-1][1] if blocks else completion


def check(completion: str, tests: str, **limits) -> tuple[bool, SandboxResult]:
    """``(passed, result)``: the completion's code and ``tests`` run in one sandboxed program."""
    token = f"reasonrl-tests-passed-{secrets.token_hex(8)}"
    program = f"{extract_code(completion)}\n\n# --- tests ---\n{tests}\n\n__import__('sys').stderr.write({token!r} + '\\n')\n"
    result = run_python(program, **limits)
    passed = result.ok and token in result.stderr
    return passed, result


@REWARDS.register("python_tests")
def python_tests(completion: str, problem: Problem, *, sandbox_timeout_s: float = 5.0, memory_mb: int = 256,
                 max_procs: int = 16, **_) -> float:
    """1.0 when the completion's code passes ``problem.meta["tests"]`` in the sandbox, else 0.0.

    ``sandbox_timeout_s`` is the program's wall time (not the reward spec's ``timeout_s``,
    which bounds the whole call in the scorer and should stay above it)."""
    tests = problem.meta.get("tests")
    if not isinstance(tests, str) or not tests.strip():
        raise ValueError("reward 'python_tests' needs problem.meta['tests'], a string of Python asserts")
    passed, _ = check(completion, tests, timeout_s=sandbox_timeout_s, memory_mb=memory_mb, max_procs=max_procs)
    return float(passed)
