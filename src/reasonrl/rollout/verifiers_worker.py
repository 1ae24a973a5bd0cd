"""The verifiers worker (``task: {name: verifiers}``; the client is ``reasonrl.envs.verifiers``).

Run by path, ``python verifiers_worker.py FD_IN FD_OUT``, by an interpreter that has verifiers
and the environment's package (``$REASONRL_VERIFIERS_PYTHON``; ``make verifiers-env``): verifiers
pins uvicorn above what Flower, a dependency of ours, accepts, so the two cannot share one
environment. It imports nothing of reasonrl, only the standard library and verifiers. One JSON
object per line in and out, on two pipes of its own; its logs go to stdout/stderr (a log file).

The environment runs its rollouts here, in this process's event loop, and asks the model through
reasonrl's OpenAI-compatible endpoint (``base_url``); the endpoint keeps the token ids of every
call under the rollout's trace id, which this worker reports with the rollout's rewards. So the
environment's code (its dataset, its rubric, its tools) never shares the trainer's process.

Requests (``{"op": ...}``), each answered ``{"ok": true, ...}`` or ``{"ok": false, "error": tb}``:

- ``start``: ``env`` (a verifiers taskset or env id: an importable module), ``config`` (the env
  config's other fields, e.g. ``{"taskset": {...}}`` parameters), ``max_turns`` — load it;
  answered with ``tasks``: each task's ``prompt`` (its text) and ``id``;
- ``rollout``: ``tasks`` (indices), ``n`` (rollouts per task), ``temperature``, ``max_tokens``,
  ``max_concurrent``, ``base_url`` and ``model`` (the endpoint to ask) — run ``n`` episodes of
  each task, answered with ``rollouts`` in that order:
  ``trace`` (its id), ``reward``, ``rewards`` (per reward function), ``metrics``, ``turns``,
  ``stop``, ``errors``;
- ``stop``: exit.

End of input (the client is gone, even killed) ends the process.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys

HARNESS = "verifiers_harness"  # the module beside this file
API_KEY_VAR = "REASONRL_ENDPOINT_KEY"  # verifiers' client sends a key; the endpoint checks none


class Worker:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.env = self.serving = None

    def start(self, env: str, config: dict, max_turns: int | None = None) -> dict:
        import verifiers
        import verifiers.v1 as vf

        os.environ.setdefault(API_KEY_VAR, "none")
        raw = {**config, "taskset": {**config.get("taskset", {}), "id": env}}
        agent = {"harness": {"id": HARNESS}, "runtime": vf.SubprocessConfig().model_dump()}
        if max_turns:
            agent["max_turns"] = max_turns
        # Every role of the env (a field holding an AgentConfig: ``agent``, or ``player``...)
        # runs our harness; the env config's own settings for it are kept.
        # A role's harness settings are ours (max_tool_rounds): name our harness before validating.
        for key, value in list(raw.items()):
            if isinstance(value, dict) and isinstance(value.get("harness"), dict):
                raw[key] = {**value, "harness": {**value["harness"], **agent["harness"]}}
        probe = vf.resolve_env_config(raw)
        roles = [name for name in type(probe).model_fields if isinstance(getattr(probe, name), vf.AgentConfig)]
        for role in roles:  # the role's own harness settings (max_tool_rounds) are kept; its id is ours
            own = raw.get(role) or {}
            raw[role] = {**own, **agent, "harness": {**(own.get("harness") or {}), **agent["harness"]}}
        self.env = vf.load_environment(vf.resolve_env_config(raw))
        self.tasks = list(self.env.taskset)
        self.serving = self.env.serving()
        self.loop.run_until_complete(self.serving.__aenter__())
        return {"verifiers": verifiers.__version__, "roles": roles,
                "tasks": [{"prompt": _prompt_text(t.data), "id": t.data.id} for t in self.tasks]}

    def rollout(self, tasks: list[int], n: int, temperature: float, max_tokens: int, max_concurrent: int,
                base_url: str, model: str) -> dict:
        import verifiers.v1 as vf

        ctx = vf.ModelContext(model=model, client=vf.EvalClientConfig(base_url=base_url, api_key_var=API_KEY_VAR),
                              sampling=vf.SamplingConfig(temperature=temperature, max_tokens=max_tokens))

        async def run():
            semaphore = asyncio.Semaphore(max_concurrent)
            slots = [s for k in tasks for s in self.env.slots(self.tasks[k], n)]
            return await asyncio.gather(*(self.env.run_slot(s, ctx, semaphore) for s in slots))

        out = []
        for k, episode in zip([k for k in tasks for _ in range(n)], self.loop.run_until_complete(run())):
            errors = [str(getattr(e, "message", e)) for e in episode.errors]
            if len(episode.traces) != 1:
                raise ValueError(f"task {k}: an episode with {len(episode.traces)} traces; multi-agent environments "
                                 "are not supported (one agent, one trace per episode)")
            trace = episode.traces[0]
            errors += [str(getattr(e, "message", e)) for e in trace.errors]
            out.append({"task": k, "trace": trace.id, "reward": _number(trace.reward),
                        "rewards": {name: _number(r.score) for name, r in trace.rewards.items() if r is not None},
                        "metrics": {name: _number(v) for name, v in trace.metrics.items() if _number(v) is not None},
                        "turns": trace.num_turns, "stop": str(trace.stop_condition), "errors": errors})
        return {"rollouts": out}

    def close(self) -> None:
        if self.serving is not None:
            self.loop.run_until_complete(self.serving.__aexit__(None, None, None))
            self.serving = None


def _prompt_text(data) -> str:
    prompt = data.prompt
    if isinstance(prompt, str) or prompt is None:
        return prompt or ""
    users = [m for m in prompt if getattr(m, "role", None) == "user"]
    return str(getattr(users[-1], "content", "")) if users else ""


def _number(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value == value and abs(value) != float("inf") else None


def serve(fd_in: int, fd_out: int) -> None:
    worker = Worker()
    try:
        serve_lines(fd_in, fd_out, lambda op, request: getattr(worker, op)(**request))
    finally:
        worker.close()


def _import_harness() -> None:
    """Make the harness beside this file importable by its name, and take this folder off the
    path: run by path, it comes first on ``sys.path``, where reasonrl's modules could stand for
    a package of the same name."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.util.spec_from_file_location(HARNESS, os.path.join(here, HARNESS + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[HARNESS] = module
    spec.loader.exec_module(module)


if __name__ == "__main__":
    from worker_lines import serve_lines  # beside this file (run by path; reasonrl is not importable here)

    _import_harness()
    serve(int(sys.argv[1]), int(sys.argv[2]))
