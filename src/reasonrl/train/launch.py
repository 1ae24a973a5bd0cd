"""Starting the learner ranks of ``train.nproc`` > 1 (``reasonrl.train.fsdp``).

- Inside a launched rank (torchrun, Slurm's ``srun torchrun``, or a Ray actor of
  ``reasonrl.train.ray_ranks``: the environment names ``RANK`` and ``WORLD_SIZE``),
  :func:`run_rank` joins the process group; rank 0 runs the :class:`Trainer`, the others
  :func:`reasonrl.train.fsdp.follow`.
- ``reasonrl train --nproc N`` on one machine runs :func:`launch_torchrun`: torch's own
  launcher (``python -m torch.distributed.run --standalone``) starts N copies of the same
  command, watches them, and stops them all when one dies (kill -9 included), so no rank
  waits in a collective for a peer that is gone. Rank 0 leaves its exit status in a file, so
  bad input found after the start (exit 2) still exits 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from reasonrl.train.fsdp import follow, init_ranks
from reasonrl.train.trainer import Trainer

EXIT_FILE = "REASONRL_EXIT_FILE"  # where rank 0 of a launched run writes its exit status


def launched_rank() -> tuple[int, int] | None:
    """(rank, world size) when a launcher (torchrun, Slurm's, Ray's actors here) started this
    process as a learner rank: even one rank alone then trains through FSDP2."""
    if not all(os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):  # what a launcher always sets
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def run_rank(recipe, run_dir: Path, resume: bool, log: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """This rank's part of the run: rank 0 returns the run's summary, the others None."""
    init_ranks(recipe)
    try:
        if dist.get_rank() == 0:
            return Trainer(recipe, run_dir, resume=resume, log=log).run()
        follow(recipe, log)
        return None
    finally:
        dist.destroy_process_group()


def write_exit_status(code: int) -> None:
    """Rank 0 of a run started by :func:`launch_torchrun` leaves its exit status for the launcher."""
    path = os.environ.get(EXIT_FILE)
    if path and os.environ.get("RANK", "0") == "0":
        Path(path).write_text(str(code))


def launch_torchrun(command: list[str], nproc: int, run_dir: Path, log: Callable[[str], None]) -> int:
    """Run ``reasonrl <command>`` as ``nproc`` ranks under torchrun on this machine; returns the
    exit status (rank 0's own when it wrote one, 1 when a rank died)."""
    with tempfile.TemporaryDirectory(prefix="reasonrl-ranks-") as tmp:
        status = Path(tmp) / "rank0.exit"
        env = {**os.environ, EXIT_FILE: str(status)}
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "--monitor_interval=0.5", "-m", "reasonrl.cli", *command]
        log(f"starting {nproc} learner ranks: {' '.join(argv[1:])}")
        code = subprocess.run(argv, env=env).returncode
        rank0 = int(status.read_text()) if status.is_file() and status.read_text().strip() else None
    if rank0 == 2:  # bad input found by rank 0 (its message is above)
        return 2
    if code != 0 or rank0:
        log(f"reasonrl: error: a learner rank failed or was killed (torchrun's report above names it; exit {code}); "
            f"the other ranks were stopped. The checkpoints in {run_dir}/checkpoints are intact: continue with "
            f"reasonrl train --resume {run_dir} --nproc {nproc}")
        return 1
    return 0
