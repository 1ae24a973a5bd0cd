"""A stand-in for ``reasonrl/rollout/vllm_worker.py`` that speaks its protocol without vLLM, for
the client's tests (deadlines, a dying engine, what is sent, how answers become Samples).

``FAKE_VLLM`` chooses the behaviour: ``ok`` (default), ``hang_start``, ``hang_generate``,
``die_generate``, ``raise_generate``. Each request is appended to ``$FAKE_VLLM_LOG`` as JSON.
``ok`` answers each prompt's n completions from ``$FAKE_VLLM_REPLY`` (a JSON list of
``[ids, logprobs, finish_reason]``, used for every prompt), else ``[[[7, 2], [-0.5, -0.25], "stop"]] * n``.
"""

import json
import os
import sys
import time


def main(fd_in: int, fd_out: int) -> None:
    mode = os.environ.get("FAKE_VLLM", "ok")
    inp, out = os.fdopen(fd_in, "r"), os.fdopen(fd_out, "w")
    print(f"fake engine: up pid={os.getpid()}", flush=True)  # what the client's log tail shows
    for line in inp:
        request = json.loads(line)
        if os.environ.get("FAKE_VLLM_LOG"):
            with open(os.environ["FAKE_VLLM_LOG"], "a") as fh:
                fh.write(json.dumps(request) + "\n")
        op = request["op"]
        if op == "stop":
            out.write('{"ok": true}\n')
            out.flush()
            return
        if mode == f"hang_{op}":
            print(f"fake engine: hanging in {op}", flush=True)
            time.sleep(3600)
        if mode == f"die_{op}":
            os._exit(3)
        if mode == f"raise_{op}":
            reply = {"ok": False, "error": "Traceback (most recent call last):\nValueError: fake failure"}
        elif op == "generate":
            canned = json.loads(os.environ["FAKE_VLLM_REPLY"]) if os.environ.get("FAKE_VLLM_REPLY") else None
            reply = {"ok": True, "outputs": [(canned or [[[7, 2], [-0.5, -0.25], "stop"]] * n)[:n]
                                             for n in request["n"]]}
        else:
            reply = {"ok": True, "vllm": "fake"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
