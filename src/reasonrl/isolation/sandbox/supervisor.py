"""The first program inside the sandbox: set up, start the user's program, report how it ended.

It is not imported by the host. The host reads this file as text and runs it with the
*system* interpreter inside the sandbox (``/usr/bin/python3 -I -S -c SOURCE PAYLOAD_FD
REPORT_FD``), so it uses the standard library only and must not import ``reasonrl``: the
project's folder is not visible in there. It

1. reads the payload (mode, program text, extra files, limits, helper count) from
   ``PAYLOAD_FD``, a memfd, in ``marshal`` format 4 (builtin: ``json`` would add ~10 ms
   of imports to every run; format 4 is read by every Python 3 since 3.4);
2. ``mode == "unshare"`` only (the fallback backend; bwrap does all this itself): builds
   the sandbox's root file system on a fresh tmpfs, ``pivot_root``s into it and detaches
   the host's, then drops its capabilities by entering a nested user namespace (see
   :func:`build_root` and :func:`drop_privileges`);
3. writes the files and ``main.py`` into its working directory (the private ``/tmp``);
4. forks the user's program, which sets the resource limits on itself and execs
   ``/usr/bin/python3 -E -s -B main.py``;
5. waits for it, and writes ``{"code": ..., "signal": ..., "cpu_s": ...}`` to
   ``REPORT_FD`` (a pipe to the host, closed in the user's program by close-on-exec),
   then exits with the same code (``128 + signal`` for a signal).

Why a supervisor rather than exec'ing the program directly: RLIMIT_NPROC must be set
*inside* the sandbox's user namespace (set outside, it would cap the sum over all
sandboxes at once: the kernel charges every level of the namespace tree), and the host
cannot see the program's CPU time or its real wait status any other way (bwrap reports
``128 + signal`` for both a signal and that exit code). The report is cross-checked by
the host against the exit code it sees, so a program that forges it gains nothing.
"""

import marshal
import os
import resource
import sys

MAIN = "main.py"

# mount(2) and friends, for the fallback backend.
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
TMP_INODES = 65536  # files the private /tmp may hold (bwrap's --tmpfs cannot set this)
# statvfs f_flag bit -> the mount flag a remount inside a user namespace must keep (locked flags).
KEEP = {8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME, 4096: MS_RELATIME, 2: MS_NOSUID, 4: MS_NODEV}
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}


class Libc:
    """The few libc calls the fallback needs (ctypes: nothing else here can mount)."""

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def check(self, result, what):
        if result != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(self, src, dst, fstype, flags, data=None):
        args = [None if s is None else s.encode() for s in (src, dst, fstype)]
        self.check(self.lib.mount(*args, flags, None if data is None else data.encode()), f"mount {dst}")

    def ro_remount(self, path, extra=0):
        flags = os.statvfs(path).f_flag
        keep = 0
        for bit, flag in KEEP.items():
            if flags & bit:
                keep |= flag
        self.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep | extra)


def build_root(layout, tmp_bytes, shm_bytes):
    """The fallback backend's root file system, the same one bwrap builds: a tmpfs holding
    read-only binds of ``/usr`` (and ``/lib*``, ``/bin``, ``/sbin`` where they are not
    symlinks into it), a few read-only files of ``/etc``, a minimal ``/dev``, a fresh
    ``/proc`` of the sandbox's own PID namespace and a private ``/tmp``; then
    ``pivot_root`` into it and detach the host's root, so no path leads back to it."""
    libc = Libc()
    new = "/tmp"  # the host's /tmp is merely covered, in this private mount namespace
    libc.mount("none", "/", None, MS_REC | MS_PRIVATE)
    libc.mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for kind, src, dst in layout:
        path = new + dst
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if kind == "symlink":
            os.symlink(src, path)
        elif kind == "data":
            with open(path, "w") as f:
                f.write(src)
        else:  # "dir" or "file": a read-only bind of the host's path
            if kind == "dir":
                os.makedirs(path, exist_ok=True)
            else:
                open(path, "w").close()
            libc.mount(src, path, None, MS_BIND | MS_REC)
            libc.ro_remount(path)
    dev = new + "/dev"
    os.makedirs(dev, exist_ok=True)
    libc.mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in ("null", "zero", "full", "random", "urandom"):
        open(f"{dev}/{name}", "w").close()
        libc.mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    libc.mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, f"size={shm_bytes},nr_inodes=1024,mode=1777")
    libc.ro_remount(dev, MS_NOEXEC)
    os.mkdir(new + "/proc")
    libc.mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(new + "/tmp")
    libc.mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_bytes},nr_inodes={TMP_INODES},mode=1777")
    os.mkdir(new + "/.old")
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: no syscall number known for {os.uname().machine}")
    libc.check(libc.lib.syscall(number, new.encode(), (new + "/.old").encode()), "pivot_root")
    os.chdir("/")
    libc.check(libc.lib.umount2(b"/.old", MNT_DETACH), "umount the host's root")
    os.rmdir("/.old")
    libc.ro_remount("/")
    libc.lib.sethostname(b"sandbox", 7)
    return libc


def drop_privileges(libc, uid):
    """Give up the capabilities the setup needed: enter a nested user namespace in which
    this process is the unprivileged ``uid`` (mapped to its current root), forbid further
    user namespaces below it, empty the capability bounding set and set no_new_privs.
    The capabilities a process gets in a
    namespace it creates do not reach the mounts, network or PID namespaces owned by the
    outer one, and the exec of the user's program (uid != 0) clears them all."""
    libc.check(libc.lib.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} 0 1"), ("gid_map", f"{uid} 0 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    for cap in range(64):
        if libc.lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and libc.ctypes.get_errno() != 22:  # EINVAL: no such cap
            libc.check(-1, f"prctl(PR_CAPBSET_DROP, {cap})")
    libc.check(libc.lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def write_files(files, code):
    for name, text in files.items():
        directory = os.path.dirname(name)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(name, "w", encoding="utf-8") as f:
            f.write(text)
    with open(MAIN, "w", encoding="utf-8") as f:
        f.write(code)


def start_program(limits, helpers):
    """In the forked child: the limits, then exec the user's program (never returns)."""
    mb = 1 << 20
    cpu = limits["cpu_s"]
    settings = (
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
        (resource.RLIMIT_AS, limits["memory_mb"] * mb, limits["memory_mb"] * mb),
        (resource.RLIMIT_FSIZE, limits["file_mb"] * mb, limits["file_mb"] * mb),
        # Counted per user in this user namespace, i.e. per sandbox; the helpers count too.
        (resource.RLIMIT_NPROC, limits["max_procs"] + helpers, limits["max_procs"] + helpers),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
    )
    for which, soft, hard in settings:
        resource.setrlimit(which, (soft, hard))
    os.closerange(3, 1 << 16)
    python = sys.executable or "/usr/bin/python3"
    os.execv(python, [python, "-E", "-s", "-B", MAIN])


def main():
    payload_fd, report_fd = int(sys.argv[1]), int(sys.argv[2])
    with os.fdopen(payload_fd, "rb") as f:
        payload = marshal.loads(f.read())
    os.set_inheritable(report_fd, False)
    init = payload["mode"] == "unshare"  # this process is then PID 1 of the sandbox

    def report(**fields):  # one JSON line; numbers and None only, but for setup_error
        if "setup_error" in fields:
            import json

            line = json.dumps(fields)
        else:
            line = "{" + ", ".join(f'"{k}": {"null" if v is None else v}' for k, v in fields.items()) + "}"
        os.write(report_fd, (line + "\n").encode())

    try:
        if init:
            libc = build_root(payload["layout"], payload["tmp_bytes"], payload["shm_bytes"])
            drop_privileges(libc, payload["uid"])
        os.chdir(payload["workdir"])
        write_files(payload["files"], payload["code"])
        pid = os.fork()
    except Exception as exc:  # noqa: BLE001
        report(setup_error=f"{type(exc).__name__}: {exc}")
        os._exit(1)
    if pid == 0:
        try:
            start_program(payload["limits"], payload["helpers"])
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"sandbox: could not start the program: {type(exc).__name__}: {exc}\n".encode())
        os._exit(127)
    while True:  # as PID 1, also reap the orphans that are reparented to us
        try:
            done, status, usage = os.wait4(-1 if init else pid, 0)
        except InterruptedError:
            continue
        if done == pid:
            break
    cpu = round(usage.ru_utime + usage.ru_stime, 4)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        report(code=None, signal=sig, cpu_s=cpu)
        os._exit(128 + sig)
    code = os.WEXITSTATUS(status)
    report(code=code, signal=None, cpu_s=cpu)
    os._exit(code)


if __name__ == "__main__":
    main()
