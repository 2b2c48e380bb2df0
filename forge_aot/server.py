"""A warm start for forge-aot's processes: ``forge-aot server start`` leaves a process that has imported torch, Triton
and forge-aot (and initialised no GPU), and forks it for every process forge-aot would otherwise start with
``python -m``: the ``forge-aot`` command itself, its compile workers and its benchmark workers.

Why: on the H100 host ``import torch`` took 3.5 - 6 s in a fresh process (benchmarks/results/session17), and a warm
``forge-aot tune`` (binaries built, nothing new to compile) paid it twice at once, in the command (planning traces
the tuning inputs with torch) and in each benchmark worker, while its rows took about 2 s. A fork of a process that
has imported them costs milliseconds.

Each request runs in a fresh fork, so nothing one command did (kernel files executed, modules imported, GPU
contexts) reaches the next: the server itself never executes project code and never touches a GPU (it refuses to
serve where an import initialised CUDA or started a Python thread; torch's import starts one native thread, as
for every program that forks after importing torch, DataLoader workers included). A forked process gets the
caller's standard streams (passed over the socket), working directory, environment, ``sys.path`` as ``python -m``
would set it for that environment, and its exit status goes back to the caller; it is killed when its caller
goes away, and when the server is killed. Only the server's own user can connect and the caller talks only to a
server of its own user (SO_PEERCRED both ways; the socket lies in a directory of mode 700). Every request carries
the caller's fingerprint of the interpreter, forge-aot's sources and the torch and Triton installations, and a
server of other code refuses it (the socket's name carries it too). The server exits after ``idle_timeout``
seconds with nothing to do.

What a server cannot give a forked process: environment variables read when Python starts or when torch or
Triton are imported (``PYTHONHASHSEED``, ``LD_LIBRARY_PATH`` for the libraries torch loaded, torch's import-time
settings) come from the environment ``forge-aot server start`` ran in, and modules the server imported are the
server's, whatever the caller's ``PYTHONPATH`` says. ``CUDA_VISIBLE_DEVICES`` and Triton's cache and compile
settings are read later, so they follow each command's own environment.

Used where present (``spawn_module``); ``FORGE_AOT_SERVER=0`` turns that off for a process and its children.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import select
import selectors
import signal
import socket
import stat
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
"""Another socket than this installation's default (the fingerprint is still checked)."""
PRELOAD = ("torch", "triton", "triton.compiler", "triton.backends.compiler", "forge_aot.cli", "forge_aot.plan",
           "forge_aot.package", "forge_aot.tune.runner", "forge_aot.tune.bench_worker", "forge_aot._compile_worker",
           "forge_aot.trace", "forge_aot.introspect", "forge_aot.dev")
"""What the server imports before it serves: what the command and its workers spend their start on."""
DEFAULT_IDLE = 900.0
FORKED = False
"""Whether this process is one the server forked."""
_MAX_FRAME = 1 << 22
_REQUEST_SECONDS = 10.0


class ServerError(ForgeError):
    """A server could not be started, reached or stopped."""


_FINGERPRINT: list[str] = []


def fingerprint() -> str:
    """Interpreter, forge-aot's sources (paths, sizes, modification times) and where torch and Triton are installed
    (their package directories and ``__init__`` files, as a reinstall changes them): what a forked process would
    run, as this process would import it. Computed once per process."""
    if _FINGERPRINT:
        return _FINGERPRINT[0]
    package = Path(__file__).resolve().parent
    parts: list[Any] = [os.path.realpath(sys.executable), sys.prefix, sys.version, str(package)]
    for path in sorted(package.rglob("*.py")):
        st = path.stat()
        parts.append((str(path.relative_to(package)), st.st_size, st.st_mtime_ns))
    for name in ("torch", "triton"):
        spec = importlib.util.find_spec(name) if name not in sys.modules else sys.modules[name].__spec__
        origin = getattr(spec, "origin", None)
        stamps = [(p, os.stat(p).st_mtime_ns) for p in (origin, os.path.dirname(origin))] if origin else None
        parts.append((name, stamps))
    _FINGERPRINT.append(hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16])
    return _FINGERPRINT[0]


_SOCKET: list[str] = []


def _socket_dir() -> str:
    return os.path.join(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(), f"forge-aot-{os.getuid()}")


def socket_path() -> str:
    """Where this installation's server listens (computed once per process), or ``FORGE_AOT_SERVER_SOCKET``."""
    if not _SOCKET and os.environ.get(SOCKET_ENV):
        _SOCKET.append(os.environ[SOCKET_ENV])
    if not _SOCKET:
        _SOCKET.append(os.path.join(_socket_dir(), f"server-{fingerprint()}.sock"))
    return _SOCKET[0]


def _may_serve(path: str | None) -> bool:
    """Whether a server may listen for this process: False where this user has no server socket at all (one
    ``listdir``), so every command and worker started without a server skips the fingerprint (1.4 ms of stats)."""
    if path is not None or _SOCKET or os.environ.get(SOCKET_ENV):  # a socket named, or its path already known
        return True
    try:
        return any(name.endswith(".sock") for name in os.listdir(_socket_dir()))
    except OSError:
        return False


def _private(directory: str) -> bool:
    """Whether a directory is this user's own and nobody else's (not a link, mode without group/other bits)."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _private_dir(path: str) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if not _private(directory):
        raise ServerError(f"{directory} must be a directory of this user's, mode 700")


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    return int.from_bytes(creds[4:8], sys.byteorder)


def _connect(path: str, timeout: float = 5.0) -> socket.socket | None:
    """A connection to a server of this user's, in a directory nobody else can enter; else None."""
    if not _private(os.path.dirname(path) or "."):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        if _peer_uid(sock) != os.getuid():
            raise OSError("another user's server")
    except OSError:
        sock.close()
        return None
    return sock


def _frame(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return len(data).to_bytes(4, "little") + data


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    frame = _frame(message)
    sent = socket.send_fds(sock, [frame], list(fds)) if fds else 0  # the descriptors ride on the first bytes
    sock.sendall(frame[sent:])


def _recv(sock: socket.socket) -> dict[str, Any] | None:
    """One framed message on a blocking socket (no descriptors); None where the peer closed first."""
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "little"):
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
        if len(buf) >= 4 and int.from_bytes(buf[:4], "little") > _MAX_FRAME:
            raise ValueError("message too large")
    message = json.loads(buf[4:4 + int.from_bytes(buf[:4], "little")])
    if not isinstance(message, dict):
        raise ValueError("not a message")
    return message


def server_info(path: str | None = None) -> dict[str, Any] | None:
    """The running server's pid, fingerprint, start time and counts, or None where none answers."""
    sock = _connect(path or socket_path())
    if sock is None:
        return None
    with sock:
        try:
            _send(sock, {"kind": "ping"})
            return _recv(sock)
        except (OSError, ValueError):
            return None


# --- the caller's side --------------------------------------------------------------------------------------------

class ServerProcess:
    """A process the server forked for this caller, used as a ``subprocess.Popen`` with text pipes is: ``poll``
    never blocks, ``wait`` may be called from any thread, signals go through the server (which sends them only to
    a process it has not reaped: no pid reuse)."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self._sock = sock
        self.pid = pid
        self.stdin: IO[str] | None = None
        self.stdout: IO[str] | None = None
        self.stderr: IO[str] | None = None
        self.returncode: int | None = None
        self.args = ["<forge-aot server>", pid]
        self._reading = threading.Lock()  # one reader of the exit message at a time
        self._writing = threading.Lock()

    def _read_exit(self, timeout: float | None) -> bool:
        """Whether the exit is known, waiting up to ``timeout`` (None: for ever) for it."""
        if self.returncode is not None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._reading.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return False
        try:
            if self.returncode is not None:
                return True
            poller = select.poll()  # not select.select: a caller of many workers may hold descriptors past 1024
            poller.register(self._sock, select.POLLIN)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not poller.poll(None if left is None else left * 1000):
                return False
            try:
                self._sock.settimeout(None)
                reply = _recv(self._sock)
            except (OSError, ValueError):
                reply = None
            # The server gone with it (it takes its forks along): as a process killed reads.
            self.returncode = int(reply["returncode"]) if reply and "returncode" in reply else -int(signal.SIGKILL)
            self._sock.close()
            return True
        finally:
            self._reading.release()

    def poll(self) -> int | None:
        if self.returncode is None and self._reading.acquire(blocking=False):  # busy: another thread waits on it
            self._reading.release()
            self._read_exit(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_exit(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Safe from a signal handler: no lock the interrupted code may hold, one small write."""
        if self.returncode is None and self._writing.acquire(blocking=False):
            try:
                with contextlib.suppress(OSError):
                    self._sock.send(_frame({"signal": int(sig)}))
            finally:
                self._writing.release()

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
    if os.environ.get(SERVER_ENV) == "0" or (env is not None and env.get(SERVER_ENV) == "0") or not _may_serve(path):
        return None
    sock = _connect(path or socket_path())
    if sock is None:
        return None
    request = {"kind": "spawn", "module": module, "args": list(args), "env": dict(os.environ if env is None else env),
               "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd()), "function": function,
               "argv0": sys.argv[0] if sys.argv else module, "fingerprint": fingerprint(),
               "main_package": getattr(sys.modules.get("__main__"), "__package__", None)}
    try:
        _send(sock, request, fds)
        reply = _recv(sock)
    except (OSError, ValueError):
        reply = None
    if not reply or "pid" not in reply:
        sock.close()
        return None
    sock.settimeout(None)
    return ServerProcess(sock, int(reply["pid"]))


def spawn_module(module: str, env: dict[str, str], cwd: str | os.PathLike[str] | None) -> Any:
    """``python -m module`` with text pipes on its standard streams (line-buffered stdin): forked by this
    installation's server where one runs, else started as a new interpreter (``subprocess.Popen``)."""
    if (os.environ.get(SERVER_ENV) != "0" and env.get(SERVER_ENV) != "0" and _may_serve(None)
            and os.path.exists(socket_path())):
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


def forward(argv: list[str], module: str = "forge_aot.cli", function: str | None = "entry") -> int | None:
    """Run ``forge-aot argv`` (by default: the console script's function, so click names the program as here) in
    the server with this process's standard streams; its exit status, or None where no server runs. Ctrl-C,
    SIGTERM and SIGHUP reach the forked command; where it dies of a signal, this process dies of the same signal
    (as the shell would see from the command run directly)."""
    if FORKED:  # already the server's fork of a command
        return None
    proc = run_in_server(module, argv, function=function)
    if proc is None:
        return None
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, lambda s, _f: proc.send_signal(s))
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code < 0:  # died of a signal: so does this process
        exit_without_teardown(code)
    return code


# --- the forked process -------------------------------------------------------------------------------------------

class _Child:
    """What a forked process runs: the request, until its exit."""

    def __init__(self, request: dict[str, Any], fds: list[int]) -> None:
        self.request, self.fds = request, fds

    def run(self) -> None:
        global FORKED
        FORKED = True
        req = self.request
        code: Any = 0
        try:
            for target, fd in enumerate(self.fds[:3]):
                os.dup2(fd, target)  # inheritable copies: what the process starts (ptxas) gets its streams
            for fd in self.fds:
                if fd > 2:
                    os.close(fd)
            self._streams(req["env"])
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            # sys.path as `python -m` builds it in that environment: the working directory (unless
            # PYTHONSAFEPATH), PYTHONPATH, then the interpreter's own (the server's without its own PYTHONPATH).
            own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            first = [] if os.environ.get("PYTHONSAFEPATH") else [req["cwd"]]
            sys.path[:] = [*first, *own, *(p for p in _BASE_PATH if p not in own)]
            sys.argv = [req["argv0"] if req.get("function") else req["module"], *req["args"]]
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._main(req)
        except SystemExit as exc:
            code = exc.code
        except KeyboardInterrupt:
            code = -int(signal.SIGINT)  # as Python's own exit after an uncaught Ctrl-C: dies of SIGINT
        except BaseException:
            import traceback

            with contextlib.suppress(Exception):
                traceback.print_exc()
            code = 1
        exit_without_teardown(code)

    @staticmethod
    def _streams(env: dict[str, str]) -> None:
        """Standard streams as a new interpreter in that environment makes them (PYTHONUNBUFFERED,
        PYTHONIOENCODING; stderr backslash-escapes what it cannot encode)."""
        encoding, _, errors = (env.get("PYTHONIOENCODING") or "").partition(":")
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        kw = {"encoding": encoding or None, "closefd": False}
        sys.stdin = open(0, errors=errors or None, **kw)  # type: ignore[call-overload]  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1, errors=errors or None, **kw)  # type: ignore[call-overload]  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", **kw)  # type: ignore[call-overload]  # noqa: SIM115
        if unbuffered:
            for stream in (sys.stdout, sys.stderr):
                stream.reconfigure(write_through=True)

    @staticmethod
    def _main(req: dict[str, Any]) -> None:
        import warnings

        with warnings.catch_warnings():  # the preloaded module itself: run again as __main__, as `-m` does
            warnings.filterwarnings("ignore", "'.*' found in sys.modules after import of package", RuntimeWarning)
            if req.get("function"):  # as called in the caller's process: its __main__ says how it was run
                import types

                main = sys.modules["__main__"] = types.ModuleType("__main__")
                main.__package__ = req.get("main_package")
                getattr(importlib.import_module(req["module"]), req["function"])()
            else:
                import runpy

                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)


def exit_without_teardown(code: Any) -> None:
    """End the process as the interpreter's exit would, less its teardown of modules: non-daemon threads joined,
    atexit handlers (logging's flush, weakref finalizers, profilers, coverage), the standard streams flushed (120
    where that fails, as Python's own exit); a non-int code as ``sys.exit`` treats it; a negative one: die of that
    signal. For the console script once torch is imported (its teardown takes a third of a second and more), and
    for a fork, whose modules are the server's."""
    import atexit

    if not isinstance(code, int):
        if code is not None:
            with contextlib.suppress(Exception):
                print(code, file=sys.stderr)
        code = 0 if code is None else 1
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads end first, as at a normal exit
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except Exception:
                code = code or 120
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def _die_with(server_pid: int) -> None:
    """A forked process is killed if the server dies (Linux): its exit could then be told to no one. A stopped
    server waits for its forks instead."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != server_pid:  # it died before that took effect
        os._exit(1)


# --- the server ---------------------------------------------------------------------------------------------------

def _check_forkable() -> str | None:
    """Why forking this process would be unsafe, or None."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads are running"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "an import initialised CUDA"
    return None


_BASE_PATH: list[str] = []


class _Pending:
    """A connection whose request is still arriving (read without blocking, within a deadline)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buf, self.fds = conn, b"", []  # type: ignore[var-annotated]
        self.deadline = time.monotonic() + _REQUEST_SECONDS

    def read(self) -> dict[str, Any] | None:
        """The request once whole; raises EOFError/ValueError where it never will be."""
        data, fds, _, _ = socket.recv_fds(self.conn, 65536, 3, socket.MSG_CMSG_CLOEXEC)
        self.fds.extend(fds)
        if not data:
            raise EOFError
        self.buf += data
        if len(self.buf) < 4:
            return None
        size = int.from_bytes(self.buf[:4], "little")
        if size > _MAX_FRAME:
            raise ValueError("message too large")
        if len(self.buf) < 4 + size:
            return None
        message = json.loads(self.buf[4:4 + size])
        if not isinstance(message, dict):
            raise ValueError("not a message")
        return message

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        self.conn.close()


class _Server:
    """The loop: accepts requests, forks, reaps, tells each caller its process's exit."""

    def __init__(self, path: str, idle_timeout: float) -> None:
        self.path, self.idle_timeout = path, idle_timeout
        self.me, self.started, self.forks = os.getpid(), time.time(), 0
        self.fingerprint = fingerprint()
        self.children: dict[int, socket.socket | None] = {}  # pid -> its caller's connection (None: caller gone)
        self.pending: dict[socket.socket, _Pending] = {}
        self.last = time.monotonic()
        _private_dir(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.inode = os.stat(path).st_ino
        # A child's exit wakes the loop at once (its caller waits on it): SIGCHLD writes to a pipe it watches.
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        signal.set_wakeup_fd(self.wake_w)
        self.selector = selectors.DefaultSelector()  # epoll: descriptors past 1024 are fine
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")

    def stop_listening(self) -> None:
        """The socket goes at once (a new server may bind it); forks still running are served to their end."""
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == self.inode:
                    os.unlink(self.path)

    def close(self) -> None:
        self.stop_listening()
        for pending in list(self.pending.values()):
            pending.close()
        signal.set_wakeup_fd(-1)
        self.selector.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                self.selector.unregister(conn)
                with contextlib.suppress(OSError):
                    _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                conn.close()
            self.last = time.monotonic()

    def run(self) -> _Child | None:
        while True:
            self.reap()
            now = time.monotonic()
            for pending in [p for p in self.pending.values() if p.deadline < now]:  # too slow: dropped
                self.selector.unregister(pending.conn)
                del self.pending[pending.conn]
                pending.close()
            if not self.children and not self.pending and (
                    self.listener is None or now - self.last > self.idle_timeout):
                return None  # stopped and drained, or idle
            for key, _ in self.selector.select(1.0):
                try:
                    child = self._event(key)
                except Exception:  # one caller's trouble never ends the server (and its forks with it)
                    child = None
                if child is not None:
                    return child

    def _event(self, key: selectors.SelectorKey) -> _Child | None:
        if key.data == "wake":
            with contextlib.suppress(BlockingIOError):
                os.read(self.wake_r, 512)
        elif key.data == "listener":
            try:
                conn, _ = self.listener.accept()  # type: ignore[union-attr]
            except OSError:  # out of descriptors, or the caller gave up: try again on the next round
                time.sleep(0.01)
                return None
            self.last = time.monotonic()
            if _peer_uid(conn) != os.getuid():
                conn.close()
                return None
            conn.setblocking(False)
            self.pending[conn] = _Pending(conn)
            self.selector.register(conn, selectors.EVENT_READ, "pending")
        elif key.data == "pending":
            pending = self.pending[key.fileobj]  # type: ignore[index]
            try:
                request = pending.read()
            except BlockingIOError:
                request = None
            except (OSError, EOFError, ValueError):
                request, pending.deadline = None, 0.0  # dropped on the next round
            if request is not None:
                self.selector.unregister(pending.conn)
                del self.pending[pending.conn]
                pending.conn.setblocking(True)
                pending.conn.settimeout(5)
                return self._request(pending, request)
        else:  # a caller's connection: a signal for its process, or it went away (and so does its process)
            conn = key.fileobj
            pid = next(p for p, c in self.children.items() if c is conn)
            try:
                conn.settimeout(1)  # type: ignore[union-attr]
                message = _recv(conn)  # type: ignore[arg-type]
            except (OSError, ValueError):
                message = None
            if message is not None:
                with contextlib.suppress(ProcessLookupError, ValueError, TypeError):
                    os.kill(pid, int(message["signal"]))  # not reaped yet: still this process's pid
                return None
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.selector.unregister(conn)
            conn.close()  # type: ignore[union-attr]
            self.children[pid] = None
        return None

    def _request(self, pending: _Pending, request: dict[str, Any]) -> _Child | None:
        conn, fds = pending.conn, pending.fds
        pending.fds = []
        kind = request.get("kind")
        if kind == "ping":
            with contextlib.suppress(OSError):
                _send(conn, {"pid": self.me, "started": self.started, "socket": self.path, "forked": self.forks,
                             "processes": sum(1 for _ in self.children), "fingerprint": self.fingerprint})
        elif kind == "stop":
            self.stop_listening()  # before the answer: once stop() returns, the socket is gone
            with contextlib.suppress(OSError):
                _send(conn, {"stopping": self.me})
        elif kind == "spawn" and len(fds) == 3 and request.get("fingerprint") == self.fingerprint:
            return self._fork(conn, request, fds)
        elif kind == "spawn":
            why = "three descriptors expected" if len(fds) != 3 else "another installation's server"
            with contextlib.suppress(OSError):
                _send(conn, {"error": why})
        for fd in fds:
            os.close(fd)
        conn.close()
        return None

    def _fork(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> _Child | None:
        try:
            pid = os.fork()
        except OSError as exc:  # the caller starts the process itself
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                _send(conn, {"error": f"fork: {exc}"})
            conn.close()
            return None
        if pid == 0:
            _die_with(self.me)
            for other in [*(c for c in self.children.values() if c is not None), *self.pending]:
                other.close()
            for pending in self.pending.values():
                for fd in pending.fds:
                    os.close(fd)
            conn.close()
            if self.listener is not None:
                self.listener.close()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.selector.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            os.setpgid(0, 0)  # its own group: a terminal's Ctrl-C to the server's group does not reach it
            return _Child(request, fds)
        self.forks += 1
        for fd in fds:
            os.close(fd)
        try:
            _send(conn, {"pid": pid})
        except OSError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.children[pid] = None
            conn.close()
            return None
        conn.settimeout(None)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, "child")
        return None


def serve(path: str, idle_timeout: float = DEFAULT_IDLE, preload: tuple[str, ...] = PRELOAD) -> _Child | None:
    """Listen at ``path`` until ``idle_timeout`` seconds pass with no process and no request, or a stop request
    (the socket then goes at once, and the server ends once its forks have, their exits told to their callers).
    Returns None in the server; in a forked process, the request it is to run. Raises ServerError where it cannot
    serve."""
    fingerprint()  # before the imports, as a caller computes it (an import may write bytecode caches)
    for name in preload:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    why = _check_forkable()
    if why is not None:
        raise ServerError(f"cannot serve forked processes: {why}")
    started_env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    _BASE_PATH[:] = [p for p in sys.path[1:] if p not in started_env]
    server = _Server(path, idle_timeout)
    try:
        return server.run()
    finally:
        if os.getpid() == server.me:
            server.close()


def start(idle_timeout: float = DEFAULT_IDLE, wait: float = 300.0, path: str | None = None,
          env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start a server at ``path`` (this installation's socket by default), detached, its log beside its socket,
    unless one runs there; its info, with ``process`` (the ``Popen``) where this call started it."""
    path = path or socket_path()
    info = server_info(path)
    if info is not None:
        return {**info, "already": True}
    _private_dir(path)
    log = path[:-len(".sock")] + ".log" if path.endswith(".sock") else path + ".log"
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != SERVER_ENV}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "forge_aot.server", path, str(idle_timeout)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd="/",
                                start_new_session=True)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        info = server_info(path)
        if info is not None:
            return {**info, "already": False, "log": log, "process": proc}
        if proc.poll() is not None:
            tail = Path(log).read_text(errors="replace")[-2000:]
            raise ServerError(f"the server exited at start ({proc.returncode}):\n{tail}")
        time.sleep(0.02)
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
