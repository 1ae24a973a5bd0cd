"""``reasonrl fed-server`` / ``fed-client`` as real Flower processes (SuperLink, SuperNodes,
``flwr run``): 3 clients x 3 rounds, and client 2 killed with SIGKILL (its whole process
group: SuperNode, SuperExec, ClientApp) while it trains round 2. Flower's own failure handling
gives the server an error reply for it; round 2 aggregates the other two and the run finishes."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import MINI_TINY

pytest.importorskip("flwr")
ROOT = Path(__file__).resolve().parents[1]
MARK_ENV = "REASONRL_TEST_TRAINING_MARK"


# A reward file the clients load by path (the recipe names it): digit-count parity, a reward the
# untrained model earns about half the time; in the process given MARK_ENV each call also appends
# a line to that file, so the test sees when this client trains, and sleeps a little, so the
# round lasts long enough to be hit.
MARKED_REWARD = f"""
import os, time

def marked_parity(completion, problem, **_):
    mark = os.environ.get({MARK_ENV!r})
    if mark:
        with open(mark, "a") as f:
            f.write("1\\n")
        time.sleep(0.2)
    return float(sum(ch.isdigit() for ch in completion) % 2)
"""


def cmdline(p) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie whose command line cannot be read
        return ""


def status(p):
    try:
        return p.status()
    except psutil.NoSuchProcess:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, log, env=None):
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "reasonrl.cli", *args], stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True, cwd=ROOT)
    proc.stdout_log = log
    return proc


def rows(out):
    path = out / "metrics.jsonl"
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())} if path.is_file() else {}


def wait_for(cond, timeout_s, what, procs):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, (f"{dead[0].args[3:5]} ended while waiting for {what}: "
                          f"{Path(dead[0].stdout_log).read_text()[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc, sig, timeout_s=30):
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_app_project_carries_the_recipe_and_the_client_its_index(tmp_path):
    """The app project ``flwr run`` submits: its run config is the recipe (JSON inside TOML,
    read back equal) and the output folder; a client's node config is its index and folder."""
    import tomllib

    from reasonrl.config import load_recipe
    from reasonrl.methods.fed_grpo.deploy import app_project, supernode_command

    recipe = load_recipe(ROOT / "recipes" / "fed_grpo.yaml", ['log.experiment=a "quoted" \\ name'])
    folder = app_project(tmp_path / "app", recipe, tmp_path / "out")
    assert [p.name for p in folder.iterdir()] == ["pyproject.toml"]  # nothing else goes into the bundle
    config = tomllib.loads((folder / "pyproject.toml").read_text())
    flwr = config["tool"]["flwr"]
    assert flwr["app"]["components"] == {"serverapp": "reasonrl.methods.fed_grpo.apps:server_app",
                                         "clientapp": "reasonrl.methods.fed_grpo.apps:client_app"}
    assert json.loads(flwr["app"]["config"]["recipe-json"]) == recipe.to_dict()
    assert flwr["app"]["config"]["out"] == str((tmp_path / "out").resolve())
    cmd = supernode_command(2, "10.0.0.1:9092", tmp_path / "c2")
    node = cmd[cmd.index("--node-config") + 1]
    assert tomllib.loads(node.replace(" ", "\n")) == {"partition-id": 2, "state-dir": str((tmp_path / "c2").resolve())}
    assert cmd[cmd.index("--port") + 1] == "9096" and "--insecure" in cmd  # 9094 + client index


@pytest.mark.parametrize("args, message", [
    (["fed-client", "--client", "0", "--superlink", "127.0.0.1:9092"], "exactly one of --insecure"),
    (["fed-client", "--client", "0", "--superlink", "localhost", "--insecure"], "HOST:PORT"),
    (["fed-client", "--client", "-1", "--superlink", "127.0.0.1:9092", "--insecure"], "--client must be >= 0"),
    (["fed-server", "recipes/fed_grpo.yaml", "-o", "OUT"], "needs --insecure"),
    (["fed-server", "recipes/fed_grpo.yaml", "-o", "OUT", "--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem",
      "--ssl-ca-certfile", "ca.pem"], "TLS file c.pem does not exist"),
    (["fed-server", "recipes/grpo.yaml", "-o", "OUT", "--insecure"], "exactly one `fed_grpo` entry"),
    (["fed-sim", "recipes/fed_grpo.yaml", "-o", "USED"], "is not empty; use --resume"),
    (["fed-sim", "--resume", "-o", "OUT"], "is not a federation's output folder"),
    (["fed-server", "recipes/fed_grpo.yaml", "--resume", "-o", "USED", "--insecure"], "give neither a RECIPE"),
    (["fed-sim", "-o", "OUT"], "needs a RECIPE.yaml"),
])
def test_bad_arguments_exit_2_before_anything_starts(args, message, tmp_path, capsys, monkeypatch):
    from reasonrl.cli import main

    monkeypatch.chdir(ROOT)
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "metrics.jsonl").write_text("")
    args = [{"OUT": str(tmp_path / "out"), "USED": str(tmp_path / "used")}.get(a, a) for a in args]
    client_dirs = {*ROOT.glob("fed_client_*"), *ROOT.glob("runs/fed_client_*")}
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and [p.name for p in (tmp_path / "used").iterdir()] == ["metrics.jsonl"]
    # a refused client leaves no state folder (they used to appear in the clone's root)
    assert {*ROOT.glob("fed_client_*"), *ROOT.glob("runs/fed_client_*")} == client_dirs


def test_fed_client_restarts_its_supernode_and_gives_up_on_quick_exits(tmp_path, monkeypatch):
    """A SuperNode that exits after serving a while (its SuperLink restarted and forgot it) is
    started again; three exits within RESTART_MIN_UPTIME_S of starting end fed-client with the code."""
    from reasonrl.methods.fed_grpo import deploy

    runs = tmp_path / "runs"
    script = (f"import pathlib, sys, time; p = pathlib.Path({str(runs)!r}); n = len(p.read_text()) if p.exists() "
              f"else 0; p.write_text('x' * (n + 1)); time.sleep(1.0 if n == 0 else 0); sys.exit(0 if n == 0 else 3)")
    monkeypatch.setattr(deploy, "supernode_command", lambda *a, **k: [sys.executable, "-c", script])
    monkeypatch.setattr(deploy, "RESTART_MIN_UPTIME_S", 0.5)
    monkeypatch.setattr(deploy, "RESTART_DELAY_S", 0.0)
    logs = []
    assert deploy.join(0, "127.0.0.1:1", tmp_path / "c0", log=logs.append) == 3
    assert len(runs.read_text()) == 4  # the long run, then three quick failures
    assert "exited (code 0); starting it again" in logs[0] and "giving up" in logs[-1] and len(logs) == 4


def test_a_flower_process_dies_with_the_command_that_started_it(tmp_path):
    """fed-server/fed-client killed with SIGKILL (no chance to stop what they started): the
    kernel sends their Flower process SIGKILL (Linux's parent-death signal), nothing is orphaned."""
    code = ("import os, sys, time; from reasonrl.methods.fed_grpo.deploy import _start; "
            "p = _start([sys.executable, '-c', 'import time; time.sleep(60)'], dict(os.environ)); "
            "print(p.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    child = psutil.Process(int(parent.stdout.readline()))
    assert child.ppid() == parent.pid and os.getsid(child.pid) == child.pid  # its own session
    parent.kill()
    parent.wait()
    _, alive = psutil.wait_procs([child], timeout=10)
    assert not [p for p in alive if status(p) not in (psutil.STATUS_ZOMBIE, None)]


@pytest.mark.slow
def test_real_processes_survive_a_client_killed_mid_round(tmp_path):
    out, port = tmp_path / "server", free_port()
    reward = tmp_path / "marked_reward.py"
    reward.write_text(MARKED_REWARD)
    sets = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()]
    sets += ["rollout.num_generations=4", "rollout.max_new_tokens=16", "train.prompts_per_step=4",
             "train.micro_batch_size=16", "train.threads=1", "eval.size=8", "log.progress=false",
             f'rewards=[{{"name": "exact_answer"}}, {{"name": "{reward}:marked_parity"}}]',
             "fed.rounds=3", "fed.local_steps=1"]
    server = start(["fed-server", str(ROOT / "recipes" / "fed_grpo.yaml"), "-o", str(out), "--port", str(port),
                    "--insecure", *[a for s in sets for a in ("--set", s)]], tmp_path / "server.log")
    mark = tmp_path / "client2.mark"
    clients = [start(["fed-client", "--client", str(c), "--superlink", f"127.0.0.1:{port}", "--insecure",
                      "--state-dir", str(tmp_path / f"client{c}"), "--port", str(free_port())],
                     tmp_path / f"client{c}.log", env={MARK_ENV: str(mark)} if c == 2 else None)
               for c in range(3)]
    procs = [server, *clients]
    spawned: list = []
    try:
        wait_for(lambda: 1 in rows(out), 300, "round 1", procs)
        seen = mark.read_text().count("\n")
        wait_for(lambda: mark.read_text().count("\n") > seen, 120, "client 2 training round 2", procs)
        assert 2 not in rows(out)
        tree = [psutil.Process(clients[2].pid), *psutil.Process(clients[2].pid).children(recursive=True)]
        assert any("clientapp" in cmdline(p) for p in tree)  # the ClientApp process at work
        for p in tree:  # the client machine dies: fed-client, SuperNode, SuperExec, ClientApp, no goodbye
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        clients[2].wait(10)
        server.wait(300)
        assert server.returncode == 0, (tmp_path / "server.log").read_text()[-3000:]
    finally:  # stop everything whatever happened, then check that stopping needed no force
        spawned = [c for p in procs if p.poll() is None for c in psutil.Process(p.pid).children(recursive=True)]
        for p in procs:
            stop(p, signal.SIGKILL if p is server else signal.SIGTERM)
        _, alive = psutil.wait_procs(spawned, timeout=20)
        left = [p for p in alive if status(p) not in (psutil.STATUS_ZOMBIE, None)]
        for p in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
    assert not left, f"Flower processes outlived their client: {[cmdline(p) for p in left]}"
    assert [p.returncode for p in clients[:2]] == [0, 0]  # fed-client stops cleanly on SIGTERM
    r = rows(out)
    assert sorted(r) == [0, 1, 2, 3]
    assert r[1]["fed/clients/ok"] == 3 and r[1]["fed/clients/failed"] == 0
    assert r[2]["fed/clients/ok"] == 2 and r[2]["fed/clients/failed"] == 1  # killed mid-round: left out
    assert "fed/weight/c2" not in r[2] and r[2]["fed/weight/c0"] + r[2]["fed/weight/c1"] == pytest.approx(1.0)
    assert r[3]["fed/clients/ok"] == 2 and "fed/weight/c2" not in r[3]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["final_accuracy"] is not None
    assert (out / "final_model").is_dir() and (tmp_path / "client0" / "client_state.pt").is_file()
    assert json.loads(r[0] and (out / "recipe.json").read_text())["methods"][0]["rounds"] == 3


def test_killed_fed_server_and_client_leave_no_flower_process(tmp_path):
    """fed-server and fed-client killed with SIGKILL (no chance to stop what they started) while
    the ServerApp waits for its other clients: every process under them — ``flwr run``, the
    SuperLink, the SuperNode, their SuperExecs (sessions of their own) and the ServerApp — is gone
    within seconds. Before, the orphaned ``flwr run`` held the SuperLink's log stream open, the
    SuperLink's graceful shutdown waited for it, and all of them outlived the kill by minutes."""
    out, port = tmp_path / "server", free_port()
    sets = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()] + ["eval.size=4", "log.progress=false"]
    server = start(["fed-server", str(ROOT / "recipes" / "fed_grpo.yaml"), "-o", str(out), "--port", str(port),
                    "--insecure", *[a for s in sets for a in ("--set", s)]], tmp_path / "server.log")
    client = start(["fed-client", "--client", "0", "--superlink", f"127.0.0.1:{port}", "--insecure",
                    "--state-dir", str(tmp_path / "client0"), "--port", str(free_port())], tmp_path / "client.log")
    tree: list = []
    left: list = []
    try:  # round 0's evaluation written: the ServerApp runs reasonrl's code; round 1 waits for 3 clients
        wait_for(lambda: 0 in rows(out), 300, "the server's round 0", [server, client])
        tree = [c for p in (server, client) for c in psutil.Process(p.pid).children(recursive=True)]
        names = [cmdline(p).split(" ")[1].rsplit("/", 1)[-1] for p in tree]
        assert sorted(names) == ["flower-superexec", "flower-superexec", "flower-superlink", "flower-supernode",
                                 "flwr", "flwr-serverapp"], names
        server.kill()
        client.kill()
        _, alive = psutil.wait_procs(tree, timeout=20)  # generous: "it did not hang"
        left = [p for p in alive if status(p) not in (psutil.STATUS_ZOMBIE, None)]
    finally:
        for p in [server, client, *tree]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                p.kill()
        server.wait()
        client.wait()
    assert not left, f"Flower processes outlived the killed fed-server/fed-client: {[cmdline(p) for p in left]}"
