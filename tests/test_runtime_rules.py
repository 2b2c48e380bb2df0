"""The packaged runtime's rules, tested on the runtime file itself: table lookup, binary choice, safety."""

from __future__ import annotations

import types

import pytest

from forge_aot import runtime as rt

TARGETS = {
    "sm_80": {"backend": "cuda", "arch": 80, "arch_specific": False},
    "sm_86": {"backend": "cuda", "arch": 86, "arch_specific": False},
    "sm_90": {"backend": "cuda", "arch": 90, "arch_specific": True},
    "gfx942": {"backend": "hip", "arch": "gfx942", "arch_specific": False},
}


@pytest.mark.parametrize(("capability", "expected"), [
    ((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 9), "sm_86"), ((8, 7), "sm_86"), ((9, 0), "sm_90"),
    ((10, 0), None), ((7, 5), None), ((12, 0), None),
])
def test_cuda_target_choice_follows_cubin_compatibility(capability, expected) -> None:
    assert rt.pick_cuda_target(capability, TARGETS) == expected


def test_arch_specific_cubin_never_runs_on_a_newer_minor() -> None:
    only90 = {"sm_90": TARGETS["sm_90"]}
    assert rt.pick_cuda_target((9, 0), only90) == "sm_90"
    assert rt.pick_cuda_target((9, 1), only90) is None


def test_hip_target_choice_is_exact() -> None:
    assert rt.pick_hip_target("gfx942:sramecc+:xnack-", TARGETS) == "gfx942"
    assert rt.pick_hip_target("gfx90a", TARGETS) is None


def test_rank_rows_exact_then_log_distance_ties_round_up() -> None:
    rows = [(1024,), (4096,), (128,), (2048,)]
    assert rt.rank_rows(rows, (4096,))[0] == 1
    assert rows[rt.rank_rows(rows, (3000,))[0]] == (4096,)  # log2 3000 is nearer 4096 than 2048
    assert rt.rank_rows([(1000,), (4000,)], (2000,))[0] == 1  # equally far in log2: a tie rounds up
    assert rows[rt.rank_rows(rows, (10**9,))[0]] == (4096,)  # beyond the table: clamped to the largest
    assert rows[rt.rank_rows(rows, (0,))[0]] == (128,)
    multi = [(4096, 4096, 4096), (512, 4096, 4096)]
    assert rt.rank_rows(multi, (600, 4000, 4096))[0] == 1


def _table(usable=None, constraints=()) -> rt.ConfigTable:
    configs = {cid: rt.Config(cid, {"BLOCK": b}, 4, 1, {}) for cid, b in (("c128", 128), ("c1024", 1024),
                                                                           ("c4096", 4096))}
    rows = [[128, "c128"], [1024, "c1024"], [4096, "c4096"]]
    return rt.ConfigTable("k", ["n"], rows, configs, [rt.Expression(c) for c in constraints], usable)


def test_table_constraints_see_the_variant_and_maxnreg_as_the_build_does() -> None:
    """The build checks constraints with the variant's values (a type variable is its dtype name) and the
    config's maxnreg; a key between rows re-checks them at run time with the same names."""
    configs = {"small": rt.Config("small", {"BLOCK": 128}, 4, 1, {}, maxnreg=128),
               "big": rt.Config("big", {"BLOCK": 4096}, 8, 1, {})}
    rows = [[128, "small"], [4096, "big"]]
    constraints = [rt.Expression('BLOCK <= 1024 or T != "fp32"'), rt.Expression("maxnreg == None or maxnreg >= 128")]
    for dtype, expect in (("fp16", "big"), ("fp32", "small")):
        table = rt.ConfigTable("k", ["n"], rows, configs, constraints, None, {"T": dtype})
        assert table.lookup((3000,)).id == expect  # not a row: the constraints decide, T included
    tight = rt.ConfigTable("k", ["n"], rows, configs, [rt.Expression("maxnreg == None")], None, {"T": "fp16"})
    assert tight.lookup((100,)).id == "big"  # the nearest row's config sets maxnreg=128


def test_table_lookup_nearest_and_cached() -> None:
    table = _table()
    assert table.lookup((1000,)).id == "c1024"
    assert table.lookup((100000,)).id == "c4096"
    assert table.lookup((1000,)) is table.lookup((1000,))


def test_table_lookup_skips_configs_unusable_on_this_device() -> None:
    assert _table(usable={"c128", "c1024"}).lookup((4096,)).id == "c1024"


def test_table_lookup_rechecks_constraints_with_actual_key() -> None:
    table = _table(constraints=["BLOCK < 2 * max(n, 128)"])
    assert table.lookup((1000,)).id == "c1024"
    assert table.lookup((500,)).id == "c128"  # the nearest row's 1024 is too wide for 500 columns
    with pytest.raises(rt.NotBuiltError, match="no packaged config satisfies"):
        _table(constraints=["BLOCK >= n"]).lookup((10000,))


def test_expressions_are_restricted() -> None:
    e = rt.Expression("BLOCK_M * BLOCK_K <= 8192 and min(num_warps, 8) >= 4")
    assert e.names == {"BLOCK_M", "BLOCK_K", "num_warps"}
    assert e({"BLOCK_M": 64, "BLOCK_K": 64, "num_warps": 4})
    for bad in ("__import__('os')", "x.__class__", "[x for x in y]", "lambda: 1", "a ** b", "open('f')"):
        with pytest.raises(ValueError):
            rt.Expression(bad)


def test_host_helpers() -> None:
    assert [rt.cdiv(n, 16) for n in (0, 1, 16, 17)] == [0, 1, 1, 2]
    assert [rt.next_power_of_2(n) for n in (0, 1, 2, 3, 1000, 1024)] == [1, 1, 2, 4, 1024, 1024]
    assert rt.host_triton.cdiv(10, 4) == 3
    with pytest.raises(AttributeError, match=r"triton\.cdiv, triton\.next_power_of_2, triton\.set_allocator, "
                       r"triton\.__version__, triton\.heuristics, triton\.Config, triton\.autotune, "
                       r"triton\.reinterpret, triton\.TensorWrapper only"):
        rt.host_triton.jit  # noqa: B018
    # forge-aot's own copy, as a build runs host code: the Triton it compiles with (a wheel's: its build record)
    from importlib.metadata import version

    assert rt.host_triton.__version__ == version("triton")
    # Missing names go through the module's own __getattr__ (PEP 562), never a class hook: a grid function's
    # triton.cdiv is a plain module read (a class-level __getattr__ puts a Python call in front of every read)
    from forge_aot.runtime.host_triton import _HostLanguage, _HostTriton

    assert "__getattr__" not in vars(_HostTriton) and "__getattr__" not in vars(_HostLanguage)
    assert type(rt.host_triton).__getattribute__ is types.ModuleType.__getattribute__
    assert str(rt.host_triton.language.float16) == "tl.float16" and callable(rt.host_triton.heuristics)
    with pytest.raises(AttributeError, match=r"Triton's element types .* only, not tl\.arange"):
        rt.host_triton.language.arange  # noqa: B018


def test_variant_ids_and_dtype_names() -> None:
    import torch

    assert rt.variant_id({"T": "fp16", "HAS_BIAS": True}, ["T", "HAS_BIAS"]) == "T=fp16,HAS_BIAS=True"
    # The axis order decides, never the dict's insertion order.
    assert rt.variant_id({"HAS_BIAS": True, "T": "fp16"}, ["T", "HAS_BIAS"]) == "T=fp16,HAS_BIAS=True"
    assert rt.variant_id({}, []) == "base"
    assert rt.dtype_name(torch.bfloat16) == "bf16" and rt.dtype_name(torch.float32) == "fp32"


def test_bf16_and_fp16_scalar_packing() -> None:
    import struct

    assert rt._pack_fp16(1.5) == struct.unpack("<H", struct.pack("<e", 1.5))[0]
    assert rt._pack_bf16(1.0) == 0x3F80
    assert rt._pack_bf16(-2.0) == 0xC000


def _kernel_for_resolution() -> rt.Kernel:
    def cfg(block: int, shared: int) -> dict:
        binary = {"shared": shared, "spec": "D"}
        return {"meta": {"BLOCK": block}, "num_warps": 4, "num_stages": 2,
                "binaries": {"aligned": binary, "generic": binary}}

    spec = {
        "function": "k", "params": [["x_ptr", "*T"], ["n", "i32"], ["BLOCK", "meta"]], "dtype_args": {"T": "x_ptr"},
        "key": ["n"], "constraints": [], "axes": ["T"], "spec_params": ["x_ptr"],
        "variants": {"T=fp16": {"assign": {"T": "fp16"}, "targets": {"sm_80": {
            "configs": {"big": cfg(256, 150 * 1024), "small": cfg(64, 32 * 1024)},
            "tables": {"default": [[4096, "big"], [128, "small"]],
                       "NVIDIA A100-SXM4-80GB": [[4096, "small"]]}}}}},
    }
    return rt.Kernel("k", spec, {"sm_80": TARGETS["sm_80"]}, backend=None)


def test_resolution_picks_target_device_table_and_drops_configs_too_big_for_the_device() -> None:
    kernel = _kernel_for_resolution()
    variant = kernel.variants["T=fp16"]
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "capability": (8, 0), "arch": "sm_80", "max_shared": 163 * 1024}
    target, table = rt.resolve_table(kernel, variant, {"T": "fp16"}, "cuda", a100)
    assert target == "sm_80" and table.lookup((4096,)).id == "small"  # the GPU model's own table
    rtx = {"name": "NVIDIA GeForce RTX 3090", "capability": (8, 6), "arch": "sm_86", "max_shared": 99 * 1024}
    target, table = rt.resolve_table(kernel, variant, {"T": "fp16"}, "cuda", rtx)
    # default table, but the sm_80 binary asking for 150 KB cannot run on a 99 KB sm_86
    assert target == "sm_80" and table.lookup((4096,)).id == "small"
    h100 = {"name": "NVIDIA H100 80GB HBM3", "capability": (9, 0), "arch": "sm_90", "max_shared": 227 * 1024}
    with pytest.raises(rt.UnsupportedDeviceError, match=r"no binaries for NVIDIA H100.*it was built for sm_80\. "
                       r"Rebuild with this device's target added to project\.targets"):
        rt.resolve_table(kernel, variant, {"T": "fp16"}, "cuda", h100)
    # a kernel the manifest builds for some of the project's targets only: the message names its own list
    only = rt.Kernel("k", {**kernel.spec, "only_targets": ["sm_80"]}, kernel.targets, backend=None)
    with pytest.raises(rt.UnsupportedDeviceError, match=r"this kernel was built for sm_80\. Rebuild with this "
                       r"device's target added to kernels\.k\.targets"):
        rt.resolve_table(only, only.variants["T=fp16"], {"T": "fp16"}, "cuda", h100)


def test_tampered_binary_is_refused_before_any_driver_call(tmp_path) -> None:
    import hashlib

    image = b"\x7fELF" + bytes(100)
    (tmp_path / "k.cubin").write_bytes(image[:-1] + b"\x01")
    spec = {"function": "k", "params": [["x", "*fp32"]], "axes": [], "dtype_args": {}, "spec_params": ["x"],
            "key": [], "variants": {}}
    kernel = rt.Kernel("k", spec, {}, backend=None)
    binary = {"function": "k", "shared": 0, "warp_size": 32, "num_warps": 4, "spec": "D", "path": "k.cubin",
              "sha256": hashlib.sha256(image).hexdigest()}
    with pytest.raises(rt.IntegrityError, match=r"k\.cubin: sha256 .* does not match .* not launched"):
        rt._BinaryLauncher(kernel, binary, str(tmp_path / "k.cubin"), 0, 0)


def test_runtime_package_is_self_contained_and_split_by_concern() -> None:
    """Shipped verbatim as <package>/_runtime: relative imports only, never Triton or forge-aot."""
    import ast
    from pathlib import Path

    root = Path(rt.__file__).parent
    modules = sorted(root.glob("*.py"))
    assert {m.stem for m in modules} >= {"errors", "expressions", "host_triton", "tables", "cuda", "hip", "kernel",
                                         "launch", "host_modules"}
    for module in modules:
        text = module.read_text()
        assert "forge_aot" not in text, module
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] not in ("triton", "forge_aot") for a in node.names), module
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] not in ("triton", "forge_aot"), module
        assert len(text.splitlines()) < 350, f"{module.name} holds more than one concern"


LAZY_DISABLE = '''
import json, sys, types
import torch
from forge_aot.runtime.host_exec import run_module_code

SOURCE = """
import torch
seen = []

@torch.compiler.disable
def dispatch(x):
    seen.append(torch.compiler.is_compiling())
    return x + 1

@torch.compiler.disable(recursive=False)
def shallow(x):
    return x * 2

many = [torch.compiler.disable(lambda x, i=i: x + i) for i in range(12)]
disable_bound = torch.compiler.disable  # (read while the file runs: the lazy one, kept)
"""


class Loader:  # what run_module_code reads: the code of a shipped file
    name = "shipped"

    def __init__(self, source):
        self.source = source

    def get_code(self, name):
        return compile(self.source, "shipped.py", "exec")


module = types.ModuleType("shipped")
run_module_code(Loader(SOURCE), module, True)
try:  # a file that raises: the swap is undone all the same
    run_module_code(Loader("raise KeyError(1)"), types.ModuleType("failing"), False)
except KeyError:
    pass
out = {"restored": torch.compiler.disable.__module__, "marked": module.dispatch._torchdynamo_disable,
       "name": module.dispatch.__name__, "eager": module.dispatch(torch.ones(2)).tolist(),
       "shallow": module.shallow(torch.ones(2)).tolist(), "dynamo_before": "torch._dynamo" in sys.modules}


def f(x):
    return module.shallow(module.dispatch(x * 3) - 1)


got = torch.compile(f, backend="eager")(torch.ones(2))  # (imports torch._dynamo: the real disable from now on)
out |= {"compiled": got.tolist(), "seen": module.seen, "kept": module.disable_bound.__name__}
try:
    torch.compile(f, backend="eager", fullgraph=True)(torch.ones(3))
    out["fullgraph"] = "traced"
except Exception as exc:  # as the real one: a compiler.disable'd function is never traced
    out["fullgraph"] = str(exc).splitlines()[0]
from torch._dynamo.utils import counters

real = [torch.compiler.disable(lambda x, i=i: x + i) for i in range(12)]  # (torch._dynamo imported: the real one)
frames = {}
for name, fns in (("lazy", module.many), ("real", real), ("again", module.many)):
    torch._dynamo.reset()
    counters.clear()

    def g(x, fns=fns):
        for fn in fns:
            x = fn(x) * 1
        return x

    value = torch.compile(g, backend="eager")(torch.ones(2)).tolist()
    frames[name] = [counters["frames"]["total"], value]
out["frames"] = frames
print(json.dumps(out))
'''


def test_compiler_disable_in_shipped_code_imports_no_dynamo_until_it_is() -> None:
    """FLA marks its ops and its backend dispatch ``@torch.compiler.disable`` at import; the real decorator imports
    torch._dynamo (and Triton through it where installed: 4.4 s of an FLA op's first call on an H200). While a shipped
    file runs it is ``host_exec.lazy_disable``: called eagerly the function runs as it is, torch._dynamo never
    imported; once it is (torch.compile), the real ``torch._dynamo.disable`` of the function: a compiled caller runs it
    eagerly (``is_compiling()`` False inside), ``fullgraph=True`` refuses it as it refuses the real one."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    proc = subprocess.run([sys.executable, "-c", LAZY_DISABLE], capture_output=True, text=True, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["restored"] == "torch.compiler" and got["marked"] is True and got["name"] == "dispatch"
    assert got["eager"] == [2.0, 2.0] and got["shallow"] == [2.0, 2.0] and got["dynamo_before"] is False
    assert got["compiled"] == [6.0, 6.0] and got["seen"] == [False, False], got
    assert got["kept"] == "lazy_disable" and "torch.compiler.disable" in got["fullgraph"], got
    # Dynamo never compiles the wrapper's own frame (one code object for every wrapper: it was recompiled per
    # function, 21 frames for these 12, past Dynamo's limit of 8): the first compile, which makes the real wrappers,
    # counts a fixed two frames more than around really disabled functions, the next as many
    frames = got["frames"]
    assert frames["lazy"][0] <= frames["real"][0] + 2 and frames["again"] == frames["real"], frames
    assert frames["lazy"][1] == frames["real"][1] == [67.0, 67.0], frames
