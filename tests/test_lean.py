"""The lean first calls (``runtime/lean.py``): ``import <package>`` loads ``_runtime.lean`` alone, and an op whose
host module has a lean plan is served by ``LeanKernel`` handles with no other runtime module loaded. In fresh
processes of the repository's wheel against the fake libcuda (CPU tensors answer as tensors of GPU 0; see
test_first_call_fake_driver): every launch a lean handle makes is the one the full ``Kernel`` makes for the same call
(binary, grid, block, shared memory, parameter bytes; odd sizes, three dtypes, misaligned tensors); whatever it does
not serve hands the package over to the full runtime, which adopts the bound modules and handles (one binding), and
reports as before; the build writes plans only where a lean handle can serve every kernel of a module."""

from __future__ import annotations

import json
import os
import shutil
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
    ON_CPU = []  # non-empty: tensors answer as CPU tensors again
    torch.Tensor.get_device = lambda self: -1 if ON_CPU else 0
    torch._C._cuda_getCurrentRawStream = lambda device: 0x5EED0 + device
    import forge_kernels
    at_import = sorted(m for m in sys.modules if m.startswith("forge_kernels"))
    sys.path.append(sys.argv[1])
    from tests.launcher_bytes import FakeState, renumber_addresses
    SEEN = renumber_addresses(torch)
    fake = FakeState.in_dll(ctypes.CDLL("libcuda.so.1"), "fake")
    fake.block_size = -1  # the whole parameter block of every launch

    def runtime_loaded():
        return sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("forge_kernels._runtime."))

    def kind(op, name):
        return type(getattr(sys.modules[f"forge_kernels._ops.{op}"], name)).__name__
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

    lean = [run(op, args) for op, args in cases]
    handles = {name: obj for mod in ("vector_add", "softmax", "matmul")
               for name, obj in vars(sys.modules[f"forge_kernels._ops.{mod}"]).items() if name.endswith("_kernel")}
    kinds = sorted({type(h).__name__ for h in handles.values()})
    loaded = [m for m in runtime_loaded() if m != "bundling"]  # (the first process writes the bytecode bundle)
    c_cached = sum(h._fast.size() for h in handles.values())
    from forge_kernels._runtime.cold import promoted
    for h in handles.values():
        promoted(h)
    full = [run(op, args) for op, args in cases]
    print(json.dumps({"lean": lean, "full": full, "kinds": kinds, "at_import": at_import, "loaded": loaded,
                      "after": sorted({type(h).__name__ for h in handles.values()}), "n": len(cases),
                      "c_cached": c_cached}))
""")

PROMOTIONS = PRELUDE + textwrap.dedent("""
    out = {}
    x = torch.randn(1000, dtype=torch.float16)
    forge_kernels.vector_add(x, x)
    k = sys.modules["forge_kernels._ops.vector_add"].add_kernel
    out["first"] = type(k).__name__
    o = torch.empty_like(x)
    r1, r2 = k[(1,)](x, x, o, 1000), k[(1,)](x, x, o, 1001)  # one result per binary (Triton returns the binary)
    out["same_result"] = r1 is r2
    out["lean_loaded"] = [m for m in runtime_loaded() if m != "bundling"]
    out["best_config"] = [str(k.best_config), type(k).__name__, str(r1.config)]  # reading it promotes
    forge_kernels.vector_add(x, x)
    out["second"] = type(k).__name__

    # handed over (above): a module bound from now on is the full runtime's to bind (cold handles)
    forge_kernels.softmax(torch.randn(4, 8, dtype=torch.float16))
    s = sys.modules["forge_kernels._ops.softmax"].softmax_kernel
    out["softmax_first"] = type(s).__name__

    # a CPU tensor: reported by the full path, which names the argument
    from forge_kernels._runtime import errors
    ON_CPU.append(True)
    try:
        forge_kernels.softmax(torch.randn(5, 8, dtype=torch.float16))
        out["cpu"] = None
    except errors.UnsupportedDeviceError as exc:
        out["cpu"] = [str(exc), type(s).__name__]
    ON_CPU.clear()

    # a dtype the package has no build of: raised by the full path, the handle promoted
    try:
        forge_kernels.matmul(torch.randn(8, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64))
        out["dtype"] = None
    except (errors.UnsupportedDtypeError, errors.NotBuiltError, TypeError) as exc:
        out["dtype"] = [type(exc).__name__, kind("matmul", "matmul_kernel")]
    full = sys.modules["forge_kernels._runtime.entry"].PACKAGES["forge_kernels"]
    out["adopted"] = sorted(full.modules)
    print(json.dumps(out))
""")

KEYWORDS = PRELUDE + textwrap.dedent("""
    x = torch.randn(1000, dtype=torch.float16)
    forge_kernels.vector_add(x, x)
    k = sys.modules["forge_kernels._ops.vector_add"].add_kernel
    import forge_kernels._ops.vector_add as host  # (its parent package imported by the lean binding, as before)
    assert host.add_kernel is k
    out = torch.empty_like(x)
    kinds = [type(k).__name__]
    k[(1,)](x, x, out, 1000)  # by position, as seen: the C path
    kinds.append(type(k).__name__)
    k[(1,)](x, x, out, n_elements=999)  # by keyword: bound as Kernel._bind binds it, still lean
    kinds.append(type(k).__name__)
    k[(1,)](x, x, out, 998, num_ctas=1)  # a launch option at its default: read as not passed (and by the C path)
    kinds.append(type(k).__name__)
    try:
        k[(1,)](x, x, out, 997, BLOCK_SIZE=64)  # a tuned meta-parameter: the full binding refuses it
    except TypeError as exc:
        kinds.append([type(k).__name__, "config table" in str(exc)])
    print(json.dumps({"kinds": kinds, "launched": fake.calls}))
""")

PRELOAD = PRELUDE + textwrap.dedent("""
    x = torch.randn(1000, dtype=torch.float16)
    forge_kernels.vector_add(x, x)
    k = sys.modules["forge_kernels._ops.vector_add"].add_kernel
    before = type(k).__name__
    n = forge_kernels.preload(0)
    import forge_kernels._ops.vector_add as by_name
    same = by_name is sys.modules["forge_kernels._ops.vector_add"] and by_name.add_kernel is k
    print(json.dumps({"before": before, "after": type(k).__name__, "preloaded": n, "registered": k in k.backend.kernels,
                      "same_module": same}))
""")

HAND_OVER = PRELUDE + textwrap.dedent("""
    x = torch.randn(4, 1000, dtype=torch.float16)
    forge_kernels.softmax(x)  # lean
    s = sys.modules["forge_kernels._ops.softmax"].softmax_kernel
    first = type(s).__name__
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    f = torch.compile(lambda x: forge_kernels.softmax(x) * 2, fullgraph=True, backend=backend)
    calls = fake.calls
    f(x)  # the traced call: the custom op, whose real implementation runs the host code (the handle promoted)
    import forge_kernels._ops.matmul as mm  # a module not bound yet: bound by the full runtime
    print(json.dumps({"first": first, "graphs": graphs, "after": type(s).__name__, "launched": fake.calls - calls,
                      "matmul": type(mm.matmul_kernel).__name__, "one_module": mm is sys.modules[mm.__name__]}))
""")

THREADS = PRELUDE + textwrap.dedent("""
    import threading
    x = torch.randn(4099, dtype=torch.float16)
    barrier = threading.Barrier(8)
    errors = []

    def first():
        barrier.wait()
        try:
            forge_kernels.vector_add(x, x)
        except Exception as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=first) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    k = sys.modules["forge_kernels._ops.vector_add"].add_kernel
    print(json.dumps({"errors": errors, "calls": fake.calls, "loads": fake.loads, "kind": type(k).__name__}))
""")

TAMPERED = PRELUDE + textwrap.dedent("""
    from forge_kernels._runtime import errors
    try:
        forge_kernels.vector_add(torch.randn(1000, dtype=torch.float16), torch.randn(1000, dtype=torch.float16))
        got = None
    except errors.IntegrityError as exc:
        got = str(exc)
    print(json.dumps({"error": got, "launched": fake.calls}))
""")


@pytest.fixture(scope="module")
def child_env(repo_site: Path, fake_libcuda: Path) -> dict[str, str]:
    if not any(repo_site.glob("forge_kernels/_runtime/_fastlaunch*.so")):
        pytest.skip("the wheel was built without its C extension (no compiler at build time)")
    drop = ("PYTHONPATH", "FORGE_NO_C_LAUNCH", "FORGE_NO_COLD", "FORGE_NO_LEAN")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return env | {"PYTHONPATH": str(repo_site), "LD_LIBRARY_PATH": str(fake_libcuda)}


def _child(code: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, cwd="/", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_lean_launches_are_the_full_kernels_launches_and_load_no_other_runtime_module(child_env) -> None:
    got = _child(EQUIVALENCE, child_env)
    # import runs the package entry alone (the first call's modules, basics, lean_kernel and lean_launch, load on the
    # first call)
    assert got["at_import"] == ["forge_kernels", "forge_kernels._runtime", "forge_kernels._runtime.lean"]
    assert got["kinds"] == ["LeanKernel"] and got["after"] == ["Kernel"]
    # (expressions: matmul's constraints, compiled where a key misses every table row)
    assert got["loaded"] == ["_fastlaunch", "basics", "expressions", "host_values", "lean", "lean_kernel",
                             "lean_launch", "selection"], \
        "the lean first calls loaded more of the runtime"
    assert got["c_cached"] >= 10  # the C path took the calls over
    assert got["n"] == len(got["lean"]) == len(got["full"]) >= 30
    for i, (lean, full) in enumerate(zip(got["lean"], got["full"])):
        assert lean == full and lean[3], f"case {i}: lean {lean} != full {full}"


def test_unserved_calls_hand_over_and_report_as_before(child_env) -> None:
    got = _child(PROMOTIONS, child_env)
    assert got["first"] == "LeanKernel" and got["same_result"]
    assert got["lean_loaded"] == ["_fastlaunch", "basics", "host_values", "lean", "lean_kernel", "lean_launch",
                                  "selection"]
    best, kind, config = got["best_config"]
    assert best == config and "BLOCK_SIZE" in best and kind == "Kernel"
    assert got["second"] == "Kernel" and got["softmax_first"] == "ColdKernel"
    message, kind = got["cpu"]
    assert "CPU tensor" in message and kind == "Kernel"
    assert got["dtype"] is not None and got["dtype"][1] == "Kernel"
    assert got["adopted"] == ["matmul", "softmax", "vector_add"]  # bound once, lean, and adopted


def test_keyword_calls_stay_lean_and_bad_ones_make_a_full_handle(child_env) -> None:
    got = _child(KEYWORDS, child_env)
    assert got["kinds"] == ["LeanKernel", "LeanKernel", "LeanKernel", "LeanKernel", ["Kernel", True]]
    assert got["launched"] == 4


def test_preload_promotes_lean_handles_and_the_module_imports_by_name(child_env) -> None:
    got = _child(PRELOAD, child_env)
    assert got["before"] == "LeanKernel" and got["after"] == "Kernel" and got["registered"]
    assert got["preloaded"] >= 1 and got["same_module"]


def test_torch_compile_after_a_lean_call_takes_the_custom_op(child_env) -> None:
    got = _child(HAND_OVER, child_env)
    assert got["first"] == "LeanKernel"
    (targets,) = got["graphs"]
    assert "forge_kernels.softmax" in targets, targets
    assert got["after"] == "Kernel" and got["launched"] == 1
    assert got["matmul"] in ("ColdKernel", "Kernel") and got["one_module"]


def test_threads_racing_a_first_call_load_the_binary_once(child_env) -> None:
    got = _child(THREADS, child_env)
    assert got["errors"] == [] and got["calls"] == 8 and got["loads"] == 1 and got["kind"] == "LeanKernel"


def test_lean_can_be_turned_off(child_env) -> None:
    got = _child(KEYWORDS, child_env | {"FORGE_NO_LEAN": "1"})
    assert got["kinds"][0] == "ColdKernel"


def test_a_tampered_binary_is_reported_by_the_full_path_and_never_launched(child_env, repo_site: Path,
                                                                           tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(repo_site / "forge_kernels", site / "forge_kernels")
    for cubin in (site / "forge_kernels" / "_forge" / "bin" / "add").rglob("*.cubin"):  # (add_kernel's)
        cubin.write_bytes(cubin.read_bytes()[:-1] + bytes([cubin.read_bytes()[-1] ^ 1]))
    got = _child(TAMPERED, child_env | {"PYTHONPATH": str(site)})
    assert got["error"] is not None and ".cubin" in got["error"] and got["launched"] == 0


def _part(params: list[list[str]], module: dict | None = None, **kernel) -> dict:
    spec = {"function": "k", "module": "m", "params": params, "axes": ["T"], "dtype_args": {"T": "x"},
            "key": ["n"], "spec_params": ["x", "n"], "variants": {"T=fp16": {"assign": {"T": "fp16"}},
                                                                  "T=fp32": {"assign": {"T": "fp32"}}}} | kernel
    return {"modules": {"m": {"kernels": ["k"], "path": "_ops/m.py"} | (module or {})}, "kernels": {"k": spec}}


def test_the_build_writes_a_lean_plan_only_where_a_lean_handle_serves_every_kernel() -> None:
    from forge_aot.runtime.cold_binding import lean_plan

    plain = [["x", "*T"], ["y", "*fp32"], ["n", "i32"], ["BLOCK", "meta"]]
    (name, plan), = lean_plan(_part(plain), "m").values()
    assert name == "k" and plan["axes"] == ["T"] and plan["defaults"] == [] and plan["reading"]["names"] == ()
    assert plan["device_pos"] == [0, 1] and plan["declared"] == ["T", "fp32"] and plan["type_vars"] == [["T", 0]]
    assert plan["key"] == [[True, 2]] and plan["n"] == 3 and plan["reading"]["kinds"] == [0, 0, 3]
    assert plan["ignored"] == {"num_ctas": 1, "maxnreg": None, "enable_fp_fusion": True}
    assert json.loads(json.dumps(plan))["reading"]["spec_pos"] == [0, 2]  # (written as JSON)
    # call-site constexprs and launch options (host code choosing BLOCK_SIZE and num_warps), keyed on one of them
    library = [*plain, ["BLOCK_SIZE", "constexpr"], ["EVEN", "constexpr"]]
    (_, plan), = lean_plan(_part(library, axes=["T", "BLOCK_SIZE", "EVEN", "num_warps"], key=["n", "BLOCK_SIZE"],
                                 constexpr_defaults={"EVEN": False}), "m").values()
    assert plan["axes"] == ["T", "BLOCK_SIZE", "EVEN", "num_warps"]
    assert plan["key"] == [[True, 2], [False, "BLOCK_SIZE"]]
    assert plan["reading"]["names"] == ("BLOCK_SIZE", "EVEN", "num_warps")
    assert plan["defaults"] == [["EVEN", False], ["num_warps", 4]] and plan["required"] == ["BLOCK_SIZE"]
    assert "num_warps" not in plan["ignored"] and plan["params"] == ["x", "y", "n", "BLOCK", "BLOCK_SIZE", "EVEN"]
    assert lean_plan(_part(library, axes=["T", "BLOCK_SIZE"]), "m") is None  # a call-site value selecting no build
    (_, plan), = lean_plan(_part(plain, launch_flags=["launch_pdl"]), "m").values()  # launch attributes
    assert plan["flags"] == [["launch_pdl", 1]] and plan["defaults"] == [["launch_pdl", False]]
    (_, plan), = lean_plan(_part([*plain, ["EVEN", "heuristic"]]), "m").values()  # @triton.heuristics
    assert plan["reading"]["heuristic_names"] == ("EVEN",) and plan["reading"]["names"] == ()
    # Unsloth: a heuristic parameter the call also passes (its heuristic coerces it): read, selecting no build
    (_, plan), = lean_plan(_part([*plain, ["FLAG", "heuristic"]], call_heuristics=["FLAG"]), "m").values()
    assert plan["reading"]["names"] == ("FLAG",) and plan["defaults"] == []
    # project modules: served (run under the package's import rules, since session 63); kernel files imported by
    # their project names (or through a package above one, imports_host) too, since session 64, where each of those
    # has a lean plan of its own (the lean path binds them there: a hand-over midway is what the check avoids)
    assert lean_plan(_part(plain, {"local_modules": ["lib", "lib.utils"]}), "m") is not None
    assert lean_plan(_part(plain, {"imported_as": ["lib.m"]}), "m") is not None

    def with_other(module: dict, **other_kernel) -> dict:  # m and a kernel file "other" (lib.other)
        part = _part(plain, module)
        other = {"kernels": ["k2"], "path": "_ops/other.py", "imported_as": ["lib.other"]}
        k2 = {**part["kernels"]["k"], "function": "k2", "module": "other"} | other_kernel
        return {"modules": {**part["modules"], "other": other}, "kernels": {**part["kernels"], "k2": k2}}

    imports_other = {"local_modules": ["lib", "lib.other"]}
    assert lean_plan(with_other(imports_other), "m") is not None
    assert lean_plan(with_other({"local_modules": ["lib"], "imports_host": ["other"]}), "m") is not None
    assert lean_plan(with_other(imports_other, grid_args=["n"]), "m") is None  # (other has no plan)
    assert lean_plan(with_other(imports_other), "m", without={"other"}) is None  # (it reads a handle's attribute)
    cycle = with_other(imports_other | {"imported_as": ["lib.m"]})
    cycle["modules"]["other"]["local_modules"] = ["lib", "lib.m"]  # (each imports the other)
    assert lean_plan(cycle, "m") is not None and lean_plan(cycle, "other") is not None
    # FLA's kernel files import each other's packages: every module reaching every other, decided once per module
    # (a search along every path took seconds at 10 modules and grew factorially)
    many = _part(plain, imports_other)
    names = [f"f{i}" for i in range(40)]
    many["modules"] |= {n: {"kernels": [], "path": f"_ops/{n}.py", "imported_as": [f"lib.{n}"],
                            "local_modules": ["lib", *(f"lib.{o}" for o in names)]} for n in names}
    from forge_aot.runtime.cold_binding import lean_plans

    assert all(plan is not None for plan, _ in lean_plans(many).values())
    blocked = lean_plans(many, without={"f7"})
    assert all(blocked[n][0] is None for n in names) and blocked["m"][0] is not None  # (m imports none of them)
    # why not, as scripts/census_cold.py counts it
    from forge_aot.runtime.cold_binding import lean_blocker

    assert lean_blocker(_part(plain), "m") is None
    assert lean_blocker(_part([*plain, ["EVEN", "heuristic"]]), "m") is None
    assert lean_blocker(_part(plain, launch_flags=["launch_pdl"]), "m") is None
    assert lean_blocker(with_other(imports_other, grid_args=["n"]), "m") == \
        "imports a kernel file with no lean plan by its project name"
    assert lean_blocker(with_other(imports_other, grid_args=["n"]), "other") == "grid arguments"
    assert lean_blocker(with_other(imports_other, pre_hooks=["zero"]), "other") is None  # (since session 65)
    assert lean_blocker(_part(library, axes=["T", "BLOCK_SIZE"]), "m") == "a call-site value that selects no build"
    assert lean_plan(_part(plain, pre_hooks=["zero"]), "m") is not None  # (the lean binding binds and runs them)
    # an integer or a tensor to one pointer (flash-attn's rotary SEQLEN_OFFSETS, ``*i32|i32``): served since session 66
    (_, plan), = lean_plan(_part(plain, pointer_ints={"x": "i32"}), "m").values()
    assert list(plan["reading"]["pointer_ints"]) == [0] and plan["device_pos"] == [0, 1]


GPU_HAND_OVER = textwrap.dedent("""
    import json, sys
    import torch
    import forge_kernels
    torch.manual_seed(0)
    x = torch.randn(37 * 1000 + 1, device="cuda", dtype=torch.float16)[1:].view(37, 1000)  # misaligned, odd rows
    a, b = torch.randn(100, 33, device="cuda", dtype=torch.float16), torch.randn(33, 72, device="cuda",
                                                                                 dtype=torch.float16)
    eager = forge_kernels.softmax(x)  # lean first calls
    mm = forge_kernels.matmul(a, b)
    kinds = [type(sys.modules["forge_kernels._ops.softmax"].softmax_kernel).__name__]
    loaded = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("forge_kernels._runtime."))
    f = torch.compile(lambda t: forge_kernels.softmax(t) * 2, fullgraph=True)  # hands over: the custom op
    compiled = f(x)
    forge_kernels.preload()  # every binary loaded, every handle full: then a CUDA graph captures the ops
    y = torch.empty_like(x).copy_(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = forge_kernels.softmax(y)
    y.copy_(x * 0.5)
    g.replay()
    torch.cuda.synchronize()
    ref = torch.softmax(x.double(), -1)
    kinds.append(type(sys.modules["forge_kernels._ops.softmax"].softmax_kernel).__name__)
    print(json.dumps({"kinds": kinds, "loaded": loaded,
                      "eager": (eager.double() - ref).abs().max().item(),
                      "mm": ((mm.double() - a.double() @ b.double()).abs().max()).item(),
                      "compiled": (compiled.double() - 2 * ref).abs().max().item(),
                      "replayed": (captured.double() - torch.softmax(x.double() * 0.5, -1)).abs().max().item()}))
""")


@pytest.mark.gpu
def test_on_the_gpu_lean_first_calls_hand_over_to_torch_compile_and_cuda_graphs() -> None:
    """The installed wheel on the GPU, in a fresh process: the first calls of softmax and matmul are lean (correct
    against torch in float64, no module but lean's loaded), then torch.compile(fullgraph=True) takes the custom op
    (the package handed over to the full runtime), ``preload`` makes every handle full, and a captured graph replays
    with new inputs."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("forge_kernels")
    env = {k: v for k, v in os.environ.items() if k not in ("FORGE_NO_COLD", "FORGE_NO_LEAN", "FORGE_NO_C_LAUNCH")}
    proc = subprocess.run([sys.executable, "-c", GPU_HAND_OVER], capture_output=True, text=True, cwd="/", env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["kinds"] == ["LeanKernel", "Kernel"]
    assert set(got["loaded"]) <= {"_fastlaunch", "basics", "lean", "lean_kernel", "lean_launch", "expressions",
                                  "host_values", "selection"}, \
        got["loaded"]
    assert got["eager"] < 1e-3 and got["compiled"] < 2e-3 and got["replayed"] < 1e-3 and got["mm"] < 5e-2, got


def test_a_binary_taking_a_descriptor_gets_no_lean_parameter_block() -> None:
    """A module with pre-hooks gets a lean plan since session 65: the tutorial attention's, whose host code passes
    host descriptors to pointer parameters on Hopper (binaries specialized ``T``). The build writes the lean path's
    parameter block of every other binary and none for those (its first call hands over: ``"block" not in best``);
    it raised at packaging before."""
    import types

    from forge_aot.package import _block
    from forge_aot.runtime import rules

    spec = {"function": "k", "module": "m", "params": [["x", "*fp16"], ["y", "*fp16"], ["n", "i32"]], "axes": [],
            "dtype_args": {}, "key": ["n"], "spec_params": ["x", "y", "n"], "variants": {}}
    kernel = types.SimpleNamespace()
    rules.read_params(kernel, spec)
    assert _block(kernel, {"spec": "DDD"}) == [[0, 1, 2], [0, 0, 3], [0, 8, 16, 24, 32], 40]
    assert _block(kernel, {"spec": "DD1"}) == [[0, 1], [0, 0], [0, 8, 16, 24], 32]  # (n == 1 compiled in)
    assert _block(kernel, {"spec": "TDD"}) is None
