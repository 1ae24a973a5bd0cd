"""The two ways of building a sandbox, and the choice between them (probed once per process).

``bwrap`` (bubblewrap, preferred): one exec builds every namespace (user, PID, mount,
network, IPC, UTS, cgroup), the root file system, drops all capabilities and forbids
further user namespaces; ``--die-with-parent`` ties it to the calling thread.

``unshare`` (util-linux, the fallback where bwrap is missing or refused): ``unshare``
creates the namespaces and forks the supervisor as PID 1 of the new PID namespace; the
supervisor (``supervisor.py``) builds the same root file system itself with
``mount``/``pivot_root`` and drops its capabilities in a nested user namespace;
``setpriv --pdeathsig KILL`` and ``unshare --kill-child`` tie it to the calling thread.

Both run as the unprivileged uid 65534 on the host when this process is root. Why: the
kernel exempts tasks whose real uid is host root from RLIMIT_NPROC, even inside a user
namespace (its uid maps back to root), so a root-owned sandbox has no process limit.
As 65534, the limit counts the tasks of that uid *in the sandbox's own user namespace*
(kernel >= 5.14 ucounts), i.e. per sandbox, and an escape would land as ``nobody``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


__all__ = ["BACKENDS", "SYSTEM_PYTHON", "SANDBOX_UID", "INNER_UID", "ENV",
           "layout", "command"]

BACKENDS = ("bwrap", "unshare")
SYSTEM_PYTHON = "/usr/bin/python3"
SANDBOX_UID = 65534  # the host uid a root caller runs sandboxes as ("nobody")
INNER_UID = 1000  # the program's uid in there; not 65534, the overflow uid unmapped files show as
WORKDIR = "/tmp"
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8",
       "USER": "sandbox", "LOGNAME": "sandbox"}
ENV_VAR = "REASONRL_SANDBOX_BACKEND"
INSTALL = {"bwrap": "install bubblewrap: apt-get install -y bubblewrap (Debian/Ubuntu), dnf install bubblewrap",
           "unshare": "install util-linux (unshare, setpriv)"}
FIX = ("To fix: install bubblewrap (apt-get install -y bubblewrap) and let unprivileged processes create "
       "user namespaces: sysctl -w user.max_user_namespaces=15000 (and kernel.unprivileged_userns_clone=1 "
       "on older Debian kernels; kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04); inside "
       "Docker, run with --security-opt seccomp=unconfined --security-opt apparmor=unconfined (or "
       "--privileged), since the default profiles refuse unshare(CLONE_NEWUSER) and mounting /proc.")

_PASSWD = (f"sandbox:x:{INNER_UID}:{INNER_UID}:sandbox:{WORKDIR}:/bin/sh\n"
           "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
_GROUP = f"sandbox:x:{INNER_UID}:\nnogroup:x:65534:\n"
_HOSTS = "127.0.0.1 localhost sandbox\n::1 localhost\n"

_SUPERVISOR: str | None = None
def supervisor_source() -> str:
    """The text of ``supervisor.py``, run inside the sandbox with ``python3 -I -S -c``."""
    global _SUPERVISOR
    if _SUPERVISOR is None:
        _SUPERVISOR = Path(__file__).with_name("supervisor.py").read_text()
    return _SUPERVISOR


def layout() -> list[tuple[str, str, str]]:
    """What the sandbox's root holds, as ``(kind, source, path)``: ``"dir"``/``"file"``
    (a read-only bind of the host's ``source``), ``"symlink"`` (to ``source``), ``"data"``
    (a file holding the text ``source``). Only what the system Python and a shell need:
    ``/usr`` and the ``/lib*``, ``/bin``, ``/sbin`` beside it, and of ``/etc`` only the
    loader cache, the time zone, the alternatives symlinks and a synthetic passwd, group
    and hosts (never ``/etc/shadow``). The project, ``/root``, ``/home`` and the host's
    ``/tmp`` are simply not in it."""
    entries = [("dir", "/usr", "/usr")]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            entries.append(("symlink", os.readlink(top), top))
        elif os.path.isdir(top):
            entries.append(("dir", top, top))
    for name in ("/etc/ld.so.cache", "/etc/localtime"):
        if os.path.isfile(name):
            entries.append(("file", os.path.realpath(name), name))
    if os.path.isdir("/etc/alternatives"):
        entries.append(("dir", "/etc/alternatives", "/etc/alternatives"))
    entries += [("data", _PASSWD, "/etc/passwd"), ("data", _GROUP, "/etc/group"), ("data", _HOSTS, "/etc/hosts")]
    return entries


def _memfd(data: str | bytes) -> int:
    fd = os.memfd_create("reasonrl-sandbox", os.MFD_CLOEXEC)
    data = data.encode() if isinstance(data, str) else data
    while data:
        data = data[os.write(fd, data):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def command(backend: str, payload_fd: int, report_fd: int, *, tmp_bytes: int, shm_bytes: int) -> tuple[list[str], list[int]]:
    """``(argv, extra_fds)`` that start the supervisor in a sandbox of ``backend``; the
    caller passes ``extra_fds`` (memfds bwrap copies files from) to the child and closes them."""
    tail = [SYSTEM_PYTHON, "-I", "-S", "-c", supervisor_source(), str(payload_fd), str(report_fd)]
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; known: {', '.join(BACKENDS)}")
    tool = shutil.which(backend)  # this process's PATH: the child's env has a fixed one
    if tool is None:
        raise FileNotFoundError(f"{backend} is not installed ({INSTALL[backend]})")
    if backend == "unshare":
        head = [tool, "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child",
                "--mount", "--ipc", "--uts", "--cgroup"]
        setpriv = shutil.which("setpriv")
        if setpriv:
            head = [setpriv, "--pdeathsig", "KILL", "--"] + head
        return head + tail, []
    argv = [tool, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--uid", str(INNER_UID), "--gid", str(INNER_UID), "--hostname", "sandbox"]
    fds = []
    for kind, src, path in layout():
        if kind == "symlink":
            argv += ["--symlink", src, path]
        elif kind == "data":
            fds.append(_memfd(src))
            argv += ["--ro-bind-data", str(fds[-1]), path]
        else:
            argv += ["--ro-bind", src, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(shm_bytes), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev", "--size", str(tmp_bytes), "--tmpfs", WORKDIR, "--remount-ro", "/",
             "--chdir", WORKDIR]
    return argv + tail, fds


def host_uid() -> int | None:
    """The uid the sandbox runs as on the host: 65534 when this process is root, else its own."""
    return SANDBOX_UID if os.geteuid() == 0 else None
