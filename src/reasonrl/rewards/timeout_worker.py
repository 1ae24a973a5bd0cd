"""The worker process's side of :class:`~reasonrl.rewards.timeout.TimeoutRunner`.

``timeout.py`` starts ``python -P -c <bootstrap> <this file>``: the worker loads this
file *by path* and runs :func:`worker_main`, which serves ``load``/``call`` messages
over its stdin/stdout pipes until EOF. It lives apart from the runner so that the
worker never imports ``reasonrl.rewards/__init__`` (and with it torch: ~2 s, ~200 MB);
that is also why it imports nothing but the standard library. The frame format
(:data:`HEADER`) and :func:`read_exact` are here because both ends use them: the
runner imports them from this module.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import threading
import time
from typing import Any, Callable

__all__ = ["HEADER", "read_exact", "worker_main"]

HEADER = struct.Struct("!Q")
"""Every message, either way, is this 8-byte length and then that many bytes of pickle."""
_FN_CACHE_SIZE = 256
# Lets the worker notice that its parent died while the worker was busy (stdin EOF
# only tells it when idle).
_PARENT_POLL_S = 0.5


def read_exact(fd: int, n: int) -> bytes | None:
    """Exactly ``n`` bytes from ``fd`` (blocking), or None at EOF: a worker's framed reads
    (here and in ``reasonrl.rewards.worker_protocol``)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def worker_main() -> None:
    """Entry point of the worker process (see ``timeout._BOOTSTRAP``); serves calls until EOF."""
    import importlib
    import importlib.util
    import traceback
    import types

    # Ctrl-C reaches the whole process group; the parent decides what to do with it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Keep the protocol on private descriptors so that a print() or a C library
    # writing to fd 1 (or reading fd 0) inside a job cannot corrupt the stream.
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)

    def recv() -> bytes | None:
        header = read_exact(proto_in, HEADER.size)
        return None if header is None else read_exact(proto_in, HEADER.unpack(header)[0])

    def send(obj: Any) -> None:
        try:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            payload = pickle.dumps(("error", f"cannot pickle the result: {type(exc).__name__}: {exc}", None))
        data = memoryview(HEADER.pack(len(payload)) + payload)
        while data:
            data = data[os.write(proto_out, data):]

    def describe(exc: BaseException) -> tuple:
        return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())

    init_blob = recv()
    if init_blob is None:
        return
    init = pickle.loads(init_blob)
    sys.path[:] = init["sys_path"]
    parent_pid = init["parent_pid"]

    def watch_parent() -> None:
        while True:
            time.sleep(_PARENT_POLL_S)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch_parent, daemon=True, name="parent-watch").start()

    try:
        for name in init["skip_package_init"]:
            if name in sys.modules:
                continue
            spec = importlib.util.find_spec(name)
            if spec is None or spec.submodule_search_locations is None:
                raise ImportError(f"skip_package_init: {name!r} is not a package")
            pkg = types.ModuleType(name)
            pkg.__path__ = list(spec.submodule_search_locations)
            pkg.__spec__ = spec
            pkg.__package__ = name
            sys.modules[name] = pkg
        for name in init["preload"]:
            importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001
        send(describe(exc))
        return
    send(("ready", os.getpid()))

    functions: dict[bytes, Callable] = {}
    while True:
        blob = recv()
        if blob is None:
            return  # parent closed the pipe or exited
        try:
            message = pickle.loads(blob)
            if message[0] == "load":
                sys.path[:] = message[2]
                fn = pickle.loads(message[1])
                if len(functions) >= _FN_CACHE_SIZE:
                    functions.clear()
                functions[message[1]] = fn
                send(("loaded",))
                continue
            _, fn_blob, args, kwargs = message
            fn = functions.get(fn_blob) or pickle.loads(fn_blob)
            value = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 — reported to the caller
            send(describe(exc))
            continue
        except SystemExit as exc:
            send(("error", f"SystemExit: {exc.code}", None))
            continue
        send(("ok", value))
