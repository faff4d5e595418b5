"""A sandbox that runs a model's shell and Python commands, contained: one episode's private working directory.

`Sandbox()` starts a small server process (`_sandbox_server.py`, standard library only) inside bubblewrap (`bwrap`,
the unprivileged sandbox Flatpak uses) and sends it commands over a pipe. What a command inside sees:

| | inside the sandbox |
|---|---|
| network | none: its own network namespace with only a loopback device (no TCP, no DNS) |
| file system | `/usr` (and `/bin`, `/lib`, ...) read-only, the rest of `/` and `/dev` too; a private working directory `/work` (a tmpfs of `disk_mb`); a fresh `/tmp` and `/dev/shm` (`tmp_mb` each); no `/home`, `/root`, `/etc/shadow`, HF cache or token, project checkout, nor any other sandbox |
| processes | its own PID namespace (it sees only its own processes), an unprivileged uid; every process of a command is killed when the command ends or times out (however it detached: `setsid`, `nohup`, double fork), and all of them when the sandbox closes; the server is its PID 1, which no command can signal nor ptrace |
| system calls | System V shared memory and message queues and `memfd_create` are refused (seccomp): memory no per-process limit would count |
| environment | empty but for `PATH`, `HOME=/tmp`, `LANG`, `TERM`, `USER`: no `HF_TOKEN`, no other variable of the trainer |
| limits (per command) | CPU seconds, address space, processes, file size, open files (`setrlimit`); stdout and stderr each kept up to `output_bytes` (the rest is counted, dropped and marked); a wall `timeout` |

Without bubblewrap, `Sandbox()` fails with one line naming the package; `Sandbox(backend="none")` runs the same
server directly on the host, in a temporary folder, with the same limits and timeouts but **no isolation** (the
commands can read and write what your user can, and reach the network), and warns once. Details, the security test
suite and the measured latency: `envs/shell_tasks/README.md` (section "The sandbox").

Example:
    >>> from trl_agents.envs.sandbox import Sandbox, bubblewrap_available
    >>> box = Sandbox() if bubblewrap_available() else Sandbox(backend="none")  # doctest: +SKIP
    >>> box.write_file("notes.txt", "a\\nb\\n")  # doctest: +SKIP
    >>> box.run("wc -l < notes.txt").stdout  # doctest: +SKIP
    '2\\n'
    >>> box.run("sleep 5", timeout=0.5).timed_out  # doctest: +SKIP
    True
    >>> box.close()  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import itertools
import json
import logging
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..names import check_choice

logger = logging.getLogger(__name__)

SANDBOX_BACKENDS = ("bwrap", "none")
WORKDIR = "/work"  # the working directory as commands inside bubblewrap see it
BUBBLEWRAP_MISSING = (
    "sandbox_backend='bwrap' needs bubblewrap, which is not installed: install the `bubblewrap` package "
    "(apt-get install bubblewrap, or dnf install bubblewrap), or set sandbox_backend='none' to run the model's "
    "commands on this machine without isolation"
)
# When the trainer runs as root, each sandbox runs as its own unprivileged host uid from this range, so that the
# process limit (RLIMIT_NPROC, counted per host uid) is the sandbox's own and root's capabilities never enter it.
_UID_BASE, _UID_SPAN = 1_500_000, 1_000_000
_uids = itertools.count()
_uid_lock = threading.Lock()
# Seconds the trainer waits for the server's answer beyond a command's own timeout (a server that a command stopped,
# or that hangs, must fail the episode, not block training): then the sandbox is killed and `SandboxError` raised.
_REPLY_GRACE = 30.0
_SERVER_SOURCE = (Path(__file__).with_name("_sandbox_server.py")).read_text()
_warned_no_isolation = False


class SandboxError(RuntimeError):
    """The sandbox cannot be used: it failed to start, or its server died (e.g. a command killed it)."""


class SandboxUnavailable(SandboxError):
    """The chosen backend cannot run on this machine (bubblewrap missing, or user namespaces disabled)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of a sandbox. Every command gets them afresh (`setrlimit`), so one command cannot use up
    the next one's budget; the defaults suit small shell and Python tasks.

    Args:
        timeout: Wall-clock seconds a command may run (`run(timeout=...)` overrides it per call); then every process
            of the sandbox is killed and the result says `timed_out`.
        cpu_seconds: CPU seconds per process (RLIMIT_CPU): a busy loop is killed even if it stays under the wall
            timeout.
        memory_mb: Address space per process in MiB (RLIMIT_AS): a memory bomb gets `MemoryError` / ENOMEM.
        total_memory_mb: Resident memory of a command's processes together, in MiB: the server sums it every 50 ms
            while the command runs and kills them all past it (the result's stderr says so). Without it, many
            processes each under `memory_mb` could together use `max_processes` times that; a cgroup would bound it
            exactly, but needs privileges and a cgroup layout this code cannot assume (our choice). An allocation
            faster than the 50 ms sampling can overshoot by what it writes in that time.
        max_processes: Processes and threads the sandbox may run at once (RLIMIT_NPROC): a fork bomb stops there.
            Exact when the trainer runs as root (each sandbox then has its own host uid); otherwise the host user's
            processes at start-up are added to it, since the kernel counts them together.
        file_size_mb: Largest file a command may write, in MiB (RLIMIT_FSIZE).
        open_files: Open file descriptors per process (RLIMIT_NOFILE).
        output_bytes: Bytes of stdout, and of stderr, kept per command; the rest is drained, counted and replaced
            by a marker, and the result says `truncated`.
        disk_mb: Size of the working directory (a tmpfs with bubblewrap: writes past it fail with ENOSPC). With
            `backend="none"` it is checked after every command, and the command's result says so when exceeded.
        tmp_mb: Size of the sandbox's private `/tmp`, and of its `/dev/shm` (bubblewrap only).
    """

    timeout: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 1024
    total_memory_mb: int = 2048
    max_processes: int = 64
    file_size_mb: int = 16
    open_files: int = 256
    output_bytes: int = 16_384
    disk_mb: int = 64
    tmp_mb: int = 64

    def __post_init__(self):
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"sandbox limit {spec.name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class SandboxResult:
    """What one `Sandbox.run` did.

    Args:
        stdout: What the command printed (decoded as UTF-8, invalid bytes replaced), at most `output_bytes` of it.
        stderr: Its error output, likewise.
        exit_code: The shell's exit status; a command killed by a signal gives minus the signal number (`-9` after
            a timeout).
        timed_out: The wall timeout was reached and every process of the command was killed.
        truncated: stdout or stderr was longer than `output_bytes` (a marker says how much was dropped).
        duration: Seconds the command ran, measured inside the sandbox.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@functools.cache
def _bwrap_path() -> str | None:
    return shutil.which("bwrap")


def bubblewrap_available() -> bool:
    """Whether bubblewrap is installed here (it may still be refused by the kernel; `Sandbox()` then says so)."""
    return _bwrap_path() is not None


@functools.cache
def _bwrap_supports(option: str) -> bool:
    try:
        text = subprocess.run([_bwrap_path(), "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return option in text


# System calls refused inside bubblewrap (EPERM), per architecture: (AUDIT_ARCH_*, {name: number}). Each gives a
# command memory that RLIMIT_AS does not count: System V shared memory segments and message queues outlive the
# processes that filled them (until the sandbox closes); a memfd is filled with write(), never mapped.
_SECCOMP_DENIED = {
    "x86_64": (0xC000003E, {"shmget": 29, "msgget": 68, "memfd_create": 319}),
    "aarch64": (0xC00000B7, {"shmget": 194, "msgget": 186, "memfd_create": 279}),
}


@functools.cache
def _seccomp_program() -> bytes | None:
    """The classic-BPF seccomp filter bubblewrap installs (`--seccomp FD`): EPERM for `_SECCOMP_DENIED` and for
    every system call of another ABI (32-bit x86 or ARM, x32, which number them differently), allow the rest.
    None on an architecture not listed (no filter)."""
    entry = _SECCOMP_DENIED.get(os.uname().machine)
    if entry is None:
        return None
    arch, numbers = entry
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, ...|BPF_JGE, BPF_RET
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    checks = [(jge, 0x40000000)] + [(jeq, number) for number in sorted(numbers.values())]  # x32 first
    program = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny), (load, 0, 0, 0)]
    for index, (code, value) in enumerate(checks):
        program.append((code, len(checks) - index, 0, value))  # to the final deny
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


@functools.cache
def sandbox_python() -> tuple[str, tuple[str, ...]]:
    """(the interpreter the sandbox runs, the host folders to bind read-only for it).

    The system's `/usr/bin/python3` when there is one (it comes with `/usr`); otherwise the trainer's own base
    interpreter, whose installation folder (`sys.base_prefix`, never a virtual environment) is bound read-only."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate, ()
    executable = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    return executable, (() if prefix.startswith("/usr/") or prefix == "/usr" else (prefix,))


def _pids_of(uid: int) -> list[int]:
    """Live host processes (not zombies) whose real, effective, saved or file-system uid is `uid` (read from
    `/proc/<pid>/status`, which, unlike the owner of `/proc/<pid>`, is right for non-dumpable processes too)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as handle:
                for line in handle:
                    if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                        break
                    if line.startswith("Uid:"):
                        if str(uid) in line.split()[1:]:
                            found.append(int(name))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


def _dedicated_uid() -> int:
    """A host uid of `_UID_BASE`'s range that no process uses now, for one sandbox (the trainer runs as root).

    Several trainer processes (e.g. one per rank, with consecutive pids) draw from the same range: a uid still in use
    by another sandbox is skipped, so that no two live sandboxes share a process limit, nor does closing one kill
    the other's processes (see `_stop`)."""
    with _uid_lock:
        for _ in range(1000):
            uid = _UID_BASE + (os.getpid() * 64 + next(_uids)) % _UID_SPAN
            if not _pids_of(uid):
                return uid
    raise SandboxUnavailable("no free sandbox uid: more than 1000 candidate uids are in use")


def _drop_to(uid: int):
    """A `preexec_fn` that makes the child run as host user `uid` (group `uid`, no supplementary groups)."""

    def preexec():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return preexec


def _nproc_counted_per_user_namespace() -> bool:
    """Whether the kernel counts RLIMIT_NPROC per (user namespace, uid) (Linux >= 5.14, "ucounts"): inside
    bubblewrap only the sandbox's own processes then count against the limit, not the user's other ones."""
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def _count_tasks_of(uid: int) -> int:
    """Processes and threads of host user `uid` now (what RLIMIT_NPROC counts against)."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid:
                count += len(os.listdir(f"/proc/{name}/task"))
        except OSError:
            continue
    return count


class Sandbox:
    """One episode's private working directory and the commands run in it (see the module docstring).

    Args:
        backend: `"bwrap"` (bubblewrap, the default) or `"none"` (no isolation; warns once per process).
        limits: A `SandboxLimits`, or None for the defaults.
        **limit_overrides: Individual limits (`Sandbox(timeout=2, memory_mb=256)`), applied over `limits`.

    Methods are safe to call from several threads (one call runs at a time). The sandbox is closed, and every
    process in it killed, by `close()`, by leaving a `with` block, or when it is garbage-collected.
    """

    def __init__(self, backend: str = "bwrap", limits: SandboxLimits | None = None, **limit_overrides: Any):
        check_choice("sandbox_backend", backend, SANDBOX_BACKENDS)
        unknown = set(limit_overrides) - {spec.name for spec in dataclasses.fields(SandboxLimits)}
        if unknown:
            names = ", ".join(spec.name for spec in dataclasses.fields(SandboxLimits))
            raise ValueError(f"unknown sandbox limit(s) {sorted(unknown)}; the limits are: {names}")
        self.backend = backend
        self.limits = dataclasses.replace(limits or SandboxLimits(), **limit_overrides)
        self._lock = threading.Lock()
        self._host_dir: str | None = None
        self._pass_fds: tuple[int, ...] = ()  # the seccomp program's pipe, for bubblewrap
        self._process: subprocess.Popen | None = None
        self._closed = False
        # As root, the sandbox runs as its own unprivileged host uid (both backends): the kernel never applies
        # RLIMIT_NPROC to root, so a fork bomb would otherwise be unbounded, and root's rights never reach a command.
        self._uid = _dedicated_uid() if os.geteuid() == 0 else None
        if backend == "bwrap":
            command, preexec = self._bwrap_command()
            workdir, namespace = WORKDIR, True
        else:
            _warn_no_isolation()
            self._host_dir = tempfile.mkdtemp(prefix="trl-agents-sandbox-")
            python, _ = sandbox_python()
            command, preexec = [python, "-I", "-S", "-c", _SERVER_SOURCE], None
            if self._uid is not None:
                os.chown(self._host_dir, self._uid, self._uid)
                preexec = _drop_to(self._uid)
            workdir, namespace = self._host_dir, False
        self.workdir = workdir
        self._start(command, preexec, {
            "workdir": workdir,
            "limits": dataclasses.asdict(self.limits),
            "pid_namespace": namespace,
            "nproc": self._process_limit(user_namespace=namespace),
            "env": self._command_env(workdir),
            "shell": "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh",
        })
        self._finalizer = weakref.finalize(self, _stop, self._process, self._host_dir, self._uid)

    # ---- start -------------------------------------------------------------------------------------------------------

    def _command_env(self, workdir: str) -> dict[str, str]:
        python, bound = sandbox_python()
        path = ["/usr/local/bin", "/usr/bin", "/bin"]
        if bound:
            path.insert(0, os.path.dirname(python))
        return {"PATH": ":".join(path), "HOME": "/tmp" if self.backend == "bwrap" else workdir, "LANG": "C.UTF-8",
                "TERM": "dumb", "USER": "sandbox", "PYTHONDONTWRITEBYTECODE": "1"}

    def _bwrap_command(self) -> tuple[list[str], Any]:
        bwrap = _bwrap_path()
        if bwrap is None:
            raise SandboxUnavailable(BUBBLEWRAP_MISSING)
        python, bound = sandbox_python()
        limits = self.limits
        # --as-pid-1: the server itself is PID 1 of the sandbox, with no bubblewrap init beside it. That init would
        # hold the pipes to the trainer, be dumpable (ptrace-able by any command) and never be killed between
        # commands: a command could take it over and forge later answers. PID 1 instead ignores every signal a
        # command sends it (SIGKILL and SIGSTOP included), and the server is non-dumpable. --die-with-parent: the
        # sandbox dies with the bubblewrap process the trainer started (killed when the server stops answering).
        args = [bwrap, "--unshare-all", "--unshare-user", "--new-session", "--die-with-parent", "--as-pid-1",
                "--hostname", "sandbox", "--clearenv", "--uid", "1000", "--gid", "1000", "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = f"/{name}"
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
                     "/etc/localtime", "/etc/nsswitch.conf"):
            args += ["--ro-bind-try", path, path]
        for path in bound:
            args += ["--ro-bind", path, path]
        # Every writable file system is a sized tmpfs: /tmp, /dev/shm (POSIX shared memory) and the working
        # directory. bubblewrap's own root and /dev are tmpfs without a size, writable by the sandbox's user:
        # they are remounted read-only, else a command could fill half the host's memory with files there.
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
                 "--size", str(limits.tmp_mb << 20), "--tmpfs", "/dev/shm",
                 "--size", str(limits.disk_mb << 20), "--tmpfs", WORKDIR,
                 "--remount-ro", "/dev", "--remount-ro", "/",
                 "--chdir", WORKDIR]
        if _bwrap_supports("--disable-userns"):
            args.append("--disable-userns")  # no user namespace inside: no second sandbox to regain capabilities
        program = _seccomp_program()
        if program is not None:  # memory that no per-process limit bounds: System V shared memory, memfd
            read_end, write_end = os.pipe()
            os.write(write_end, program)
            os.close(write_end)
            self._pass_fds = (read_end,)
            args += ["--seccomp", str(read_end)]
        args += ["--", python, "-I", "-S", "-c", _SERVER_SOURCE]
        # Drop root before bubblewrap: the sandbox's host uid owns nothing.
        return args, (_drop_to(self._uid) if self._uid is not None else None)

    def _process_limit(self, user_namespace: bool) -> int:
        """RLIMIT_NPROC for the commands: `max_processes` + 1 for the server where the kernel counts only the
        sandbox's processes (its own host uid, or, Linux >= 5.14, its own user namespace); else the kernel counts all
        of the user's processes, and those running now are added."""
        if self._uid is not None or (user_namespace and _nproc_counted_per_user_namespace()):
            return self.limits.max_processes + 1
        return _count_tasks_of(os.getuid()) + self.limits.max_processes

    def _start(self, command: list[str], preexec, config: dict[str, Any]) -> None:
        try:
            self._process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=self._host_dir or "/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, preexec_fn=preexec,
                pass_fds=self._pass_fds,
            )
        except OSError as err:
            self._cleanup_dir()
            raise SandboxUnavailable(f"could not start the sandbox ({self.backend}): {err}") from None
        finally:
            for fd in self._pass_fds:
                os.close(fd)
            self._pass_fds = ()
        try:
            self._send(config)
            ready = self._receive(_REPLY_GRACE)
        except SandboxError:
            stderr = self._stderr_text()
            self._kill()
            self._cleanup_dir()
            hint = ""
            if "namespace" in stderr.lower() or "permission" in stderr.lower():
                hint = (" (user namespaces are disabled here: enable them, e.g. sysctl kernel.unprivileged_userns_clone=1"
                        " or the AppArmor profile for bwrap on Ubuntu 24.04, or set sandbox_backend='none')")
            raise SandboxUnavailable(
                f"the {self.backend} sandbox did not start: {stderr.strip() or 'no output'}{hint}"
            ) from None
        if not ready.get("ready"):
            self._kill()
            self._cleanup_dir()
            raise SandboxUnavailable(f"the {self.backend} sandbox did not start: {ready}")

    # ---- protocol ----------------------------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        try:
            self._process.stdin.write(struct.pack(">I", len(data)) + data)
            self._process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise SandboxError(self._death()) from None

    def _read_exactly(self, size: int, deadline: float) -> bytes:
        """`size` bytes from the server (read from the pipe itself, never through a buffer, so that `select` sees
        all that is pending); when none come before `deadline`, the server is killed and SandboxError raised."""
        fd, chunks, missing = self._process.stdout.fileno(), [], size
        while missing:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self._kill()
                raise SandboxError("the sandbox's server did not answer in time (a command may have stopped it); "
                                   "the sandbox was killed")
            chunk = os.read(fd, min(missing, 1 << 20))
            if not chunk:
                raise SandboxError(self._death())
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)

    def _receive(self, wait: float) -> dict[str, Any]:
        deadline = time.monotonic() + wait
        (size,) = struct.unpack(">I", self._read_exactly(4, deadline))
        return json.loads(self._read_exactly(size, deadline))

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        wait = float(message.get("timeout") or 0) + _REPLY_GRACE
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            self._send(message)
            reply = self._receive(wait)
        if "error" in reply:  # a path out of the working directory, a missing file, a broken archive
            kind = {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError}.get(reply["kind"])
            raise kind(reply["error"]) if kind else OSError(f"{reply['kind']}: {reply['error']}")
        return reply

    def _death(self) -> str:
        """Why the server does not answer; what is left of the sandbox (e.g. the commands of a `none` server that a
        command killed) is killed now, not only at `close()`."""
        code = None
        if self._process is not None:
            try:
                code = self._process.wait(timeout=1)  # its pipe just closed: it is exiting
            except subprocess.TimeoutExpired:
                pass
            self._kill()
        return (f"the sandbox's server is gone (exit status {code}); a command may have killed it"
                if code is not None else "the sandbox's server stopped answering")

    def _stderr_text(self) -> str:
        try:
            self._process.wait(timeout=5)
            return self._process.stderr.read().decode(errors="replace")[-2000:]
        except (subprocess.TimeoutExpired, OSError, ValueError):
            return ""

    # ---- public API --------------------------------------------------------------------------------------------------

    def run(self, command: str, timeout: float | None = None, stdin: str | None = None) -> SandboxResult:
        """Run `command` with bash in the working directory (stdin: `stdin`, or nothing) and return what it did.

        Every process the command started is killed when it returns; `timeout` (seconds, default
        `limits.timeout`) bounds its wall-clock time. Raises `SandboxError` only when the sandbox itself is gone.
        """
        if not isinstance(command, str):
            raise TypeError(f"command must be a string, got {type(command).__name__}")
        if stdin is not None and not isinstance(stdin, str):
            raise TypeError(f"stdin must be a string or None, got {type(stdin).__name__}")
        timeout = self.limits.timeout if timeout is None else float(timeout)
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        return SandboxResult(**self._call({"op": "run", "command": command, "stdin": stdin, "timeout": timeout}))

    def write_file(self, path: str, content: str | bytes, executable: bool = False) -> None:
        """Write `content` (text as UTF-8, or bytes) to `path`, relative to the working directory (folders are
        created). A path that leads out of it (absolute, `..`, a symlink) raises ValueError."""
        data = content.encode() if isinstance(content, str) else bytes(content)
        self._call({"op": "write", "path": path, "data": base64.b64encode(data).decode(), "executable": bool(executable)})

    def read_file(self, path: str, limit: int | None = None) -> str:
        """The text of `path` (relative to the working directory), at most `limit` bytes of it when given."""
        reply = self._call({"op": "read", "path": path, "limit": int(limit or 0)})
        return base64.b64decode(reply["data"]).decode("utf-8", errors="replace")

    def snapshot(self) -> bytes:
        """The working directory's files as a gzip tar archive (what `restore` takes back)."""
        return base64.b64decode(self._call({"op": "snapshot"})["data"])

    def restore(self, snapshot: bytes) -> None:
        """Make the working directory what it was at `snapshot()` (everything else in it is removed)."""
        self._call({"op": "restore", "data": base64.b64encode(snapshot).decode()})

    def close(self) -> None:
        """Kill every process of the sandbox and remove its files. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _kill(self) -> None:
        _stop(self._process, None, self._uid, kill=True)

    def _cleanup_dir(self) -> None:
        if self._host_dir:
            shutil.rmtree(self._host_dir, ignore_errors=True)


def _stop(process: subprocess.Popen | None, host_dir: str | None, uid: int | None = None, kill: bool = False) -> None:
    """Close the server's stdin (it then kills its commands and exits), then kill it (`kill`: at once) and, with
    bubblewrap, the whole namespace with it; kill whatever still runs as the sandbox's own uid (`uid`, when the
    trainer is root); remove the host folder of a `none` sandbox."""
    if process is not None and process.poll() is None:
        if not kill:
            try:
                process.stdin.close()
            except OSError:
                pass
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                kill = True
        if kill:
            process.kill()
            process.wait(timeout=5)
    if uid is not None:
        # Without bubblewrap, the commands of a server that died (a command killed it) are left behind; with it, the
        # namespace dies with its bubblewrap process. What still runs as the sandbox's uid is killed either way.
        for _ in range(200):
            pids = _pids_of(uid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.005)
    if process is not None:
        for stream in (process.stdout, process.stderr):
            try:
                stream.close()
            except OSError:
                pass
    if host_dir:
        shutil.rmtree(host_dir, ignore_errors=True)


def _warn_no_isolation() -> None:
    global _warned_no_isolation
    if not _warned_no_isolation:
        _warned_no_isolation = True
        logger.warning(
            "sandbox_backend='none': the model's commands run on this machine as your user, without isolation (they "
            "can read your files and reach the network); only the resource limits and timeouts apply. Install "
            "bubblewrap and use sandbox_backend='bwrap' for anything you would not run yourself."
        )
