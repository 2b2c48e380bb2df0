"""Real cross-compilation (sm_80, sm_90, gfx942), failure handling, deterministic wheels, installing the wheel
into a fresh venv that has no triton, and `forge-aot inspect`."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from forge_aot.cli import main
from forge_aot.pipeline import BuildFailed, build
from tests.conftest import FIXTURES, REPO, assert_manifest_errors

pytestmark = pytest.mark.slow
TINY = FIXTURES / "projects" / "tiny" / "kernel_manifest.toml"


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory):
    return build(TINY, out_dir=tmp_path_factory.mktemp("dist"), build_dir=tmp_path_factory.mktemp("work"))


def test_cross_compiles_every_target_with_sidecars(tiny_build) -> None:
    work = tiny_build.build_dir / "binaries"
    sidecars = [json.loads(p.read_text()) for p in sorted(work.rglob("*.json"))]
    assert {s["target"] for s in sidecars} == {"sm_80", "sm_90", "gfx942"}
    # per row: every argument as the row makes it, the same with the key unassumed, and the generic binary
    assert {s["spec"] for s in sidecars if s["kernel"] == "add"} == {"DDDD", "DDDx", "xxxx"}
    assert {s["spec"] for s in sidecars if s["kernel"] == "picky"} == {"DD", "Dx", "xx"}
    by_arch = {s["target"]: s["arch"] for s in sidecars}
    assert by_arch == {"sm_80": "sm_80", "sm_90": "sm_90a", "gfx942": "gfx942"}
    for s in sidecars:
        cid = "-".join([*(f"{k}{v}" for k, v in s["config"]["meta"].items()), f"w{s['num_warps']}",
                        f"s{s['num_stages']}"])
        image = (work / s["kernel"] / s["target"] / s["variant"].replace(",", "_") / cid /
                 f"{s['spec']}.{s['format']}").read_bytes()
        assert image[:4] == b"\x7fELF"  # cubin and hsaco are both ELF images
        assert hashlib.sha256(image).hexdigest() == s["sha256"] and len(image) == s["size"]
        assert s["triton_version"] == "3.6.0" and s["function"] in ("add_kernel", "picky_kernel")
        assert s["warp_size"] == (64 if s["target"] == "gfx942" else 32)
        for key in ("shared", "global_scratch_size", "profile_scratch_size", "num_warps", "config"):
            assert key in s
        # arguments assumed aligned / divisible by 16 carry Triton's divisibility attribute, no others
        assert len(s["divisible"]) == s["spec"].count("D")


def test_failed_config_is_reported_and_left_out(tiny_build) -> None:
    failures = tiny_build.report.failures
    assert failures, "BLOCK_SIZE=1024 of picky_kernel must fail (static_assert)"
    assert all("picky" in f and "BLOCK_SIZE1024" in f for f in failures)
    assert any("sm_90" in f and "static_assert" in f.lower() for f in failures)
    (picky,) = [e for e in tiny_build.report.entries if e.entry.kernel == "picky" and e.entry.target == "sm_90"]
    assert [cid for _, cid in picky.tables["default"]] == ["BLOCK_SIZE256-w4-s1"]
    with zipfile.ZipFile(tiny_build.wheel) as zf:
        assert not [n for n in zf.namelist() if "picky" in n and "BLOCK_SIZE1024" in n]


def test_entry_with_no_config_left_fails_the_build(tmp_path: Path) -> None:
    manifest = FIXTURES / "projects" / "all_configs_fail" / "kernel_manifest.toml"
    with pytest.raises(BuildFailed) as info:
        build(manifest, out_dir=tmp_path / "dist", build_dir=tmp_path / "work")
    (err,) = info.value.errors
    assert (err.kernel, err.variant, err.target) == ("picky", "base", "sm_90")
    # per config: the default specialization, the one with no size assumed, the generic one
    assert len(err.failures) == 6 and "BLOCK_SIZE2048" in str(err)
    result = CliRunner().invoke(main, ["build", "--manifest", str(manifest), "--out", str(tmp_path / "d2"),
                                       "--build-dir", str(tmp_path / "w2"), "-q"])
    assert result.exit_code == 1 and "no config compiled" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "d2").exists()


def test_same_inputs_give_identical_wheel_bytes(repo_wheel: Path, tmp_path: Path) -> None:
    # A second build from scratch (fresh work directory, so a cold Triton cache): same bytes.
    second = build(REPO / "kernel_manifest.toml", out_dir=tmp_path / "dist", build_dir=tmp_path / "work").wheel
    assert second.name == repo_wheel.name
    assert second.read_bytes() == repo_wheel.read_bytes()


def _check_record(zf: zipfile.ZipFile) -> list[list[str]]:
    """RECORD read as the CSV it is: three fields per row, every other entry listed once with the sha256 and
    size of its bytes in the archive."""
    record_name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
    rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
    assert all(len(r) == 3 for r in rows)
    assert [r[0] for r in rows] == zf.namelist() and rows[-1] == [record_name, "", ""]
    for name, digest, size in rows[:-1]:
        data = zf.read(name)
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={expected}" and int(size) == len(data)
    return rows


def test_record_is_csv_even_for_names_with_commas(repo_wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(repo_wheel) as zf:
        rows = _check_record(zf)
    # no packaged file name needs quoting (variant directories replace the commas of variant ids) ...
    assert not any("," in r[0] for r in rows)
    # ... and the writer quotes one that does
    spec = importlib.util.spec_from_file_location("backend", REPO / "dist_templates" / "_forge_build_backend.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    backend._write_wheel(str(wheel), [("x/a,b=1.json", b"{}"), ("x/plain.py", b"")], "x-1.0.dist-info")
    with zipfile.ZipFile(wheel) as zf:
        assert _check_record(zf)[0][0] == "x/a,b=1.json"


def test_wheel_metadata_records_manifest_triton_targets_and_binaries(repo_wheel: Path) -> None:
    with zipfile.ZipFile(repo_wheel) as zf:
        names = zf.namelist()
        package = [n for n in names if not n.startswith("forge_kernels-0.1.0.dist-info/")]
        dist_info = [n for n in names if n.startswith("forge_kernels-0.1.0.dist-info/")]
        # package files sorted, then the dist-info files sorted, RECORD last (computed from written bytes)
        assert names == package + dist_info and package == sorted(package)
        assert dist_info[:-1] == sorted(dist_info[:-1]) and dist_info[-1].endswith("RECORD")
        assert {zf.getinfo(n).date_time for n in names} == {(1980, 1, 1, 0, 0, 0)}
        info = json.loads(zf.read("forge_kernels-0.1.0.dist-info/forge-aot.json"))
        manifest_sha = hashlib.sha256((REPO / "kernel_manifest.toml").read_bytes()).hexdigest()
        assert info["manifest_sha256"] == manifest_sha and info["triton_version"] == "3.6.0"
        assert info["targets"] == ["sm_80", "sm_90", "gfx942"]
        for rel, sha in info["binaries"].items():
            assert hashlib.sha256(zf.read(f"forge_kernels/{rel}")).hexdigest() == sha
        metadata = zf.read("forge_kernels-0.1.0.dist-info/METADATA").decode()
        assert "Requires-Dist: torch" in metadata and "Name: forge_kernels" in metadata
        for n in names:
            if n.endswith(".py"):
                text = zf.read(n).decode()
                assert "import triton" not in text and "forge_aot" not in text, n


def test_inspect_lists_kernels_variants_targets_configs(repo_wheel: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(repo_wheel)])
    assert result.exit_code == 0, result.output
    for word in ("matmul", "softmax", "add", "T=bf16", "sm_80", "sm_90", "gfx942", "DDDD+DDDx+xxxx",
                 "ops: matmul, softmax, vector_add"):
        assert word in result.output
    data = json.loads(CliRunner().invoke(main, ["inspect", "--json", str(repo_wheel)]).output)
    combos = {(r["kernel"], r["variant"], r["target"]) for r in data["rows"]}
    # targets × variants of add, softmax, matmul; matmul_tma's 2 variants on its one target (sm_90)
    assert len(combos) == 3 * (3 + 3 + 2) + 2
    assert {t for k, _, t in combos if k == "matmul_tma"} == {"sm_90"}
    assert all(r["bytes"] > 0 for r in data["rows"])
    bad = CliRunner().invoke(main, ["inspect", str(TINY)])
    assert bad.exit_code == 1 and "not a wheel" in bad.output


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv without system site-packages: torch installed, no triton, no forge-aot."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    import torch

    subprocess.run([str(py), "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}"],
                   check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return py


def _install(venv_python: Path, wheel: Path) -> None:
    subprocess.run([str(venv_python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--force-reinstall",
                    str(wheel)], check=True)


def test_wheel_installs_offline_into_venv_without_triton(repo_wheel: Path, fresh_venv: Path) -> None:
    # The C launch path makes it a platform wheel (abi3: one wheel for every CPython >= 3.9).
    assert repo_wheel.name.startswith("forge_kernels-0.1.0-cp39-abi3-manylinux_2_17_"), repo_wheel.name
    _install(fresh_venv, repo_wheel)
    code = (
        "import importlib.util, json, sys, torch, forge_kernels\n"
        "res = {'triton': importlib.util.find_spec('triton') is not None,\n"
        "       'forge_aot': importlib.util.find_spec('forge_aot') is not None,\n"
        "       'ops': forge_kernels.__all__, 'version': forge_kernels.__version__,\n"
        "       'loaded': sorted(m for m in sys.modules if m.startswith(('triton', 'forge_aot')))}\n"
        "try:\n"
        "    forge_kernels.softmax(torch.randn(4, 4))\n"
        "except Exception as e:\n"
        "    res['cpu_error'] = f'{type(e).__name__}: {e}'\n"
        "from forge_kernels._runtime import fastpath, kernel\n"
        "res['c_launch'] = fastpath.c is not None\n"
        "res['base'] = kernel.Kernel.__mro__[1].__name__\n"
        "res['dir'] = forge_kernels.__path__[0]\n"
        "print(json.dumps(res))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing from the checkout
    out = subprocess.run([str(fresh_venv), "-c", code], check=True, capture_output=True, text=True, cwd="/", env=env)
    res = json.loads(out.stdout)
    assert res["triton"] is False and res["forge_aot"] is False and res["loaded"] == []
    assert sorted(res["ops"]) == ["matmul", "preload", "softmax", "vector_add"] and res["version"] == "0.1.0"
    assert res["cpu_error"].startswith("UnsupportedDeviceError") and "CPU tensor" in res["cpu_error"]
    assert res["c_launch"] is True and res["base"] == "KernelBase"
    # Without the extension (removed, or a platform it does not load on) the same package runs pure Python.
    so = Path(res["dir"]) / "_runtime" / "_fastlaunch.abi3.so"
    assert so.exists()
    so.unlink()
    out = subprocess.run([str(fresh_venv), "-c", code], check=True, capture_output=True, text=True, cwd="/", env=env)
    res = json.loads(out.stdout)
    assert res["c_launch"] is False and res["base"] == "_PyKernelBase"
    assert res["cpu_error"].startswith("UnsupportedDeviceError") and "CPU tensor" in res["cpu_error"]
    so.write_bytes(b"not an ELF file")  # a broken .so is refused the same way
    out = subprocess.run([str(fresh_venv), "-c", code], check=True, capture_output=True, text=True, cwd="/", env=env)
    assert json.loads(out.stdout)["c_launch"] is False


def test_pure_python_wheel_when_the_extension_is_not_built(tiny_build, tmp_path: Path) -> None:
    import shutil

    import build as pypa_build
    import pyproject_hooks

    stage = tmp_path / "package"
    shutil.copytree(tiny_build.build_dir / "package", stage)
    (stage / "tiny_pkg" / "_runtime" / "_fastlaunch.abi3.so").unlink()
    pyproject = stage / "pyproject.toml"
    text = pyproject.read_text()
    assert 'wheel-tag = "cp39-abi3-manylinux_2_17_' in text
    pyproject.write_text(text.replace(text[text.index('wheel-tag = "'):].splitlines()[0],
                                      'wheel-tag = "py3-none-any"'))
    builder = pypa_build.ProjectBuilder(str(stage), runner=pyproject_hooks.quiet_subprocess_runner)
    wheel = Path(builder.build("wheel", tmp_path / "dist"))
    assert wheel.name == "tiny_pkg-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        assert b"Root-Is-Purelib: true\nTag: py3-none-any\n" in zf.read("tiny_pkg-0.1.0.dist-info/WHEEL")
    with zipfile.ZipFile(tiny_build.wheel) as zf:
        wheel_file = zf.read("tiny_pkg-0.1.0.dist-info/WHEEL").decode()
        assert "Root-Is-Purelib: false" in wheel_file and "Tag: cp39-abi3-manylinux_2_17_" in wheel_file
        assert "tiny_pkg/_runtime/_fastlaunch.abi3.so" in zf.namelist()


def test_generated_backend_builds_identical_sdists(tiny_build, tmp_path: Path) -> None:
    import tarfile

    import build as pypa_build
    import pyproject_hooks

    stage = tiny_build.build_dir / "package"
    outs = []
    for i in range(2):
        builder = pypa_build.ProjectBuilder(str(stage), runner=pyproject_hooks.quiet_subprocess_runner)
        outs.append(Path(builder.build("sdist", tmp_path / f"s{i}")))
    assert outs[0].read_bytes() == outs[1].read_bytes()
    with tarfile.open(outs[0]) as tf:
        names = tf.getnames()
    assert "tiny_pkg-0.1.0/PKG-INFO" in names and "tiny_pkg-0.1.0/tiny_pkg/_forge/index.json" in names
    # The compiled C launch path serves one CPU architecture: the sdist leaves it out and builds the pure wheel
    # (on any machine, with no compiler), its build info recording no C launch path.
    assert not [n for n in names if n.endswith(".so")]
    # (the package's own data files stay, a .so among them: only the runtime's extension is left out)
    stage = tmp_path / "with-data"
    import shutil

    shutil.copytree(tiny_build.build_dir / "package", stage)
    (stage / "tiny_pkg" / "_ops" / "libdata.so").write_bytes(b"data")
    builder = pypa_build.ProjectBuilder(str(stage), runner=pyproject_hooks.quiet_subprocess_runner)
    with tarfile.open(builder.build("sdist", tmp_path / "s-data")) as tf:
        kept = [n for n in tf.getnames() if n.endswith(".so")]
    assert kept == ["tiny_pkg-0.1.0/tiny_pkg/_ops/libdata.so"]
    with tarfile.open(outs[0]) as tf:
        tf.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    unpacked = tmp_path / "unpacked" / "tiny_pkg-0.1.0"
    assert json.loads((unpacked / "tiny_pkg" / "_forge" / "build_info.json").read_text())["c_launch"] is None
    builder = pypa_build.ProjectBuilder(str(unpacked), runner=pyproject_hooks.quiet_subprocess_runner)
    wheel = Path(builder.build("wheel", tmp_path / "from-sdist"))
    assert wheel.name == "tiny_pkg-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf, zipfile.ZipFile(tiny_build.wheel) as platform_wheel:
        assert sorted(zf.namelist()) == sorted(n for n in platform_wheel.namelist() if not n.endswith(".so"))


EXPORTS = FIXTURES / "projects" / "exports" / "kernel_manifest.toml"


def test_exports_are_checked(tmp_path: Path) -> None:
    """``[exports]``: each name a class or function of a Python file, not an op, with the key path and a close
    match where the name is not in the file."""
    from forge_aot.errors import ManifestError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text("import torch\nimport triton\n\n@triton.jit\ndef k(x):\n    pass\n\n\n"
                                   "def op(x):\n    k[(1,)](x)\n\n\nclass Layer(torch.nn.Module):\n    pass\n")
    head = ('[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\nsource = "k.py:k"\n'
            'ops = ["op"]\nsignature = { x = "*fp32" }\n\n[exports]\n')
    assert_manifest_errors(tmp_path, head, (('op = "k.py"\n', "exports.op", "is an op of this manifest"),
                                            ('preload = "k.py"\n', "exports.preload", "the package's own function"),
                                            ('Layer = "none.py"\n', "exports.Layer", "is not a Python file"),
                                            ('"2x" = "k.py"\n', "exports.2x", "is not an identifier")))
    (tmp_path / "kernel_manifest.toml").write_text(head + 'Layr = "k.py"\n')
    with pytest.raises(ManifestError) as info:
        make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    assert "exports.Layr" in str(info.value) and "no host class or function 'Layr'" in str(info.value)
    assert "Layer" in str(info.value)  # did you mean
    (tmp_path / "kernel_manifest.toml").write_text(head + 'Layer = "k.py"\n')
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    assert plan.modules["k"]["exports"] == ["Layer"] and "class Layer" in plan.modules["k"]["host_source"]


def test_exported_classes_bind_their_files_on_first_access(fresh_venv: Path, tmp_path: Path) -> None:
    """A library's nn.Modules exported as they are (``[exports]``), from a kernel file and from a file of its own
    that imports the kernel file by its project name: import binds nothing; the first access binds the file (its
    kernel handles the packaged ones, the kernel file bound once for both); an unknown name is an AttributeError."""
    wheel = build(EXPORTS, out_dir=tmp_path / "dist", build_dir=tmp_path / "work").wheel
    listed = CliRunner().invoke(main, ["inspect", str(wheel)])
    assert "ops: scale\nexported as they are: DoubleScale, double_scale, Scale\n" in listed.output, listed.output
    _install(fresh_venv, wheel)
    code = (
        "import json, sys, torch, exports_pkg\n"
        "res = {'bound_at_import': sorted(m for m in sys.modules if m.startswith('exports_pkg._ops.')),\n"
        "       'all': sorted(exports_pkg.__all__), 'dir': 'DoubleScale' in dir(exports_pkg)}\n"
        "from exports_pkg import DoubleScale, double_scale\n"
        "res['bound'] = sorted(m for m in sys.modules if m.startswith('exports_pkg._ops.'))\n"
        "res['modules'] = [exports_pkg.Scale.__module__, DoubleScale.__module__, double_scale.__module__]\n"
        "layer = DoubleScale(3.0)\n"
        "res['same_class'] = type(layer.inner[0]) is exports_pkg.Scale\n"
        "res['handle'] = type(sys.modules['exports_pkg._ops.scale'].scale_kernel).__name__\n"
        "try:\n"
        "    layer(torch.randn(8))\n"
        "except Exception as e:\n"
        "    res['cpu_error'] = type(e).__name__\n"
        "try:\n"
        "    exports_pkg.Scal\n"
        "except AttributeError as e:\n"
        "    res['unknown'] = str(e)\n"
        "print(json.dumps(res))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(fresh_venv), "-c", code], check=True, capture_output=True, text=True, cwd="/", env=env)
    res = json.loads(out.stdout)
    assert res["bound_at_import"] == [] and res["all"] == ["DoubleScale", "Scale", "double_scale", "preload", "scale"]
    assert res["dir"] is True  # dir() lists them before their first access (completion in a REPL)
    # the two files, and the kernel file under the project name layers.py imports it by (the same module)
    assert res["bound"] == ["exports_pkg._ops._local", "exports_pkg._ops._local.mylib",
                            "exports_pkg._ops._local.mylib.scale", "exports_pkg._ops.layers", "exports_pkg._ops.scale"]
    assert res["modules"] == ["exports_pkg._ops.scale", "exports_pkg._ops.layers", "exports_pkg._ops.layers"]
    # a packaged handle (cold until its first call needs the full Kernel: runtime/cold.py)
    assert res["same_class"] is True and res["handle"] in ("ColdKernel", "Kernel")
    assert res["cpu_error"] == "UnsupportedDeviceError"  # the packaged kernel's launch path refused a CPU tensor
    assert res["unknown"] == "module 'exports_pkg' has no attribute 'Scal'"


def test_development_mode_binds_the_exports_too() -> None:
    """``forge_aot.dev.load_dev_ops`` (the same host code under Triton's JIT) gives the exports beside the ops, the
    layers' class built on the kernel file's own (one bound module)."""
    from forge_aot.dev import load_dev_ops

    ops = load_dev_ops(EXPORTS)
    assert sorted(ops) == ["DoubleScale", "Scale", "double_scale", "scale"]
    layer = ops["DoubleScale"](2.0)
    assert type(layer.inner[0]) is ops["Scale"] and ops["Scale"].forward.__globals__["scale"] is ops["scale"]


def test_long_variant_and_config_ids_get_short_file_names(tmp_path: Path) -> None:
    """SGLang's extend attention passes a dozen call-site constexprs, some with long names: its variant ids are
    longer than the 255 bytes a file name may have, and every binary failed to write ("File name too long"). Such
    ids are shortened to 64 characters and a hash of the whole id, in the build directory and in the wheel, and
    the runtime reads every part of the index the build wrote."""
    import zipfile

    from forge_aot.runtime.host_modules import load_index

    long_names = [f"A_VERY_LONG_CONSTEXPR_NAME_NUMBER_{i}" for i in ("ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX")]
    (tmp_path / "k.py").write_text(
        "import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        f"def k(X, Y, n, {', '.join(f'{n}: tl.constexpr' for n in long_names)}, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)\n\n\n"
        "def copy(x, flag: bool):\n    y = torch.empty_like(x)\n"
        "    k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), "
        f"{', '.join(f'{n}=flag' for n in long_names)}, BLOCK=1024)\n    return y\n\n\n"
        "def examples(device):\n    for flag in (True, False):\n"
        "        copy(torch.empty(4096, dtype=torch.float16, device=device), flag)\n")
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "longnames"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\n'
        'source = "k.py:k"\nops = ["copy"]\nsignature = { X = "*fp16" }\nexamples = "examples"\n')
    result = build(tmp_path / "kernel_manifest.toml", out_dir=tmp_path / "dist", build_dir=tmp_path / "work",
                   platforms=["any"])
    assert len({e.variant for e in result.plan.entries}) == 2
    assert all(len(e.variant) > 255 for e in result.plan.entries)
    with zipfile.ZipFile(result.wheel) as zf:
        names = zf.namelist()
        zf.extractall(tmp_path / "site")
    assert max(len(part) for n in names for part in n.split("/")) <= 97 + len(".cubin")
    # a string constexpr may hold a slash or "..": such ids are spelt safely (and hashed), never a path
    from forge_aot.plan import path_component

    assert path_component("MODE=../x") == path_component("MODE=../x") != path_component("MODE=..\\x")
    assert "/" not in path_component("MODE=../x") and path_component("..") not in (".", "..")
    assert path_component("T=fp16,BLOCK=64") == "T=fp16_BLOCK=64"
    root = str(tmp_path / "site" / "longnames")
    whole = load_index(root)
    paths = {b["path"] for spec in whole["kernels"].values() for v in spec["variants"].values()
             for t in v["targets"].values() for c in t["configs"].values() for b in c["binaries"].values()}
    assert len(paths) >= 2 and all(f"longnames/{p}" in names for p in paths)
    part = load_index(root, "k")  # what an op's first call reads: each target entry, then each config's binaries
    read = [b["path"] for spec in part["kernels"].values() for v in spec["variants"].values()
            for t in v["targets"].values() for c in t["configs"].values() for b in c["binaries"].values()]
    assert set(read) == paths


def test_long_binary_ids_get_short_file_names(tmp_path: Path) -> None:
    """Cut Cross-Entropy's backward kernel computes seventeen ``@triton.heuristics`` values, each part of a binary's
    id: every such binary failed to write ("[Errno 36] File name too long", on the H200 in session 40). Binary ids
    are shortened as variant and config ids are, and the wheel's index names the files it holds."""
    import zipfile

    from forge_aot.runtime.host_modules import load_index

    flags = [f"HAS_A_RATHER_LONG_HEURISTIC_FLAG_{i}" for i in range(8)]
    (tmp_path / "k.py").write_text(
        "import torch\nimport triton\nimport triton.language as tl\n\n\n"
        f"@triton.heuristics({{{', '.join(f'{f!r}: lambda args: args[{chr(39)}n{chr(39)}] > 4000' for f in flags)}}})\n"
        f"@triton.jit\ndef k(X, Y, n, {', '.join(f'{f}: tl.constexpr' for f in flags)}, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)\n\n\n"
        "def copy(x):\n    y = torch.empty_like(x)\n"
        "    k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)\n    return y\n\n\n"
        "def examples(device):\n    for n in (4096, 1000):\n"
        "        copy(torch.empty(n, dtype=torch.float16, device=device))\n")
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "longheur"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\n'
        'source = "k.py:k"\nops = ["copy"]\nsignature = { X = "*fp16" }\nexamples = "examples"\n'
        'constexprs = { BLOCK = [1024] }\n')
    result = build(tmp_path / "kernel_manifest.toml", out_dir=tmp_path / "dist", build_dir=tmp_path / "work",
                   platforms=["any"])
    ids = {b.id for e in result.plan.entries for rows in e.tables.values() for row in rows
           for b in result.plan.binaries_for(e, row.key, row.preferences[0])}
    assert len(ids) >= 2 and all(len(i) > 255 for i in ids)
    with zipfile.ZipFile(result.wheel) as zf:
        names = zf.namelist()
        zf.extractall(tmp_path / "site")
    assert max(len(part) for n in names for part in n.split("/")) <= 97 + len(".cubin")
    index = load_index(str(tmp_path / "site" / "longheur"), "k")
    paths = [b["path"] for spec in index["kernels"].values() for v in spec["variants"].values()
             for t in v["targets"].values() for c in t["configs"].values() for b in c["binaries"].values()]
    assert len(paths) == len(ids) and all(f"longheur/{p}" in names for p in paths)
