"""Wheel platforms: the C launch path's wheel tag read from the compiled file (manylinux), wheels for another CPU
architecture (aarch64: Grace Hopper / Grace Blackwell servers) cross-compiled on this one, and a pure-Python
fallback wheel, all from one build.

The aarch64 extension is checked here three ways: its ELF file (machine, libraries, glibc symbol versions, as
``auditwheel show`` reads them), pip's own choice among the wheels for each platform, and, where ``qemu-aarch64``
and an aarch64 CPython are present (``scripts/aarch64_sysroot.sh``; ``.ci/run`` sets one up when it can), the
extension loaded into that CPython and launching against a fake driver compiled for aarch64, byte for byte as
the native one does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from forge_aot.errors import ManifestError, PackageError
from forge_aot.extension import ElfInfo, build_extension, compiler, compiler_for, native_arch, read_elf, wheel_platform
from forge_aot.pipeline import build

TESTS = Path(__file__).resolve().parent
TINY = TESTS / "fixtures" / "projects" / "tiny" / "kernel_manifest.toml"
OTHER = {"x86_64": "aarch64", "aarch64": "x86_64"}.get(native_arch(), "aarch64")
needs_cross = pytest.mark.skipif(compiler_for(OTHER) is None,
                                 reason=f"no C compiler for {OTHER} (pip install ziglang, or set CC_{OTHER.upper()})")


def _manylinux(arch: str) -> str:
    return f"manylinux_2_17_{arch}.manylinux2014_{arch}"


def test_the_native_extension_is_tagged_from_its_elf_file(tmp_path) -> None:
    ext = build_extension(tmp_path)
    assert ext.path is not None, ext.note
    info = read_elf(ext.path.read_bytes())
    assert info.machine == native_arch() and info.needed == ("libc.so.6",)
    assert info.glibc() <= (2, 17) and all(v.startswith("GLIBC_") for v in info.versions), info
    assert ext.tag == f"cp39-abi3-{_manylinux(native_arch())}"
    if shutil.which("readelf"):  # binutils' reading of the same file
        listed = subprocess.run(["readelf", "-V", str(ext.path)], capture_output=True, text=True).stdout
        assert {v for v in info.versions} == {w for w in listed.split() if w.startswith("GLIBC_")}


def test_manylinux_policy() -> None:
    assert wheel_platform(ElfInfo("x86_64", ("libc.so.6",), ("GLIBC_2.14", "GLIBC_2.2.5"))) == _manylinux("x86_64")
    assert wheel_platform(ElfInfo("aarch64", ("libc.so.6", "libm.so.6"), ("GLIBC_2.17",))) == _manylinux("aarch64")
    # a newer glibc raises the floor; a library no manylinux policy allows, or C++'s versions, leave linux_
    assert wheel_platform(ElfInfo("x86_64", ("libc.so.6",), ("GLIBC_2.2.5", "GLIBC_2.28"))) == "manylinux_2_28_x86_64"
    assert wheel_platform(ElfInfo("aarch64", ("libc.so.6", "libcuda.so.1"), ())) == "linux_aarch64"
    assert wheel_platform(ElfInfo("x86_64", ("libc.so.6",), ("GLIBC_2.3.4", "GLIBCXX_3.4.21"))) == "linux_x86_64"
    assert ElfInfo("x86_64", (), ("GLIBC_2.3.4", "GLIBC_2.14", "GLIBC_2.2.5")).glibc() == (2, 14)
    # glibc's named ABI versions: DT_RELR (-z pack-relative-relocs) came with 2.36; a private one is no policy's
    relr = ElfInfo("x86_64", ("libc.so.6",), ("GLIBC_2.14", "GLIBC_2.2.5", "GLIBC_ABI_DT_RELR"))
    assert wheel_platform(relr) == "manylinux_2_36_x86_64"
    assert wheel_platform(ElfInfo("x86_64", ("libc.so.6",), ("GLIBC_2.2.5", "GLIBC_PRIVATE"))) == "linux_x86_64"
    with pytest.raises(ValueError, match="ELF"):
        read_elf(b"#!/bin/sh\n")


def test_an_elf_file_without_a_dynamic_section_is_not_read_as_needing_nothing(tmp_path) -> None:
    import struct

    ext = build_extension(tmp_path)
    assert ext.path is not None
    data = bytearray(ext.path.read_bytes())
    struct.pack_into("<H", data, 60, 0)  # e_shnum = 0: no section headers, so no dynamic section to read
    with pytest.raises(ValueError, match="no dynamic section"):
        read_elf(bytes(data))


@needs_cross
def test_a_cross_compiled_extension_is_reproducible_and_tagged_for_its_architecture(tmp_path) -> None:
    a = build_extension(tmp_path / "a", OTHER)
    b = build_extension(tmp_path / "b", OTHER)
    assert a.path is not None and b.path is not None, a.note
    assert a.path.read_bytes() == b.path.read_bytes() and str(tmp_path).encode() not in a.path.read_bytes()
    info = read_elf(a.path.read_bytes())
    assert info.machine == OTHER and info.needed == ("libc.so.6",) and info.glibc() <= (2, 17)
    assert a.tag == f"cp39-abi3-{_manylinux(OTHER)}" and "cross-compiled" in a.note


def test_a_compiler_for_another_architecture_that_writes_this_one_is_caught(tmp_path, monkeypatch) -> None:
    cc = compiler()
    if cc is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv(f"CC_{OTHER.upper()}", " ".join(cc))  # the native compiler posing as a cross compiler
    ext = build_extension(tmp_path, OTHER)
    assert ext.path is None and f"compiled for {native_arch()}, not {OTHER}" in ext.note
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def platform_wheels(tmp_path_factory) -> dict[str, Path]:
    if compiler_for(OTHER) is None:
        pytest.skip(f"no C compiler for {OTHER}")
    result = build(TINY, out_dir=tmp_path_factory.mktemp("dist"), build_dir=tmp_path_factory.mktemp("work"),
                   platforms=["native", OTHER, "any"])
    return {"native": result.wheels[0], OTHER: result.wheels[1], "any": result.wheels[2], "result": result}


def _entries(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def test_one_build_writes_a_wheel_per_platform_with_the_same_kernels(platform_wheels) -> None:
    names = {k: w.name for k, w in platform_wheels.items() if k != "result"}
    assert names == {"native": f"tiny_pkg-0.1.0-cp39-abi3-{_manylinux(native_arch())}.whl",
                     OTHER: f"tiny_pkg-0.1.0-cp39-abi3-{_manylinux(OTHER)}.whl",
                     "any": "tiny_pkg-0.1.0-py3-none-any.whl"}
    assert platform_wheels["result"].wheel == platform_wheels["native"]
    so = "tiny_pkg/_runtime/_fastlaunch.abi3.so"
    contents = {k: _entries(platform_wheels[k]) for k in ("native", OTHER, "any")}
    for platform, entries in contents.items():
        wheel_file = entries["tiny_pkg-0.1.0.dist-info/WHEEL"].decode()
        info = json.loads(entries["tiny_pkg/_forge/build_info.json"])
        if platform == "any":
            assert so not in entries and info["c_launch"] is None
            assert "Root-Is-Purelib: true\nTag: py3-none-any\n" in wheel_file
            continue
        arch = native_arch() if platform == "native" else platform
        assert read_elf(entries[so]).machine == arch
        assert info["c_launch"]["wheel_tag"] == f"cp39-abi3-{_manylinux(arch)}"
        assert (f"Root-Is-Purelib: false\nTag: cp39-abi3-manylinux_2_17_{arch}\n"
                f"Tag: cp39-abi3-manylinux2014_{arch}\n") in wheel_file
    # Everything but the extension, its record and the wheel's own metadata is the same bytes in every wheel.
    def same(entries: dict[str, bytes]) -> dict[str, bytes]:
        return {n: b for n, b in entries.items() if n != so and ".dist-info/" not in n
                and n != "tiny_pkg/_forge/build_info.json"}

    assert same(contents["native"]) == same(contents[OTHER]) == same(contents["any"])
    assert any(n.endswith(".cubin") for n in contents["any"])
    # forge-aot inspect says which C launch path each wheel carries
    from click.testing import CliRunner

    from forge_aot.cli import main

    shown = CliRunner().invoke(main, ["inspect", str(platform_wheels[OTHER])]).output
    assert f"C launch path: _runtime/_fastlaunch.abi3.so (cp39-abi3-{_manylinux(OTHER)})" in shown
    shown = CliRunner().invoke(main, ["inspect", str(platform_wheels["any"])]).output
    assert "C launch path: none (pure Python: launches through ctypes)" in shown


def test_pip_takes_each_platforms_wheel(platform_wheels, tmp_path) -> None:
    """pip's own resolution among the three wheels: each architecture its C launch path's wheel, any other platform
    (or a Python pip cannot give an abi3 wheel) the pure one."""
    found = platform_wheels["any"].parent

    def chosen(*platform_args: str) -> str:
        dest = tmp_path / "-".join(platform_args or ("here",))
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-index", "--no-deps", "--find-links",
                        str(found), "-d", str(dest), *platform_args, "tiny_pkg"], check=True,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        (wheel,) = dest.iterdir()
        return wheel.name

    here = chosen()
    assert here == platform_wheels["native"].name
    for arch in ("x86_64", "aarch64"):  # a glibc 2.28 machine (pip given its platforms, as it derives them itself)
        platforms = [a for minor in (28, 17, 12) for a in ("--platform", f"manylinux_2_{minor}_{arch}")]
        assert chosen("--only-binary=:all:", *platforms, "--python-version", "3.12") \
            == f"tiny_pkg-0.1.0-cp39-abi3-{_manylinux(arch)}.whl"
    # glibc older than 2.17, macOS: the pure wheel
    assert chosen("--only-binary=:all:", "--platform", "manylinux2010_x86_64", "--python-version", "3.10") \
        == "tiny_pkg-0.1.0-py3-none-any.whl"
    assert chosen("--only-binary=:all:", "--platform", "macosx_14_0_arm64", "--python-version", "3.12") \
        == "tiny_pkg-0.1.0-py3-none-any.whl"


def test_auditwheel_agrees_with_the_tags(platform_wheels) -> None:
    auditwheel = shutil.which("auditwheel") or str(Path(sys.executable).parent / "auditwheel")
    if not os.path.exists(auditwheel):
        pytest.skip("auditwheel is not installed (pip install auditwheel)")
    for arch, wheel in ((native_arch(), platform_wheels["native"]), (OTHER, platform_wheels[OTHER])):
        out = subprocess.run([auditwheel, "show", str(wheel)], capture_output=True, text=True, check=True).stdout
        assert f'is consistent with the following platform tag:\n"manylinux_2_17_{arch}"' in out, out
        assert "requires no external shared libraries" in out or "libc.so.6" in out


def test_a_wheel_platform_that_cannot_be_built_fails_the_build(tmp_path, monkeypatch) -> None:
    """An architecture listed explicitly must get its C launch path (only `native` falls back to pure Python)."""
    monkeypatch.setenv(f"CC_{OTHER.upper()}", "false")
    with pytest.raises(PackageError, match=f"lists {OTHER}, but its C launch path cannot be built"):
        build(TINY, out_dir=tmp_path / "dist", build_dir=tmp_path / "work", platforms=[OTHER])
    with pytest.raises(ManifestError, match="unknown wheel platform 'arm64'") as info:
        build(TINY, out_dir=tmp_path / "dist", build_dir=tmp_path / "work", platforms=["arm64"])
    assert info.value.key_path == "--wheel-platform"


def test_the_manifest_key_is_checked(tmp_path) -> None:
    from tests.conftest import assert_manifest_errors

    head = '[project]\nname = "p"\nversion = "0.1"\ntargets = ["sm_90"]\n'
    kernels = '[kernels.add]\nsource = "k.py:add_kernel"\nsignature = { x = "i32" }\n'
    (tmp_path / "k.py").write_text("import triton\n\n\n@triton.jit\ndef add_kernel(x):\n    pass\n")
    assert_manifest_errors(tmp_path, head, [
        (f'wheel-platforms = ["x86-64"]\n{kernels}', "project.wheel-platforms",
         "unknown wheel platform 'x86-64' (accepted: native, any, x86_64, aarch64) (did you mean 'x86_64'?)"),
        (f"wheel-platforms = []\n{kernels}", "project.wheel-platforms", "list at least one wheel platform"),
        (f'wheel-platforms = ["any", "any"]\n{kernels}', "project.wheel-platforms",
         "a wheel platform is listed twice"),
    ])


def _aarch64_python() -> list[str] | None:
    root = os.environ.get("FORGE_AARCH64_SYSROOT", "")
    qemu = shutil.which("qemu-aarch64")
    pythons = sorted(Path(root).glob("usr/bin/python3.*")) if root else []
    return [qemu, "-L", root, str(pythons[-1])] if qemu and pythons else None


@pytest.mark.skipif(_aarch64_python() is None, reason="no qemu-aarch64 or aarch64 CPython (FORGE_AARCH64_SYSROOT; "
                    "scripts/aarch64_sysroot.sh makes one)")
def test_the_aarch64_extension_launches_as_the_native_one_does(tmp_path) -> None:
    """Loaded into an aarch64 CPython (under qemu), the cross-compiled extension gives a fake aarch64 driver the same
    parameter blocks, grids, streams and contexts as the native extension gives the native fake driver, leaves the
    same values to the Python path and reports the same driver error."""
    fake_source = TESTS / "fixtures" / "fake_cuda" / "fake_cuda.c"
    outputs = {}
    for arch in (native_arch(), "aarch64"):
        where = tmp_path / arch
        ext = build_extension(where, arch)
        assert ext.path is not None, ext.note
        cc = compiler_for(arch)
        assert cc is not None
        subprocess.run([*cc, "-O1", "-fPIC", "-shared", "-o", str(where / "libfakecuda.so"), str(fake_source)],
                       check=True)
        assert read_elf((where / "libfakecuda.so").read_bytes()).machine == arch
        python = [sys.executable] if arch == native_arch() else _aarch64_python()
        assert python is not None
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        run = subprocess.run([*python, str(TESTS / "launcher_bytes.py"), str(where), str(where / "libfakecuda.so")],
                             capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stderr
        outputs[arch] = json.loads(run.stdout)
    native, arm = outputs[native_arch()], outputs["aarch64"]
    assert arm == native
    assert set(arm["launches"]) >= {"ptr", "i64", "u64", "fp16", "bf16", "fp32", "fp64", "pushed"}
    assert arm["launches"]["pushed"]["pushes"] == 1 and arm["launches"]["pushed"]["pops"] == 1
    assert all(v.startswith("ValueError") for v in arm["left_to_python"].values())
    assert arm["errors"] == [[700, "launch of probe (grid 1x1x1, block 128)"]]


def _system_python_with_multiarch_headers() -> str | None:
    """A Debian/Ubuntu system Python whose pyconfig.h dispatches on the target's triplet (python3-dev)."""
    for python in sorted(Path("/usr/bin").glob("python3.[0-9]*")):
        if not python.name.replace("python3.", "").isdigit():
            continue
        out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                             capture_output=True, text=True)
        header = Path(out.stdout.strip(), "pyconfig.h")
        if out.returncode == 0 and header.is_file() and "aarch64-linux-gnu/" in header.read_text(errors="replace"):
            return str(python)
    return None


@needs_cross
@pytest.mark.skipif(_system_python_with_multiarch_headers() is None,
                    reason="no Debian/Ubuntu system Python with multiarch headers (python3-dev)")
def test_a_cross_compile_reads_a_system_pythons_multiarch_headers(tmp_path) -> None:
    """A release pipeline on Debian/Ubuntu's own Python: its pyconfig.h includes <aarch64-linux-gnu/python3.X/
    pyconfig.h> when compiling for aarch64, which an x86_64 machine lacks; the build gives it its own under that
    name (the same file the self-contained Pythons' builds use), and the result runs as the native one does."""
    python = _system_python_with_multiarch_headers()
    assert python is not None and native_arch() == "x86_64"
    cc = " ".join(compiler_for("aarch64") or [])
    code = (f"import sys; from pathlib import Path; sys.path.insert(0, {str(TESTS.parent)!r}); "
            "from forge_aot.extension import build_extension; "
            f"x = build_extension(Path({str(tmp_path / 'out')!r}), 'aarch64'); print(x.tag); print(x.note)")
    run = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CC_AARCH64": cc})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == f"cp39-abi3-{_manylinux('aarch64')}", run.stdout
    so = tmp_path / "out" / "_fastlaunch.abi3.so"
    assert read_elf(so.read_bytes()).machine == "aarch64"
    arm = _aarch64_python()
    if arm is None:
        return
    subprocess.run([*compiler_for("aarch64"), "-O1", "-fPIC", "-shared", "-o", str(tmp_path / "out" / "libfake.so"),
                    str(TESTS / "fixtures" / "fake_cuda" / "fake_cuda.c")], check=True)
    native = tmp_path / "native"
    build_extension(native)
    subprocess.run([*compiler(), "-O1", "-fPIC", "-shared", "-o", str(native / "libfake.so"),
                    str(TESTS / "fixtures" / "fake_cuda" / "fake_cuda.c")], check=True)
    script = str(TESTS / "launcher_bytes.py")
    on_arm = subprocess.run([*arm, script, str(tmp_path / "out"), str(tmp_path / "out" / "libfake.so")],
                            capture_output=True, text=True, timeout=300, env={"PATH": os.environ.get("PATH", "")})
    here = subprocess.run([sys.executable, script, str(native), str(native / "libfake.so")], capture_output=True,
                          text=True, timeout=300)
    assert on_arm.returncode == 0, on_arm.stderr
    assert json.loads(on_arm.stdout) == json.loads(here.stdout)
