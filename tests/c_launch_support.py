"""Shared by the C launch path tests: the runtime with its extension built, a fake libcuda, fake packages.

The runtime is copied (as a wheel ships it) into a temporary package with ``_fastlaunch.abi3.so`` compiled by
forge-aot's own build step, and imported under its own name. The fake driver is a small C library
(``fixtures/fake_cuda/fake_cuda.c``) loaded by the runtime's real drivers (``cuda``, ``cuda_ctypes``); both launch
paths call it, and it records what each launch receives, so the two paths are compared on the bytes the driver gets.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from forge_aot.extension import build_extension, compiler
from tests.launcher_bytes import FakeState

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RUNTIME = Path(__file__).resolve().parent.parent / "forge_aot" / "runtime"


def build_c_runtime(tmp: Path, name: str) -> Any:
    """Copy the runtime to ``tmp/name`` with its C extension compiled, and import it as package ``name``."""
    pkg = tmp / name
    pkg.mkdir(parents=True)
    for module in RUNTIME.glob("*.py"):
        shutil.copyfile(module, pkg / module.name)
    ext = build_extension(pkg)
    if ext.path is None:
        raise RuntimeError(ext.note)
    sys.path.insert(0, str(tmp))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp))
    assert module.fastpath.c is not None, "the compiled extension did not load"
    return module


def build_fake_cuda(tmp: Path) -> ctypes.CDLL:
    cc = compiler()
    assert cc is not None
    out = tmp / "libfakecuda.so"
    subprocess.run([*cc, "-O1", "-fPIC", "-shared", "-o", str(out), str(FIXTURES / "fake_cuda" / "fake_cuda.c")],
                   check=True)
    return ctypes.CDLL(str(out))


def install_fake_driver(rt: Any, lib: ctypes.CDLL, monkeypatch: Any, c_driver: bool = True) -> FakeState:
    """Make ``lib`` the runtime's driver and reset the fake's state: through the C extension's ``Driver``, as the
    runtime opens it (``cuda.open_driver``), or with ``c_driver=False`` through ctypes (``_CudaDriver``)."""
    cuda = importlib.import_module(f"{rt.__name__}.cuda")
    if c_driver:
        drv = cuda.open_driver(lib._name)
        assert type(drv) is cuda._CudaDriverC
    else:
        drv = importlib.import_module(f"{rt.__name__}.cuda_ctypes")._CudaDriver(lib)
    monkeypatch.setattr(rt.drivers, "_driver", drv)
    state = FakeState.in_dll(lib, "fake")
    ctypes.memset(ctypes.addressof(state), 0, ctypes.sizeof(state))
    state.current = drv.primary_context(0)
    return state


def fake_devices(monkeypatch: Any) -> None:
    """CPU tensors act as GPU tensors of the device in their ``fake_device`` attribute (plain CPU tensors stay
    CPU tensors), and torch's current stream is 0x5EED0 + device, for both launch paths."""
    import torch

    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: getattr(self, "fake_device", -1))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0x5EED0 + device, raising=False)


def on(device: int, *tensors: Any) -> None:
    for t in tensors:
        t.fake_device = device


def binary(root: Path, kernel: str, spec: str, **fields: Any) -> dict[str, Any]:
    image = b"\x7fELF" + f"{kernel}/{spec}/{sorted(fields.items())}".encode()
    rel = f"_forge/bin/{kernel}/{spec}-{hashlib.sha256(image).hexdigest()[:8]}.cubin"
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(image)
    out = {"path": rel, "function": f"{kernel}_kernel", "shared": 0, "warp_size": 32, "num_warps": 4,
           "global_scratch_size": 0, "profile_scratch_size": 0, "sha256": hashlib.sha256(image).hexdigest(),
           "spec": spec}
    out.update(fields)
    return out


TARGETS = {"sm_90": {"backend": "cuda", "arch": 90, "arch_specific": True, "warp_size": 32}}


def kernel_spec(root: Path, name: str, params: list[list[str]], *, dtypes: dict[str, list[str]] | None = None,
                key: list[str] | None = None, specs: list[str] | None = None, block: int = 1024,
                binary_fields: dict[str, Any] | None = None, pre_hook: str | None = None,
                call_site: dict[str, list[Any]] | None = None,
                constexpr_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """An index entry for a kernel with one config per variant, every listed specialization built. Variants:
    the type variables in ``dtypes`` × the call-site values in ``call_site`` (constexpr parameters of
    ``params``, or launch options such as num_warps)."""
    spec_params = [n for n, t in params if t.startswith("*") or t in ("i32", "i64", "u32", "u64", "i16", "i8")]
    dtypes = dtypes or {}
    call_site = call_site or {}
    type_args = {tv: next(n for n, t in params if t == f"*{tv}") for tv in dtypes}
    axes = [*dtypes, *call_site]
    variants = {}
    for vals in _product([*dtypes.values(), *call_site.values()]):
        assign = dict(zip(axes, vals))
        vid = ",".join(f"{k}={v}" for k, v in assign.items()) or "base"
        built = specs or ["x" * len(spec_params)]
        binaries = {}
        for s in built:
            b = binary(root, name, s + vid, **(binary_fields or {}))
            b["spec"] = s
            binaries[s] = b
        config = {"meta": {"BLOCK": block} if "BLOCK" not in call_site else {}, "num_warps": 4, "num_stages": 1,
                  "binaries": binaries}
        if pre_hook:
            config["pre_hook"] = pre_hook
        variants[vid] = {"assign": assign, "targets": {"sm_90": {
            "configs": {"c": config}, "tables": {"default": [[*([4096] * len(key or [])), "c"]]}}}}
    return {"function": f"{name}_kernel", "params": params, "dtype_args": type_args, "key": key or [],
            "axes": axes, "spec_params": spec_params, "constraints": [], "variants": variants,
            "pre_hooks": [pre_hook] if pre_hook else [], "constexpr_defaults": constexpr_defaults or {}}


def _product(lists: list[list[str]]) -> list[tuple[str, ...]]:
    import itertools

    return list(itertools.product(*lists))
