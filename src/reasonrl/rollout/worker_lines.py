"""The request loop of the workers run by path in interpreters of their own (``vllm_worker``,
``verifiers_worker``): one JSON object per line in, one answer per line out. The standard library
only, imported by those workers as a sibling file (they import nothing of reasonrl)."""

from __future__ import annotations

import json
import os
import traceback
from typing import Any, Callable


def serve_lines(fd_in: int, fd_out: int, call: Callable[[str, dict[str, Any]], dict[str, Any]]) -> None:
    """Answer each request ``{"op": name, ...}`` with ``{"ok": true, **call(name, rest)}``, or
    ``{"ok": false, "error": traceback}`` when ``call`` raises; ``stop`` answers and returns, and
    so does the end of input (the client is gone)."""
    inp = os.fdopen(fd_in, "r", encoding="utf-8")
    out = os.fdopen(fd_out, "w", encoding="utf-8")
    for line in inp:
        request = json.loads(line)
        op = request.pop("op")
        if op == "stop":
            out.write(json.dumps({"ok": True}) + "\n")
            out.flush()
            return
        try:
            reply = {"ok": True, **call(op, request)}
        except Exception:  # the client raises it with this traceback
            reply = {"ok": False, "error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()
