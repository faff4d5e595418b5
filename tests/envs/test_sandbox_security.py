"""Security suite of `trl_agents.envs.sandbox`: every attack a model's command can try is contained, and the episode
fails or goes on visibly while training (this process) goes on.

Each test is one attack family, parametrized over its variants; each variant runs in a fresh sandbox with small
limits (`_LIMITS`). The secrets the attacks look for are real: `HF_TOKEN` and a random variable are set in this
process's environment, and `$HOME/.cache/huggingface/token` holds a random token.

| attack family | variants (bwrap) | expected containment |
|---|---|---|
| network egress | TCP to 1.1.1.1:80, TCP to a server of this test on 127.0.0.1, UDP DNS query to 1.1.1.1:53, name lookup, `/etc/resolv.conf`, bash `/dev/tcp`, abstract unix socket of this test, interfaces | no route (own network namespace with only `lo`): every connection fails, the host server gets none |
| host files | `/etc/shadow`, the HF token by absolute path and under `$HOME`, `find` for it, the project checkout, `/root`, `/home`, the host's `/proc/<pid>/environ` and `/proc/1/environ`, `/sys` | not there (only `/usr` and a few `/etc` files are bound): no secret in any output |
| writes outside | `../x`, `/x`, `/usr/x`, `/etc/x`, `/dev/x`, `/tmp/x` (private), symlink to a host folder (shell, `write_file`), symlink to a host file, hard link, `mount`, `write_file`/`read_file` with `..`, an absolute path, a symlink | read-only or private file systems, `ValueError` from the file API: the host folder stays empty, no host file appears |
| environment | `env`, `set`, `/proc/self/environ`, `/proc/1/environ`, `/proc/$PPID/environ`, Python `os.environ`, this process's `/proc/<pid>/environ` | clean environment: neither `HF_TOKEN` nor the secret appears |
| fork bomb | bash `:(){ :|:& };:`, Python `os.fork` loop, thread bomb, `sleep &` loop, counting forks | `max_processes` (RLIMIT_NPROC, a uid of its own): returns within the timeout, `echo ok` works after, nothing of it is left on the host |
| memory bomb | Python 4 GB `bytearray`, growing list, 4 GB `mmap`, a 600 MB bash string, System V shared memory, memfd; eight processes each under `memory_mb` (also with `none`) | RLIMIT_AS: MemoryError / ENOMEM; shared memory and memfd (not counted by RLIMIT_AS) refused by seccomp; processes together past `total_memory_mb` all killed |
| CPU spin | bash `while :`, Python `while True`, Python ignoring SIGXCPU, two spinners in the background | RLIMIT_CPU (or the wall timeout) kills them |
| disk fill | `dd` into the working directory, `/tmp`, `/dev/shm`, `/` ; a file over `file_size_mb` (dd, Python), `fallocate` | sized tmpfs: ENOSPC at `disk_mb`/`tmp_mb`; RLIMIT_FSIZE: EFBIG; `/` read-only; the sandbox stays usable |
| output flood | `yes` for the whole timeout, `head -c 2G /dev/zero`, stderr flood, one 50 MB line, 50 MB of binary | kept up to `output_bytes` per stream plus a marker, `truncated`, the server's memory stays small, returns |
| signals outside | `kill -9` of this test's pid, of a host sleeper's pid, of its parent, of pid 1, `kill -9 -1`, `kill -STOP 1`, `pkill -9 sleep` | own PID namespace: host processes survive; the server (PID 1 inside) ignores them and the sandbox keeps working |
| ptrace | `PTRACE_ATTACH` to pid 1 (the server), to this test's pid, `strace -p 1`, `/proc/1/mem`, `/proc/1/fd` | refused (the server is non-dumpable; host processes are not visible) |
| timeout escapes | `setsid`, `nohup`, double fork, `disown`, `setsid -f`, Python daemon (fork, setsid, fork), a detached process past the timeout | every process of the sandbox is killed when the command returns: none is left on the host |
| leftovers after close | background processes (trapping signals, stopped), then `close()`, a `with` block, garbage collection | nothing of the sandbox (its bubblewrap process, descendants, uid) runs after |
| the server attacked | `kill -9 1`, `kill -9`/`kill -STOP` of the server found through `/proc`, `kill -INT 1` | ignored (the server is PID 1 of the sandbox): the sandbox keeps working, no hang |

14 attack families, 103 variants with bubblewrap, all contained. The `none` backend runs a reduced set (22 variants:
fork bomb, memory bomb, CPU spin, output flood, timeout escapes, leftovers after close, the server killed or stopped
from inside: `SandboxError`, never a hang, and nothing left; a clean environment), whose resource limits hold there
too (as root each sandbox runs as a uid of its own, else RLIMIT_NPROC would not apply). It has **no**
isolation of network, files or `/proc`: only the command's environment is clean (`test_none_backend_isolation`).

Bounded by sampling, not by the kernel (no cgroup): the command's processes together are killed once their resident
memory passes `total_memory_mb` (checked every 50 ms, so a very fast allocation can overshoot by what it writes in
that time); the tmpfs (`disk_mb` + 2 x `tmp_mb`) comes on top.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import secrets as secrets_module
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import trl_agents
from trl_agents.envs import sandbox as sandbox_module
from trl_agents.envs.sandbox import (
    BUBBLEWRAP_MISSING,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    bubblewrap_available,
)

_LIMITS = dict(timeout=3, cpu_seconds=2, memory_mb=512, max_processes=32, file_size_mb=8, disk_mb=16, tmp_mb=16,
               output_bytes=4096)
_SLACK = 10.0  # seconds a run may take beyond its timeout on a loaded CI machine (start, kill, transfer)
_MARKER_ROOM = 80  # the truncation marker's length

needs_bwrap = pytest.mark.skipif(
    not bubblewrap_available(),
    reason="bubblewrap (`bwrap`) is not installed: apt-get install bubblewrap (the CI installs it)",
)


# ---- fixtures and helpers -------------------------------------------------------------------------------------------


class Secrets:
    def __init__(self, hf_token: str, secret: str, token_path: Path, host_dir: Path):
        self.hf_token, self.secret, self.token_path, self.host_dir = hf_token, secret, token_path, host_dir

    def assert_absent(self, *texts: str) -> None:
        for text in texts:
            for value in (self.hf_token, self.secret):
                assert value not in text, f"a secret of the trainer leaked into the sandbox's output: {text[:300]!r}"


@pytest.fixture
def secrets(monkeypatch, tmp_path):
    """The trainer's secrets: HF_TOKEN and a random variable in os.environ, the HF token file under a fresh $HOME,
    and an empty host folder that no attack may write into."""
    hf_token, secret = "hf_" + secrets_module.token_hex(16), "secret-" + secrets_module.token_hex(16)
    monkeypatch.setenv("HF_TOKEN", hf_token)
    monkeypatch.setenv("TRL_AGENTS_TEST_SECRET", secret)
    home = tmp_path / "home"
    token_path = home / ".cache" / "huggingface" / "token"
    token_path.parent.mkdir(parents=True)
    token_path.write_text(hf_token)
    monkeypatch.setenv("HOME", str(home))
    host_dir = tmp_path / "host_dir"
    host_dir.mkdir()
    return Secrets(hf_token, secret, token_path, host_dir)


def _open(backend: str, **overrides) -> Sandbox:
    return Sandbox(backend=backend, **{**_LIMITS, **overrides})


@pytest.fixture
def box(secrets):
    """A bubblewrap sandbox with small limits, started after the secrets were set."""
    if not bubblewrap_available():
        pytest.skip("bubblewrap (`bwrap`) is not installed: apt-get install bubblewrap (the CI installs it)")
    sandbox = _open("bwrap")
    yield sandbox
    sandbox.close()
    _assert_gone(sandbox)


@pytest.fixture
def none_box(secrets):
    sandbox = _open("none")
    yield sandbox
    sandbox.close()
    _assert_gone(sandbox)


def _run(box: Sandbox, command: str, timeout: float | None = None, **kwargs):
    """`box.run`, checked to return within its timeout (plus slack) and to leak no secret of this process."""
    limit = box.limits.timeout if timeout is None else timeout
    started = time.monotonic()
    result = box.run(command, timeout=timeout, **kwargs)
    elapsed = time.monotonic() - started
    assert elapsed < limit + _SLACK, f"the run took {elapsed:.1f}s with a timeout of {limit}s"
    assert result.duration <= limit + _SLACK
    for value in (os.environ.get("HF_TOKEN", ""), os.environ.get("TRL_AGENTS_TEST_SECRET", "")):
        if value:
            assert value not in result.stdout and value not in result.stderr
    return result


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _host_processes() -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, command line)} of the live host processes."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X"):
                continue
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
            table[int(name)] = (int(fields[1]), cmdline)
        except (OSError, IndexError, ValueError):
            continue
    return table


def _with_marker(marker: str) -> list[int]:
    """Host processes whose command line holds `marker` (a unique sleep duration), this one aside."""
    return [pid for pid, (_, cmdline) in _host_processes().items() if marker in cmdline and pid != os.getpid()]


def _descendants(root: int) -> list[int]:
    table = _host_processes()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, (parent, _) in table.items() if parent in frontier and pid not in found}
        found |= frontier
    return sorted(found)


def _sandbox_processes(box: Sandbox) -> list[int]:
    """The host processes of `box` besides its bubblewrap process: its descendants, and (as root) its uid's."""
    pids = set(_descendants(box._process.pid))
    if box._uid is not None:
        pids |= set(sandbox_module._pids_of(box._uid))
    pids.discard(box._process.pid)
    return sorted(pids)


def _assert_gone(box: Sandbox) -> None:
    """Nothing of `box` runs on the host: its bubblewrap (or server) process, descendants, uid; its folder is gone."""
    assert box._process.poll() is not None, "the sandbox's process outlived close()"
    assert not _descendants(box._process.pid)
    if box._uid is not None:
        assert not sandbox_module._pids_of(box._uid), "a process of the sandbox's uid outlived close()"
    if box._host_dir:
        assert not os.path.exists(box._host_dir)


def _assert_idle(box: Sandbox) -> None:
    """Between commands only the server runs: every process a command started is gone."""
    deadline = time.monotonic() + 2
    while True:
        left = _sandbox_processes(box)
        if len(left) <= (1 if box.backend == "bwrap" else 0):  # bubblewrap: the server under it
            return
        assert time.monotonic() < deadline, f"processes of the sandbox outlived the command: {left}"
        time.sleep(0.05)


def _usable(box: Sandbox) -> None:
    result = _run(box, "echo ok")
    assert (result.stdout, result.exit_code) == ("ok\n", 0), result


def _python(code: str) -> str:
    """A shell command running `code` with the sandbox's python3 (the code goes in a quoted here-document)."""
    return f"python3 - <<'PYEOF'\n{code}\nPYEOF"


# ---- network egress -------------------------------------------------------------------------------------------------

_CONNECT = """
import socket, sys
try:
    s = socket.create_connection(({host!r}, {port}), timeout=2)
    print("CONNECTED")
except OSError as err:
    print("refused:", err)
    sys.exit(1)
"""


@pytest.fixture
def host_server():
    """A TCP server on this machine's 127.0.0.1 and an abstract unix socket, which the sandbox must not reach."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.setblocking(False)
    unix = socket.socket(socket.AF_UNIX)
    name = "\0trl-agents-test-" + secrets_module.token_hex(8)
    unix.bind(name)
    unix.listen(8)
    unix.setblocking(False)
    yield tcp.getsockname()[1], name[1:]
    for server in (tcp, unix):
        try:
            server.accept()
            raise AssertionError("a sandboxed command connected to a server on the host")
        except BlockingIOError:
            pass
        finally:
            server.close()


NETWORK = {
    "tcp-public": _python(_CONNECT.format(host="1.1.1.1", port=80)),
    "tcp-host-loopback": _python(_CONNECT.format(host="127.0.0.1", port="{port}")),
    "udp-dns-query": _python(
        "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.settimeout(2)\n"
        "try:\n    s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x01\\x00\\x01', "
        "('1.1.1.1', 53))\n    print('CONNECTED', s.recvfrom(512))\nexcept OSError as err:\n"
        "    print('refused:', err)\n    sys.exit(1)"
    ),
    "dns-lookup": _python(
        "import socket, sys\ntry:\n    print('CONNECTED', socket.getaddrinfo('huggingface.co', 443))\n"
        "except OSError as err:\n    print('refused:', err)\n    sys.exit(1)"
    ),
    "resolv-conf": "cat /etc/resolv.conf",
    "bash-dev-tcp": "exec 3<>/dev/tcp/1.1.1.1/80 && echo CONNECTED",
    "bash-dev-tcp-host-loopback": "exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED",
    "abstract-unix-socket": _python(
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0{abstract}')\n"
        "    print('CONNECTED')\nexcept OSError as err:\n    print('refused:', err)\n    sys.exit(1)"
    ),
}


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(NETWORK))
def test_network_egress(box, host_server, variant):
    port, abstract = host_server
    result = _run(box, NETWORK[variant].replace("{port}", str(port)).replace("{abstract}", abstract))
    assert result.exit_code != 0, result
    assert "CONNECTED" not in result.stdout
    assert "nameserver" not in result.stdout


@needs_bwrap
def test_network_only_loopback(box):
    result = _run(box, "cat /proc/net/dev")
    interfaces = {line.split(":")[0].strip() for line in result.stdout.splitlines()[2:]}
    assert interfaces <= {"lo"}, result.stdout


# ---- host files -----------------------------------------------------------------------------------------------------

def _checkout() -> Path:
    return Path(trl_agents.__file__).resolve().parent


HOST_FILES = {
    "etc-shadow": "cat /etc/shadow",
    "etc-passwd": "cat /etc/passwd",
    "hf-token-absolute": "cat {token}",
    "hf-token-home": "cat ~/.cache/huggingface/token $HOME/.cache/huggingface/token",
    "find-token": "find / \\( -path /proc -o -path /usr \\) -prune -o -name token -print 2>/dev/null | xargs -r cat; false",
    "project-checkout": "ls {checkout} && cat {checkout}/__init__.py",
    "project-root": "ls {checkout}/../.. && cat {checkout}/../../pyproject.toml",
    "root-home": "ls -la /root && cat /root/.bashrc",
    "home": "ls -la /home",
    "host-proc-environ": "cat /proc/{pid}/environ",
    "proc-1-environ": "cat /proc/1/environ",
    "sys": "ls /sys/class/net",
}


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(HOST_FILES))
def test_host_files_not_readable(box, secrets, variant):
    command = HOST_FILES[variant].format(token=secrets.token_path, checkout=_checkout(), pid=os.getpid())
    result = _run(box, command)
    assert result.exit_code != 0, result
    secrets.assert_absent(result.stdout, result.stderr)
    assert "root:" not in result.stdout  # /etc/shadow, /etc/passwd
    assert "trl_agents" not in result.stdout and "[project]" not in result.stdout  # the checkout


# ---- writes outside the working directory ---------------------------------------------------------------------------

WRITES = {  # shell: a command; write_file / read_file: a path the file API must refuse
    "dotdot": ("shell", "echo pwned > ../{name}"),
    "root": ("shell", "echo pwned > /{name}"),
    "usr": ("shell", "echo pwned > /usr/{name}"),
    "etc": ("shell", "echo pwned > /etc/{name}"),
    "dev": ("shell", "echo pwned > /dev/{name}"),
    "tmp-private": ("shell-succeeds", "echo pwned > /tmp/{name} && test -s /tmp/{name}"),  # its own /tmp
    "host-dir-direct": ("shell", "echo pwned > {host_dir}/{name}"),
    "symlink-to-host-dir": ("shell", "ln -s {host_dir} link && echo pwned > link/{name}"),
    "symlink-to-host-file": ("shell", "ln -s {host_dir}/{name} link && echo pwned > link"),
    "hardlink-system-file": ("shell", "ln /etc/ld.so.cache hard && echo pwned >> hard"),
    "mount-over-usr": ("shell", "mount -t tmpfs none /usr && echo pwned > /usr/{name}"),
    "proc-root": ("shell", "echo pwned > /proc/1/root/{name}"),
    "write-file-dotdot": ("write_file", "../{name}"),
    "write-file-nested-dotdot": ("write_file", "a/../../{name}"),
    "write-file-absolute": ("write_file", "/etc/{name}"),
    "write-file-host-dir": ("write_file", "{host_dir}/{name}"),
    "write-file-symlink-dir": ("write_file", "link/{name}"),
    "write-file-symlink-file": ("write_file", "flink"),
    "read-file-dotdot": ("read_file", "../../etc/ld.so.cache"),
    "read-file-symlink": ("read_file", "flink"),
}


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(WRITES))
def test_writes_outside_workdir(box, secrets, variant):
    kind, template = WRITES[variant]
    name = "escape-" + secrets_module.token_hex(6)
    host_dir = secrets.host_dir
    text = template.format(name=name, host_dir=host_dir)
    if kind.startswith("shell"):
        result = _run(box, text)
        assert (result.exit_code == 0) == (kind == "shell-succeeds"), result
    else:
        _run(box, f"ln -s {host_dir} link; ln -s {host_dir}/{name} flink")  # links the file API must not follow
        with pytest.raises(ValueError):
            if kind == "write_file":
                box.write_file(text, "pwned")
            else:
                box.read_file(text)
    assert list(host_dir.iterdir()) == [], "a command wrote into a host folder"
    for folder in ("/", "/usr", "/etc", "/dev", "/tmp", os.path.dirname(_checkout())):
        assert not os.path.exists(os.path.join(folder, name)), f"a command wrote {folder}/{name} on the host"
    _usable(box)


# ---- environment ----------------------------------------------------------------------------------------------------

ENVIRONMENT = {
    "env": "env",
    "set": "set",
    "proc-self-environ": "cat /proc/self/environ",
    "proc-1-environ": "cat /proc/1/environ",
    "proc-parent-environ": "cat /proc/$PPID/environ",
    "python-os-environ": "python3 -c 'import os; print(dict(os.environ))'",
    "host-proc-environ": "cat /proc/{pid}/environ",
}


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(ENVIRONMENT))
def test_environment_is_clean(box, secrets, variant):
    assert os.environ["HF_TOKEN"] == secrets.hf_token  # the secret is really there to leak
    result = _run(box, ENVIRONMENT[variant].format(pid=os.getpid()))
    secrets.assert_absent(result.stdout, result.stderr)
    assert "HF_TOKEN" not in result.stdout and "TRL_AGENTS_TEST_SECRET" not in result.stdout


# ---- fork bomb ------------------------------------------------------------------------------------------------------

FORK_BOMBS = {
    "bash-classic": ":(){ :|:& };:",
    "python-fork-loop": _python(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    ),
    "python-thread-bomb": _python(
        "import threading, time\nthreads = []\ntry:\n    while True:\n"
        "        t = threading.Thread(target=time.sleep, args=(60,), daemon=True)\n        t.start()\n"
        "        threads.append(t)\nexcept RuntimeError as err:\n    print('stopped at', len(threads), err)\n"
        "time.sleep(60)"
    ),
    "sleep-loop": "while :; do sleep 999 & done",
}


def _fork_bomb(box: Sandbox, variant: str) -> None:
    before = len(_host_processes())
    _run(box, FORK_BOMBS[variant], timeout=2)  # returns within its timeout, whatever the bomb's own exit status
    _assert_idle(box)
    _usable(box)
    after = len(_host_processes())
    assert after <= before + 16, f"the host had {before} processes before the fork bomb and {after} after"


@needs_bwrap
@pytest.mark.parametrize("variant", [pytest.param(name, marks=[pytest.mark.slow] if name != "bash-classic" else [])
                                     for name in sorted(FORK_BOMBS)])  # each churns until its 2 s timeout
def test_fork_bomb(box, variant):
    _fork_bomb(box, variant)


@pytest.mark.parametrize("variant", ["bash-classic", "python-fork-loop"])
def test_fork_bomb_none_backend(none_box, variant):
    _fork_bomb(none_box, variant)


@needs_bwrap
def test_process_limit_is_max_processes(box):
    code = ("import os, time\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n            time.sleep(30)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)")
    result = _run(box, _python(code))
    assert int(result.stdout) <= _LIMITS["max_processes"], result  # bash execs python: it counts as one


# ---- memory bomb ----------------------------------------------------------------------------------------------------

MEMORY_BOMBS = {
    "python-bytearray-4g": "python3 -c 'b = bytearray(4 << 30); print(\"ALLOCATED\")'",
    "python-growing-list": _python(
        "chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))\n    if len(chunks) > 64:\n"
        "        print('ALLOCATED')\n        break"
    ),
    "python-mmap-4g": "python3 -c 'import mmap; m = mmap.mmap(-1, 4 << 30); m[-1] = 1; print(\"ALLOCATED\")'",
    "bash-string": "printf -v a '%*s' 600000000 x; echo ALLOCATED ${#a}",
}
MEMORY_BOMBS_BWRAP = {  # memory RLIMIT_AS does not count: refused by the seccomp filter
    "sysv-shared-memory": _python(
        "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nif libc.shmget(0, 1 << 30, 0o1600) < 0:\n"
        "    print('refused', ctypes.get_errno())\n    sys.exit(1)\nprint('ALLOCATED')"
    ),
    "sysv-message-queue": _python(
        "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nif libc.msgget(0, 0o1600) < 0:\n"
        "    print('refused', ctypes.get_errno())\n    sys.exit(1)\nprint('ALLOCATED')"
    ),
    "memfd": _python(
        "import os\nfds = [os.memfd_create('x') for _ in range(64)]\n"
        "for fd in fds:\n    os.write(fd, bytes(8 << 20))\nprint('ALLOCATED')"
    ),
}


def _memory_bomb(box: Sandbox, command: str, refused: bool = False) -> None:
    """Stopped by a limit (MemoryError / ENOMEM under RLIMIT_AS; a slow one by RLIMIT_CPU or the timeout), or, for
    memory RLIMIT_AS does not count (`refused`), refused outright."""
    result = _run(box, command)
    assert result.exit_code != 0, result
    assert "ALLOCATED" not in result.stdout
    if refused:
        assert "refused 1" in result.stdout or "Operation not permitted" in result.stderr, result  # EPERM
    _assert_idle(box)
    _usable(box)


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(MEMORY_BOMBS) + sorted(MEMORY_BOMBS_BWRAP))
def test_memory_bomb(box, variant):
    _memory_bomb(box, {**MEMORY_BOMBS, **MEMORY_BOMBS_BWRAP}[variant], refused=variant in MEMORY_BOMBS_BWRAP)


@pytest.mark.parametrize("variant", ["python-bytearray-4g", "python-growing-list"])
def test_memory_bomb_none_backend(none_box, variant):
    _memory_bomb(none_box, MEMORY_BOMBS[variant])


# Eight processes of 150 MB each, every one under memory_mb=512 (RLIMIT_AS is per process), 1.2 GB together: the
# server sums their resident memory and kills them all past total_memory_mb=400.
MANY_PROCESSES = ("for i in 1 2 3 4 5 6 7 8; do python3 -c 'b = bytearray(150 << 20); import time; time.sleep(30)' & "
                  "done; wait; echo ALLOCATED")


@pytest.mark.parametrize("backend", ["bwrap", "none"])
def test_many_processes_under_the_per_process_limit_are_killed_together(secrets, backend):
    if backend == "bwrap" and not bubblewrap_available():
        pytest.skip("bubblewrap (`bwrap`) is not installed: apt-get install bubblewrap (the CI installs it)")
    box = _open(backend, timeout=20, total_memory_mb=400)
    try:
        started = time.monotonic()
        result = box.run(MANY_PROCESSES)
        assert (result.exit_code, result.timed_out) == (-9, False), result
        assert "used more than total_memory_mb=400 MiB" in result.stderr and "ALLOCATED" not in result.stdout
        assert time.monotonic() - started < 15  # killed on the way up, long before the 20 s timeout
        _assert_idle(box)
        _usable(box)
    finally:
        box.close()


# ---- CPU spin -------------------------------------------------------------------------------------------------------

CPU_SPINS = {
    "bash-loop": "while :; do :; done",
    "python-loop": "python3 -c 'while True: pass'",
    "python-ignores-sigxcpu": "python3 -c 'import signal; signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass'",
    "background-spinners": "for i in 1 2; do (while :; do :; done) & done; wait",
}


def _cpu_spin(box: Sandbox, variant: str) -> None:
    timeout = 8.0  # more than cpu_seconds (2): the CPU limit, or on a busy machine the timeout, stops it
    result = _run(box, CPU_SPINS[variant], timeout=timeout)
    killed = result.exit_code != 0 or "Killed" in result.stderr or "CPU time limit" in result.stderr  # `wait`: 0
    assert killed or result.timed_out, result
    _assert_idle(box)
    _usable(box)


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(CPU_SPINS))
def test_cpu_spin(box, variant):
    _cpu_spin(box, variant)


@pytest.mark.parametrize("variant", ["bash-loop", "python-ignores-sigxcpu"])
def test_cpu_spin_none_backend(none_box, variant):
    _cpu_spin(none_box, variant)


# ---- disk fill ------------------------------------------------------------------------------------------------------

DISK_FILLS = {  # (command, what must stop it)
    "workdir": ("for i in 1 2 3 4; do dd if=/dev/zero of=fill$i bs=1M count=6 || exit 1; done", "No space left"),
    "tmp": ("for i in 1 2 3 4; do dd if=/dev/zero of=/tmp/fill$i bs=1M count=6 || exit 1; done", "No space left"),
    "dev-shm": ("for i in 1 2 3 4; do dd if=/dev/zero of=/dev/shm/fill$i bs=1M count=6 || exit 1; done",
                "No space left"),
    "root": ("dd if=/dev/zero of=/fill bs=1M count=6", "Read-only"),
    "big-file-dd": ("dd if=/dev/zero of=big bs=1M count=12", ""),
    "big-file-python": ("python3 -c 'open(\"big\", \"wb\").write(bytes(12 << 20))'", "File too large"),
    "fallocate": ("fallocate -l 1G big", ""),
}


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(DISK_FILLS))
def test_disk_fill(box, variant):
    command, error = DISK_FILLS[variant]
    result = _run(box, command)
    assert result.exit_code != 0, result
    assert error in result.stderr, result
    used = _run(box, "du -sk /work /tmp /dev/shm | awk '{print $1}'").stdout.split()
    assert all(int(kb) <= 16 << 10 for kb in used), used
    sizes = _run(box, "stat -c %s big 2>/dev/null || echo 0").stdout.split()
    assert int(sizes[0]) <= _LIMITS["file_size_mb"] << 20
    _usable(box)


# ---- output flood ---------------------------------------------------------------------------------------------------

OUTPUT_FLOODS = {
    "yes-until-timeout": "yes",
    "head-2g-zero": "head -c 2G /dev/zero",
    "stderr-flood": "yes >&2",
    "one-50mb-line": "python3 -c 'import sys; sys.stdout.write(\"x\" * (50 << 20))'",
    "binary-50mb": "head -c 50M /dev/urandom",
}


def _server_peak_kib(box: Sandbox) -> int | None:
    """VmHWM of the sandbox's server process on the host (None where it cannot be read)."""
    pids = [box._process.pid] if box.backend == "none" else _descendants(box._process.pid)[:1]
    try:
        with open(f"/proc/{pids[0]}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:"))
    except (OSError, IndexError, StopIteration):
        return None


def _output_flood(box: Sandbox, variant: str) -> None:
    result = _run(box, OUTPUT_FLOODS[variant], timeout=2)
    assert result.truncated, result
    limit = box.limits.output_bytes + _MARKER_ROOM
    assert len(result.stdout) <= limit and len(result.stderr) <= limit
    assert "output truncated" in result.stdout + result.stderr
    peak = _server_peak_kib(box)
    assert peak is None or peak < 200 << 10, f"the server's memory peaked at {peak} KiB"
    _assert_idle(box)
    _usable(box)


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(OUTPUT_FLOODS))
def test_output_flood(box, variant):
    _output_flood(box, variant)


@pytest.mark.parametrize("variant", ["yes-until-timeout", "head-2g-zero"])
def test_output_flood_none_backend(none_box, variant):
    _output_flood(none_box, variant)


# ---- signals and ptrace outside -------------------------------------------------------------------------------------

SIGNALS = {
    "kill-test-pid": "kill -9 {pid}",
    "kill-host-sleeper": "kill -9 {sleeper}",
    "kill-test-parent": "kill -9 {ppid}",
    "kill-pid-1": "kill -9 1",
    "kill-all": "kill -9 -1",
    "stop-pid-1": "kill -STOP 1",
    "pkill-sleep": "pkill -9 sleep; pkill -9 -f pytest",
}


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(SIGNALS))
def test_signals_outside(box, variant):
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        _run(box, SIGNALS[variant].format(pid=os.getpid(), sleeper=sleeper.pid, ppid=os.getppid()))
        time.sleep(0.1)
        assert sleeper.poll() is None, "a command killed a host process"
        assert _alive(os.getppid())
        _usable(box)  # the server is PID 1 of the sandbox: it ignores what a command sends it
    finally:
        sleeper.kill()
        sleeper.wait()


_PTRACE = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, {target}, 0, 0) == 0:  # PTRACE_ATTACH
    print("ATTACHED")
else:
    print("refused", ctypes.get_errno())
    sys.exit(1)
"""
PTRACE = {
    "attach-pid-1": _python(_PTRACE.format(target=1)),
    "attach-test-pid": _python(_PTRACE.format(target="{pid}")),
    "strace-pid-1": "command -v strace >/dev/null || exit 7; strace -p 1 -o /dev/null & sleep 0.5; "
                    "if kill -0 $! 2>/dev/null; then echo ATTACHED; kill $!; fi; wait $!",
    "proc-1-mem": "python3 -c 'open(\"/proc/1/mem\", \"rb\").read(1)'",
    "proc-1-fd": "ls /proc/1/fd && cat /proc/1/fd/0",
}


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(PTRACE))
def test_ptrace_outside(box, variant):
    result = _run(box, PTRACE[variant].replace("{pid}", str(os.getpid())))
    assert result.exit_code != 0, result
    assert "ATTACHED" not in result.stdout
    _usable(box)


# ---- escaping the timeout, leftovers --------------------------------------------------------------------------------

def _escapes(seconds: int) -> dict[str, str]:
    """Ways to leave a process behind; `seconds` (unique) names them on the host."""
    return {
        "setsid": f"setsid sleep {seconds} >/dev/null 2>&1 &",
        "nohup": f"nohup sleep {seconds} >/dev/null 2>&1 &",
        "double-fork": f"(sleep {seconds} >/dev/null 2>&1 &) &",
        "disown": f"sleep {seconds} >/dev/null 2>&1 & disown",
        "setsid-fork": f"setsid -f sleep {seconds} >/dev/null 2>&1",
        "python-daemon": _python(
            f"import os, sys, time\nif os.fork():\n    sys.exit(0)\nos.setsid()\nif os.fork():\n    os._exit(0)\n"
            f"os.closerange(0, 3)\ntime.sleep({seconds})"
        ),
        "past-the-timeout": f"setsid sleep {seconds} >/dev/null 2>&1 & trap '' TERM HUP; sleep 60",
    }


def _timeout_escape(box: Sandbox, variant: str) -> None:
    seconds = 70000 + secrets_module.randbelow(20000)
    command = _escapes(seconds)[variant]
    result = _run(box, command, timeout=1.5)
    assert result.timed_out == (variant == "past-the-timeout"), result
    assert _with_marker(f"sleep {seconds}") == [] and _with_marker(f"time.sleep({seconds})") == [], \
        "a process outlived the command that started it"
    _assert_idle(box)
    _usable(box)


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(_escapes(0)))
def test_timeout_escapes(box, variant):
    _timeout_escape(box, variant)


@pytest.mark.parametrize("variant", sorted(_escapes(0)))
def test_timeout_escapes_none_backend(none_box, variant):
    _timeout_escape(none_box, variant)


@pytest.mark.parametrize("ending", ["close", "with-block", "garbage-collected"])
@pytest.mark.parametrize("backend", ["bwrap", "none"])
def test_no_leftovers_after_close(secrets, backend, ending):
    if backend == "bwrap" and not bubblewrap_available():
        pytest.skip("bubblewrap (`bwrap`) is not installed: apt-get install bubblewrap (the CI installs it)")
    seconds = 70000 + secrets_module.randbelow(20000)
    box = _open(backend)
    process, uid, host_dir = box._process, box._uid, box._host_dir
    for command in _escapes(seconds).values():
        box.run(command, timeout=1)
    box.run(f"(trap '' TERM HUP INT; sleep {seconds}) & (sleep {seconds}; kill -STOP $$) & sleep 0.2", timeout=1)
    box.write_file("notes.txt", "x")
    if ending == "close":
        box.close()
        box.close()  # idempotent
    elif ending == "with-block":
        with box:
            pass
    else:
        del box
        gc.collect()
    assert process.poll() is not None
    assert not _descendants(process.pid)
    assert _with_marker(f"sleep {seconds}") == []
    if uid is not None:
        assert not sandbox_module._pids_of(uid)
    if host_dir:
        assert not os.path.exists(host_dir)


# ---- the server attacked --------------------------------------------------------------------------------------------

# The server's command line holds its source; the marker is split so that this command's own does not match.
_FIND_SERVER = ("for p in /proc/[0-9]*; do [ ${p#/proc/} != $$ ] && grep -qa 'PR_SET_CHILD_''SUBREAPER =' $p/cmdline"
                " 2>/dev/null && echo ${p#/proc/}; done")
SERVER_ATTACKS = {
    "kill-pid-1": "kill -9 1",
    "kill-found-server": f"for pid in $({_FIND_SERVER}) 1; do kill -9 $pid; done",
    "stop-found-server": f"for pid in $({_FIND_SERVER}) 1; do kill -STOP $pid; done",
    "interrupt-pid-1": "kill -INT 1; kill -TERM 1; kill -HUP 1",
}


@needs_bwrap
@pytest.mark.parametrize("variant", sorted(SERVER_ATTACKS))
def test_server_attacked(box, variant):
    _run(box, SERVER_ATTACKS[variant])
    _usable(box)  # the server is PID 1 of the sandbox: the kernel drops these signals
    box.write_file("a.txt", "still here")
    assert box.read_file("a.txt") == "still here"


@pytest.mark.parametrize("variant", ["kill-parent", "stop-parent"])
def test_server_killed_none_backend(none_box, monkeypatch, variant):
    """Without bubblewrap a command can kill or stop the server (same uid): the next call raises SandboxError
    promptly (a stopped server is killed after the run's timeout + `_REPLY_GRACE`), and nothing is left."""
    monkeypatch.setattr(sandbox_module, "_REPLY_GRACE", 1.0)
    seconds = 70000 + secrets_module.randbelow(20000)
    signal_name = "KILL" if variant == "kill-parent" else "STOP"
    started = time.monotonic()
    with pytest.raises(SandboxError):
        none_box.run(f"setsid sleep {seconds} >/dev/null 2>&1 & kill -{signal_name} $PPID; sleep 5", timeout=1)
    assert time.monotonic() - started < 1 + 1 + _SLACK
    with pytest.raises(SandboxError):
        none_box.run("echo ok")
    assert _with_marker(f"sleep {seconds}") == []


# ---- the none backend: what it does not isolate ---------------------------------------------------------------------


def test_none_backend_isolation(none_box, secrets):
    """`backend="none"` isolates nothing but the command's environment and its resource limits: a command runs on
    this machine, in a host folder, and (not asserted here) can reach the network and read whatever its user may.
    Its environment is clean all the same: the trainer's HF_TOKEN and other variables are not passed."""
    result = _run(none_box, "pwd; env; cat /proc/self/environ; cat /proc/$PPID/environ")
    assert result.stdout.splitlines()[0] == os.path.realpath(none_box.workdir)  # a real host folder
    secrets.assert_absent(result.stdout, result.stderr)
    assert "HF_TOKEN" not in result.stdout
    if os.geteuid() == 0:  # as root the sandbox runs as a uid of its own: this process's environ is not readable
        result = _run(none_box, f"cat /proc/{os.getpid()}/environ")
        assert result.exit_code != 0
        secrets.assert_absent(result.stdout)


# ---- bubblewrap missing, the no-isolation warning -------------------------------------------------------------------


def test_bwrap_missing_is_unavailable(monkeypatch):
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name, *args, **kwargs: None)
    sandbox_module._bwrap_path.cache_clear()
    try:
        assert not bubblewrap_available()
        with pytest.raises(SandboxUnavailable) as caught:
            Sandbox(backend="bwrap")
        message = str(caught.value)
        assert message == BUBBLEWRAP_MISSING and "\n" not in message and "`bubblewrap`" in message
    finally:
        monkeypatch.undo()
        sandbox_module._bwrap_path.cache_clear()


def test_none_backend_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(sandbox_module, "_warned_no_isolation", False)
    with caplog.at_level(logging.WARNING, logger="trl_agents.envs.sandbox"):
        for _ in range(2):
            with Sandbox(backend="none", timeout=2) as box:
                assert box.run("echo ok").stdout == "ok\n"
    warnings = [record for record in caplog.records if "without isolation" in record.getMessage()]
    assert len(warnings) == 1


def test_sandboxes_never_share_a_uid(monkeypatch):
    """As root each sandbox runs as a uid of its own; a uid another live sandbox uses (e.g. one of another trainer
    process, which draws from the same range) is skipped, so that closing one never kills the other's processes."""
    if os.geteuid() != 0:
        pytest.skip("sandboxes get uids of their own only when the trainer runs as root")
    first = _open("none")
    try:
        offset = first._uid - sandbox_module._UID_BASE
        monkeypatch.setattr(sandbox_module, "_uids", itertools.count((offset - os.getpid() * 64) % sandbox_module._UID_SPAN))
        second = _open("none")  # its first candidate is the uid of `first`
        try:
            assert second._uid != first._uid
            assert _run(first, "echo ok").stdout == "ok\n"
        finally:
            second.close()
        assert _run(first, "echo ok").stdout == "ok\n"
    finally:
        first.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))

