"""A warm start for forge-aot's processes: ``forge-aot server start`` leaves a process that has imported torch, Triton
and forge-aot (and initialised no GPU), and forks it for every process forge-aot would otherwise start with
``python -m``: the ``forge-aot`` command itself, its compile workers and its benchmark workers.

Why: on the H100 host ``import torch`` took 3.5 - 6 s in a fresh process (benchmarks/results/session17), and a warm
``forge-aot tune`` (binaries built, nothing new to compile) paid it twice at once, in the command (planning traces
the tuning inputs with torch) and in each benchmark worker, while its rows took about 2 s. A fork of a process that
has imported them costs milliseconds.

Each request runs in a fresh fork, so nothing one command did (kernel files executed, modules imported, GPU
contexts) reaches the next: the server itself never executes project code and never touches a GPU (it refuses to
serve where an import initialised CUDA or started a thread Python does not know of... see ``_check_forkable``).
A forked process gets the caller's standard streams (passed over the socket), working directory, environment,
``sys.path`` as ``python -m`` would set it for that environment, and its exit status goes back to the caller;
it is killed when its caller goes away. Only the caller's own user can connect (SO_PEERCRED; the socket lies in a
directory only that user can enter). The socket's name carries a fingerprint of the interpreter, forge-aot's
sources and the torch and Triton installations: a server of other code is never used, and it exits after
``idle_timeout`` seconds with nothing to do.

What a server cannot give a forked process: environment variables that torch or Triton read when they are
imported come from the environment ``forge-aot server start`` ran in (``CUDA_VISIBLE_DEVICES`` and Triton's
cache and compile settings are read later, so they follow each command's own environment).

Used where present (``spawn_module``); ``FORGE_AOT_SERVER=0`` turns that off for a process and its children.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from .errors import ForgeError

SERVER_ENV = "FORGE_AOT_SERVER"
"""``0`` in the environment: start processes with ``python -m`` even where a server runs."""
SOCKET_ENV = "FORGE_AOT_SERVER_SOCKET"
PRELOAD = ("torch", "triton", "triton.compiler", "triton.backends.compiler", "forge_aot.cli", "forge_aot.plan",
           "forge_aot.package", "forge_aot.tune.runner", "forge_aot.tune.bench_worker", "forge_aot._compile_worker",
           "forge_aot.trace", "forge_aot.introspect", "forge_aot.dev")
"""What the server imports before it serves: what the command and its workers spend their start on."""
DEFAULT_IDLE = 900.0
FORKED = False
"""Whether this process is one the server forked."""
_MAX_HEADER = 1 << 20


class ServerError(ForgeError):
    """A server could not be started, reached or stopped."""


def _fingerprint() -> str:
    """Interpreter, forge-aot's sources (paths, sizes, modification times) and where torch and Triton are installed
    (and when): what a forked process would run, as this process would import it."""
    package = Path(__file__).resolve().parent
    parts: list[Any] = [os.path.realpath(sys.executable), sys.prefix, sys.version, str(package)]
    for path in sorted(package.rglob("*.py")):
        st = path.stat()
        parts.append((str(path.relative_to(package)), st.st_size, st.st_mtime_ns))
    for name in ("torch", "triton"):
        spec = importlib.util.find_spec(name) if name not in sys.modules else sys.modules[name].__spec__
        origin = getattr(spec, "origin", None)
        parts.append((name, origin, os.stat(origin).st_mtime_ns if origin else None))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


_SOCKET: list[str] = []


def socket_path() -> str:
    """Where this installation's server listens (computed once per process); ``FORGE_AOT_SERVER_SOCKET`` names
    another (then the caller, not the fingerprint, vouches that the server runs this code)."""
    if not _SOCKET and os.environ.get(SOCKET_ENV):
        _SOCKET.append(os.environ[SOCKET_ENV])
    if not _SOCKET:
        base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
        _SOCKET.append(os.path.join(base, f"forge-aot-{os.getuid()}", f"server-{_fingerprint()}.sock"))
    return _SOCKET[0]


def _private_dir(path: str) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ServerError(f"{directory} must belong to this user and be private (mode 700)")


def _connect(path: str, timeout: float = 5.0) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    frame = len(data).to_bytes(4, "little") + data
    if fds:
        socket.send_fds(sock, [frame], list(fds))
    else:
        sock.sendall(frame)


def _recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One framed message (and the descriptors sent with it); None where the peer closed first."""
    fds: list[int] = []
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "little"):
        if max_fds and not fds:
            chunk, got, _, _ = socket.recv_fds(sock, 65536, max_fds)
            fds.extend(got)
        else:
            chunk = sock.recv(65536)
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        buf += chunk
        if len(buf) >= 4 and int.from_bytes(buf[:4], "little") > _MAX_HEADER:
            raise ValueError("message too large")
    return json.loads(buf[4:4 + int.from_bytes(buf[:4], "little")]), fds


def server_info(path: str | None = None) -> dict[str, Any] | None:
    """The running server's pid, fingerprint and start time, or None where none answers."""
    sock = _connect(path or socket_path())
    if sock is None:
        return None
    with sock:
        try:
            _send(sock, {"kind": "ping"})
            reply, _ = _recv(sock)
        except (OSError, ValueError):
            return None
    return reply


# --- the caller's side --------------------------------------------------------------------------------------------

class ServerProcess:
    """A process the server forked for this caller, used as a ``subprocess.Popen`` with text pipes is."""

    def __init__(self, sock: socket.socket, pid: int, stdin: IO[str] | None, stdout: IO[str] | None,
                 stderr: IO[str] | None) -> None:
        self._sock = sock
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: int | None = None
        self.args = ["<forge-aot server>", pid]
        self._lock = threading.Lock()

    def _read_exit(self, timeout: float | None) -> bool:
        with self._lock:
            if self.returncode is not None:
                return True
            return self._read_exit_locked(timeout)

    def _read_exit_locked(self, timeout: float | None) -> bool:
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return False
        try:
            self._sock.settimeout(None)
            reply, _ = _recv(self._sock)
        except (OSError, ValueError):
            reply = None
        # The server gone with it: as a process killed would read.
        self.returncode = int(reply["returncode"]) if reply else -int(signal.SIGKILL)
        self._sock.close()
        return True

    def poll(self) -> int | None:
        self._read_exit(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_exit(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not after its exit was reported: the pid may be another process's by then
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def run_in_server(module: str, args: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike[str] |
                  None = None, fds: tuple[int, int, int] = (0, 1, 2), path: str | None = None,
                  function: str | None = None) -> ServerProcess | None:
    """Have the server fork ``python -m module args`` with these standard descriptors (or, given ``function``,
    call ``module.function()`` with ``sys.argv`` this process's ``argv[0]`` and ``args``); None where no server of
    this installation answers (the caller then starts the process itself)."""
    if os.environ.get(SERVER_ENV) == "0" or (env is not None and env.get(SERVER_ENV) == "0"):
        return None
    sock = _connect(path or socket_path())
    if sock is None:
        return None
    request = {"kind": "spawn", "module": module, "args": list(args), "env": dict(os.environ if env is None else env),
               "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd()), "function": function,
               "argv0": sys.argv[0] if sys.argv else module,
               "main_package": getattr(sys.modules.get("__main__"), "__package__", None)}
    try:
        _send(sock, request, fds)
        reply, _ = _recv(sock)
    except (OSError, ValueError):
        reply = None
    if not reply or "pid" not in reply:
        sock.close()
        return None
    sock.settimeout(None)
    return ServerProcess(sock, int(reply["pid"]), None, None, None)


def spawn_module(module: str, env: dict[str, str], cwd: str | os.PathLike[str] | None) -> Any:
    """``python -m module`` with text pipes on its standard streams (line-buffered stdin): forked by this
    installation's server where one runs, else started as a new interpreter (``subprocess.Popen``)."""
    if os.environ.get(SERVER_ENV) != "0" and env.get(SERVER_ENV) != "0" and os.path.exists(socket_path()):
        pipes = [os.pipe() for _ in range(3)]  # (read, write): the child reads stdin, writes stdout and stderr
        theirs = (pipes[0][0], pipes[1][1], pipes[2][1])
        try:
            proc = run_in_server(module, [], env, cwd, theirs)
        finally:
            for fd in theirs:
                os.close(fd)
        if proc is not None:
            proc.stdin = open(pipes[0][1], "w", buffering=1)  # noqa: SIM115 - owned by the process object
            proc.stdout = open(pipes[1][0])  # noqa: SIM115
            proc.stderr = open(pipes[2][0])  # noqa: SIM115
            return proc
        for fd in (pipes[0][1], pipes[1][0], pipes[2][0]):
            os.close(fd)
    return subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, bufsize=1)


def forward(argv: list[str]) -> int | None:
    """Run ``forge-aot argv`` in the server with this process's standard streams; its exit status, or None where
    no server runs. Ctrl-C and SIGTERM reach the forked command."""
    if FORKED:  # already the server's fork of a command
        return None
    proc = run_in_server("forge_aot.cli", argv, function="entry")  # as the console script: click's names
    if proc is None:
        return None
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, lambda s, _f: proc.send_signal(s))
    try:
        while True:
            with contextlib.suppress(InterruptedError):
                return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- the server ---------------------------------------------------------------------------------------------------

def _check_forkable() -> str | None:
    """Why forking this process would be unsafe, or None."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads are running"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "an import initialised CUDA"
    return None


class _Child:
    """What a forked process runs: the request, until its exit."""

    def __init__(self, request: dict[str, Any], fds: list[int]) -> None:
        self.request, self.fds = request, fds

    def run(self) -> None:
        global FORKED
        FORKED = True
        req = self.request
        for target, fd in enumerate(self.fds[:3]):
            os.dup2(fd, target)
        for fd in self.fds:
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        # sys.path as `python -m` builds it in that environment: the working directory, PYTHONPATH, then the
        # interpreter's own (the server's path without its own PYTHONPATH entries).
        own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [req["cwd"], *own, *(p for p in _BASE_PATH if p not in own)]
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.argv = [req["argv0"] if req.get("function") else req["module"], *req["args"]]
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import runpy

        code: Any = 0
        import warnings

        try:
            with warnings.catch_warnings():  # the preloaded module itself: run again as __main__, as `-m` does
                warnings.filterwarnings("ignore", "'.*' found in sys.modules after import of package",
                                        RuntimeWarning)
                if req.get("function"):  # as called in the caller's process: its __main__ (how it was run)
                    import types

                    main = sys.modules["__main__"] = types.ModuleType("__main__")
                    main.__package__ = req.get("main_package")
                    getattr(importlib.import_module(req["module"]), req["function"])()
                else:
                    runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
        except KeyboardInterrupt:
            code = 130
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        _exit(code)


def _die_with(server_pid: int) -> None:
    """A forked process is killed if the server dies (Linux): its exit could then be told to no one. A stopped
    server waits for its forks instead."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != server_pid:  # it died before that took effect
        os._exit(1)


def _exit(code: Any) -> None:
    """Leave as the interpreter's exit would (non-daemon threads, atexit, streams), without tearing down modules
    the fork shares with the server."""
    import atexit

    if not isinstance(code, int):
        if code is not None:
            with contextlib.suppress(Exception):
                print(code, file=sys.stderr)
        code = 0 if code is None else 1
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


_BASE_PATH: list[str] = []
_FORKS = [0]


def serve(path: str, idle_timeout: float = DEFAULT_IDLE, preload: tuple[str, ...] = PRELOAD) -> _Child | None:
    """Listen at ``path`` until ``idle_timeout`` seconds pass with no process and no request, or a stop request
    (the socket then goes at once, and the server ends once its forks have, their exits told to their callers).
    Returns None in the server; in a forked process, the request it is to run. Raises ServerError where it cannot
    serve."""
    for name in preload:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    why = _check_forkable()
    if why is not None:
        raise ServerError(f"cannot serve forked processes: {why}")
    started_env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    _BASE_PATH[:] = [p for p in sys.path[1:] if p not in started_env]
    _private_dir(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    ours = os.stat(path).st_ino

    def stop_listening() -> None:  # the socket goes at once (a new server may bind it); forks are still served
        nonlocal listener
        if listener is not None:
            listener.close()
            listener = None
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == ours:
                    os.unlink(path)

    me, started = os.getpid(), time.time()
    children: dict[int, socket.socket | None] = {}  # pid -> the caller's connection (None: caller gone)
    last = time.monotonic()
    # A child's exit wakes the loop at once (its caller waits on it): SIGCHLD writes to a pipe select watches.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    signal.set_wakeup_fd(wake_w)
    try:
        while True:
            while children:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = children.pop(pid, None)
                if conn is not None:
                    with contextlib.suppress(OSError):
                        _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                    conn.close()
                last = time.monotonic()
            if not children and (listener is None or time.monotonic() - last > idle_timeout):
                return None  # stopped and drained, or idle
            watched = [c for c in children.values() if c is not None]
            try:
                ready, _, _ = select.select([*([listener] if listener else []), wake_r, *watched], [], [], 1.0)
            except InterruptedError:
                continue
            for sock in ready:
                if sock == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 512)
                    continue
                if sock is not listener:  # a caller's connection: it went away, so does its process
                    pid = next(p for p, c in children.items() if c is sock)
                    with contextlib.suppress(OSError):
                        if sock.recv(1):
                            continue
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    sock.close()
                    children[pid] = None
                    continue
                conn, _ = sock.accept()
                last = time.monotonic()
                child = _accept(conn, children, me, started, path)
                if child == "stop":
                    stop_listening()
                elif isinstance(child, _Child):
                    sock.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    return child
    finally:
        if os.getpid() == me:
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            stop_listening()


def _accept(conn: socket.socket, children: dict[int, socket.socket | None], me: int, started: float,
            path: str) -> _Child | str | None:
    """Answer one connection: None, "stop", or in a forked process the request it is to run."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    if int.from_bytes(creds[4:8], "little") != os.getuid():
        conn.close()
        return None
    conn.settimeout(10)
    try:
        request, fds = _recv(conn, max_fds=3)
    except (OSError, ValueError):
        conn.close()
        return None
    kind = (request or {}).get("kind")
    if kind == "ping":
        with contextlib.suppress(OSError):
            _send(conn, {"pid": me, "started": started, "socket": path, "processes": len(children),
                         "forked": _FORKS[0]})
        conn.close()
        return None
    if kind == "stop":
        with contextlib.suppress(OSError):
            _send(conn, {"stopping": me})
        conn.close()
        return "stop"
    if kind != "spawn" or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    try:
        pid = os.fork()
    except OSError as exc:  # the caller starts the process itself
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            _send(conn, {"error": f"fork: {exc}"})
        conn.close()
        return None
    _FORKS[0] += 1
    if pid == 0:
        _die_with(me)
        for other in children.values():
            if other is not None:
                other.close()
        conn.close()
        os.setpgid(0, 0)  # its own group: a terminal's Ctrl-C to the server's group does not reach it
        return _Child(request, fds)  # type: ignore[arg-type]
    for fd in fds:
        os.close(fd)
    conn.settimeout(None)
    try:
        _send(conn, {"pid": pid})
        children[pid] = conn
    except OSError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        children[pid] = None
        conn.close()
    return None


def start(idle_timeout: float = DEFAULT_IDLE, wait: float = 300.0) -> dict[str, Any]:
    """Start this installation's server (detached, its log beside its socket) unless one runs; its info."""
    path = socket_path()
    info = server_info(path)
    if info is not None:
        return {**info, "already": True}
    _private_dir(path)
    log = path[:-len(".sock")] + ".log"
    env = {k: v for k, v in os.environ.items() if k != SERVER_ENV}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "forge_aot.server", path, str(idle_timeout)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd="/",
                                start_new_session=True)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        info = server_info(path)
        if info is not None:
            return {**info, "already": False, "log": log}
        if proc.poll() is not None:
            tail = Path(log).read_text(errors="replace")[-2000:]
            raise ServerError(f"the server exited at start ({proc.returncode}):\n{tail}")
        time.sleep(0.05)
    proc.kill()
    raise ServerError(f"the server did not answer within {wait:g} s (log: {log})")


def stop(path: str | None = None) -> bool:
    """Ask this installation's server to stop: its socket goes at once (commands from then on start their own
    processes), and it exits once the processes it forked have. Whether one was running."""
    sock = _connect(path or socket_path())
    if sock is None:
        return False
    with sock, contextlib.suppress(OSError, ValueError):
        _send(sock, {"kind": "stop"})
        _recv(sock)
    return True


def main() -> None:
    from forge_aot import server  # one copy of this module, not a second as __main__

    path, idle = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else server.DEFAULT_IDLE
    child = server.serve(path, idle)
    if child is not None:
        child.run()


if __name__ == "__main__":
    main()
