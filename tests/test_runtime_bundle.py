"""The runtime's bytecode bundle: a wheel's first call in an environment writes it, later processes import the
first-call modules from it, and anything that makes it doubtful (an edited module, a damaged file, a place it
cannot be written, PYTHONDONTWRITEBYTECODE) leaves imports to the import system. Fresh processes on the CPU over
the repository's wheel, unpacked as pip lays it out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

BUNDLED = ["cold", "cold_binding", "cold_launch", "cuda", "drivers", "entry", "errors", "exports", "fastpath",
           "host_exec", "host_language", "host_modules", "host_triton", "kernel", "launch", "names", "packing", "rules",
           "tables", "torch_ops"]
"""What FIRST_CALL loads from the bundle: the full runtime's modules, read at the lean package's hand-over (here: no
GPU), not the lean path's own (``lean``, ``lean_kernel``, ``lean_launch``, ``basics``), loaded through the import
system before."""

FIRST_CALL = textwrap.dedent("""
    import json, sys, torch
    import forge_kernels
    x = torch.randn(100)
    try:
        forge_kernels.vector_add(x, x)
    except Exception as exc:
        error = type(exc).__name__
    import forge_kernels._runtime.cuda  # what a GPU's first call imports too
    import forge_kernels._runtime.torch_ops  # what a package with autograd imports, or a trace
    rt = sys.modules["forge_kernels._runtime"]
    from_bundle = sorted(n.rsplit(".", 1)[1] for n, m in sys.modules.items()
                         if n.startswith("forge_kernels._runtime.")
                         and m.__spec__.loader_state == "bundle")
    print(json.dumps({"error": error, "from_bundle": from_bundle,
                      "file": forge_kernels._runtime.kernel.__file__,
                      "cached": forge_kernels._runtime.kernel.__cached__}))
""")


@pytest.fixture()
def site(repo_wheel: Path, tmp_path: Path) -> Path:
    out = tmp_path / "site"
    with zipfile.ZipFile(repo_wheel) as zf:
        zf.extractall(out)
    return out


def _run(site: Path, code: str = FIRST_CALL, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                          env=base | {"PYTHONPATH": str(site)} | env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _bundle(site: Path, opt: str = "") -> Path:
    return site / "forge_kernels" / "_runtime" / "__pycache__" / f"_bundle.{sys.implementation.cache_tag}{opt}.pyc"


def test_first_call_writes_the_bundle_and_later_processes_import_from_it(site: Path) -> None:
    first = _run(site)
    assert first["from_bundle"] == [] and first["error"] == "UnsupportedDeviceError"
    assert _bundle(site).is_file()
    second = _run(site)
    assert second["from_bundle"] == BUNDLED and second["error"] == "UnsupportedDeviceError"
    runtime = site / "forge_kernels" / "_runtime"
    assert second["file"] == str(runtime / "kernel.py") and second["cached"] == first["cached"]
    # the modules' own code objects: tracebacks and inspect point at the shipped files
    probe = _run(site, "import json, inspect, forge_kernels._runtime.rules as t\n"
                       "print(json.dumps({'src': inspect.getsource(t.call_defaults).splitlines()[0], "
                       "'file': t.call_defaults.__code__.co_filename}))")
    assert probe == {"src": "def call_defaults(kernel: Any) -> tuple[list[tuple[str, Any]], list[str]]:",
                     "file": str(runtime / "rules.py")}


def test_an_edited_module_invalidates_the_bundle_which_is_written_again(site: Path) -> None:
    _run(site)
    before = _bundle(site).read_bytes()
    tables = site / "forge_kernels" / "_runtime" / "tables.py"
    tables.write_text(tables.read_text() + "\nEDITED = True\n")
    edited = _run(site, FIRST_CALL.replace("print(json.dumps({", "print(json.dumps({'edited': rt.tables.EDITED, "))
    # the edit runs, not the bundled bytecode: the modules, checked together when the first of them loads, come from
    # their files
    assert edited["from_bundle"] == [] and edited["edited"] is True
    assert _bundle(site).read_bytes() != before
    assert _run(site)["from_bundle"] == BUNDLED


@pytest.mark.parametrize("mapped", [True, False])
def test_the_bundle_is_mapped_where_mmap_is_imported_and_read_where_not(site: Path, mapped: bool) -> None:
    _run(site)
    forget = "" if mapped else "del sys.modules['mmap']\n"  # (torch imports it: a process without it reads)
    code = FIRST_CALL.replace("import forge_kernels\n", forget + "import forge_kernels\n", 1).replace(
        "print(json.dumps({", "finder = next(f for f in sys.meta_path if type(f).__name__ == '_Finder')\n"
        "print(json.dumps({'held': sorted({type(v[2].obj).__name__ for v in finder.held.values()}), ")
    got = _run(site, code)
    assert got["from_bundle"] == BUNDLED and got["error"] == "UnsupportedDeviceError"
    assert got["held"] == ["mmap" if mapped else "bytes"]  # the modules not loaded yet: views of what was read


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "directory"])
def test_a_damaged_or_unwritable_bundle_leaves_imports_to_python(site: Path, damage: str) -> None:
    _run(site)
    path = _bundle(site)
    if damage == "garbage":
        path.write_bytes(b"not a bundle")
    elif damage == "empty":  # (a mapping of an empty file fails: read instead)
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-200])
    else:  # a place that cannot be written: the bundle's name taken by a directory
        path.unlink()
        path.mkdir()
    assert _run(site)["from_bundle"] == []
    if damage == "directory":
        assert path.is_dir() and not list(path.parent.glob("*.tmp"))
    else:
        assert _run(site)["from_bundle"] == BUNDLED  # written again by the process before


def test_pythondontwritebytecode_writes_no_bundle_unless_asked(site: Path) -> None:
    _run(site)  # the .pyc files, as pip would have compiled them
    _bundle(site).unlink()
    assert _run(site, PYTHONDONTWRITEBYTECODE="1")["from_bundle"] == []
    assert not _bundle(site).exists()
    asked = _run(site, "import json, forge_kernels._runtime as r\nprint(json.dumps({'wrote': r.write_bundle()}))",
                 PYTHONDONTWRITEBYTECODE="1")
    assert asked == {"wrote": True}
    assert _run(site, PYTHONDONTWRITEBYTECODE="1")["from_bundle"] == BUNDLED


def test_the_bundle_is_readable_as_the_bytecode_beside_it(site: Path) -> None:
    """Written as Python writes a .pyc (the source's permissions, umask applied): an image baked by root serves
    the user the service runs as."""
    _run(site)
    cached = site / "forge_kernels" / "_runtime" / "__pycache__"
    pyc = next(cached.glob(f"entry.{sys.implementation.cache_tag}.pyc"))
    assert _bundle(site).stat().st_mode & 0o777 == pyc.stat().st_mode & 0o777


def test_write_bundle_compiles_where_no_bytecode_was_written(site: Path) -> None:
    """An install without .pyc files (pip --no-compile, uv) under PYTHONDONTWRITEBYTECODE: the explicit call
    compiles the sources as the import system would."""
    asked = _run(site, "import json, forge_kernels._runtime as r\nprint(json.dumps({'wrote': r.write_bundle()}))",
                 PYTHONDONTWRITEBYTECODE="1")
    assert asked == {"wrote": True}
    assert _run(site, PYTHONDONTWRITEBYTECODE="1")["from_bundle"] == BUNDLED


def test_an_unwritable_place_costs_no_gathering(site: Path) -> None:
    """Where the bytecode directory cannot be written, write_bundle says so before importing or reading anything."""
    _run(site)
    _bundle(site).unlink()
    cached = site / "forge_kernels" / "_runtime" / "__pycache__"
    code = ("import json, os, sys, forge_kernels._runtime as r\nos.access = lambda *a, **k: False\n"
            "print(json.dumps({'wrote': r.write_bundle(), "
            "'imported': 'forge_kernels._runtime.launch' in sys.modules}))")
    assert _run(site, code) == {"wrote": False, "imported": False}
    assert not list(cached.glob("_bundle*"))


def test_a_bundle_of_other_sources_is_not_used(site: Path) -> None:
    """The build's fingerprint of the runtime's sources names the sources a bundle is for: files unpacked over an
    older install keep the wheel's fixed timestamps, and a same-size edit would keep its size."""
    _run(site)
    init = site / "forge_kernels" / "__init__.py"
    text = init.read_text()
    # the fingerprint: load_package's last argument
    start = text.index('_OPS, _EXPORTS, "') + len('_OPS, _EXPORTS, "')
    before = init.stat()
    init.write_text(text[:start] + "0" * 64 + text[start + 64:])
    # Same size: a later mtime, or Python's own .pyc of __init__ (checked to the second) would keep the old text.
    os.utime(init, ns=(before.st_atime_ns, before.st_mtime_ns + 10**10))
    assert _run(site)["from_bundle"] == []
    assert _run(site)["from_bundle"] == BUNDLED  # written again for these sources


def test_optimisation_levels_keep_their_own_bundles(site: Path) -> None:
    _run(site)
    code = FIRST_CALL.replace("print(json.dumps({", "print(json.dumps({'doc': rt.tables.__doc__ is not None, ")
    proc = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True, cwd="/",
                          env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
                          | {"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["doc"] is False
    assert _bundle(site, ".opt-2").is_file()
    plain = _run(site, code)
    assert plain["doc"] is True and plain["from_bundle"] == BUNDLED


def test_a_moved_installation_reports_its_new_paths(site: Path, tmp_path: Path) -> None:
    """Copied with its timestamps (cp -a, rsync), the bundle stays valid; the code objects name the new files."""
    _run(site)
    moved = tmp_path / "moved"
    shutil.copytree(site, moved)  # copy2: timestamps kept
    code = ("import json, forge_kernels._runtime.tables as t\n"
            "print(json.dumps({'file': t.resolve_table.__code__.co_filename, 'loader': type(t.__loader__).__name__}))")
    res = _run(moved, code, FORGE_NO_LEAN="1")  # (the lean path reads the bundle when the full runtime loads)
    assert res == {"file": str(moved / "forge_kernels" / "_runtime" / "tables.py"), "loader": "_BundleLoader"}
    runs = subprocess.run([sys.executable, "-m", "forge_kernels._runtime.errors"], capture_output=True, text=True,
                          cwd="/", env={**os.environ, "PYTHONPATH": str(moved)})
    assert runs.returncode == 0, runs.stderr  # runpy asks the loader for the code


def test_hash_based_bytecode_is_gathered_too(site: Path) -> None:
    """Installs made with SOURCE_DATE_EPOCH compile checked-hash .pyc files (PEP 552)."""
    runtime = site / "forge_kernels" / "_runtime"
    subprocess.run([sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "checked-hash", str(site)],
                   check=True)
    assert _run(site, PYTHONDONTWRITEBYTECODE="1")["from_bundle"] == []
    asked = _run(site, "import json, forge_kernels._runtime as r\nprint(json.dumps({'wrote': r.write_bundle()}))",
                 PYTHONDONTWRITEBYTECODE="1")
    assert asked == {"wrote": True}
    assert _run(site, PYTHONDONTWRITEBYTECODE="1")["from_bundle"] == BUNDLED
    assert (runtime / "_bundle.py").is_file()


def test_pip_uninstall_removes_the_bundle(repo_wheel: Path, tmp_path: Path) -> None:
    """The bundle has the cache name of a shipped module, so pip removes it with the package's bytecode: nothing
    is left to make the package importable (as an empty namespace package) after an uninstall."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(repo_wheel)], check=True)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    torch_site = str(Path(torch.__file__).parent.parent)  # torch from this environment, the wheel from the venv's
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": torch_site}
    wrote = subprocess.run([str(py), "-c", "import forge_kernels._runtime as r; print(r.write_bundle())"],
                           capture_output=True, text=True, env=env, cwd="/")
    assert wrote.stdout.strip() == "True", wrote.stderr
    assert _bundle(site).is_file()
    subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "forge_kernels"], check=True)
    assert not (site / "forge_kernels").exists()


def test_import_runs_the_first_call_modules_from_the_bundle_without_their_docstrings(site: Path) -> None:
    """With a valid bundle, ``import <package>`` runs the modules every first call needs, from the bundle, where the
    full runtime serves the package from import on (``FORGE_NO_LEAN=1`` here; packages with autograd or exports);
    their functions' and classes' docstrings and annotations are left out, each module's own docstring is kept."""
    _run(site)
    code = textwrap.dedent("""
        import json, sys, forge_kernels
        rt = sys.modules["forge_kernels._runtime"]
        loaded = {n.rsplit(".", 1)[1]: type(m.__spec__.loader).__name__ for n, m in sys.modules.items()
                  if n.startswith("forge_kernels._runtime.")}
        print(json.dumps({"loaded": loaded, "first_call": list(rt.FIRST_CALL),
                          "class_doc": rt.kernel.Kernel.__doc__, "module_doc": bool(rt.kernel.__doc__),
                          "annotations": rt.tables.resolve_table.__annotations__,
                          "on_package": all(getattr(rt, n) is sys.modules["forge_kernels._runtime." + n]
                                            for n in rt.FIRST_CALL if n != "host_triton")}))
    """)
    res = _run(site, code, FORGE_NO_LEAN="1")
    assert {n: res["loaded"].get(n) for n in res["first_call"]} == {n: "_BundleLoader" for n in res["first_call"]}
    assert "torch_ops" not in res["loaded"]  # bundled, but imported where needed only
    assert res["class_doc"] is None and res["module_doc"] is True and res["annotations"] == {}
    assert res["on_package"] is True


def test_the_bundled_bytecode_runs_as_the_source_does(tmp_path: Path) -> None:
    """What the bundle leaves out changes no behaviour: same results, same line numbers in tracebacks (no columns)."""
    from forge_aot.runtime.bundling import module_bytecode

    src = tmp_path / "sample.py"
    src.write_text(textwrap.dedent('''
        """Module docstring."""
        from __future__ import annotations
        LIMIT: int = 3
        """An attribute's docstring."""

        class Box:
            """A class docstring."""
            size: int = 2

            def grow(self, by: int = 1) -> int:
                """A method docstring."""
                return self.size + by

        def only_a_docstring(x: int) -> None:
            """Nothing else."""

        def fails(x: int) -> None:
            raise ValueError("here")

        def fails_within(x: int) -> None:
            y = [x,
                 x + 1]
            return {"y": y,
                    "z": 1 // (x -
                               x)}
    '''))
    import marshal
    import traceback

    plain, stripped = {}, {}
    exec(compile(src.read_text(), str(src), "exec"), plain)
    exec(marshal.loads(module_bytecode(str(src))), stripped)
    assert stripped["__doc__"] == plain["__doc__"] == "Module docstring."
    assert stripped["Box"]().grow(5) == plain["Box"]().grow(5) == 7 and stripped["LIMIT"] == 3
    assert stripped["__annotations__"] == plain["__annotations__"] == {"LIMIT": "int"}
    assert stripped["Box"].__doc__ is None and stripped["Box"].grow.__annotations__ == {}
    assert stripped["only_a_docstring"](1) is None
    lines = []
    for ns in (plain, stripped):
        for name, error in (("fails", ValueError), ("fails_within", ZeroDivisionError)):
            try:
                ns[name](1)
            except error as exc:
                lines.append(traceback.extract_tb(exc.__traceback__)[-1].lineno)
    raised = next(i for i, line in enumerate(src.read_text().splitlines(), 1) if "raise" in line)
    divided = next(i for i, line in enumerate(src.read_text().splitlines(), 1) if "1 //" in line)
    assert lines == [raised, divided, raised, divided]
    # every instruction on the line it had, no columns (the carets under a traceback's line)
    code = marshal.loads(module_bytecode(str(src)))
    within = next(c for c in code.co_consts if getattr(c, "co_name", "") == "fails_within")
    assert {p[2:] for p in within.co_positions()} == {(None, None), (0, 0)}  # (0, 0): the compiler's RESUME
    assert [line for *_, line in within.co_lines()] == [line for *_, line in plain["fails_within"].__code__.co_lines()]
