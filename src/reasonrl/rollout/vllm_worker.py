"""The vLLM engine's process (``rollout.engine: vllm``; the client is ``reasonrl.rollout.vllm_engine``).

Run by path, ``python vllm_worker.py FD_IN FD_OUT``, by an interpreter that has vLLM: ours, or
the separate environment ``make vllm-env`` builds where vLLM's transformers pin cannot be
shared (docs/vllm.md). It imports nothing of reasonrl, only the standard library and vLLM, so
it runs in either. One JSON object per line in, one per line out, on two pipes of its own:
vLLM writes its logs to stdout/stderr, which the client sends to a log file.

Requests (``{"op": ...}``), each answered ``{"ok": true, ...}`` or ``{"ok": false, "error": tb}``:

- ``start``: ``model`` (a safetensors folder), ``args`` (keyword arguments of ``vllm.LLM``),
  ``lora_rank`` (None: no adapters) — load the engine;
- ``generate``: ``prompts`` (token id lists), per prompt ``n``, ``seed``, ``max_tokens``, and
  ``temperature``, ``stop`` — answered with, per prompt, ``n`` completions
  ``[token_ids, logprobs, finish_reason]``: the ids as sampled (an EOS or the token that
  completed a stop string included) and each token's log-prob under the distribution it was
  drawn from (``logprobs_mode="processed_logprobs"``: after the temperature), and the
  ``seconds`` vLLM took (the client measures its own overhead against them);
- ``reload``: ``path`` — load new weights in place from a safetensors folder
  (``reload_weights``), the engine's own in-place update;
- ``adapter``: ``name``, ``id``, ``path`` — load a LoRA adapter folder; later generations use it
  and the previous adapter is dropped;
- ``stop``: exit.

End of input (the client is gone, even killed) ends the process too, and every process of its
session (vLLM's engine core and workers) with it; the synced weights in ``$REASONRL_VLLM_SCRATCH``
are removed. A guard process does the same if this process is killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time


SCRATCH_ENV = "REASONRL_VLLM_SCRATCH"  # the client's folder of synced weights


def serve(fd_in: int, fd_out: int) -> None:
    scratch = os.environ.get(SCRATCH_ENV, "")
    _guard(fd_in, fd_out, scratch)
    held: dict = {}
    try:
        _serve(fd_in, fd_out, held)
    finally:
        if held.get("engine") is not None:
            held["engine"].shutdown()
        _end_session(scratch)


def _end_session(scratch: str) -> None:
    """Remove the synced weights (hundreds of MB, often in memory: /dev/shm; the log stays, it
    may say why the engine ended) and kill every process of this session: vLLM's engine core and
    workers. This process leads the session (the client starts it so)."""
    if scratch and os.path.isdir(scratch):
        for name in os.listdir(scratch):
            if name.startswith("sync-"):
                shutil.rmtree(os.path.join(scratch, name), ignore_errors=True)
    if os.getpgid(0) == os.getsid(0):
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _guard(fd_in: int, fd_out: int, scratch: str) -> None:
    """Fork a guard that ends the session when this process dies without its clean-up. A Ray
    actor's child processes are killed with SIGKILL when the actor exits, so this process
    cannot clean up after itself there; vLLM's engine core, re-parented to init, kept its
    memory and the synced weights stayed in /dev/shm (measured before the guard). Forked
    before vLLM is imported; it polls its parent once a second."""
    if os.getpgid(0) != os.getpid():  # not a session of our own: nothing to guard
        return
    parent = os.getpid()
    if os.fork():
        return
    os.close(fd_in)  # the client must see end of file when this process dies, not the guard's copy
    os.close(fd_out)
    while os.getppid() == parent:
        time.sleep(1.0)
    _end_session(scratch)
    os._exit(0)


def _serve(fd_in: int, fd_out: int, held: dict) -> None:
    def call(op: str, request: dict) -> dict:
        if op == "start":
            engine = held["engine"] = Engine(**request)
            return {"vllm": engine.version}
        return getattr(held["engine"], op)(**request)

    serve_lines(fd_in, fd_out, call)


class Engine:
    def __init__(self, model: str, args: dict, lora_rank: int | None = None) -> None:
        import vllm

        self.version = vllm.__version__
        if lora_rank is not None:
            args = {"enable_lora": True, "max_lora_rank": lora_rank, "max_loras": 1, **args}
        self.llm = vllm.LLM(model=model, logprobs_mode="processed_logprobs", **args)
        self.lora = None  # the adapter generations use (a LoRARequest)

    def generate(self, prompts, n, seed, max_tokens, temperature, stop) -> dict:
        from vllm import SamplingParams

        started = time.perf_counter()
        params = [SamplingParams(n=n[i], seed=seed[i], max_tokens=max_tokens[i], temperature=temperature,
                                 stop=stop or None, logprobs=0, skip_special_tokens=True)
                  for i in range(len(prompts))]
        results = self.llm.generate([{"prompt_token_ids": ids} for ids in prompts], params,
                                    use_tqdm=False, lora_request=self.lora)
        return {"outputs": [[[list(c.token_ids), [d[t].logprob for t, d in zip(c.token_ids, c.logprobs)],
                              c.finish_reason] for c in r.outputs] for r in results],
                "seconds": time.perf_counter() - started}

    def shutdown(self) -> None:
        """vLLM's own shutdown of its engine core (its shared-memory queues), where it has one;
        whatever is left is killed with the session."""
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 — best effort before the kill
            pass

    def reload(self, path: str) -> dict:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        return {}

    def adapter(self, name: str, id: int, path: str) -> dict:
        from vllm.lora.request import LoRARequest

        new = LoRARequest(name, id, path)
        self.llm.llm_engine.add_lora(new)  # loaded now, so a bad adapter fails the sync, not a later step
        if self.lora is not None and self.lora.lora_int_id != id:
            self.llm.llm_engine.remove_lora(self.lora.lora_int_id)
        self.lora = new
        return {}


if __name__ == "__main__":
    from worker_lines import serve_lines  # beside this file (run by path; reasonrl is not importable here)

    serve(int(sys.argv[1]), int(sys.argv[2]))
