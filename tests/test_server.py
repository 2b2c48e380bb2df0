"""``forge-aot server``: a warm process that forks forge-aot's commands and workers. Real servers, real forks, real
sockets; each test's server listens on its own socket (never the user's)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from forge_aot import server

REPO = Path(__file__).resolve().parent.parent
ECHO = textwrap.dedent("""
    import os, sys
    import json
    print("hello", json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "var": os.environ.get("FORGE_TEST_VAR"),
          "torch": "torch" in sys.modules, "path0": sys.path[:2], "mark": getattr(json, "FORGE_MARK", None),
          "pid": os.getpid()}), flush=True)
    json.FORGE_MARK = "set by an earlier process"  # a preloaded module: the next fork must not see it
    for line in sys.stdin:
        if line.strip() == "exit":
            sys.exit(7)
        if line.strip() == "raise":
            raise RuntimeError("boom")
        if line.strip() == "hang":
            time_ = __import__("time"); time_.sleep(600)
        print("echo", line.strip(), flush=True)
        print("err", line.strip(), file=sys.stderr, flush=True)
""")


def _start(path: Path, idle: float = 600) -> subprocess.Popen[bytes]:
    info = server.start(idle, wait=120, path=str(path), env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert not info["already"]
    return info["process"]


@pytest.fixture(scope="module")
def sock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # A short private directory: a Unix socket's path is limited to 107 bytes.
    directory = Path(os.path.realpath(tempfile_dir())) / f"fst-{os.getpid()}-{threading.get_ident() % 10000}"
    directory.mkdir(mode=0o700)
    path = directory / "s.sock"
    proc = _start(path)
    try:
        yield path
    finally:
        server.stop(str(path))
        proc.wait(30)
        shutil.rmtree(directory, ignore_errors=True)


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


@pytest.fixture()
def echo_mod(tmp_path: Path) -> Path:
    (tmp_path / "fst_echo.py").write_text(ECHO)
    return tmp_path


@pytest.fixture()
def use(sock: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(server, "_SOCKET", [str(sock)])
    monkeypatch.delenv(server.SERVER_ENV, raising=False)
    return sock


def _env(echo_mod: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(echo_mod), FORGE_TEST_VAR="from the caller")
    env.pop(server.SERVER_ENV, None)
    return {**env, **extra}


def _hello(proc) -> dict:
    import json

    line = proc.stdout.readline()
    assert line.startswith("hello "), line + proc.stderr.read()
    return json.loads(line[len("hello "):])


def test_a_forked_process_gets_the_callers_streams_env_cwd_and_path(use: Path, echo_mod: Path, tmp_path: Path) -> None:
    before = server.server_info(str(use))["forked"]
    proc = server.spawn_module("fst_echo", _env(echo_mod), tmp_path)
    assert isinstance(proc, server.ServerProcess)
    hello = _hello(proc)
    assert hello["cwd"] == str(tmp_path) and hello["var"] == "from the caller" and hello["argv"] == []
    assert hello["torch"], "the server imported torch before it forked"
    assert hello["path0"] == [str(tmp_path), str(echo_mod)]  # as `python -m`: cwd, then PYTHONPATH
    assert hello["pid"] == proc.pid and proc.poll() is None
    proc.stdin.write("abc\n")
    assert proc.stdout.readline() == "echo abc\n" and proc.stderr.readline() == "err abc\n"
    proc.stdin.write("exit\n")
    assert proc.wait(30) == 7 and proc.returncode == 7
    assert server.server_info(str(use))["forked"] == before + 1


def test_each_process_starts_from_a_clean_fork(use: Path, echo_mod: Path) -> None:
    for _ in range(2):
        proc = server.spawn_module("fst_echo", _env(echo_mod), echo_mod)
        assert _hello(proc)["mark"] is None
        proc.stdin.close()
        assert proc.wait(30) == 0


def test_kill_wait_timeout_and_errors(use: Path, echo_mod: Path) -> None:
    proc = server.spawn_module("fst_echo", _env(echo_mod), echo_mod)
    _hello(proc)
    proc.stdin.write("hang\n")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.3)
    proc.kill()
    assert proc.wait(30) == -signal.SIGKILL
    proc.kill()  # after its exit: nothing (its pid may be another process's)
    proc = server.spawn_module("fst_echo", _env(echo_mod), echo_mod)
    _hello(proc)
    proc.stdin.write("raise\n")
    assert proc.wait(30) == 1
    assert "RuntimeError: boom" in proc.stderr.read()


def test_a_process_whose_caller_goes_away_is_killed(use: Path, echo_mod: Path, tmp_path: Path) -> None:
    caller = textwrap.dedent(f"""
        import sys
        from forge_aot import server
        server._SOCKET[:] = [{str(use)!r}]
        proc = server.spawn_module("fst_echo", {_env(echo_mod)!r}, {str(echo_mod)!r})
        print(proc.pid, flush=True)
        proc.stdout.readline()
        import time; time.sleep(600)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(server.SERVER_ENV, None)
    parent = subprocess.Popen([sys.executable, "-c", caller], env=env, stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    os.kill(pid, 0)  # running
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the orphaned process still runs"
        time.sleep(0.05)


def test_a_server_of_other_code_refuses_and_the_caller_starts_its_own(use: Path, echo_mod: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "_FINGERPRINT", ["another installation"])
    before = server.server_info(str(use))["forked"]
    proc = server.spawn_module("fst_echo", _env(echo_mod), echo_mod)
    assert isinstance(proc, subprocess.Popen) and server.server_info(str(use))["forked"] == before
    proc.stdin.close()
    proc.wait(30)


def test_a_slow_or_broken_caller_neither_blocks_nor_ends_the_server(use: Path, echo_mod: Path) -> None:
    import socket

    idle = socket.socket(socket.AF_UNIX)
    idle.connect(str(use))  # connects and says nothing
    for garbage in (b"\x05\x00\x00\x00[1,2]", b"\xff\xff\xff\x7f", b"\x03\x00\x00\x00{x}"):
        bad = socket.socket(socket.AF_UNIX)
        bad.connect(str(use))
        bad.sendall(garbage)
        bad.close()
    start = time.monotonic()
    proc = server.spawn_module("fst_echo", _env(echo_mod), echo_mod)
    assert isinstance(proc, server.ServerProcess) and _hello(proc)["torch"]
    proc.stdin.close()
    assert proc.wait(30) == 0 and time.monotonic() - start < 5  # not behind the silent caller's 10 s
    idle.close()
    assert server.server_info(str(use)) is not None


def test_ctrl_c_reaches_a_forwarded_process_and_its_caller_dies_of_it(use: Path, echo_mod: Path) -> None:
    """The caller forwards Ctrl-C (its handler never waits on a lock the waiting thread holds); the fork dies of
    SIGINT as Python does after an uncaught KeyboardInterrupt, and so does the caller, as the shell would see."""
    caller = textwrap.dedent(f"""
        import sys
        from forge_aot import server
        server._SOCKET[:] = [{str(use)!r}]
        sys.exit(server.forward([], module="fst_echo", function=None))
    """)
    env = dict(_env(echo_mod), PYTHONPATH=os.pathsep.join([str(REPO), str(echo_mod)]))
    proc = subprocess.Popen([sys.executable, "-c", caller], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=echo_mod)
    assert proc.stdout.readline().startswith("hello ")
    proc.stdin.write("hang\n")
    proc.stdin.flush()
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == -signal.SIGINT


def test_without_a_server_or_when_turned_off_processes_start_as_new_interpreters(
        use: Path, echo_mod: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    proc = server.spawn_module("fst_echo", _env(echo_mod, **{server.SERVER_ENV: "0"}), echo_mod)
    assert isinstance(proc, subprocess.Popen) and not _hello(proc)["torch"]
    proc.stdin.close()
    assert proc.wait(30) == 0
    monkeypatch.setattr(server, "_SOCKET", [str(tmp_path / "none.sock")])  # another installation's fingerprint
    proc = server.spawn_module("fst_echo", _env(echo_mod), echo_mod)
    assert isinstance(proc, subprocess.Popen)
    proc.stdin.close()
    proc.wait(30)


def test_the_cli_runs_in_the_server_with_the_same_output(use: Path, tmp_path: Path) -> None:
    project = tmp_path / "p"
    shutil.copytree(REPO / "tests" / "fixtures" / "tune", project)
    code = ("import sys; from forge_aot import server; server._SOCKET[:] = [sys.argv[1]]; sys.argv[1:2] = []; "
            "from forge_aot.cli import entry; entry()")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(server.SERVER_ENV, None)
    before = server.server_info(str(use))["forked"]
    args = [sys.executable, "-c", code, str(use), "check", "--manifest", "kernel_manifest.toml"]
    served = subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert server.server_info(str(use))["forked"] == before + 1
    plain = subprocess.run(args, cwd=project, env={**env, server.SERVER_ENV: "0"}, capture_output=True, text=True,
                           timeout=300)
    assert served.returncode == plain.returncode == 0, served.stderr
    assert served.stdout == plain.stdout and "scale" in served.stdout
    usage = [*args[:4], "check", "--no-such-option"]
    for env_ in (env, {**env, server.SERVER_ENV: "0"}):  # click names the program as the caller's argv[0] does
        wrong = subprocess.run(usage, cwd=project, env=env_, capture_output=True, text=True, timeout=300)
        assert wrong.returncode == 2 and wrong.stderr.startswith("Usage: -c check"), wrong.stderr
    bad = [*args[:4], "check", "--manifest", "missing.toml"]
    failed = subprocess.run(bad, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0 and "missing.toml" in failed.stderr and "Traceback" not in failed.stderr


def test_a_build_forked_from_the_server_writes_the_same_wheel(use: Path, tmp_path: Path) -> None:
    """The command and its compile workers forked: the same bytes as a build without the server."""
    wheels = {}
    for mode in ("server", "plain"):
        env = dict(os.environ, PYTHONPATH=str(REPO), **{server.SOCKET_ENV: str(use)})
        env.pop(server.SERVER_ENV, None)
        if mode == "plain":
            env[server.SERVER_ENV] = "0"
        before = server.server_info(str(use))["forked"]
        done = subprocess.run([sys.executable, "-m", "forge_aot.cli", "build", "-q", "-j", "2", "--target", "sm_90",
                               "--wheel-platform", "x86_64", "--manifest", "benchmarks/launch/kernel_manifest.toml",
                               "--out", str(tmp_path / mode), "--build-dir", str(tmp_path / f"build-{mode}")],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr
        forked = server.server_info(str(use))["forked"] - before
        assert (forked >= 2) if mode == "server" else forked == 0  # the command and a compile worker at least
        (wheel,) = (tmp_path / mode).glob("*.whl")
        wheels[mode] = wheel.read_bytes()
    assert wheels["server"] == wheels["plain"]


def test_server_status_says_whether_one_serves_this_installation(use: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(server.SERVER_ENV, None)
    for socket_, rc, text in ((use, 0, "forked in all"), (tmp_path / "none.sock", 1, "no forge-aot server")):
        done = subprocess.run([sys.executable, "-m", "forge_aot.cli", "server", "status"], capture_output=True,
                              text=True, env={**env, server.SOCKET_ENV: str(socket_)}, timeout=120)
        assert done.returncode == rc and text in done.stdout, done.stdout + done.stderr


def test_idle_timeout_and_stop(tmp_path: Path) -> None:
    directory = Path(tempfile_dir()) / f"fsi-{os.getpid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    try:
        path = directory / "i.sock"
        proc = _start(path, idle=1)
        assert proc.wait(60) == 0 and not path.exists()
        proc = _start(path)
        assert server.stop(str(path)) and proc.wait(60) == 0 and not path.exists()
        assert not server.stop(str(path)) and server.server_info(str(path)) is None
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_stopped_server_serves_its_running_forks_to_their_end_and_a_dead_one_takes_them_along(
        echo_mod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = Path(tempfile_dir()) / f"fss-{os.getpid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    try:
        path = directory / "s.sock"
        proc = _start(path)
        monkeypatch.setattr(server, "_SOCKET", [str(path)])
        child = server.spawn_module("fst_echo", _env(echo_mod), echo_mod)
        _hello(child)
        assert server.stop(str(path)) and not path.exists()  # no new forks from here on
        assert isinstance(server.spawn_module("fst_echo", _env(echo_mod), echo_mod), subprocess.Popen)
        child.stdin.write("abc\n")
        assert child.stdout.readline() == "echo abc\n"  # still running, still answered
        assert proc.poll() is None
        child.stdin.write("exit\n")
        assert child.wait(30) == 7 and proc.wait(30) == 0
        # killed, not stopped: what it forked goes with it (nothing could report their exits)
        proc = _start(path)
        child = server.spawn_module("fst_echo", _env(echo_mod), echo_mod)
        _hello(child)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while True:
            try:
                os.kill(child.pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, "the fork outlived its server"
            time.sleep(0.05)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_the_server_refuses_to_fork_with_threads_running() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert "threads" in (server._check_forkable() or "")
    finally:
        stop.set()
        worker.join()


def test_the_socket_name_follows_the_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "_SOCKET", [])
    monkeypatch.setattr(server, "_FINGERPRINT", [])
    first = server.socket_path()
    assert f"forge-aot-{os.getuid()}" in first and first.endswith(".sock")
    module = Path(server.__file__)
    st = module.stat()
    try:
        os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        monkeypatch.setattr(server, "_SOCKET", [])
        monkeypatch.setattr(server, "_FINGERPRINT", [])
        assert server.socket_path() != first  # edited sources: another server
    finally:
        os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.slow
def test_tune_forks_its_workers_from_the_server(use: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline with the simulated GPU worker (its compiles are real): every compile and benchmark worker is
    forked, and the result is the one a run without the server gives."""
    from forge_aot.tune.database import TuningDatabase
    from forge_aot.tune.runner import TuneOptions, tune

    monkeypatch.setenv("FORGE_AOT_TUNE_WORKER", "tests.fake_tune_worker")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    winners = {}
    for mode in ("server", "plain"):
        project = tmp_path / mode
        shutil.copytree(REPO / "tests" / "fixtures" / "tune", project)
        monkeypatch.setenv("FAKE_TUNE_LOG", str(tmp_path / f"{mode}.log"))
        if mode == "plain":
            monkeypatch.setenv(server.SERVER_ENV, "0")
        before = server.server_info(str(use))["forked"]
        run = tune(project / "kernel_manifest.toml", TuneOptions(kernels=("scale",), jobs=2,
                                                                 build_dir=tmp_path / f"build-{mode}", report=False))
        forked = server.server_info(str(use))["forked"] - before
        assert [i.status for i in run.items] == ["tuned", "tuned"]
        # one benchmark worker and its two restarts after the planted crash, and the compile workers
        assert forked >= (3 + 1 if mode == "server" else 0) and (forked == 0) == (mode == "plain")
        winners[mode] = {(r.key["n"], r.config_id) for r in TuningDatabase(project / "tuning").select(kind="winner")}
    assert winners["server"] == winners["plain"] and len(winners["server"]) == 2


def test_without_a_server_socket_no_fingerprint_is_computed(tmp_path: Path) -> None:
    """A command or worker started where this user runs no server looks at one directory and computes nothing
    else (the fingerprint stats every forge-aot source); with a socket there, it looks for its own."""
    code = textwrap.dedent("""
        import json, os, sys
        from forge_aot import server
        none = server.run_in_server("json", [])
        os.makedirs(server._socket_dir(), mode=0o700)
        before = list(server._FINGERPRINT)
        open(os.path.join(server._socket_dir(), "server-other.sock"), "w").close()
        still_none = server.run_in_server("json", [])
        print(json.dumps({"none": none is None, "before": before, "still_none": still_none is None,
                          "computed": bool(server._FINGERPRINT)}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in (server.SOCKET_ENV, server.SERVER_ENV)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**env, "XDG_RUNTIME_DIR": str(tmp_path), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    import json

    assert json.loads(proc.stdout) == {"none": True, "before": [], "still_none": True, "computed": True}
