"""Where an asynchronous sampler runs: a child process (``local``) or a Ray actor (``ray``).

An endpoint runs one ``SamplerWorker`` loop and carries two message streams, learner →
sampler (weights, stop) and sampler → learner (batches, errors). Both engines move plain
picklable objects (tensors, dataclasses); a sampler whose tokens come from a vLLM engine
receives the same messages (``reasonrl.rollout.vllm_engine``). Nothing here schedules or places work: the local engine is one ``spawn``-ed
process; the Ray engine is one actor per worker on whatever cluster ``ray.init`` reached
(a local one started here when none is running). No home-made cluster manager.
"""

from __future__ import annotations

import os
import pickle
import queue
import traceback
from typing import Any

import torch
import torch.multiprocessing as mp

from reasonrl.params import ConfigError

__all__ = ["LocalEndpoint", "RayEndpoint", "worker_main", "ray_session"]


def worker_main(recipe_dict: dict, threads: int, start: dict, inbox, outbox) -> None:
    """A sampler's whole life: build it from the recipe, loop, report any failure."""
    try:
        torch.set_num_threads(threads)
        from reasonrl.recipe import recipe_from_dict
        from reasonrl.rollout.sampler_worker import SamplerWorker

        SamplerWorker(recipe_from_dict(recipe_dict, "async sampler"), start).loop(inbox, outbox)
    except ConfigError as exc:  # the recipe's fault (a reward failing on most calls): the learner exits 2 with it
        outbox.put(("config_error", str(exc)))
    except BaseException:  # the learner reports it; nothing may die silently
        outbox.put(("error", traceback.format_exc()))
    finally:
        if hasattr(outbox, "flush"):
            outbox.flush()


class PipeSender:
    """The sampler's end of its outgoing stream: a pipe written by a thread of its own (as
    ``multiprocessing.Queue``'s feeder), so sampling goes on while a batch waits to be read.
    A pipe rather than a Queue because the learner closes its copy of the write end: a
    sampler that dies, even mid-message, then reads as end-of-file instead of a hang."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.pending: queue.Queue | None = None

    def put(self, message) -> None:
        if self.pending is None:
            import threading

            self.pending = queue.Queue()
            self.thread = threading.Thread(target=self._send_all, daemon=True)
            self.thread.start()
        self.pending.put(message)

    def _send_all(self) -> None:
        while True:
            message = self.pending.get()
            if message is None:
                return
            self.conn.send(message)

    def flush(self) -> None:
        if self.pending is not None:
            self.pending.put(None)
            self.thread.join()


class LocalEndpoint:
    """The sampler in a child process with its own torch threads."""

    def __init__(self, recipe_dict: dict, threads: int, start: dict) -> None:
        ctx = mp.get_context("spawn")
        self.inbox = ctx.Queue()
        self.reader, writer = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=worker_main, name="reasonrl-sampler", daemon=True,
                                   args=(recipe_dict, threads, start, self.inbox, PipeSender(writer)))
        self.process.start()
        writer.close()  # the child holds the only write end now

    def send(self, message) -> None:
        self.inbox.put(message)

    def receive(self, timeout: float):
        """The next message, or None after ``timeout`` seconds; ``("dead", why)`` if the process died."""
        try:
            if self.reader.poll(timeout):
                return self.reader.recv()
        except (EOFError, OSError, pickle.UnpicklingError) as exc:  # died, maybe mid-message
            self.process.join(timeout=5)
            return ("dead", f"the sampler process died (exit code {self.process.exitcode}; {type(exc).__name__})")
        if not self.process.is_alive():
            return ("dead", f"the sampler process died (exit code {self.process.exitcode})")
        return None

    def kill(self) -> None:  # for tests: what a crash looks like
        os.kill(self.process.pid, 9)

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.inbox.put(("stop",))
            except (OSError, ValueError):
                pass
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.inbox.cancel_join_thread()  # never block this process's exit on a dead reader
        self.inbox.close()
        self.reader.close()


_RAY_STARTED_HERE = False


def ray_session():
    """The ``ray`` module, connected: an existing ``ray.init(...)`` (or ``RAY_ADDRESS``) is
    used as it is; otherwise a local cluster is started here and shut down by ``close``."""
    global _RAY_STARTED_HERE
    try:
        import ray
    except ImportError:
        from reasonrl.params import ConfigError

        raise ConfigError("rollout.engine: ray needs Ray: pip install 'reasonrl[ray]'") from None
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if not os.environ.get("RAY_ADDRESS"):
            kwargs["num_cpus"] = os.cpu_count() or 2
        ray.init(**kwargs)
        _RAY_STARTED_HERE = True
    return ray


def ray_shutdown() -> None:
    """Shut Ray down if this process started it (a user's own cluster connection stays)."""
    global _RAY_STARTED_HERE
    if _RAY_STARTED_HERE:
        import ray

        ray.shutdown()
        _RAY_STARTED_HERE = False


class _RayWorker:
    """The Ray actor: the sampler loop on a thread of its own, fed through in-process queues by
    concurrent actor calls (no queue actors, which would each unpickle every tensor again)."""

    def __init__(self, recipe_dict, threads, start) -> None:
        import threading

        self.inbox, self.outbox = queue.Queue(), queue.Queue()
        self.runner = threading.Thread(target=worker_main, args=(recipe_dict, threads, start, self.inbox, self.outbox),
                                       daemon=True)
        self.runner.start()

    def send(self, message) -> None:
        self.inbox.put(message)

    def receive(self, timeout: float):
        try:
            return self.outbox.get(timeout=timeout)
        except queue.Empty:
            return None if self.runner.is_alive() else ("dead", "the sampler loop ended")

    def pid(self) -> int:
        return os.getpid()


class RayEndpoint:
    """The sampler as a Ray actor (one process per worker, wherever the cluster places it)."""

    def __init__(self, recipe_dict: dict, threads: int, start: dict) -> None:
        self.ray = ray_session()
        # Concurrent calls: receive() may wait while send() delivers weights.
        self.actor = self.ray.remote(num_cpus=0, max_concurrency=4)(_RayWorker).remote(recipe_dict, threads, start)

    def send(self, message) -> None:
        self.actor.send.remote(message)

    def receive(self, timeout: float):
        try:
            return self.ray.get(self.actor.receive.remote(timeout))
        except self.ray.exceptions.RayActorError as exc:  # the actor's process is gone
            return ("dead", f"the sampler actor died ({type(exc).__name__})")

    def kill(self) -> None:  # for tests: what a crash looks like
        os.kill(self.ray.get(self.actor.pid.remote()), 9)

    def stop(self) -> None:
        try:
            self.ray.get(self.actor.send.remote(("stop",)), timeout=5)
        except Exception:  # a dead actor: nothing left to stop gracefully
            pass
        try:
            self.ray.kill(self.actor)
        except Exception:
            pass
