"""Cold handles (``runtime/cold.py``): a plain kernel's first calls served without the rest of the runtime, in fresh
processes of the repository's wheel against the fake libcuda (CPU tensors answer as tensors of GPU 0; see
test_first_call_fake_driver). Every launch a cold handle makes is the one the full ``Kernel`` makes for the same
call (the same binary, grid, block, shared memory and parameter bytes: odd sizes, three dtypes, misaligned
tensors), the first calls load none of the full runtime's modules, and whatever a cold handle does not serve
promotes it in place to a full ``Kernel`` that reports it as before."""

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

PRELUDE = textwrap.dedent("""
    import ctypes, json, os, sys
    sys.modules["triton"] = None
    import torch
    real_get_device = torch.Tensor.get_device
    ON_CPU = []  # non-empty: tensors answer as CPU tensors again
    torch.Tensor.get_device = lambda self: -1 if ON_CPU else 0
    torch._C._cuda_getCurrentRawStream = lambda device: 0x5EED0 + device
    import forge_kernels
    sys.path.append(sys.argv[1])
    from tests.launcher_bytes import FakeState, renumber_addresses
    SEEN = renumber_addresses(torch)
    fake = FakeState.in_dll(ctypes.CDLL("libcuda.so.1"), "fake")
    fake.block_size = -1  # the whole parameter block of every launch
    ops = {m: sys.modules.get(f"forge_kernels._ops.{m}") for m in ("vector_add", "softmax", "matmul")}
    FULL = ("kernel", "launch", "tables", "host_modules", "host_triton")

    def full_loaded():
        return sorted(m for m in FULL if f"forge_kernels._runtime.{m}" in sys.modules)
""")

EQUIVALENCE = PRELUDE + textwrap.dedent("""
    torch.manual_seed(0)
    cases = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for n in (1, 1000, 4097, 1 << 20):
            x, y = torch.randn(n + 1, dtype=dtype), torch.randn(n + 1, dtype=dtype)
            cases.append(("vector_add", (x[:n], y[:n])))
            cases.append(("vector_add", (x[1:], y[1:])))  # misaligned: a binary that assumes no alignment
    for shape in ((3, 5), (37, 1000), (128, 4096)):
        x = torch.randn(shape[0] * shape[1] + 1, dtype=torch.float16)
        cases.append(("softmax", (x[1:].view(shape),)))
    for m, n, k in ((64, 64, 64), (100, 72, 33), (256, 512, 128)):
        cases.append(("matmul", (torch.randn(m, k, dtype=torch.float16), torch.randn(k, n, dtype=torch.float16))))

    def run(op, args):
        SEEN.clear()
        getattr(forge_kernels, op)(*args)
        r = fake.launch_record()
        return [r[1], r[2], r[3], r[6].hex(), list(r[7])]

    cold = [run(op, args) for op, args in cases]
    handles = {name: obj for mod in ("vector_add", "softmax", "matmul")
               for name, obj in vars(sys.modules[f"forge_kernels._ops.{mod}"]).items() if name.endswith("_kernel")}
    kinds = sorted({type(h).__name__ for h in handles.values()})
    loaded = full_loaded()
    cold_paths = sorted(p for h in handles.values() for _, p, _ in h._cold.launchers)
    for h in handles.values():
        h._promoted()
    full = [run(op, args) for op, args in cases]
    full_paths = sorted(p for _, p in handles["add_kernel"].backend._loaded)
    print(json.dumps({"cold": cold, "full": full, "kinds": kinds, "after": sorted({type(h).__name__ for h in
                      handles.values()}), "loaded": loaded, "cold_paths": cold_paths, "full_paths": full_paths,
                      "n": len(cases)}))
""")

PROMOTIONS = PRELUDE + textwrap.dedent("""
    from forge_kernels._runtime import errors
    out = {}
    x = torch.randn(1000, dtype=torch.float16)
    forge_kernels.vector_add(x, x)
    k = sys.modules["forge_kernels._ops.vector_add"].add_kernel
    out["first"] = type(k).__name__
    # one result per binary, whichever call resolved it (as Triton returns the binary it ran)
    o = torch.empty_like(x)
    r1, r2 = k[(1,)](x, x, o, 1000), k[(1,)](x, x, o, 1001)
    out["same_binary_same_result"] = [r1._of[1]["path"] == r2._of[1]["path"], r1 is r2]
    config = k._cold.last.config
    out["best_config"] = [str(k.best_config), str(config), type(k).__name__]  # reading it promotes
    out["c_cache_after_promotion"] = k._fast.size()
    forge_kernels.vector_add(x, x)
    out["second"] = type(k).__name__

    # a CPU tensor: the cold handle leaves it to the full path, which names the argument
    forge_kernels.softmax(torch.randn(4, 8, dtype=torch.float16))  # binds the module, cold
    mod = sys.modules["forge_kernels._ops.softmax"]
    out["softmax_first"] = type(mod.softmax_kernel).__name__
    ON_CPU.append(True)
    try:
        forge_kernels.softmax(torch.randn(5, 8, dtype=torch.float16))
        out["cpu"] = None
    except errors.UnsupportedDeviceError as exc:
        out["cpu"] = [str(exc), type(mod.softmax_kernel).__name__]
    ON_CPU.clear()

    # a dtype the package has no build of, on a fresh module: raised by the full path, the handle promoted
    try:
        forge_kernels.matmul(torch.randn(8, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64))
        out["dtype"] = None
    except (errors.UnsupportedDtypeError, errors.NotBuiltError, TypeError) as exc:
        out["dtype"] = [type(exc).__name__, type(sys.modules["forge_kernels._ops.matmul"].matmul_kernel).__name__]
    print(json.dumps(out))
""")

PRELOAD = PRELUDE + textwrap.dedent("""
    x = torch.randn(1000, dtype=torch.float16)
    forge_kernels.vector_add(x, x)
    k = sys.modules["forge_kernels._ops.vector_add"].add_kernel
    before = type(k).__name__
    n = forge_kernels.preload(0)
    print(json.dumps({"before": before, "after": type(k).__name__, "preloaded": n, "loads": fake.loads,
                      "registered": k in k.backend.kernels}))
""")

KEYWORDS = PRELUDE + textwrap.dedent("""
    x = torch.randn(1000, dtype=torch.float16)
    forge_kernels.vector_add(x, x)  # binds the host module with cold handles
    k = sys.modules["forge_kernels._ops.vector_add"].add_kernel
    out = torch.empty_like(x)
    k[(1,)](x, x, out, n_elements=1000)  # by keyword, as seen before: the C path launches it, still cold
    kinds = [type(k).__name__]
    k[(1,)](x, x, out, n_elements=999)  # by keyword, not seen: bound as Kernel._bind binds it, still cold
    k[(1,)](y_ptr=x, x_ptr=x, out_ptr=out, n_elements=998)  # all by keyword, in another order (Liger's style)
    kinds.append(type(k).__name__)
    try:
        k[(1,)](x, x, out, 997, BLOCK_SIZE=64)  # a tuned meta-parameter: the full binding refuses it
    except TypeError as exc:
        kinds.append([type(k).__name__, "config table" in str(exc)])
    print(json.dumps({"kinds": kinds, "launched": fake.calls}))
""")


@pytest.fixture(scope="module")
def child_env(repo_site: Path, fake_libcuda: Path) -> dict[str, str]:
    if not any(repo_site.glob("forge_kernels/_runtime/_fastlaunch*.so")):
        pytest.skip("the wheel was built without its C extension (no compiler at build time)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FORGE_NO_C_LAUNCH", "FORGE_NO_COLD")}
    # (lean handles, test_lean.py, would serve vector_add, softmax and matmul first: these tests are the cold ones')
    return env | {"PYTHONPATH": str(repo_site), "LD_LIBRARY_PATH": str(fake_libcuda), "FORGE_NO_LEAN": "1"}


def _child(code: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, cwd="/", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cold_launches_are_the_full_kernels_launches(child_env) -> None:
    got = _child(EQUIVALENCE, child_env)
    assert got["kinds"] == ["ColdKernel"] and got["after"] == ["Kernel"]
    assert got["loaded"] == [], "the first calls loaded the full runtime"
    assert got["n"] == len(got["cold"]) == len(got["full"]) >= 30
    for i, (cold, full) in enumerate(zip(got["cold"], got["full"])):
        assert cold == full and cold[3], f"case {i}: cold {cold} != full {full}"
    assert set(got["cold_paths"]) <= set(got["full_paths"]) and len(set(got["cold_paths"])) >= 3


def test_unserved_calls_promote_and_report_as_before(child_env) -> None:
    got = _child(PROMOTIONS, child_env)
    assert got["first"] == "ColdKernel"
    same_binary, same_result = got["same_binary_same_result"]
    assert same_result == same_binary
    best, config, kind = got["best_config"]
    assert best == config and "BLOCK_SIZE" in best and kind == "Kernel"
    assert got["second"] == "Kernel"
    assert got["softmax_first"] == "ColdKernel"
    message, kind = got["cpu"]
    assert "CPU tensor" in message and kind == "Kernel"
    assert got["dtype"] is not None and got["dtype"][1] == "Kernel"


def test_preload_promotes_cold_handles(child_env) -> None:
    got = _child(PRELOAD, child_env)
    assert got["before"] == "ColdKernel" and got["after"] == "Kernel" and got["registered"]
    assert got["preloaded"] >= 1 and got["loads"] >= got["preloaded"]


def test_keyword_calls_stay_cold_and_bad_ones_promote(child_env) -> None:
    got = _child(KEYWORDS, child_env)
    assert got["kinds"] == ["ColdKernel", "ColdKernel", ["Kernel", True]] and got["launched"] == 4


def test_cold_handles_can_be_turned_off(child_env) -> None:
    got = _child(KEYWORDS, child_env | {"FORGE_NO_COLD": "1"})
    assert got["kinds"] == ["Kernel", "Kernel", ["Kernel", True]] and got["launched"] == 4


GPU_CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    import forge_kernels
    torch.manual_seed(0)
    outs, kinds = [], {}
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for n in (1, 1000, 4097, 1 << 20):
            x = torch.randn(n + 1, device="cuda", dtype=dtype)
            y = torch.randn(n + 1, device="cuda", dtype=dtype)
            for a, b in ((x[:n], y[:n]), (x[1:], y[1:])):  # aligned, misaligned
                outs.append(("vector_add", forge_kernels.vector_add(a, b), (a.double() + b.double())))
    for rows, cols in ((3, 5), (37, 1000), (128, 4096)):
        x = torch.randn(rows * cols + 1, device="cuda", dtype=torch.float16)[1:].view(rows, cols)
        outs.append(("softmax", forge_kernels.softmax(x), torch.softmax(x.double(), -1)))
    for m, n, k in ((64, 64, 64), (100, 72, 33), (1000, 1000, 1000)):
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        outs.append(("matmul", forge_kernels.matmul(a, b), a.double() @ b.double()))
    torch.cuda.synchronize()
    for mod in ("vector_add", "softmax", "matmul"):
        for name, obj in vars(sys.modules[f"forge_kernels._ops.{mod}"]).items():
            if name.endswith("_kernel"):
                kinds[name] = type(obj).__name__
    errs = [((o.double() - r).abs().max() / r.abs().max().clamp_min(1e-6)).item() for _, o, r in outs]
    torch.save([o.cpu() for _, o, _ in outs], sys.argv[1])
    print(json.dumps({"kinds": kinds, "errs": errs, "full_loaded": sorted(
        m for m in ("kernel", "launch", "tables", "host_modules", "host_triton")
        if f"forge_kernels._runtime.{m}" in sys.modules)}))
""")


@pytest.mark.gpu
def test_lean_and_cold_handles_on_the_gpu_match_the_full_kernels_bit_for_bit(tmp_path: Path) -> None:
    """The installed wheel on the GPU: the first calls of vector_add, softmax and matmul (odd sizes, misaligned
    tensors, three dtypes) run through lean handles (``lean.py``: no other runtime module loaded but matmul's
    constraints), or with those off through cold handles, without loading the full runtime, correct against torch in
    float64; a process with cold handles off (the full ``Kernel``) gives the same bits."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("forge_kernels")
    env = {k: v for k, v in os.environ.items() if k not in ("FORGE_NO_COLD", "FORGE_NO_LEAN")}
    results = {}
    for mode, extra in (("lean", {}), ("cold", {"FORGE_NO_LEAN": "1"}), ("full", {"FORGE_NO_COLD": "1"})):
        proc = subprocess.run([sys.executable, "-c", GPU_CHILD, str(tmp_path / f"{mode}.pt")], capture_output=True,
                              text=True, cwd="/", env=env | extra)
        assert proc.returncode == 0, proc.stderr
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results["lean"]["kinds"].values()) == {"LeanKernel"}, results["lean"]["kinds"]
    assert set(results["cold"]["kinds"].values()) == {"ColdKernel"}, results["cold"]["kinds"]
    assert results["lean"]["full_loaded"] == results["cold"]["full_loaded"] == []
    assert set(results["full"]["kinds"].values()) == {"Kernel"}
    for mode in ("lean", "cold"):
        assert max(results[mode]["errs"]) < 2e-2, (mode, results[mode]["errs"])
    lean, cold, full = (torch.load(tmp_path / f"{mode}.pt") for mode in ("lean", "cold", "full"))
    assert len(lean) == len(cold) == len(full) >= 30
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(lean, cold, full))


TWO_GPU_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import forge_kernels
    torch.cuda.set_device(0)
    out = {}
    for dev in (1, 0):  # the first calls on the other GPU, then on the current one
        x = torch.randn(4097, device=f"cuda:{dev}", dtype=torch.float16)
        s = torch.randn(37, 1000, device=f"cuda:{dev}")
        v, p = forge_kernels.vector_add(x, x), forge_kernels.softmax(s)
        torch.cuda.synchronize(dev)
        out[dev] = [v.device.index, p.device.index, torch.equal(v, x + x),
                    (p.double() - torch.softmax(s.double(), -1)).abs().max().item()]
    out["kinds"] = sorted({type(sys.modules[f"forge_kernels._ops.{m}"].__dict__[k]).__name__
                           for m, k in (("vector_add", "add_kernel"), ("softmax", "softmax_kernel"))})
    out["current"] = torch.cuda.current_device()
    print(json.dumps(out))
""")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["lean", "cold"])
def test_lean_and_cold_handles_launch_on_the_tensors_device(mode: str) -> None:
    """Lean (or cold) handles' first calls on a GPU other than the current one: that device's binaries, context and
    stream, then the current one's, with neither promoted."""
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    pytest.importorskip("forge_kernels")
    env = {k: v for k, v in os.environ.items() if k not in ("FORGE_NO_COLD", "FORGE_NO_LEAN")}
    env |= {"FORGE_NO_LEAN": "1"} if mode == "cold" else {}
    proc = subprocess.run([sys.executable, "-c", TWO_GPU_CHILD], capture_output=True, text=True, cwd="/", env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["kinds"] == ["LeanKernel" if mode == "lean" else "ColdKernel"] and got["current"] == 0
    for dev in ("1", "0"):
        v_dev, p_dev, v_ok, p_err = got[dev]
        assert v_dev == p_dev == int(dev) and v_ok and p_err < 1e-5
