"""``train.engine: ray``: the learner ranks as Ray actors in one placement group.

The driver (``reasonrl train``, or :func:`reasonrl.train`) reaches a Ray cluster through
``ray.init`` (``RAY_ADDRESS`` names an existing one, e.g. one started under Slurm with Ray's own
``ray start --head`` / ``ray start --address``, see docs/scaling.md; without it a local cluster
is started and shut down here), reserves one bundle per rank (``PACK``: on as few machines as
fit; one CPU, or one GPU with ``model.device`` on CUDA), and starts one actor per bundle. Each
actor sets the environment torchrun would (``MASTER_ADDR``/``MASTER_PORT`` of rank 0's actor,
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) and runs :func:`reasonrl.train.launch.run_rank`, so the
ranks are those of ``reasonrl.train.fsdp`` whatever started them. Actors that rank 0 creates
(the rollout workers of ``rollout.source: async`` with ``engine: ray``) are captured into the same
placement group. When any rank fails, the driver kills the others: none waits in a collective
for a peer that is gone. Checkpoints are written by every rank into the run folder, so on more
than one machine it must be on a shared file system.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from reasonrl.params import ConfigError
from reasonrl.rollout.endpoints import ray_session, ray_shutdown
from reasonrl.train.launch import run_rank


class _Rank:
    """One learner rank: a Ray actor running ``run_rank`` with torchrun's environment."""

    def address(self) -> tuple[str, int]:
        """This actor's machine and a free port there, for rank 0's rendezvous."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def run(self, recipe, run_dir: str, resume: bool, rank: int, size: int, master: tuple[str, int]):
        os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]), RANK=str(rank), WORLD_SIZE=str(size),
                          LOCAL_RANK="0")  # Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES: device 0
        return run_rank(recipe, Path(run_dir), resume)


def run_on_ray(recipe, run_dir: Path, resume: bool, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run ``recipe`` with ``train.nproc`` learner ranks as Ray actors; rank 0's summary."""
    ray = ray_session()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    n = recipe.train.nproc
    gpu = recipe.model.device.startswith("cuda")
    bundle = {"CPU": 1, **({"GPU": 1} if gpu else {})}
    group = placement_group([bundle] * n, strategy="PACK")
    actors: list[Any] = []
    try:
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            raise ConfigError(f"train.engine: ray: the cluster could not place {n} learner ranks of {bundle} within "
                              f"{timeout_s:.0f}s (ray.cluster_resources(): {ray.cluster_resources()})")
        for i in range(n):
            strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i,
                                                        placement_group_capture_child_tasks=True)
            actors.append(ray.remote(_Rank).options(num_cpus=1, num_gpus=1 if gpu else 0,
                                                    scheduling_strategy=strategy).remote())
        master = ray.get(actors[0].address.remote())
        futures = [a.run.remote(recipe, str(run_dir), resume, i, n, master) for i, a in enumerate(actors)]
        pending, summary = list(futures), None
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayTaskError as exc:  # a rank raised: its own error, as in one process
                raise exc.as_instanceof_cause() from None
            except ray.exceptions.RayActorError as exc:
                raise RuntimeError(f"learner rank {futures.index(done[0])} died ({type(exc).__name__}); the other "
                                   f"ranks were stopped. The checkpoints in {run_dir}/checkpoints are intact: "
                                   f"continue with reasonrl train --resume {run_dir}") from None
            if done[0] is futures[0]:
                summary = result
        return summary
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(group)
        ray_shutdown()
