"""Shared fixtures: the repository's wheel (built once per session) and GPU gating."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
REALWORLD = FIXTURES / "realworld"
"""The library-style fixture project."""
HALF_TOL = {"fp16": 2e-3, "bf16": 1.2e-2}
"""Relative error against an fp64 reference for a forward op computed in half precision (fp32 accumulation)."""


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of kernel_manifest.toml, built once (or taken from $FORGE_TEST_WHEEL)."""
    given = os.environ.get("FORGE_TEST_WHEEL")
    if given:
        return Path(given)
    from forge_aot.pipeline import build

    out = tmp_path_factory.mktemp("dist")
    work = tmp_path_factory.mktemp("work")
    return build(REPO / "kernel_manifest.toml", out_dir=out, build_dir=work).wheel


@pytest.fixture(scope="module")
def repo_site(repo_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's wheel unpacked as pip lays it out (one per test module: a module's processes may write its
    bytecode bundle)."""
    import zipfile

    out = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(repo_wheel) as zf:
        zf.extractall(out)
    return out


@pytest.fixture(scope="session")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the fake libcuda (fixtures/fake_cuda/fake_cuda.c) compiled as ``libcuda.so.1``: first on
    a child process's LD_LIBRARY_PATH, the runtime's own driver code loads it."""
    import subprocess

    from forge_aot.extension import compiler

    cc = compiler()
    if cc is None:
        pytest.skip("no C compiler for the fake driver")
    out = tmp_path_factory.mktemp("fakelib")
    subprocess.run([*cc, "-O1", "-fPIC", "-shared", "-o", str(out / "libcuda.so.1"),
                    str(REPO / "tests" / "fixtures" / "fake_cuda" / "fake_cuda.c")], check=True)
    return out


def fixture_site(work: Path, manifest: Path, package: str) -> Path:
    """A fixture manifest's wheel built here (x86_64) under ``work`` and unpacked as pip lays it out; skips where the
    wheel was built without its C extension (no compiler at build time)."""
    import zipfile

    from forge_aot.pipeline import build

    wheel = build(manifest, out_dir=work / "dist", build_dir=work / "build", platforms=["x86_64"]).wheel
    site = work / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    if not any(site.glob(f"{package}/_runtime/_fastlaunch*.so")):
        pytest.skip("the wheel was built without its C extension (no compiler at build time)")
    return site


FAKE_GPU_PRELUDE = """import ctypes, json, sys
sys.modules["triton"] = None
import torch
torch.Tensor.get_device = lambda self: 0
torch._C._cuda_getCurrentRawStream = lambda device: 0x5EED0 + device
# flash-attn's `with torch.cuda.device(x.device.index)`: a CPU tensor's index is None, nothing to switch
torch.cuda._exchange_device = torch.cuda._maybe_exchange_device = lambda device: -1
sys.path.append(sys.argv[1])
from tests.launcher_bytes import FakeLaunchEx, FakeState, canonical_block, renumber_addresses
SEEN = renumber_addresses(torch)


def odd(*shape, dtype, grad=False):  # misaligned by one element
    n = 1
    for s in shape:
        n *= s
    return torch.randn(n + 1, dtype=dtype)[1:].view(*shape).requires_grad_(grad)


def fused_add_rms_norm_cases(lib):  # Liger's fused add + RMSNorm (a project module, a relative package)
    cases = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape in ((3, 3500), (1, 1, 4096)):  # (on no GPU the backward's rows per program are all the rows)
            X, R, W = odd(*shape, dtype=dtype, grad=True), odd(*shape, dtype=dtype, grad=True), \\
                torch.randn(shape[-1], dtype=dtype, requires_grad=True)
            cases.append(lambda X=X, R=R, W=W: lib.liger_fused_add_rms_norm(X.detach(), R.detach(), W.detach(), 1e-6,
                                                                            0.0, "llama"))
            # the backward (one program: these tensors are on no GPU), its element type a constexpr by position
            gemma = dtype == torch.bfloat16  # (Gemma's casting built in bf16 only, as the examples call it)
            cases.append(lambda X=X, R=R, W=W, g=gemma: sum(t.float().sum() for t in lib.liger_fused_add_rms_norm(
                X, R, W, 1e-6, 1.0 if g else 0.0, "gemma" if g else "llama")).backward())
    return cases

"""
"""The start of a ``fake_driver_child`` script: CPU tensors answer as tensors of GPU 0, launches' addresses renumbered
per call (``SEEN``) so two runs compare, ``odd`` makes misaligned inputs, ``fused_add_rms_norm_cases`` the calls of
Liger's fused add + RMSNorm both library fixtures' tests make."""


def fake_driver_child(code: str, site: Path, fake_libcuda: Path, **extra: str) -> dict:
    """``code`` run in a fresh process with ``site`` on its path and the fake libcuda first on its library path (the
    runtime's switches unset, ``extra`` set); what it printed last, as JSON."""
    import json
    import subprocess
    import sys

    drop = ("PYTHONPATH", "FORGE_NO_C_LAUNCH", "FORGE_NO_COLD", "FORGE_NO_LEAN")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env |= {"PYTHONPATH": str(site), "LD_LIBRARY_PATH": str(fake_libcuda), **extra}
    proc = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, cwd="/", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def rt(tmp_path_factory: pytest.TempPathFactory):
    """The runtime with its C launch path compiled, as a wheel ships it (tests/c_launch_support.py)."""
    from tests import c_launch_support as cs

    return cs.build_c_runtime(tmp_path_factory.mktemp("crt"), "forge_ctest_rt")


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory: pytest.TempPathFactory):
    """The fake libcuda (fixtures/fake_cuda/fake_cuda.c), compiled."""
    from tests import c_launch_support as cs

    return cs.build_fake_cuda(tmp_path_factory.mktemp("fakecuda"))


@pytest.fixture
def fake(rt, fake_lib, monkeypatch: pytest.MonkeyPatch):
    """The fake driver as ``rt``'s driver, its state reset; CPU tensors with ``fake_device`` act as GPU tensors."""
    from tests import c_launch_support as cs

    cs.fake_devices(monkeypatch)
    return cs.install_fake_driver(rt, fake_lib, monkeypatch)


@pytest.fixture(scope="session")
def packaged():
    """The installed forge_kernels wheel (GPU tests use the wheel, never the source tree)."""
    try:
        module = importlib.import_module("forge_kernels")
    except ImportError:
        pytest.skip("forge_kernels is not installed: forge-aot build && pip install --no-index dist/*.whl")
    assert "site-packages" in (module.__file__ or "") or os.environ.get("FORGE_ALLOW_UNINSTALLED"), \
        module.__file__
    return module


@pytest.fixture(scope="session")
def dev_ops():
    """The same ops from the source tree through Triton's JIT (development mode)."""
    from forge_aot.dev import load_dev_ops

    return load_dev_ops(REPO / "kernel_manifest.toml")


@pytest.fixture(scope="session")
def realworld_plan():
    """The build plan of the library-style fixtures for all their targets (traced once per target and GPU model:
    seconds on the CPU machine, so made once per session; tests only read it)."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    return make_plan(load_manifest(REALWORLD / "kernel_manifest.toml"))


@pytest.fixture(scope="session")
def realworld():
    """The installed wheel of the library-style fixtures (tests/fixtures/realworld)."""
    try:
        return importlib.import_module("forge_realworld")
    except ImportError:
        pytest.skip("forge_realworld is not installed: forge-aot build --manifest tests/fixtures/realworld/"
                    "kernel_manifest.toml && pip install --no-index dist/forge_realworld-*.whl")


def torch_dtype(name: str):
    """The torch dtype of a test parameter's name (``fp16``, ``bf16``, ``fp32``)."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def import_fixture_file(path: Path, name: str):
    """A fixture kernel file imported as its authors run it (under Triton's JIT), its project's root (the nearest
    folder above it with a kernel_manifest.toml) importable for its helper packages."""
    import importlib.util
    import sys

    root = str(next((d for d in path.parents if (d / "kernel_manifest.toml").is_file()), path.parent.parent))
    if root not in sys.path:
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def assert_manifest_errors(root: Path, head: str, cases) -> None:
    """Each (manifest text after ``head``, key path, message) written to ``root/kernel_manifest.toml`` fails to
    load with a ManifestError naming the key path and saying the message."""
    from forge_aot.errors import ManifestError
    from forge_aot.manifest import load_manifest

    for tail, where, message in cases:
        (root / "kernel_manifest.toml").write_text(head + tail)
        with pytest.raises(ManifestError) as info:
            load_manifest(root / "kernel_manifest.toml")
        assert where in str(info.value) and message in str(info.value), str(info.value)


def poison_allocator(nbytes: int) -> None:
    """Fill a block of torch's caching allocator with NaN and free it, so a later torch.empty of that size
    hands back poisoned memory: an output element the kernel fails to write then shows up as NaN."""
    import torch

    block = torch.empty(nbytes // 4 + 1024, dtype=torch.float32, device="cuda")
    block.fill_(float("nan"))
    del block


def offset_view(t, offset: int = 1):
    """The same values at a storage offset of `offset` elements: the pointer is not 16-byte aligned."""
    import torch

    flat = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = flat[offset:].view(t.shape)
    view.copy_(t)
    return view


def relative_error(out, ref) -> float:
    import torch

    out = out.double()
    if torch.isnan(out).any():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def reset_handle(module_name: str, function: str) -> None:
    """Forget a packaged kernel handle's resolved state, so the next call shows which binaries it picks."""
    handle = getattr(importlib.import_module(module_name), function)  # binds the host module if not yet used
    handle._states.clear()
    if handle._fast is not None:
        handle._fast.clear()  # the C launch path's remembered launches too, so the next call is resolved again


def launched_specs(module_name: str, function: str) -> set[str]:
    """The specializations (see the README) of the binaries a packaged kernel handle launched since its reset."""
    handle = getattr(importlib.import_module(module_name), function)
    return {launcher.spec for state in handle._states.values() for launcher in state.launchers.values()}


def in_fresh_thread(fn):
    """Run ``fn`` on a new thread (one with no current CUDA context) and return its result or raise its error."""
    import threading

    result = {}

    def work() -> None:
        try:
            result["out"] = fn()
        except Exception as exc:  # re-raised below, on the test's thread
            result["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["out"]


def launched_and_built(module_name: str, function: str) -> tuple[set[str], set[str]]:
    """The specializations a packaged kernel handle launched since its reset, and every specialization the wheel
    carries for the config(s) it launched with (what a call could have taken)."""
    handle = getattr(importlib.import_module(module_name), function)
    launched: set[str] = set()
    built: set[str] = set()
    for state in handle._states.values():
        for (cid, *_), launcher in state.launchers.items():
            launched.add(launcher.spec)
            config = handle.variants[state.variant]["targets"][state.target]["configs"][cid]
            built |= {b["spec"] for b in config["binaries"].values()}
    return launched, built


def expected_spec(args, built: set[str]) -> str:
    """The binary a call must take: its arguments' specialization (Triton's rules: ``D`` aligned pointer or
    integer divisible by 16, ``1`` integer equal to 1, ``x`` otherwise), then the most specialized built
    binary whose assumptions all hold."""
    from forge_aot import runtime as rt

    values = [a.data_ptr() if hasattr(a, "data_ptr") else a for a in args]
    call = rt.argument_spec([(i, hasattr(a, "data_ptr")) for i, a in enumerate(args)], values)
    return max((b for b in built if rt.spec_fits(b, call)), key=rt.spec_rank)
