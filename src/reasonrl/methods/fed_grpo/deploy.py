"""Fed-GRPO as real Flower processes: ``reasonrl fed-server`` and ``reasonrl fed-client``.

Both wrap Flower's own deployment runtime (flwr 1.42), never a transport of ours:

- ``serve`` (``fed-server``) starts a SuperLink (``flower-superlink``; in 1.42 its Fleet,
  Control and ServerAppIo APIs share one HTTP port), writes a Flower app project — a
  ``pyproject.toml`` whose components are ``reasonrl.methods.fed_grpo.apps:server_app`` / ``:client_app``
  and whose run config holds the recipe (JSON) and the output folder — submits it with
  ``flwr run --stream`` (the run's log streams to this terminal), and stops the SuperLink when
  the run ends or fails. Flower runs the ServerApp in a ``flwr-serverapp`` subprocess of the
  SuperLink; it writes ``metrics.jsonl``, ``final_model/`` and ``summary.json`` in OUT exactly
  as ``fed-sim`` does.
- ``join`` (``fed-client``) starts a SuperNode (``flower-supernode``) that connects to the
  SuperLink, with the node config ``partition-id`` (the client's index, Flower's convention) and
  ``state-dir`` (the client's own folder: its optimiser state, random streams and error-feedback
  residual between rounds). The recipe arrives with the run, so a client needs nothing but its
  index. It serves runs until stopped (Ctrl-C), starting the SuperNode again when it exits (a
  restarted SuperLink does not know it: Flower's SuperNode then shuts down).

Flower's working files (installed app bundles, the CLI's connection config) go to a
``FLWR_HOME`` inside OUT / the state folder, so nothing is written to ``~/.flwr``. Runtime
dependency installation (``uv sync`` of the app's dependencies) stays off: the app bundle has
none, reasonrl is already installed where each process runs.

Security: ``insecure=True`` is plain HTTP (one machine, a trusted network); otherwise the
SuperLink serves TLS with the given certificate and key and each client verifies it with
``root_certificates`` (Flower's ``--ssl-*`` / ``--root-certificates`` options).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from reasonrl.params import ConfigError

from reasonrl.sections import Recipe

__all__ = ["TLS", "app_project", "serve", "join", "supernode_command", "DEFAULT_PORT"]

DEFAULT_PORT = 9092  # the SuperLink's one HTTP port (Flower's Fleet API port before 1.42)
CLIENT_PORT_BASE = 9094  # each SuperNode's local Runtime API: 9094 + client index by default
RESTART_MIN_UPTIME_S, RESTART_DELAY_S = 10.0, 2.0  # fed-client restarts a SuperNode that exits
CONNECTION = "reasonrl"  # the SuperLink connection's name in the server's Flower config
APP_DIR, HOME_DIR = "flower_app", "flower_home"


@dataclass(frozen=True)
class TLS:
    """The SuperLink's certificate, key and CA certificate (PEM paths), for ``insecure=False``."""

    certfile: str
    keyfile: str
    ca_certfile: str


def _flower_exe(name: str) -> str:
    """A Flower console script: beside this interpreter (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.is_file() else shutil.which(name)
    if not found:
        raise ImportError(f"'{name}' not found: fed-server/fed-client need Flower: pip install 'reasonrl[fed]'")
    return found


def _toml_str(value: str) -> str:
    # A JSON string literal is a valid TOML basic string (same escapes: \" \\ \n \uXXXX).
    return json.dumps(value)


def app_project(folder: str | Path, recipe: Recipe, out: str | Path) -> Path:
    """Write the Flower app project ``flwr run`` submits; returns its folder. It holds only its
    ``pyproject.toml``: the apps are importable from the installed reasonrl."""
    from reasonrl.methods.fed_grpo.apps import OUT_KEY, RECIPE_KEY

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n".join([
        "[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
        "[project]", 'name = "reasonrl-fed-grpo"', 'version = "1.0.0"',
        'description = "Fed-GRPO (reasonrl): the federated recipe in the run config"',
        'license = "Apache-2.0"', "dependencies = []", "",
        "[tool.flwr.app]", 'publisher = "reasonrl"', "",
        "[tool.flwr.app.components]", 'serverapp = "reasonrl.methods.fed_grpo.apps:server_app"',
        'clientapp = "reasonrl.methods.fed_grpo.apps:client_app"', "",
        "[tool.flwr.app.config]",
        f"{RECIPE_KEY} = {_toml_str(json.dumps(recipe.to_dict()))}",
        f"{OUT_KEY} = {_toml_str(str(Path(out).resolve()))}", ""])
    (folder / "pyproject.toml").write_text(text)
    return folder


def _connection_config(home: Path, address: str, tls: TLS | None) -> None:
    """The Flower CLI's config (``$FLWR_HOME/config.toml``): one SuperLink connection."""
    home.mkdir(parents=True, exist_ok=True)
    auth = "insecure = true" if tls is None else f"root-certificates = {_toml_str(str(Path(tls.ca_certfile).resolve()))}"
    (home / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                                      f'address = "{address}"\n{auth}\n')


def _env(home: Path) -> dict[str, str]:
    # Flower's processes start their helpers (flower-superexec, flwr-serverapp, flwr-clientapp)
    # by name: its scripts' folder goes first on PATH, for a venv that is not activated.
    bin_dir = str(Path(_flower_exe("flower-superlink")).parent)
    return {**os.environ, "FLWR_HOME": str(home.resolve()), "FLWR_TELEMETRY_ENABLED": "0",
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}


def _own_session_dying_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    # Linux: SIGKILL when this process's parent dies, even by SIGKILL, so nothing is orphaned. Not
    # SIGTERM: a SuperLink's graceful shutdown waits for its open connections (a `flwr log` stream,
    # a SuperNode) to close, and an orphan has no one left to finish for.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(cmd: list[str], env: dict[str, str], log_file: Path | None = None) -> subprocess.Popen:
    """A Flower process in its own session: Ctrl-C in this terminal reaches this process only,
    which then stops it (``_stop``) in order; if this process is killed outright, the Flower
    process gets SIGKILL from the kernel (Linux's parent-death signal). The SuperExec it starts
    detaches into a session of its own and exits when its parent does (Flower's
    ``--parent-pid``); the ServerApp/ClientApp processes exit within half a second of their
    SuperExec (``apps._exit_with_superexec``). ``tests/test_fed_deploy.py`` kills fed-server and
    fed-client with SIGKILL and checks that none is left seconds later."""
    out = open(log_file, "ab") if log_file is not None else None
    try:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                preexec_fn=_own_session_dying_with_parent)
    finally:
        if out is not None:
            out.close()  # the child holds its own descriptor


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
    try:  # children the leader left behind
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _TermAsInterrupt:
    """SIGTERM (a service manager's stop, ``kill``) ends the process as Ctrl-C does, through the
    ``finally`` that stops the Flower processes it started (they run in their own sessions, so
    nothing else would stop them)."""

    def __enter__(self):
        self.previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self.previous)


def _wait_for_port(host: str, port: int, proc: subprocess.Popen, what: str, log_file: Path,
                   timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on {host}:{port}; "
                               f"its log: {log_file}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout_s:.0f} s; its log: {log_file}")


def serve(recipe: Recipe, out: str | Path, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          tls: TLS | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the federation with real Flower processes (module docstring); returns the server's
    summary once every round is done. Clients join with ``join`` (``reasonrl fed-client``) at any
    time: the first round waits until all ``clients`` are connected. A run whose OUT holds a
    server state resumes after its round (``apps.run_server``)."""
    from reasonrl.methods.fed_grpo.client import fed_settings

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    fed_settings(recipe)  # a federated recipe, checked before anything starts
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    home, app = out / HOME_DIR, app_project(out / APP_DIR, recipe, out)
    local = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host  # where this machine reaches it
    _connection_config(home, f"{local}:{port}", tls)
    env, link_log = _env(home), out / "superlink.log"
    cmd = [_flower_exe("flower-superlink"), "--host", host, "--port", str(port),
           "--disable-runtime-dependency-installation"]
    cmd += ["--insecure"] if tls is None else ["--ssl-certfile", tls.certfile, "--ssl-keyfile", tls.keyfile,
                                                "--ssl-ca-certfile", tls.ca_certfile]
    with _TermAsInterrupt():
        superlink, run = _start(cmd, env, link_log), None
        try:
            _wait_for_port(local, port, superlink, "flower-superlink", link_log)
            log(f"SuperLink on {host}:{port} (log: {link_log}); clients join with `reasonrl fed-client --client C "
                f"--superlink {local}:{port}{' --insecure' if tls is None else ''}`")
            # Started as the SuperLink is, so it dies with this process: an orphaned `flwr run` went
            # on streaming the run's log, keeping the SuperLink's graceful shutdown waiting.
            run = _start([_flower_exe("flwr"), "run", str(app), CONNECTION, "--stream"], env)
            if run.wait() != 0:
                raise RuntimeError(f"`flwr run` failed with code {run.returncode}; the SuperLink's log: {link_log}")
        finally:
            if run is not None:
                _stop(run)
            _stop(superlink)
    summary = out / "summary.json"
    if not summary.is_file():
        raise RuntimeError(f"the federated run ended without a summary in {out}: see the log above and {link_log}")
    return json.loads(summary.read_text())


def supernode_command(client: int, superlink: str, state_dir: str | Path, port: int | None = None,
                      root_certificates: str | None = None) -> list[str]:
    """``flower-supernode`` for client ``client`` (``insecure`` when no root certificate)."""
    if client < 0:
        raise ConfigError(f"--client must be >= 0, got {client}")
    if ":" not in superlink:
        raise ConfigError(f"--superlink must be HOST:PORT, got '{superlink}'")
    node_config = f"partition-id={client} state-dir={_toml_str(str(Path(state_dir).resolve()))}"
    cmd = [_flower_exe("flower-supernode"), "--superlink", superlink, "--node-config", node_config,
           "--port", str(CLIENT_PORT_BASE + client if port is None else port)]
    return cmd + (["--insecure"] if root_certificates is None else ["--root-certificates", root_certificates])


def join(client: int, superlink: str, state_dir: str | Path, port: int | None = None,
         root_certificates: str | None = None, log: Callable[[str], None] | None = None) -> int:
    """Serve as client ``client`` until stopped (Ctrl-C). A SuperNode whose SuperLink restarted
    (a crashed ``fed-server`` resumed) is not known to the new one and exits; it is started again
    so the client rejoins. One that exits within ``RESTART_MIN_UPTIME_S`` three times in a row
    (a wrong address, certificate, port) ends ``join`` with its exit code."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    state_dir = Path(state_dir)
    cmd = supernode_command(client, superlink, state_dir, port, root_certificates)  # refuses bad input first
    state_dir.mkdir(parents=True, exist_ok=True)  # so a refused client leaves no folder behind
    env = _env(state_dir / HOME_DIR)
    quick_exits = 0
    with _TermAsInterrupt():
        while True:
            started = time.monotonic()
            node = _start(cmd, env)
            try:
                code = node.wait()
            finally:
                _stop(node)
            quick_exits = quick_exits + 1 if time.monotonic() - started < RESTART_MIN_UPTIME_S else 0
            if quick_exits >= 3:
                log(f"client {client}: flower-supernode exited {quick_exits} times within "
                    f"{RESTART_MIN_UPTIME_S:.0f} s of starting (code {code}); giving up (see its log above)")
                return code or 1
            log(f"client {client}: flower-supernode exited (code {code}); starting it again in "
                f"{RESTART_DELAY_S:.0f} s")
            time.sleep(RESTART_DELAY_S)
