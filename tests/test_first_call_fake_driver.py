"""A fresh process's first call of the repository's wheel on the CPU machine, through the runtime's real driver
code against the fake libcuda (``fixtures/fake_cuda/fake_cuda.c`` compiled as ``libcuda.so.1`` and put first on
``LD_LIBRARY_PATH``; CPU tensors answer as tensors of GPU 0): the C driver serves the first launch where the C
extension is loaded, ctypes where it is turned off, and either way one binary is loaded and launched once under
the device's primary context, with neither Triton nor forge-aot imported (``scripts/probe_first_call_fake.py``
times the same process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import ctypes, json, sys
    sys.modules["triton"] = None  # the wheel must not need it
    import torch
    torch.Tensor.get_device = lambda self: 0  # CPU tensors answer as tensors of GPU 0
    torch._C._cuda_getCurrentRawStream = lambda device: 0x5EED0 + device
    import forge_kernels
    x = torch.randn(1000, dtype=torch.float16)
    forge_kernels.vector_add(x, x)
    forge_kernels.vector_add(x, x)  # the second call: the C path's cache where it is on, no second load
    from forge_kernels._runtime import drivers, fastpath, lean
    sys.path.append(sys.argv[1])
    from tests.launcher_bytes import FakeState
    fake = FakeState.in_dll(ctypes.CDLL("libcuda.so.1"), "fake")
    print(json.dumps({"driver": type(drivers._driver).__name__, "c_path": fastpath.c is not None,
                      "lean": type(sys.modules["forge_kernels._ops.vector_add"].add_kernel).__name__ == "LeanKernel",
                      "calls": fake.calls, "loads": fake.loads, "ctx": fake.ctx_at_launch,
                      "block": list(fake.block), "triton": sys.modules.get("triton") is not None,
                      "forge_aot": "forge_aot" in sys.modules}))
""")


@pytest.fixture(scope="module")
def site(repo_site: Path) -> Path:
    return repo_site


@pytest.mark.parametrize("mode", ["lean", "c-extension", "pure-python"])
def test_a_first_call_loads_and_launches_through_the_runtimes_driver(site, fake_libcuda, mode) -> None:
    """``lean``: the lean first call (``lean.py``: the C ``Driver`` it opened, no ``drivers`` module); ``c-extension``:
    the cold handle's through the runtime's C driver (``FORGE_NO_LEAN=1``); ``pure-python``: ctypes."""
    c_launch = mode != "pure-python"
    if c_launch and not any(site.glob("forge_kernels/_runtime/_fastlaunch*.so")):
        pytest.skip("the wheel was built without its C extension (no compiler at build time)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FORGE_NO_C_LAUNCH", "FORGE_NO_LEAN")}
    env |= {"PYTHONPATH": str(site), "LD_LIBRARY_PATH": str(fake_libcuda)}
    if mode == "pure-python":
        env["FORGE_NO_C_LAUNCH"] = "1"
    elif mode == "c-extension":
        env["FORGE_NO_LEAN"] = "1"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(REPO)], capture_output=True, text=True, cwd="/",
                          env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    driver = {"lean": "NoneType", "c-extension": "_CudaDriverC", "pure-python": "_CudaDriver"}[mode]
    assert got["driver"] == driver and got["c_path"] is c_launch and got["lean"] is (mode == "lean")
    # one binary loaded, launched by both calls under GPU 0's primary context (the fake's 0xC000)
    assert got["loads"] == 1 and got["calls"] == 2 and got["ctx"] == 0xC000
    assert got["block"][0] % 32 == 0 and got["block"][1:] == [1, 1]
    assert not got["triton"] and not got["forge_aot"]
