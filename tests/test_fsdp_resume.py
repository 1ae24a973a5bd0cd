"""FSDP2 learner ranks that die, and runs that resume across rank counts (``reasonrl.train.fsdp``)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reasonrl.metrics_log import read_metrics

from fsdp_helpers import cli, close_metrics, max_relative_diff, one_process, recipe_file
from helpers import comparable, run_cli


def rank_pid(rank: int, timeout: float = 120.0) -> int:
    """The pid of learner rank ``rank`` of the one run under way (a child of torchrun)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"RANK={rank}".encode() in env and b"reasonrl.cli" in cmd and b"torch.distributed.run" not in cmd:
                return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"no learner rank {rank} found")


def test_a_killed_rank_ends_the_run_and_resume_with_two_or_one_rank_is_exact(tmp_path):
    """On the embedded model: the straight 2-rank run takes the single-process steps; a rank killed
    by kill -9 ends the run; --resume with 2 ranks, and with 1, gives the straight run; a checkpoint
    written by one process is refused by 2 ranks (exit 2)."""
    path = recipe_file(tmp_path, train={"steps": 4, "checkpoint_every": 2})
    cli("train", str(path), "-o", str(tmp_path / "straight"), "--nproc", "2", cwd=tmp_path)
    one_process(path, tmp_path / "one")
    assert max_relative_diff(tmp_path / "one", tmp_path / "straight") < 1e-5
    close_metrics(tmp_path / "one", tmp_path / "straight")

    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "reasonrl.cli", "train", str(path), "-o", str(run), "--nproc", "2"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = rank_pid(1)
    deadline = time.monotonic() + 180
    while not (run / "checkpoints" / "step_000002").is_dir():
        assert time.monotonic() < deadline and proc.poll() is None, "the run never wrote its step-2 checkpoint"
        time.sleep(0.02)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)  # no rank is left waiting in a collective
    assert time.monotonic() - killed_at < 60
    assert proc.returncode == 1
    assert "a learner rank failed or was killed" in err and f"--resume {run} --nproc 2" in err
    assert not (run / "final_model").exists()
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")] == ["step_000002"]

    subprocess.run(["cp", "-r", str(run), str(tmp_path / "killed1")], check=True)
    cli("train", "--resume", str(run), cwd=tmp_path)  # with the recipe's nproc: 2
    assert comparable(read_metrics(tmp_path / "straight")) == comparable(read_metrics(run))
    assert max_relative_diff(tmp_path / "straight", run) == 0.0

    cli("train", "--resume", str(tmp_path / "killed1"), "--nproc", "1", cwd=tmp_path)
    close_metrics(tmp_path / "straight", tmp_path / "killed1")
    assert max_relative_diff(tmp_path / "straight", tmp_path / "killed1") < 1e-6

    (tmp_path / "one" / "summary.json").unlink()  # the one-process run as if stopped at its last checkpoint
    done = run_cli("train", "--resume", str(tmp_path / "one"), "--nproc", "2", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "was written by one process; resume it with --nproc 1" in done.stderr
