"""The worker process's side of :class:`~reasonrl.isolation.timeout.TimeoutRunner`.

``timeout.py`` starts ``python -P -c <bootstrap> <this file>``: the worker loads this
file *by path* and runs :func:`worker_main`, which serves ``load``/``call`` messages
over its stdin/stdout pipes until EOF. It lives apart from the runner so that the
worker imports no package ``__init__`` (``reasonrl.rewards/__init__`` once pulled in torch: ~2 s, ~200 MB);
that is also why it imports nothing but the standard library and two stdlib-only
siblings, which it loads by path too when it was loaded by path: ``frames.py`` (every
message, either way, is a frame with an 8-byte length header,
:data:`~reasonrl.isolation.frames.HEADER_U64`, around a pickle; the runner uses the
same module) and ``parent_watch.py`` (the thread that ends the worker when its parent
dies).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from typing import Any, Callable

if __package__:
    from reasonrl.isolation.frames import HEADER_U64, frame, read_frame, write_all
    from reasonrl.isolation.parent_watch import watch_parent
else:
    # Loaded by path (in the worker, before the parent's sys.path arrives, or beside a
    # timeout.py loaded by path): the package must not be imported, so load the siblings
    # by path too.
    import importlib.util

    def _sibling(name: str) -> Any:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_reasonrl_isolation_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    _frames, _parent_watch = _sibling("frames"), _sibling("parent_watch")
    HEADER_U64, frame, read_frame, write_all = _frames.HEADER_U64, _frames.frame, _frames.read_frame, _frames.write_all
    watch_parent = _parent_watch.watch_parent

__all__ = ["worker_main"]

_FN_CACHE_SIZE = 256


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
        return read_frame(proto_in, HEADER_U64)

    def send(obj: Any) -> None:
        try:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            payload = pickle.dumps(("error", f"cannot pickle the result: {type(exc).__name__}: {exc}", None))
        write_all(proto_out, frame(payload, HEADER_U64))

    def describe(exc: BaseException) -> tuple:
        return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())

    init_blob = recv()
    if init_blob is None:
        return
    init = pickle.loads(init_blob)
    sys.path[:] = init["sys_path"]
    # Lets the worker notice that its parent died while the worker was busy (stdin EOF
    # only tells it when idle).
    watch_parent(init["parent_pid"])

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
