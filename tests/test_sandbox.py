"""The code sandbox (reasonrl.isolation.sandbox): hostile programs are contained, scored as
failures with their reason, leave nothing running and write nothing outside.

The battery runs on every backend that works here. A backend that should work (Linux,
user namespaces allowed, its tool installed) but does not is a failure, not a skip;
where none can work, ``test_unavailable_is_loud`` checks the error instead.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from reasonrl.isolation.sandbox import SandboxPool, SandboxUnavailable, choose_backend, run_python, sandbox_backend
from reasonrl.isolation.sandbox.choice import probe
from reasonrl.isolation.sandbox.result import classify


def _userns_allowed() -> bool:
    try:
        return int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
    except (OSError, ValueError):
        return False


_PROBED: dict[str, str | None] = {}


@pytest.fixture(params=["bwrap", "unshare"])
def backend(request) -> str:
    name = request.param
    tool = "bwrap" if name == "bwrap" else "unshare"
    if name not in _PROBED:
        _PROBED[name] = probe(name)
    why = _PROBED[name]
    if why is None:
        return name
    if sys.platform.startswith("linux") and _userns_allowed() and shutil.which(tool):
        pytest.fail(f"the {name} sandbox should work here (Linux, user namespaces allowed, {tool} installed) "
                    f"but does not: {why}")
    pytest.skip(f"{name} sandbox unavailable here: {why}")


def run(code: str, backend: str, **limits):
    return run_python(textwrap.dedent(code), backend=backend, **limits)


def _processes_with(marker: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                shown = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry}: {shown}")
    return found


def _wait_gone(marker: str, seconds: float = 2.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# ---------------------------------------------------------------- normal programs


def test_normal_program_ok(backend):
    r = run("import sys\nprint('hello', 6 * 7)\nprint('warn', file=sys.stderr)\n", backend)
    assert (r.status, r.reason, r.returncode) == ("ok", "exit code 0", 0)
    assert r.ok and r.stdout == "hello 42\n" and r.stderr == "warn\n" and not r.truncated_output
    assert r.backend == backend and 0 < r.wall_s < 10 and r.cpu_s is not None and r.cpu_s >= 0


def test_errors_are_failures_with_their_reason(backend):
    r = run("1 / 0\n", backend)
    assert (r.status, r.returncode) == ("error", 1)
    assert r.reason == "exit code 1: ZeroDivisionError: division by zero"
    r = run("import sys\nsys.exit(3)\n", backend)
    assert (r.status, r.reason, r.returncode) == ("error", "exit code 3", 3)
    r = run("def f(:\n", backend)
    assert r.status == "error" and "SyntaxError" in r.reason


def test_the_reason_names_the_exception_even_when_a_childs_half_traceback_comes_last():
    # a fork bomb's children are killed mid-write after the parent's own traceback ends
    stderr = ("Traceback (most recent call last):\n  File \"/tmp/main.py\", line 3, in <module>\n"
              "BlockingIOError: [Errno 11] Resource temporarily unavailable\n"
              "Traceback (most recent call last):\n  File \"/tmp/main.py\", line 3, in <module>\n")
    common = dict(report=None, killed_for=None, timeout_s=5.0, cpu_limit_s=5, memory_mb=256, output_bound=100)
    assert classify(exit_code=1, stderr=stderr, **common) == (
        "error", "exit code 1: BlockingIOError: [Errno 11] Resource temporarily unavailable", 1)
    # no exception line at all: the last non-empty line, as before
    assert classify(exit_code=2, stderr="usage: x\nbad flag\n\n", **common) == ("error", "exit code 2: bad flag", 2)
    assert classify(exit_code=2, stderr="", **common) == ("error", "exit code 2", 2)


def test_stdin_and_files(backend):
    code = """
        import helper, sys
        lines = sys.stdin.read().split()
        print(sum(map(int, lines)), open('data/input.txt').read().strip(), helper.VALUE)
    """
    r = run(code, backend, stdin="1 2\n3\n", files={"data/input.txt": "payload\n", "helper.py": "VALUE = 'mod'\n"})
    assert r.ok, r.reason
    assert r.stdout == "6 payload mod\n"


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        run_python("print(1)", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb must be >= 32"):
        run_python("print(1)", memory_mb=8)
    with pytest.raises(ValueError, match="not a plain relative path"):
        run_python("print(1)", files={"../escape.txt": "x"})
    with pytest.raises(ValueError, match="not a plain relative path"):
        run_python("print(1)", files={"/etc/passwd": "x"})
    with pytest.raises(TypeError, match="code must be a str"):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="unknown sandbox backend 'docker'"):
        run_python("print(1)", backend="docker")


# ---------------------------------------------------------------- each limit, enforced


def test_wall_time_limit(backend):
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
    r = run(f"import os, time\nos.system('sleep {marker} &')\ntime.sleep(60)\n", backend, timeout_s=1.0)
    assert (r.status, r.reason, r.returncode) == ("timeout", "wall time 1 s exceeded", None)
    assert r.wall_s < 4.0
    assert _wait_gone(marker) == []


def test_cpu_time_limit(backend):
    r = run("while True:\n    pass\n", backend, timeout_s=15.0, cpu_s=1)
    assert r.status == "timeout"
    assert r.reason == "CPU time 1 s exceeded (SIGXCPU)"
    assert r.returncode == -24 and r.cpu_s is not None and r.cpu_s >= 0.9


def test_memory_limit(backend):
    r = run("x = bytearray(512 * 2**20)\n", backend, memory_mb=128)
    assert (r.status, r.reason) == ("memory", "memory limit 128 MB exceeded (MemoryError)")
    bomb = "a = []\nwhile True:\n    a.append(' ' * 2**20)\n"
    r = run(bomb, backend, memory_mb=64, timeout_s=10.0)
    assert r.status == "memory" and "64 MB" in r.reason


def test_disk_limits(backend):
    r = run("with open('big', 'wb') as f:\n    f.seek(80 << 20)\n    f.write(b'x')\n", backend, memory_mb=64)
    # RLIMIT_FSIZE; Python ignores SIGXFSZ (and so do its children), so the write fails
    assert (r.status, r.reason) == ("error", "exit code 1: OSError: [Errno 27] File too large")
    fill = "with open('a', 'wb') as f, open('b', 'wb') as g:\n    for _ in range(50):\n" \
           "        f.write(b'x' * 2**20)\n        g.write(b'y' * 2**20)\n"
    r = run(fill, backend, memory_mb=64)
    assert r.status == "error" and "No space left on device" in r.reason


def test_process_limit_is_exact_and_per_sandbox(backend):
    code = """
        import os, time
        n = 0
        for _ in range(30):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(3)
                os._exit(0)
            n += 1
        print(n)
    """
    # Two sandboxes at once: each gets its own max_procs (the program itself is one of them).
    with SandboxPool(workers=2, backend=backend) as pool:
        results = [pool.submit(textwrap.dedent(code), max_procs=5) for _ in range(2)]
        results = [f.result() for f in results]
    for r in results:
        assert r.ok, r.reason
        assert r.stdout == "4\n"


def test_output_limit(backend):
    r = run("import sys\nsys.stdout.write('x' * 30000)\nsys.stderr.write('e' * 50)\n", backend,
            max_output_bytes=10000)
    assert r.ok and r.truncated_output
    assert r.stdout == "x" * 10000 and r.stderr == "e" * 50
    r = run("while True:\n    print('y' * 1000)\n", backend, max_output_bytes=10000, timeout_s=20.0)
    assert r.status == "killed" and r.reason.startswith("output limit exceeded")
    assert r.truncated_output and len(r.stdout) == 10000 and r.wall_s < 10


# ---------------------------------------------------------------- hostile programs


def test_fork_bomb(backend):
    r = run("import os\nwhile True:\n    os.fork()\n", backend, timeout_s=5.0)
    assert r.status == "error" and "BlockingIOError" in r.reason
    # the host can still start processes, and nothing of the bomb is left
    assert subprocess.run(["true"]).returncode == 0
    assert _wait_gone("os.fork()") == []


def test_writing_outside_the_sandbox(backend, tmp_path):
    token = secrets.token_hex(6)
    targets = [f"/work/main/evil-{token}", f"/root/evil-{token}", f"/tmp/evil-{token}", str(tmp_path / "evil"),
               f"/usr/evil-{token}", f"/evil-{token}", f"/etc/evil-{token}"]
    code = f"""
        import os
        for path in {targets!r}:
            try:
                with open(path, 'w') as f:
                    f.write('pwned')
                print('wrote', path)
            except OSError as exc:
                print('refused', path, type(exc).__name__)
    """
    r = run(code, backend)
    assert r.ok, r.reason
    # inside, only the private /tmp is writable (so the host-named /tmp path "succeeds" in there)
    assert f"wrote /tmp/evil-{token}" in r.stdout
    for path in targets:
        assert not os.path.exists(path), path
        if not path.startswith("/tmp/"):
            assert f"refused {path}" in r.stdout


def test_reading_home_project_and_shadow(backend):
    code = """
        import os
        for path in ['/etc/shadow', '/root', '/home', '/work', '/work/main/pyproject.toml']:
            print(path, os.path.exists(path))
        open('/etc/shadow').read()
    """
    r = run(code, backend)
    assert r.status == "error" and "FileNotFoundError" in r.reason and "/etc/shadow" in r.reason
    for path in ["/etc/shadow", "/root", "/home", "/work", "/work/main/pyproject.toml"]:
        assert f"{path} False" in r.stdout


def test_no_network(backend):
    r = run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n", backend)
    assert r.status == "error"
    assert "Network is unreachable" in r.reason or "Errno 101" in r.reason
    r = run("import socket\nsocket.getaddrinfo('example.com', 80)\n", backend)
    assert r.status == "error" and "gaierror" in r.reason


def test_killing_the_parent_or_everything(backend):
    r = run("import os, time\nos.kill(os.getppid(), 9)\ntime.sleep(0.5)\nprint('still here')\n", backend)
    if backend == "bwrap":  # the parent is the supervisor: the sandbox ends with it
        assert r.status == "killed" and "SIGKILL" in r.reason and r.stdout == ""
    else:  # the parent is the supervisor as PID 1 of the namespace: the kernel ignores the signal
        assert r.ok and r.stdout == "still here\n"
    # kill(-1): every process it may signal, i.e. (in its PID namespace) all but init and itself
    r = run("import os, time\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass\ntime.sleep(0.3)\nprint('alive')\n",
            backend)
    if backend == "bwrap":
        assert r.status == "killed" and "SIGKILL" in r.reason
    else:  # nothing but the program and the supervisor (init) in there: no one to kill
        assert r.ok and r.stdout == "alive\n"
    assert os.getpid() and subprocess.run(["true"]).returncode == 0  # we are still here


def test_detached_child_does_not_outlive_the_run(backend):
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6) + 1}"
    code = f"""
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv('/bin/sleep', ['sleep', '{marker}'])
            os._exit(0)
        os.wait()
        import time; time.sleep(0.3)
        print('parent done')
    """
    r = run(code, backend)
    assert r.ok and r.stdout == "parent done\n"
    assert _wait_gone(marker) == []


_CALLER = """
import os, sys, types
import reasonrl
# Skip reasonrl.rewards' __init__ (it imports torch): only the sandbox package is needed.
pkg = types.ModuleType("reasonrl.rewards")
pkg.__path__ = [os.path.join(os.path.dirname(reasonrl.__file__), "rewards")]
sys.modules["reasonrl.rewards"] = pkg
from reasonrl.isolation.sandbox import run_python
run_python("import os, time\\nos.system('sleep %s &')\\ntime.sleep(60)", backend=sys.argv[1], timeout_s=60)
"""


def test_sandbox_dies_with_its_caller(backend):
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6) + 2}"
    caller = subprocess.Popen([sys.executable, "-c", _CALLER.replace("%s", marker), backend])
    try:
        deadline = time.monotonic() + 15
        def sleeping() -> bool:  # the sandboxed `sleep MARKER` itself, not the caller's command line
            return any(p.split(": ", 1)[1].startswith("sleep ") for p in _processes_with(marker))

        while not sleeping() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sleeping(), "the sandboxed sleep never started"
    finally:
        caller.kill()  # SIGKILL: the caller gets no chance to clean up
        caller.wait()
    assert _wait_gone(marker, 5.0) == []


def test_os_system_is_contained(backend, tmp_path):
    host_file = tmp_path / "keep-me"
    host_file.write_text("precious")
    code = f"""
        import os
        print(os.system('echo hi; cat /etc/shadow; ls /root; touch /work/evil-sys; rm -f {host_file}; id -u'))
    """
    r = run(code, backend)
    assert r.ok, r.reason
    assert r.stdout.startswith("hi\n1000\n")
    assert host_file.read_text() == "precious"
    assert not os.path.exists("/work/evil-sys")


# ---------------------------------------------------------------- pool, backend choice, CLI


def test_pool_keeps_order_and_closes():
    codes = [f"import time\ntime.sleep({0.3 if i % 2 == 0 else 0})\nprint({i})" for i in range(6)]
    with SandboxPool(workers=3, timeout_s=10.0) as pool:
        results = pool.map(codes)
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
        assert [r.stdout for r in pool.map(["print(input())"] * 2, stdins=["a", "b"])] == ["a\n", "b\n"]
    with pytest.raises(RuntimeError, match="closed"):
        pool.map(["print(1)"])
    pool.close()  # idempotent
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        SandboxPool(workers=0)


def test_unavailable_is_loud():
    with pytest.raises(SandboxUnavailable) as info:
        choose_backend(find=lambda tool: None)
    message = str(info.value)
    assert "bwrap: bwrap is not installed" in message and "unshare: unshare is not installed" in message
    assert "apt-get install -y bubblewrap" in message and "user namespaces" in message
    try:
        backend = sandbox_backend()
    except SandboxUnavailable as exc:  # only where no backend can work (the battery then skips)
        assert "no sandbox for model-written code works on this machine" in str(exc)
    else:
        assert backend in ("bwrap", "unshare") and sandbox_backend() == backend


def test_refusal_is_explained(monkeypatch):
    """A backend the kernel refuses (simulated: fake tools that fail the way bwrap and
    unshare do without user namespaces) gives SandboxUnavailable naming the refusal."""
    fake = Path(tempfile.mkdtemp(prefix="reasonrl-fakebin-"))
    try:
        fake.chmod(0o755)  # the sandbox's tool runs as uid 65534 when we are root
        for tool, line in (("bwrap", "bwrap: setting up uid map: Permission denied"),
                           ("unshare", "unshare: unshare failed: Operation not permitted")):
            (fake / tool).write_text(f"#!/bin/sh\necho '{line}' >&2\nexit 1\n")
            (fake / tool).chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
        with pytest.raises(SandboxUnavailable) as info:
            choose_backend()
    finally:
        shutil.rmtree(fake)
    message = str(info.value)
    assert "bwrap: bwrap: setting up uid map: Permission denied (the kernel refused to create a user namespace)" \
        in message
    assert "unshare: unshare: unshare failed: Operation not permitted (the kernel refused" in message
    assert "sysctl -w user.max_user_namespaces" in message


def test_cli_sandbox(tmp_path, capsys):
    from reasonrl.cli import main

    sandbox_backend()
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("print('hi')\n")
    bad.write_text("import time\ntime.sleep(30)\n")
    assert main(["sandbox", str(good)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["status"] == "ok" and line["stdout"] == "hi\n" and line["reason"] == "exit code 0"
    assert set(line) == {"status", "reason", "stdout", "wall_s", "backend"}
    assert main(["sandbox", str(bad), "--timeout", "1"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out)["reason"] == "wall time 1 s exceeded"
    assert main(["sandbox", str(tmp_path / "missing.py")]) == 2
    assert f"no such file: {tmp_path / 'missing.py'}" in capsys.readouterr().err
    assert main(["sandbox", str(good), "--memory-mb", "1"]) == 2
    assert "memory_mb must be >= 32" in capsys.readouterr().err


def test_python_tests_reward():
    from reasonrl.registry import REWARDS
    from reasonrl.rewards.python_tests import extract_code
    from reasonrl.problem import Problem

    sandbox_backend()
    reward = REWARDS.get("python_tests")
    problem = Problem("write add", "", meta={"tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0"})
    right = "Sure:\n```python\ndef add(a, b):\n    return a - b\n```\nFixed:\n```python\ndef add(a, b):\n    return a + b\n```"
    assert reward(right, problem) == 1.0
    assert reward("def add(a, b):\n    return a * b\n", problem) == 0.0  # no fence: the whole text
    assert reward("```python\nimport sys\nsys.exit(0)\n```", problem) == 0.0  # exiting early is no pass
    assert reward("```python\nwhile True: pass\n```", problem, sandbox_timeout_s=1.0) == 0.0
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    with pytest.raises(ValueError, match="needs problem.meta"):
        reward(right, Problem("p", ""))
