"""OpenEnv environments (``env: {name: openenv}``, ``reasonrl.envs.openenv``): our episode loop
drives examples/openenv/calculator_server.py — the calculator written with OpenEnv's own API and
served by OpenEnv on the loopback, started and stopped here — over OpenEnv's WebSocket sessions.
The same scripted turns give the very batch the in-process calculator gives; a server that dies
ends episodes, never the run. The server's interpreter is ``$REASONRL_OPENENV_PYTHON``
(``make openenv-env``; under CI a missing one fails, since ``make test`` installs it)."""

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch

import reasonrl.policy.hf as hf_policy
from reasonrl.config import load_recipe
from reasonrl.envs.openenv import ws_url
from reasonrl.metrics_log import read_metrics
from reasonrl.problem import Problem
from reasonrl.rollout.episodes import EpisodeRollout, sample_problems
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, require_interpreter, scripted
from test_episodes import calculator_recipe, tools_policy

SERVER = Path(__file__).resolve().parents[1] / "examples" / "openenv" / "calculator_server.py"
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "openenv_calculator.yaml"
PYTHON_ENV = "REASONRL_OPENENV_PYTHON"


def openenv_python() -> str:
    return require_interpreter(os.environ.get(PYTHON_ENV) or None, "OpenEnv",
                               f"`make openenv-env` and export {PYTHON_ENV}=$PWD/.venv-openenv/bin/python", ".venv-openenv")


def start_server(python: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Not this process's PYTHONPATH: an earlier test in this worker may have exported .venv's
    # site-packages there (Flower's Ray backend does), and the server's venv would import them.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([python, str(SERVER), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with proc.stderr:
                raise RuntimeError(f"the OpenEnv server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    proc.wait()
    proc.stderr.close()
    raise RuntimeError("the OpenEnv server did not answer /health within 90 s")


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(openenv_python())
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    proc.stderr.close()


def openenv_recipe(url, env=None, **sections):
    return calculator_recipe(env={"name": "openenv", "url": url, "stop": ["]"], **(env or {})}, **sections)


def test_ws_url():
    assert ws_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/ws"
    assert ws_url("https://h/") == "wss://h/ws" and ws_url("ws://h/ws") == "ws://h/ws"
    with pytest.raises(ValueError, match="env.url"):
        ws_url("127.0.0.1:8000")


def test_openenv_episodes_are_the_in_process_calculators_batch(server, monkeypatch):
    problem = Problem("1+2*4;", "12")
    batches = []
    for recipe in (calculator_recipe(), openenv_recipe(server)):
        pol = tools_policy()
        seen = []
        monkeypatch.setattr(hf_policy, "sample_completions", scripted(["[1+2]", "[3*4]", "12;####12</s>"], pol.tokenizer, seen))
        ep = EpisodeRollout(pol, recipe)
        batches.append((sample_problems(ep, [problem], 2, 12, 1.0, torch.Generator().manual_seed(0)), seen, ep.metrics()))
    (here, seen_here, m_here), (remote, seen_remote, m_remote) = batches
    for key in ("prompt_ids", "completion_ids", "completion_mask", "loss_mask", "sample_logprobs"):
        assert torch.equal(getattr(here, key), getattr(remote, key)), key
    assert seen_here == seen_remote  # every turn was sampled from the same ids
    assert remote.texts == ["[1+2]=3[3*4]=1212;####12"] * 2
    # the OpenEnv server scores the episode itself: 1 for the right answer given at reset
    assert here.env_rewards.tolist() == [0.0, 0.0] and remote.env_rewards.tolist() == [1.0, 1.0]
    assert m_remote["episode/turns"] == m_here["episode/turns"] == 3 and m_remote["episode/openenv_errors"] == 0


def test_a_server_that_is_gone_ends_episodes_not_the_run(monkeypatch):
    proc, url = start_server(openenv_python())
    proc.kill()
    proc.wait()
    proc.stderr.close()
    pol = tools_policy()
    monkeypatch.setattr(hf_policy, "sample_completions", scripted(["[1+2]"], pol.tokenizer, []))
    ep = EpisodeRollout(pol, openenv_recipe(url, env={"timeout_s": 2}))
    start = time.monotonic()
    s = sample_problems(ep, [Problem("1+2;", "3")], 2, 12, 1.0, torch.Generator().manual_seed(0))
    assert time.monotonic() - start < 10
    assert s.env_rewards.tolist() == [0.0, 0.0] and ep.metrics()["episode/openenv_errors"] == 1.0


def test_the_recipe_trains_on_openenv_episodes_with_the_environments_reward_alone(server, tmp_path):
    overrides = [f"env.url={server}", "train.steps=2", "train.prompts_per_step=4", "eval.size=4", "log.plots=false",
                 *(f"model.tiny.{k}={v}" for k, v in MINI_TINY.items())]
    recipe = load_recipe(RECIPE, overrides)
    assert recipe.rewards == []
    Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "run") if "reward/mean" in r]
    assert len(rows) == 2 and all(r["episode/openenv_errors"] == 0 for r in rows)
    assert all(r["reward/mean"] == pytest.approx(r["reward/env"]) for r in rows)
