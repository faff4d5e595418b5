"""The process that runs inside a sandbox and executes its commands (standard library only, run with `python3 -I -S`).

`Sandbox` (sandbox.py) starts this file's source as `python3 -I -S -c <source>`: inside bubblewrap, or directly on
the host with `backend="none"`. It reads requests from stdin and answers on stdout, each message a 4-byte big-endian
length followed by that many bytes of JSON. The first message is the configuration; then, one at a time:

- `{"op": "run", "command": str, "stdin": str | None, "timeout": float}` runs `bash -c command` in the working
  directory with the resource limits, keeps at most `output_bytes` of stdout and of stderr (draining the rest), and
  kills every other process of the sandbox when the command ends or its time is up: no process outlives a run.
- `{"op": "write" | "read", "path": str, ...}`: a file of the working directory (paths that leave it are refused).
- `{"op": "snapshot" | "restore"}`: the working directory as a gzip tar archive, and back.

A request that fails is answered `{"error": message, "kind": the exception's class name}`.

Its own process is made non-dumpable, so commands (which run under the same uid) cannot read its pipes through
`/proc/<pid>/fd` nor ptrace it. Inside bubblewrap it is PID 1 of the sandbox (`--as-pid-1`): the kernel then drops
every signal a command sends it whose action is the default one, SIGKILL and SIGSTOP included, so no command can
kill or stop it (it leaves every signal at its default action for that). When stdin closes (the trainer exited or
closed the sandbox) it kills every command process and exits; inside bubblewrap, the kernel then kills every process
left in the sandbox, since its PID 1 is gone.
"""

import base64
import ctypes
import io
import json
import os
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import time

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
TRUNCATION_MARKER = "\n[... output truncated: {} more bytes not shown ...]\n"
MEMORY_MARKER = "\n[killed: the command's processes used more than total_memory_mb={} MiB of memory together]\n"
DISK_MARKER = "\n[the working directory holds {} bytes, more than disk_mb={} MiB]\n"
MEMORY_CHECK_SECONDS = 0.05
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def receive(stream):
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return json.loads(stream.read(size))


def send(stream, message):
    data = json.dumps(message).encode()
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def prctl(option, value):
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Server:
    def __init__(self, config):
        self.workdir = config["workdir"]
        self.limits = config["limits"]
        self.namespace = config["pid_namespace"]  # inside bubblewrap: this process sees only the sandbox's
        self.nproc = config["nproc"]
        self.env = config["env"]
        self.shell = config["shell"]

    # ---- commands ------------------------------------------------------------------------------------------------

    def set_limits(self):
        limits = self.limits
        for name, value in (
            ("RLIMIT_CPU", limits["cpu_seconds"]),
            ("RLIMIT_AS", limits["memory_mb"] << 20),
            ("RLIMIT_FSIZE", limits["file_size_mb"] << 20),
            ("RLIMIT_NOFILE", limits["open_files"]),
            ("RLIMIT_NPROC", self.nproc),
            ("RLIMIT_CORE", 0),
        ):
            resource.setrlimit(getattr(resource, name), (value, value))

    def run(self, request):
        limit = self.limits["output_bytes"]
        started = time.monotonic()
        deadline = started + float(request["timeout"])
        data = request.get("stdin")
        try:
            child = subprocess.Popen(
                [self.shell, "-c", request["command"]], cwd=self.workdir, env=self.env,
                stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, preexec_fn=self.set_limits, start_new_session=True,
            )
        except OSError as err:  # e.g. the process limit is reached by leftovers: report it as the command's failure
            return {"stdout": "", "stderr": f"could not start the command: {err}\n", "exit_code": 126,
                    "timed_out": False, "truncated": False, "duration": 0.0}
        kept = {child.stdout.fileno(): bytearray(), child.stderr.fileno(): bytearray()}
        dropped = dict.fromkeys(kept, 0)

        def keep(fd, chunk):  # at most `limit` bytes per stream; the rest is counted
            room = max(limit - len(kept[fd]), 0)
            kept[fd] += chunk[:room]
            dropped[fd] += max(len(chunk) - room, 0)

        selector = selectors.DefaultSelector()
        selector.register(child.stdout, selectors.EVENT_READ)
        selector.register(child.stderr, selectors.EVENT_READ)
        if data is not None:
            self.feed(child, data.encode())
        timed_out, open_streams, exited_at, over_memory = False, 2, None, False
        next_memory_check = started
        while open_streams:
            now = time.monotonic()
            if now >= deadline:
                timed_out = child.poll() is None
                break
            if now >= next_memory_check:  # every 50 ms, not on every chunk of a flood of output
                next_memory_check = now + MEMORY_CHECK_SECONDS
                if self.over_memory():
                    over_memory = True
                    break
            if exited_at is None and child.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.05:
                break  # the command is done; what is left holds its pipes open (a background process): stop reading
            for key, _ in selector.select(timeout=min(0.05, deadline - now)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                keep(key.fd, chunk)
        while not (timed_out or over_memory):  # its pipes are closed: let it finish (exiting, or running silently)
            try:
                child.wait(timeout=max(0.0, min(deadline - time.monotonic(), MEMORY_CHECK_SECONDS)))
                break
            except subprocess.TimeoutExpired:
                timed_out = time.monotonic() >= deadline
                over_memory = self.over_memory()
        self.kill_all(child)
        for key in list(selector.get_map().values()):  # what was written before the kill
            while True:
                try:
                    chunk = os.read(key.fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                keep(key.fd, chunk)
        selector.close()
        child.stdout.close()
        child.stderr.close()
        code = child.wait()
        texts = []  # stdout, then stderr (the order `kept` was filled in)
        for stream_kept, stream_dropped in zip(kept.values(), dropped.values()):
            text = bytes(stream_kept).decode("utf-8", errors="replace")
            texts.append(text + (TRUNCATION_MARKER.format(stream_dropped) if stream_dropped else ""))
        if over_memory:
            texts[1] += MEMORY_MARKER.format(self.limits["total_memory_mb"])
        code = -signal.SIGKILL if timed_out or over_memory else code
        if not self.namespace:  # without bubblewrap's sized tmpfs, the working directory's size is checked here
            used = self.disk_used()
            if used > self.limits["disk_mb"] << 20:
                code = code or 1
                texts[1] += DISK_MARKER.format(used, self.limits["disk_mb"])
        return {
            "stdout": texts[0], "stderr": texts[1], "exit_code": code, "timed_out": timed_out,
            "truncated": any(dropped.values()), "duration": time.monotonic() - started,
        }

    def over_memory(self):
        return self.memory_used() > self.limits["total_memory_mb"] << 20

    def memory_used(self):
        """Resident memory of the command's processes together, in bytes (the per-process address-space limit
        does not bound a sandbox running many processes)."""
        pids = [pid for pid in self.pids() if pid != os.getpid()] if self.namespace else self.descendants()
        total = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/statm") as handle:
                    total += int(handle.read().split()[1]) * PAGE_SIZE
            except (OSError, IndexError, ValueError):
                continue
        return total

    @staticmethod
    def feed(child, data):
        try:
            os.set_blocking(child.stdin.fileno(), False)
            written = 0
            deadline = time.monotonic() + 1.0
            while written < len(data) and time.monotonic() < deadline:
                try:
                    written += os.write(child.stdin.fileno(), data[written:written + 65536])
                except BlockingIOError:
                    time.sleep(0.001)
        except (BrokenPipeError, OSError):
            pass
        finally:
            try:
                child.stdin.close()
            except OSError:
                pass

    def kill_all(self, child):
        """Kill the command and everything it started, however it detached (setsid, nohup, double fork)."""
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        for _ in range(100):
            if self.namespace:
                # Inside the sandbox's PID namespace, -1 is every process but bubblewrap's init and this one.
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                left = [pid for pid in self.pids() if pid not in (1, os.getpid())]
            else:
                left = self.descendants()
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            self.reap(child)
            if not left:
                return
            time.sleep(0.002)

    @staticmethod
    def reap(child):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == child.pid:  # keep subprocess's bookkeeping right: it is reaped here
                child.returncode = os.waitstatus_to_exitcode(status)

    @staticmethod
    def pids():
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]

    def descendants(self):
        """Processes whose parent chain leads here (orphans are re-parented here: this process is a subreaper)."""
        parents = {}
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/stat") as handle:
                    parents[pid] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
        me, found, frontier = os.getpid(), set(), {os.getpid()}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in found}
            found |= frontier
        found.discard(me)
        return sorted(found)

    # ---- files ---------------------------------------------------------------------------------------------------

    def inside(self, path):
        """The absolute path of `path` in the working directory; ValueError when it leads out (.., a symlink)."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError("a path must be a non-empty string")
        if os.path.isabs(path):
            raise ValueError(f"{path!r} is absolute: give a path relative to the working directory")
        root = os.path.realpath(self.workdir)
        full = os.path.realpath(os.path.join(root, path))
        if full != root and not full.startswith(root + os.sep):
            raise ValueError(f"{path!r} leads out of the working directory")
        return full

    def write(self, request):
        full = self.inside(request["path"])
        os.makedirs(os.path.dirname(full), exist_ok=True)
        full = self.inside(request["path"])  # a folder on the way may be a symlink: check again once it exists
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(full, flags, 0o755 if request.get("executable") else 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(base64.b64decode(request["data"]))
        if request.get("executable"):
            os.chmod(full, 0o755)
        return {}

    def read(self, request):
        full = self.inside(request["path"])
        limit = int(request.get("limit") or 0)
        fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(limit + 1) if limit else handle.read()
        return {"data": base64.b64encode(data[:limit] if limit else data).decode(), "truncated": bool(limit) and
                len(data) > limit}

    def snapshot(self, request):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:
            for name in sorted(os.listdir(self.workdir)):
                archive.add(os.path.join(self.workdir, name), arcname=name)
        return {"data": base64.b64encode(buffer.getvalue()).decode()}

    def restore(self, request):
        for name in os.listdir(self.workdir):
            path = os.path.join(self.workdir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(request["data"])), mode="r:gz") as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(self.workdir, filter="data")
            else:  # Python < 3.11.4: refuse members that leave the folder ourselves
                for member in archive.getmembers():
                    self.inside(member.name)
                    if member.issym() or member.islnk():
                        self.inside(os.path.join(os.path.dirname(member.name), member.linkname))
                archive.extractall(self.workdir)
        return {}

    def disk_used(self):
        """Bytes of the files of the working directory."""
        total = 0
        for folder, _, names in os.walk(self.workdir):
            for name in names:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    pass
        return total


def main():
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as PID 1, a default action makes `kill -INT 1` a no-op
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    config = receive(stdin)
    if config is None:
        return
    server = Server(config)
    if server.namespace and os.getpid() > 8:  # not the first processes of a fresh PID namespace: never kill(-1)
        server.namespace = False
    os.makedirs(server.workdir, exist_ok=True)
    os.chdir(server.workdir)
    send(stdout, {"ready": True, "pid": os.getpid()})
    handlers = {"run": server.run, "write": server.write, "read": server.read, "snapshot": server.snapshot,
                "restore": server.restore}
    while True:
        request = receive(stdin)
        if request is None or request.get("op") == "close":
            break
        try:
            reply = handlers[request["op"]](request)
        except (OSError, ValueError, KeyError, tarfile.TarError) as err:
            reply = {"error": str(err), "kind": type(err).__name__}
        send(stdout, reply)
    if not server.namespace:
        for pid in server.descendants():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    main()
