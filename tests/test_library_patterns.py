"""Patterns of real library files that forge-aot refused or misreported (session 42's hunts over SGLang 0.5.2,
flash-attn 2.8.3's AMD Triton backend, GPTQModel 7.7.0 and Liger-Kernel 0.8.5), each as a small kernel in that
library's style: built and checked on the CPU, run against Triton's JIT on a GPU."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from forge_aot.cli import main
from forge_aot.errors import ForgeError
from forge_aot.manifest import load_manifest
from forge_aot.plan import make_plan
from tests.test_localmods import _forget_package, _installed, _run_fresh, one_file_project


def _write_project(root: Path, files: dict[str, str]) -> Path:
    """A project of several files (path → text) under ``root``; its manifest's path."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "kernel_manifest.toml"


SOFTCAP = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def softcap_kernel(output_ptr, input_ptr, n_ele, softcap_const: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_ele
    x = tl.load(input_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(output_ptr + offsets, tl.sigmoid(x / softcap_const) * softcap_const, mask=mask)


def softcap(x, softcap_const):
    output = torch.empty_like(x, dtype=torch.float32)
    n = output.numel()
    softcap_kernel[(triton.cdiv(n, 128),)](output, x, n, softcap_const, BLOCK_SIZE=128, num_warps=8)
    return output
'''
"""SGLang's ``fused_softcap``: a float constexpr chosen by the caller (``softcap_const``)."""

SOFTCAP_MANIFEST = '''\
[project]
name = "forge_softcap"
version = "0.1.0"
targets = ["sm_90"]

[kernels.softcap]
source = "k.py:softcap_kernel"
ops = ["softcap"]
signature = { output_ptr = "*fp32", input_ptr = "*T", n_ele = "i32" }
dtypes = { T = ["fp16", "bf16"] }
constexprs = { softcap_const = [30.0, 50.0], BLOCK_SIZE = [128], num_warps = [8] }
'''


def test_float_constexpr_values_listed_in_the_manifest_build_a_variant_each(tmp_path: Path) -> None:
    """SGLang passes ``softcap_const`` (30.0, 50.0) as a constexpr; listing those values under ``constexprs`` was
    refused ("expected an integer or a boolean or a string, got float 30.0")."""
    (tmp_path / "k.py").write_text(SOFTCAP)
    (tmp_path / "kernel_manifest.toml").write_text(SOFTCAP_MANIFEST)
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    assert sorted(e.variant for e in plan.entries) == [
        f"T={t},softcap_const={c},BLOCK_SIZE=128,num_warps=8" for t in ("bf16", "fp16") for c in ("30.0", "50.0")]
    assert {type(e.assignment["softcap_const"]) for e in plan.entries} == {float}
    # an integer stays an integer; a string is still refused where a number is not
    (tmp_path / "kernel_manifest.toml").write_text(SOFTCAP_MANIFEST.replace("[30.0, 50.0]", "[30, 50.0]"))
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    assert sorted({type(e.assignment["softcap_const"]).__name__ for e in plan.entries}) == ["float", "int"]


EXAMPLES_REACH_TRITON = '''\
import torch
import triton
import triton.language as tl

BENCH = triton.testing.do_bench


@triton.jit
def scale_kernel(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x):
    out = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 128),)](out, x, x.numel(), BLOCK=128)
    return out


def examples(device="cpu"):
    print(BENCH)
    scale(torch.randn(1000, device=device))
'''


def test_an_examples_function_reaching_triton_is_reported_at_its_line(tmp_path: Path) -> None:
    """An examples function that reaches a Triton-built name was left out with the kernel side and reported as
    missing ("no host function 'examples'"), hiding the cause (SGLang's elementwise.py, where the cause was the
    second, autotuned handle below)."""
    manifest = one_file_project(tmp_path / "p", "forge_reach", EXAMPLES_REACH_TRITON, "scale_kernel", ["scale"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "no host function" not in result.output
    assert "k.py:21: host code uses 'BENCH', defined with Triton on line 5" in result.output



OTHER_GPU_BRANCH = '''\
import torch
import triton
import triton.language as tl

_is_hip = torch.version.hip is not None


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


@triton.jit
def lean_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def _lean(x, y):
    lean_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)


def scale(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    if _is_hip and x.numel() > 4096:
        _lean(x, y)
    else:
        scale_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


def examples(device="cpu"):
    scale(torch.randn(1000, device=device, dtype=torch.float16))
'''


def test_a_launch_no_traced_call_reaches_is_a_warning(tmp_path: Path) -> None:
    """SGLang's ``decode_attention_fwd`` (its public decode op) launches ``_lean_attention_decode_kernel`` only on
    ROCm. Listing the op was refused ("host function '_decode_lean_attention_fwd' launches ..., which has no
    entry"), and giving that kernel an entry needs values no CUDA example reaches: the op could not be packaged. A
    launch in a helper the ops reach that no traced call reaches is now a warning, as for the ops other files import
    (an op's own launch stays an error); the wheel's op works, and the branch raises ForgeRuntimeError if a call ever
    takes it. A traced call that launches such a kernel is refused: its stand-in raises, naming the manifest."""
    manifest = one_file_project(tmp_path / "p", "forge_branch", OTHER_GPU_BRANCH, "scale_kernel", ["scale"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert ("k.py: host function '_lean', which the package's ops reach, launches 'lean_kernel', which has no entry "
            "in kernel_manifest.toml, and no traced call launched it") in " ".join(result.output.split()), result.output
    reached = manifest.parent / "k.py"
    reached.write_text(OTHER_GPU_BRANCH.replace("if _is_hip and x.numel() > 4096:", "if not _is_hip:"))
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "lean_kernel is Triton code that the package does not ship" in result.output, result.output
    assert "a kernel needs an entry there" in " ".join(result.output.split()), result.output
    reached.write_text(OTHER_GPU_BRANCH)
    site = _installed(manifest, tmp_path)
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_branch
        import forge_branch._ops.k as host
        y = torch.ops.forge_branch.scale(torch.empty(5000, device="meta", dtype=torch.float16))
        try:
            host.lean_kernel[(1,)](y, y, 1, BLOCK=256)
        except Exception as exc:
            refused = type(exc).__name__
        print(json.dumps({"shape": list(y.shape), "refused": refused}))
        ''')
    assert _run_fresh(check, site) == {"shape": [5000], "refused": "ForgeRuntimeError"}


def test_an_entry_its_examples_never_launch_says_so(tmp_path: Path) -> None:
    """Given an entry (typed by hand), the ROCm-only kernel above was refused with "give its values under
    constexprs, derive or combinations, or name an examples function" where the entry names one: the examples just
    never reach the launch. The message says so."""
    manifest = one_file_project(tmp_path / "p", "forge_branch2", OTHER_GPU_BRANCH, "scale_kernel", ["scale"],
                                '\n[kernels.lean]\nsource = "k.py:lean_kernel"\nexamples = "examples"\n'
                                'signature = { x_ptr = "*fp16", y_ptr = "*fp16", n = "i32" }\n')
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert ("constexpr parameter 'BLOCK' of lean_kernel is chosen at the call site (_lean() line 21), and no "
            "call of the examples (examples) launched it: give its values under constexprs, derive or "
            "combinations, or examples that reach the launch") in " ".join(result.output.split()), result.output



STAR_STRIDES = '''\
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({}, num_warps=1), triton.Config({}, num_warps=8, num_stages=2)], key=["n"])
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs * stride, tl.load(x_ptr + offs * stride, mask=offs < n) * 2, mask=offs < n)


def scale(x):
    y = torch.empty_like(x)
    scale_kernel[(1,)](x, y, x.numel(), *x.stride(), BLOCK=1024)  # attorch passes strides as *t.stride()
    return y


def examples(device="cpu"):
    scale(torch.randn(1000, device=device))
'''


def test_a_launch_spreading_positional_arguments_keeps_the_autotune_configs_warps(tmp_path: Path) -> None:
    """attorch launches ``kernel[grid](x, ..., *x.stride(), BLOCK=...)``: any spread argument made ``num_warps``
    and ``num_stages`` call-site axes (meant for vLLM's ``**config`` dicts), so every row took Triton's defaults
    (w4-s3) instead of the decorator's configs and only those were built, silently. A positional spread passes no
    keyword, and an autotuned kernel takes them from its configs (Triton refuses them passed again)."""
    manifest = one_file_project(tmp_path / "p", "forge_star", STAR_STRIDES, "scale_kernel", ["scale"])
    plan = make_plan(load_manifest(manifest))
    kp = plan.kernels["k"]
    assert "num_warps" not in kp.axes and "num_stages" not in kp.axes, kp.axes
    assert {e.assignment.get("num_warps") for e in plan.entries} == {None}
    assert {(c.num_warps, c.num_stages) for c in kp.space} == {(1, 3), (8, 2)}
    # a kernel without @triton.autotune, launched with **config: the dict may carry them (vLLM), still axes
    plain = STAR_STRIDES.split("@triton.jit")[0].rsplit("@triton.autotune", 1)[0] + "@triton.jit" + \
        STAR_STRIDES.split("@triton.jit", 1)[1].replace("BLOCK=1024)", "**{'BLOCK': 1024, 'num_warps': 2})")
    plan = make_plan(load_manifest(one_file_project(tmp_path / "q", "forge_star2", plain, "scale_kernel",
                                                    ["scale"])))
    assert {"num_warps", "num_stages"} <= set(plan.kernels["k"].axes)


BRANCH_FOR_ANOTHER_TRITON = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


@triton.jit
def add_kernel_tma(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # (FBGEMM's uses tl._experimental_descriptor_load)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


@triton.jit
def add_kernel_ws(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def add_one(x, tma_persistent: bool = False, ws: bool = False):
    y = torch.empty_like(x)
    if tma_persistent:
        add_kernel_tma[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    elif ws:
        add_kernel_ws[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    else:
        add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def examples(device="cpu"):
    add_one(torch.randn(4096, device=device))
'''


def test_an_ops_branch_launching_a_kernel_with_no_entry_is_a_warning(tmp_path: Path) -> None:
    """FBGEMM's ``matmul_fp8_row`` launches its TMA kernels where ``tma_persistent`` (kernels this Triton cannot
    compile): an op's own launch of a kernel with no entry was an error wherever it stood, so the op could not be
    packaged without them, and the four were named one rebuild at a time. One in a branch is now a warning, as a
    helper's is (a call taking it raises ForgeRuntimeError; a traced call reaching it is refused by the build);
    one on the op's main path stays an error, every such launch named at once."""
    manifest = one_file_project(tmp_path / "p", "forge_branchy", BRANCH_FOR_ANOTHER_TRITON, "add_kernel", ["add_one"])
    plan = make_plan(load_manifest(manifest))
    assert [w.split(", which has no entry")[0] for w in plan.warnings] == [
        "k.py: host function 'add_one', an op of the package, launches 'add_kernel_tma' in a branch",
        "k.py: host function 'add_one', an op of the package, launches 'add_kernel_ws' in a branch"]
    main_path = BRANCH_FOR_ANOTHER_TRITON.replace("    if tma_persistent:\n        add_kernel_tma",
                                                  "    add_kernel_tma").replace("    elif ws:\n        add_kernel_ws",
                                                                               "    add_kernel_ws").replace(
        "    else:\n        add_kernel[", "    add_kernel[")
    manifest = one_file_project(tmp_path / "q", "forge_branchy2", main_path, "add_kernel", ["add_one"])
    with pytest.raises(ForgeError) as caught:
        make_plan(load_manifest(manifest))
    assert str(caught.value).count("which has no entry in kernel_manifest.toml") == 2, str(caught.value)
    assert "launches 'add_kernel_tma'" in str(caught.value) and "launches 'add_kernel_ws'" in str(caught.value)


REINTERPRET_FP8 = '''\
import torch
import triton
import triton.language as tl
from triton.runtime.jit import reinterpret as tl_reinterpret, TensorWrapper  # (FBGEMM's fp8_gemm.py)


@triton.jit
def scale_fp8_kernel(x_ptr, y_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)
    tl.store(y_ptr + offs, x * s, mask=offs < n)


def reinterpret_fp8_type(tensor: torch.Tensor, dtype: tl.dtype) -> TensorWrapper:
    return tl_reinterpret(tensor, dtype=dtype)


def scale_fp8(x: torch.Tensor, s: float) -> torch.Tensor:
    """x: fp8 e4m3 values in uint8 storage."""
    y = torch.empty(x.shape, device=x.device, dtype=torch.float32)
    scale_fp8_kernel[(triton.cdiv(x.numel(), 1024),)](reinterpret_fp8_type(x, tl.float8e4nv), y, x.numel(), s,
                                                      BLOCK=1024)
    return y


def examples(device="cpu"):
    scale_fp8(torch.randn(4099, device=device).to(torch.float8_e4m3fn).view(torch.uint8), 0.5)
'''


def test_host_code_reinterpreting_a_tensor_for_a_kernel(tmp_path: Path) -> None:
    """FBGEMM's fp8 matmuls hand kernels ``tl_reinterpret(tensor, dtype=tl.float8e4nv)`` (``from
    triton.runtime.jit import reinterpret as tl_reinterpret, TensorWrapper``): ``check`` refused the host function
    as Triton code. The runtime has both; the kernel is typed by the element type given."""
    manifest = one_file_project(tmp_path / "p", "forge_reint", REINTERPRET_FP8, "scale_fp8_kernel", ["scale_fp8"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert 'x_ptr = "*fp8e4nv", y_ptr = "*fp32"' in result.output, result.output
    assert "scale_fp8(Tensor x, float s) -> Tensor" in result.output, result.output


@pytest.mark.gpu
def test_host_code_reinterpreting_a_tensor_on_the_gpu(tmp_path: Path) -> None:
    """The wheel's op on uint8 storage of fp8 values (misaligned, odd length), Triton blocked, against torch's own
    float8_e4m3fn conversion in fp64; the plain call and the custom op."""
    site = _installed(one_file_project(tmp_path / "p", "forge_reint", REINTERPRET_FP8, "scale_fp8_kernel",
                                       ["scale_fp8"]), tmp_path)
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_reint
        out = {}
        for n in (1000, 4099):
            x = torch.randn(n + 1, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)[1:]
            ref = x.view(torch.float8_e4m3fn).double() * 0.5
            y, z = forge_reint.scale_fp8(x, 0.5), torch.ops.forge_reint.scale_fp8(x, 0.5)
            out[n] = max((y.double() - ref).abs().max().item(), (z.double() - ref).abs().max().item())
        print(json.dumps(out))
        '''), site)
    assert len(res) == 2 and max(res.values()) == 0.0, res


NESTED_OP_CALL = {
    # Cut Cross-Entropy: the examples call cce_lse_forward_kernel(e, c) (a tensor), its training path calls it with
    # return_logit_avg=True (a tuple), from cce.py's LinearCrossEntropyFunction.forward
    "k.py": textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def _scale(X, Y, Z, N, HAS_Z: tl.constexpr, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(X + o, mask=o < N)
            tl.store(Y + o, x * 2, mask=o < N)
            if HAS_Z:
                tl.store(Z + o, x * 3, mask=o < N)


        def scale(x: torch.Tensor, return_extra: bool = False):
            y = torch.empty_like(x)
            z = torch.empty_like(x) if return_extra else None
            _scale[(triton.cdiv(x.numel(), 128),)](x, y, z, x.numel(), HAS_Z=z is not None, BLOCK=128)
            if return_extra:
                return y, z
            return y


        def examples(device="cpu"):
            x = torch.randn(1000, device=device)
            scale(x)
            from train import train_op
            train_op(x)
        '''),
    "train.py": textwrap.dedent('''\
        import torch

        from k import scale


        def train_op(x: torch.Tensor) -> torch.Tensor:
            y, z = scale(x, return_extra=True)
            return y + z
        '''),
    "kernel_manifest.toml": textwrap.dedent('''\
        [project]
        name = "forge_nested"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.scale]
        source = "k.py:_scale"
        ops = ["scale"]
        examples = "examples"

        [ops.train_op]
        source = "train.py"
        examples = "k.py:examples"
        '''),
}


def test_an_ops_schema_takes_the_calls_other_ops_make(tmp_path: Path) -> None:
    """Cut Cross-Entropy's training path calls ``cce_lse_forward_kernel(..., return_logit_avg=True)`` (a tuple) from
    another op, which imported it by name; the schema came from the examples' own calls only (``-> Tensor``), and the
    custom op, which a compiled call of the other op reaches through routing, raised "Unable to cast (tensor,
    tensor) to Tensor". Calls from other ops' host code count now, through any host module's global."""
    plan = make_plan(load_manifest(_write_project(tmp_path / "p", NESTED_OP_CALL)))
    assert plan.modules["k"]["schemas"]["scale"] == "(Tensor x, bool return_extra=False) -> (Tensor, Tensor?)", \
        plan.modules["k"]["schemas"]


@pytest.mark.gpu
def test_an_ops_schema_takes_the_calls_other_ops_make_on_the_gpu(tmp_path: Path) -> None:
    """The wheel's ``scale`` with and without ``return_extra``, plainly, through its custom op and compiled with
    fullgraph=True, and ``train_op`` calling it, against torch's fp32 products on a misaligned odd length, Triton
    blocked."""
    site = _installed(_write_project(tmp_path / "p", NESTED_OP_CALL), tmp_path)
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_nested
        x = torch.randn(4100, device="cuda")[1:]
        two, three = (x * 2).double(), (x * 3).double()  # (the kernel's fp32 products)
        err = lambda a, b: (a.double() - b).abs().max().item()
        y, z = forge_nested.scale(x, return_extra=True)
        cy, cz = torch.compile(lambda t: forge_nested.scale(t, return_extra=True), fullgraph=True,
                               backend="aot_eager")(x)
        oy, oz = torch.ops.forge_nested.scale(x, True)
        out = {"plain": max(err(y, two), err(z, three)), "compiled": max(err(cy, two), err(cz, three)),
               "op": max(err(oy, two), err(oz, three)), "one": err(forge_nested.scale(x), two),
               "train": err(forge_nested.train_op(x), (x * 2 + x * 3).double()), "none": oz is not None and
               torch.ops.forge_nested.scale(x)[1] is None}
        print(json.dumps(out))
        '''), site)
    assert res.pop("none") is True and max(res.values()) == 0.0, res


STATE_HEURISTIC = '''\
import torch
import triton
import triton.language as tl


@triton.heuristics({"PREC": lambda args: "tf32" if torch.get_float32_matmul_precision() == "high" else "ieee"})
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, PREC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if PREC == "tf32":
        x = x * 1.0
    tl.store(y_ptr + offs, x * 2, mask=offs < n)


def scale(x):
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def examples(device="cpu"):
    scale(torch.randn(1000, device=device))
'''


def test_a_heuristic_reading_process_wide_settings_is_noted(tmp_path: Path) -> None:
    """Cut Cross-Entropy's ``DOT_PRECISION`` heuristic follows ``torch.get_float32_matmul_precision()``: the build
    evaluates it under its own setting, so only ``ieee`` was built, and a server that sets ``"high"`` asks for a
    binary the wheel lacks (NotBuiltError). ``check`` says so. (Examples calling the op under both settings do not
    build both: the build evaluates heuristics per config after the trace, under its own setting.)"""
    manifest = one_file_project(tmp_path / "p", "forge_state", STATE_HEURISTIC, "scale_kernel", ["scale"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "@triton.heuristics computes PREC from process-wide settings (get_float32_matmul_precision)" in \
        " ".join(result.output.split()), result.output
    plan = make_plan(load_manifest(manifest))
    assert {dict(b.heur)["PREC"] for e in plan.entries for rows in e.tables.values() for row in rows
            for b in plan.binaries_for(e, row.key, row.preferences[0])} == {"ieee"}


FUNCTION_CONSTEXPR = {
    # SGLang's decode/extend attention: SCORE_MOD is a @triton.jit function host code passes as a constexpr, one of
    # the kernel file's own or of a helper module (its score_mod.py)
    "fk/__init__.py": "",
    "fk/mods.py": "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef square_mod(x):\n"
                  "    return x * x\n",
    "fk/k.py": textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        from fk.mods import square_mod


        @triton.jit
        def relu_mod(x):
            return tl.maximum(x, 0.0)


        @triton.jit
        def apply_kernel(x_ptr, y_ptr, n, MOD: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)
            if MOD is not None:
                x = MOD(x)
            tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty), mask=offs < n)


        def apply(x: torch.Tensor, mod=None) -> torch.Tensor:
            y = torch.empty_like(x)
            n = x.numel()
            apply_kernel[(triton.cdiv(n, 256),)](x, y, n, MOD=mod, BLOCK=256)
            return y


        def examples(device="cpu"):
            for mod in (None, relu_mod, square_mod):
                apply(torch.randn(1000, device=device, dtype=torch.float16), mod)
        '''),
    "kernel_manifest.toml": textwrap.dedent('''\
        [project]
        name = "forge_fnconst"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.apply]
        source = "fk/k.py:apply_kernel"
        ops = ["apply"]
        examples = "examples"
        '''),
}


def test_a_function_valued_constexpr_gets_a_binary_per_function(tmp_path: Path) -> None:
    """SGLang's decode and extend attention take ``SCORE_MOD: tl.constexpr``, a ``@triton.jit`` function the host
    code passes (Triton compiles one binary per function). ``check`` passed and the build failed on every binary
    ("Object of type KernelSide is not JSON serializable", "no config compiled"). Such a value is now the text of the
    wheel's stand-in for the function (``jit:<module>.<name>``): a variant per function, compiled with the function
    itself, and the wheel's call, passing its stand-in, matches it as a string constexpr; its custom op takes the
    text. Here a function of the kernel file and one of a helper module."""
    manifest = _write_project(tmp_path / "p", FUNCTION_CONSTEXPR)
    plan = make_plan(load_manifest(manifest))
    kp = plan.kernels["apply"]
    assert {e.assignment["MOD"] for e in plan.entries} == {None, "jit:k.relu_mod", "jit:mods.square_mod"}
    assert kp.functions == {"jit:k.relu_mod": ("fk/k.py", "relu_mod"), "jit:mods.square_mod": ("fk/mods.py",
                                                                                            "square_mod")}
    site = _installed(manifest, tmp_path)
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_fnconst
        import forge_fnconst._ops.k as host
        meta = torch.ops.forge_fnconst.apply(torch.empty(9, device="meta", dtype=torch.float16), "jit:k.relu_mod")
        print(json.dumps({"own": host.relu_mod, "helper": host.square_mod, "shape": list(meta.shape)}))
        ''')
    assert _run_fresh(check, site) == {"own": "jit:k.relu_mod", "helper": "jit:mods.square_mod", "shape": [9]}
    binaries = sorted(p.parent.parent.name for p in (site / "forge_fnconst" / "_forge" / "bin").rglob("*.cubin"))
    assert {b.split("_BLOCK")[0] for b in binaries} == {"MOD=None", "MOD=jit_k.relu_mod", "MOD=jit_mods.square_mod"}


FUNCTION_WITH_AUX = {
    # SGLang's score_mod gets the kernel's aux tensor (``SCORE_MOD(qk, Aux0, ...)``), one of a helper module here
    "fk/__init__.py": "",
    "fk/mods.py": textwrap.dedent('''\
        import triton
        import triton.language as tl


        @triton.jit
        def bias_mod(x, aux_ptr, offs, mask):
            return x + tl.load(aux_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        '''),
    "fk/k.py": textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        from fk.mods import bias_mod


        @triton.jit
        def apply_kernel(x_ptr, y_ptr, aux_ptr, n, MOD: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)
            if MOD is not None:
                x = MOD(x, aux_ptr, offs, offs < n)
            tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty), mask=offs < n)


        def apply(x: torch.Tensor, aux: torch.Tensor, mod=None) -> torch.Tensor:
            y = torch.empty_like(x)
            n = x.numel()
            apply_kernel[(triton.cdiv(n, 256),)](x, y, aux, n, MOD=mod, BLOCK=256)
            return y


        def examples(device="cpu"):
            for mod in (None, bias_mod):
                apply(torch.randn(1000, device=device), torch.randn(1000, device=device), mod)
        '''),
    "kernel_manifest.toml": FUNCTION_CONSTEXPR["kernel_manifest.toml"].replace("forge_fnconst", "forge_fnaux"),
}


def test_a_tensor_handed_to_a_function_valued_constexpr_is_written_only_where_the_function_writes_it(
        tmp_path: Path) -> None:
    """SGLang's decode attention hands ``Aux0`` to its ``SCORE_MOD``; ``check`` said the op writes it (a call of a
    function the kernel file does not define counted what it was handed as written), so its custom op's schema said
    ``Tensor(a!) aux`` and torch.compile would copy the tensor. Now what the functions the traced calls pass write
    decides: a score_mod that reads its aux leaves it an input, one that stores to it makes it written."""
    plan = make_plan(load_manifest(_write_project(tmp_path / "p", FUNCTION_WITH_AUX)))
    assert plan.kernels["apply"].written == ["y_ptr"]
    assert "Tensor(a" not in plan.modules["k"]["schemas"]["apply"], plan.modules["k"]["schemas"]
    writing = {**FUNCTION_WITH_AUX, "fk/mods.py": FUNCTION_WITH_AUX["fk/mods.py"].replace(
        "    return x + tl.load(", "    tl.store(aux_ptr + offs, x, mask=mask)\n    return x + tl.load(")}
    plan = make_plan(load_manifest(_write_project(tmp_path / "w", writing)))
    assert plan.kernels["apply"].written == ["y_ptr", "aux_ptr"]
    assert "Tensor(a!) aux" in plan.modules["k"]["schemas"]["apply"], plan.modules["k"]["schemas"]


@pytest.mark.gpu
def test_a_function_valued_constexpr_on_the_gpu(tmp_path: Path) -> None:
    """The wheel's op with each function (and None) against torch in fp64, misaligned odd lengths, Triton blocked;
    through the plain call and the custom op."""
    site = _installed(_write_project(tmp_path / "p", FUNCTION_CONSTEXPR), tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_fnconst
        import forge_fnconst._ops.k as host
        refs = {None: lambda x: x, "relu": torch.relu, "square": lambda x: x * x}
        mods = {None: None, "relu": host.relu_mod, "square": host.square_mod}
        errs = {}
        for name, mod in mods.items():
            for n in (1000, 4099):
                x = torch.randn(n + 1, device="cuda", dtype=torch.float16)[1:]
                ref = refs[name](x.double()).half().double()
                y = forge_fnconst.apply(x, mod)
                z = torch.ops.forge_fnconst.apply(x, None if mod is None else str(mod))
                errs[f"{name}-{n}"] = max((y.double() - ref).abs().max().item(), (z.double() - ref).abs().max().item())
        print(json.dumps(errs))
        ''')
    errs = _run_fresh(code, site)
    assert len(errs) == 6 and max(errs.values()) == 0.0, errs

SECOND_HANDLE = '''\
import torch
import triton
import triton.language as tl

softcap_autotune = triton.autotune(
    configs=[triton.Config(kwargs={"BLOCK_SIZE": 128}, num_warps=4),
             triton.Config(kwargs={"BLOCK_SIZE": 256}, num_warps=8)],
    key=["n_ele"],
)


@triton.jit
def softcap_kernel(output_ptr, input_ptr, n_ele, softcap_const: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_ele
    x = tl.load(input_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(output_ptr + offsets, tl.sigmoid(x / softcap_const) * softcap_const, mask=mask)


softcap_kernel_autotuned = softcap_autotune(softcap_kernel)


def softcap(x, softcap_const, autotune=False):
    output = torch.empty_like(x, dtype=torch.float32)
    n = output.numel()
    if autotune:
        softcap_kernel_autotuned[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](output, x, n, softcap_const)
    else:
        softcap_kernel[(triton.cdiv(n, 128),)](output, x, n, softcap_const, BLOCK_SIZE=128, num_warps=8)
    return output


def examples(device="cpu"):
    for n in (4096, 70000):
        softcap(torch.randn(n, device=device, dtype=torch.float16), 30.0, autotune=True)
        softcap(torch.randn(n, device=device, dtype=torch.float16), 30.0)
'''


SECOND_HANDLE_ENTRY = '''
[kernels.softcap_tuned]
source = "k.py:softcap_kernel_autotuned"
examples = "examples"
'''


@pytest.mark.parametrize("inline", [False, True])
def test_a_second_autotuned_handle_of_a_kernel_is_a_kernel_of_its_own(tmp_path: Path, inline: bool) -> None:
    """SGLang's elementwise.py keeps ``triton.autotune(...)`` in a variable and applies it to the plain kernel under
    another name, launching either (``autotune=True`` or not): the build ran that host code, whose ``triton.autotune``
    call the wheel refuses ("packaged host code called triton.autotune ... unset the variable"). The second handle is
    now a kernel of its own, listed under its name: the def's code, that autotuner's space and key."""
    source = SECOND_HANDLE
    if inline:
        source = source.replace("softcap_kernel_autotuned = softcap_autotune(softcap_kernel)",
                                "softcap_kernel_autotuned = triton.autotune(configs=[triton.Config({\"BLOCK_SIZE\": "
                                "128}), triton.Config({\"BLOCK_SIZE\": 512})], key=[\"n_ele\"])(softcap_kernel)")
    manifest = one_file_project(tmp_path / "p", "forge_second", source, "softcap_kernel", ["softcap"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    # (a launch in a branch of the op: the traced call reaching it names it)
    assert "softcap_kernel_autotuned[lambda meta" in result.output and "softcap_kernel_autotuned is Triton code " \
        "that the package does not ship" in result.output and "a kernel needs an entry there" in result.output
    manifest.write_text(manifest.read_text() + SECOND_HANDLE_ENTRY)
    plan = make_plan(load_manifest(manifest))
    plain, tuned = plan.kernels["k"], plan.kernels["softcap_tuned"]
    assert plain.function == "softcap_kernel" and plain.autotune is None and plain.axes == [
        "softcap_const", "BLOCK_SIZE", "num_warps"]
    assert tuned.function == "softcap_kernel_autotuned" and tuned.key == ["n_ele"] and tuned.axes == ["softcap_const"]
    assert [c.id for c in tuned.space] == (["BLOCK_SIZE128-w4-s3", "BLOCK_SIZE512-w4-s3"] if inline else
                                           ["BLOCK_SIZE128-w4-s3", "BLOCK_SIZE256-w8-s3"])
    host = plan.modules["k"]["host_source"].splitlines()
    assert not any("triton.autotune(" in line or "triton.Config(" in line for line in host)
    assert "softcap_kernel_autotuned = __forge_kernel_side__('softcap_kernel_autotuned', __name__)" in host
    assert len(host) == len(source.splitlines())


def test_a_second_handle_a_heuristics_makes_is_refused_at_its_line(tmp_path: Path) -> None:
    source = SECOND_HANDLE.replace("softcap_kernel_autotuned = softcap_autotune(softcap_kernel)",
                                   "softcap_kernel_autotuned = triton.heuristics({\"BLOCK_SIZE\": lambda a: 128})"
                                   "(softcap_kernel)")
    manifest = one_file_project(tmp_path / "p", "forge_second_h", source, "softcap_kernel", ["softcap"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "k.py:20: host code reaches softcap_kernel_autotuned, a second handle of kernel softcap_kernel made by " \
           "the heuristics decorator of line 20" in result.output


LOCAL_ANNOTATION = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def fill_kernel(y_ptr, value, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.zeros((BLOCK,), tl.float32) + value, mask=offs < n)


def fill(y, fp8=False):
    if fp8:
        value: tl.constexpr = torch.finfo(torch.float8_e4m3fn).max
    else:
        value = 1.5 * Holder.width / 4
    fill_kernel[(triton.cdiv(y.numel(), 128),)](y, value, y.numel(), BLOCK=128)
    return None


def examples(device="cpu"):
    fill(torch.empty(1000, device=device))


class Holder:
    width: tl.constexpr = 4
'''


def test_a_local_variable_annotation_naming_triton_is_host_code(tmp_path: Path) -> None:
    """flash-attn's AMD prefill wrapper writes ``FP8_MAX: tl.constexpr = torch.finfo(q.dtype).max``: Python never
    evaluates a local variable's annotation (PEP 526), so it runs without Triton; it was refused ("host code uses
    'tl'"). A class body's annotation is evaluated when the class is made: still refused."""
    manifest = one_file_project(tmp_path / "p", "forge_localann", LOCAL_ANNOTATION, "fill_kernel", ["fill"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "k.py:16: host code uses 'Holder', defined with Triton on line 25" \
        in result.output, result.output
    (tmp_path / "p" / "k.py").write_text(LOCAL_ANNOTATION.replace("width: tl.constexpr = 4", "width = 4"))
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert 'value = "fp32"' in result.output


FLOAT_KEY = '''\
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=8)],
                 key=["n", "dropout_p"])
@triton.jit
def dropout_scale_kernel(x_ptr, y_ptr, n, dropout_p, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * (1 - dropout_p), mask=offs < n)


def dropout_scale(x, dropout_p: float):
    y = torch.empty_like(x)
    dropout_scale_kernel[lambda META: (triton.cdiv(x.numel(), META["BLOCK"]),)](x, y, x.numel(), dropout_p)
    return y


def examples(device="cpu"):
    for n in (1000, 70000):
        dropout_scale(torch.randn(n, device=device), 0.0)
        dropout_scale(torch.randn(n, device=device), 0.1)
'''


def test_a_float_in_the_decorators_key_leaves_the_table_key(tmp_path: Path) -> None:
    """flash-attn's AMD attention keys its autotuning on ``dropout_p`` too: Triton tunes each value apart; the
    table's rows are chosen by the nearest integer key, so the float leaves the key, with a note (it was refused:
    "key argument 'dropout_p' is a fp32 in the traced calls, not an integer"). A float the manifest's own key names
    is still an error."""
    manifest = one_file_project(tmp_path / "p", "forge_floatkey", FLOAT_KEY, "dropout_scale_kernel",
                                ["dropout_scale"])
    plan = make_plan(load_manifest(manifest))
    kp = plan.kernels["k"]
    assert kp.key == ["n"]
    assert any("key names dropout_p (fp32), not an integer" in n for n in kp.notes)
    assert {r.key for e in plan.entries for r in e.tables["default"]} == {(1000,), (70000,)}
    text = manifest.read_text().replace('examples = "examples"', 'examples = "examples"\nkey = ["n", "dropout_p"]')
    manifest.write_text(text)
    with pytest.raises(ForgeError, match="key argument 'dropout_p' is a fp32 in the traced calls, not an integer"):
        make_plan(load_manifest(manifest))


NONE_ONLY = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, shift, HAS_SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if HAS_SHIFT:
        offs = offs + shift
    tl.store(y_ptr + offs, x, mask=offs < n)


def copy(x, shift=None):
    y = torch.empty_like(x)
    copy_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), shift, HAS_SHIFT=shift is not None, BLOCK=128)
    return y


def examples(device="cpu"):
    copy(torch.randn(1000, device=device))
'''


def test_a_parameter_every_call_passes_none_is_never_written_through(tmp_path: Path) -> None:
    """flash-attn's ``N_CTX_NEW`` and ``stride_descale_o_z`` (integers, None where unused) sit in a store's address,
    so the pointer flow lists them; passed None in every traced call they are the constant None in every binary
    (typed ``*i8`` for the signature), which nothing is stored through."""
    manifest = one_file_project(tmp_path / "p", "forge_noneonly", NONE_ONLY, "copy_kernel", ["copy"])
    kp = make_plan(load_manifest(manifest)).kernels["k"]
    assert {"y_ptr", "shift"} <= set(kp.writes)  # what the source shows (BLOCK too: any name in the address)
    assert kp.written == ["y_ptr"]
    assert kp.spec_json()["writes"] == ["y_ptr"]


OWN_AUTOTUNER = '''\
import triton


class Autotuner(triton.KernelInterface):
    """GPTQ's custom_autotune: not triton.runtime.autotuner.Autotuner; it keeps the kernel in ``fn``."""

    def __init__(self, fn, arg_names, configs, key):
        self.fn, self.configs, self.key_idx = fn, configs, [arg_names.index(k) for k in key]
        self.cache = {}

    def run(self, *args, **kwargs):
        key = tuple(args[i] for i in self.key_idx)
        if key not in self.cache:  # the real one times every config here
            self.cache[key] = self.configs[-1]
        config = self.cache[key]
        return self.fn.run(*args, num_warps=config.num_warps, num_stages=config.num_stages, **kwargs,
                           **config.kwargs)


def autotune(configs, key):
    def decorator(fn):
        return Autotuner(fn, fn.arg_names, configs, key)

    return decorator
'''

OWN_AUTOTUNED_KERNEL = '''\
import torch
import triton
import triton.language as tl

from . import custom_autotune


@custom_autotune.autotune(
    configs=[triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2),
             triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3)],
    key=["M", "N"],
)
@triton.jit
def scale_rows_kernel(a_ptr, s_ptr, c_ptr, M, N, stride_am, stride_an, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    a = tl.load(a_ptr + rm[:, None] * stride_am + rn[None, :] * stride_an, mask=mask)
    s = tl.load(s_ptr + rn, mask=rn < N)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, a * s[None, :], mask=mask)


def scale_rows(a, s):
    c = torch.empty_like(a)
    M, N = a.shape
    grid = lambda META: (triton.cdiv(M, META["BLOCK_M"]), triton.cdiv(N, META["BLOCK_N"]))  # noqa: E731
    scale_rows_kernel[grid](a, s, c, M, N, a.stride(0), a.stride(1), c.stride(0), c.stride(1))
    return c


def examples(device="cpu"):
    for M, N in ((37, 300), (1000, 513)):
        scale_rows(torch.randn(M, N, device=device, dtype=torch.float16),
                   torch.randn(N, device=device, dtype=torch.float16))
'''

OWN_AUTOTUNER_MANIFEST = '''\
[project]
name = "forge_gptqstyle"
version = "0.1.0"
targets = ["sm_90"]

[kernels.scale_rows]
source = "gq/kernels.py:scale_rows_kernel"
ops = ["scale_rows"]
examples = "examples"
'''
TUNE_SPACE = '''key = ["M", "N"]

[kernels.scale_rows.tune]
configs = [{ BLOCK_M = 32, BLOCK_N = 64, num_warps = 4, num_stages = 2 },
           { BLOCK_M = 64, BLOCK_N = 64, num_warps = 4, num_stages = 3 }]
'''


def _own_autotuner_project(root: Path, space: bool) -> Path:
    (root / "gq").mkdir(parents=True)
    (root / "gq" / "__init__.py").write_text("")
    (root / "gq" / "custom_autotune.py").write_text(OWN_AUTOTUNER)
    (root / "gq" / "kernels.py").write_text(OWN_AUTOTUNED_KERNEL)
    (root / "kernel_manifest.toml").write_text(OWN_AUTOTUNER_MANIFEST + (TUNE_SPACE if space else ""))
    return root / "kernel_manifest.toml"


def test_an_autotuner_of_the_librarys_own_takes_the_manifests_space(tmp_path: Path) -> None:
    """GPTQModel's quant matmul is decorated with its own ``custom_autotune.autotune(configs=..., key=...)``, which
    Triton does not know: refused, at the ``def``'s line and with no way forward. Now the error points at the
    decorator and says what to give; with the manifest's tuning space (and key) the decorator is looked through."""
    bare = _own_autotuner_project(tmp_path / "bare", space=False)
    result = CliRunner().invoke(main, ["check", "--manifest", str(bare)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "kernels.py:8: scale_rows_kernel has a decorator with configs= and key= that does not make a Triton " \
           "Autotuner" in result.output
    assert "[kernels.scale_rows.tune] configs, and kernels.scale_rows.key" in result.output
    plan = make_plan(load_manifest(_own_autotuner_project(tmp_path / "space", space=True)))
    kp = plan.kernels["scale_rows"]
    assert kp.key == ["M", "N"]
    assert [c.id for c in kp.space] == ["BLOCK_M32-BLOCK_N64-w4-s2", "BLOCK_M64-BLOCK_N64-w4-s3"]
    assert any("the decorator at line 8 is not Triton's autotuner" in n for n in kp.notes)
    assert {r.key for e in plan.entries for r in e.tables["default"]} == {(37, 300), (1000, 513)}


HOST_AUTOTUNER = {
    "ll/__init__.py": "",
    "ll/autotuner.py": '''\
import functools


def autotune(kernel_name, configs_gen_func, static_key_func, run_key_func, mutates_args=()):
    """lightllm's own tuner of a host function: it picks the run_config the host function launches with."""
    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, run_config=None, **kwargs):
            return fn(*args, run_config=run_config or configs_gen_func()[-1], **kwargs)
        return wrapper
    return decorator
''',
    "ll/scale.py": '''\
import torch
import triton
import triton.language as tl

from ll.autotuner import autotune
from . import autotuner as tuners


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


@autotune(kernel_name="scale:v1", configs_gen_func=lambda: [{"BLOCK": 256}, {"BLOCK": 1024}],
          static_key_func=lambda x: {"dtype": str(x.dtype)}, run_key_func=lambda x: x.numel())
def scale(x, run_config=None):
    y = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[(triton.cdiv(n, run_config["BLOCK"]),)](x, y, n, BLOCK=run_config["BLOCK"], num_warps=4)
    return y


@tuners.autotune(kernel_name="scale2:v1", configs_gen_func=lambda: [{"BLOCK": 256}],
                 static_key_func=lambda x: {}, run_key_func=lambda x: x.numel())
def scale_small(x, run_config=None):
    return scale(x, run_config=run_config)


def examples(device="cpu"):
    scale(torch.randn(4099, dtype=torch.float16, device=device))
    scale_small(torch.randn(1000, dtype=torch.float16, device=device))
''',
    "kernel_manifest.toml": '''\
[project]
name = "forge_llstyle"
version = "0.1.0"
targets = ["sm_90"]

[kernels.scale]
source = "ll/scale.py:_scale_kernel"
ops = ["scale", "scale_small"]
examples = "examples"
''',
}
"""lightllm's ``moe_sum_reduce`` and gated RMSNorm: host functions decorated with the library's own
``@autotune(kernel_name=..., configs_gen_func=...)`` (``lightllm.common.triton_utils.autotuner``), which has Triton's
decorator's name and nothing else of it."""


def test_a_host_functions_decorator_named_autotune_from_another_module_is_not_tritons(tmp_path: Path) -> None:
    """Session 47's lightllm hunt: ``check`` refused the file, "scale is decorated with @triton.autotune or
    @triton.heuristics but not @triton.jit", because a decorator named ``autotune`` was taken for Triton's whatever
    the file imported it from. A name the file binds to another module is host code's own."""
    manifest = _write_project(tmp_path, HOST_AUTOTUNER)
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    plan = make_plan(load_manifest(manifest))
    assert {e.assignment["BLOCK"] for e in plan.entries} == {256, 1024}  # both ops' run_configs were traced
    assert {"scale", "scale_small"} <= set(plan.modules["scale"]["ops"])
    # Triton's own name keeps its meaning: a function with no @triton.jit under Triton's autotune is refused
    kernel_file = tmp_path / "ll" / "scale.py"
    kernel_file.write_text(kernel_file.read_text().replace("@tuners.autotune(", "@triton.autotune(configs=[], "
                                                           "key=[], ", 1))
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "scale_small is decorated with @triton.autotune or @triton.heuristics but not @triton.jit" \
        in result.output, result.output


@pytest.mark.gpu
def test_session_47s_hunt_patterns_run_from_their_wheels_on_the_gpu(tmp_path: Path) -> None:
    """The lightllm hunt's mends on a GPU, each wheel in a fresh process that blocks Triton, on misaligned inputs of
    odd sizes: ops under the library's own ``@autotune`` (each picks its run_config), an optional bias beside a
    call-site flag (the traced combinations, and an untraced one refused as ``check`` notes), and a helper's config
    file read beside the helper (the traced BLOCK=1024, not the fallback)."""
    from tests.test_data_files import _helper_reads_beside_itself
    from tests.test_manifest import GATED_BIAS

    llstyle = _installed(_write_project(tmp_path / "ll", HOST_AUTOTUNER), tmp_path / "ll_site")
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_llstyle
        errs = {}
        for name in ("scale", "scale_small"):
            for n in (1000, 4099):
                x = torch.randn(n + 1, device="cuda", dtype=torch.float16)[1:]
                errs[f"{name}/{n}"] = (getattr(forge_llstyle, name)(x).double() - x.double() * 2).abs().max().item()
        print(json.dumps(errs))
        '''), llstyle)
    assert res and all(e == 0 for e in res.values()), res
    gated = _installed(one_file_project(tmp_path / "g", "forge_test_gated", GATED_BIAS, "k", ["gated"]),
                       tmp_path / "g_site")
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_test_gated
        out = {}
        for flag, bias in ((False, False), (True, True), (False, True)):
            x = torch.randn(1001, device="cuda")[1:]
            b = torch.randn(1001, device="cuda")[1:] if bias else None
            ref = (x.double() + (b.double() if bias else 0)) * (2 if flag else 1)
            try:
                out[f"{flag}/{bias}"] = (forge_test_gated.gated(x, b, norm_before_gate=flag).double()
                                         - ref).abs().max().item()
            except Exception as exc:
                out[f"{flag}/{bias}"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(out))
        '''), gated)
    # the traced combinations exact; the untraced one refused before any launch, as check's note says
    assert res["False/False"] < 1e-5 and res["True/True"] < 1e-5, res
    assert res["False/True"].startswith("NotBuiltError"), res
    data = _installed(_helper_reads_beside_itself(tmp_path / "d"), tmp_path / "d_site")
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_datafiles
        import forge_datafiles._ops.scale as host
        x = torch.randn(4100, device="cuda", dtype=torch.float16)[1:]
        err = (forge_datafiles.scale(x).double() - x.double() * 2).abs().max().item()
        print(json.dumps({"err": err, "config": host.get_config(4099)}))
        '''), data)
    assert res == {"err": 0, "config": {"BLOCK": 1024}}, res


PRINTING_HOST_CODE = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x):
    y = torch.empty_like(x)
    print(f"{y.size()=}")  # applied-ai's float8_groupwise_quantize prints like this on every call
    scale_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


def examples(device="cpu"):
    scale(torch.randn(1000, device=device))
'''


def test_the_plan_on_stdout_is_json_when_host_code_prints(tmp_path: Path) -> None:
    """Session 47's applied-ai hunt: ``check --plan`` put the prints of the traced host code ahead of the JSON on
    stdout, so ``json.load`` of it failed. They go to stderr now."""
    import json

    manifest = one_file_project(tmp_path / "p", "forge_prints", PRINTING_HOST_CODE, "scale_kernel", ["scale"])
    result = CliRunner().invoke(main, ["check", "--plan", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kernels"]["k"]["function"] == "scale_kernel"
    assert "y.size()=torch.Size([1000])" in result.stderr


FUNCTION_APPLY = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_kernel(out_ptr, in_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(in_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def _launch(x):
    out = torch.empty_like(x)
    _scale_kernel[(triton.cdiv(x.numel(), 1024),)](out, x, x.numel(), BLOCK=1024)
    return out


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _launch(x)

    @staticmethod
    def backward(ctx, g):
        return _launch(g) * 1


scale2 = _Scale.apply


def examples(device="cpu"):
    x = torch.randn(4099, device=device, requires_grad=True)
    scale2(x).backward(torch.randn(4099, device=device))
'''
"""applied-ai's training softmax: ``fused_softmax = triton_softmax.apply``, forward and backward Triton kernels."""


def test_an_autograd_function_op_with_no_backward_in_the_manifest_is_told_what_compile_does(tmp_path: Path) -> None:
    """Session 47's applied-ai hunt: ``check`` listed the op's custom op as "what torch.compile(fullgraph=True)
    traces" and said nothing of its having no backward; a compiled call needing gradients then failed in Dynamo
    with "missing_mp_subscript" or "posix.stat". Now ``check`` says so, and the compiled call's graph break names
    the op and what to give (``tests/test_torch_ops.py``)."""
    manifest = one_file_project(tmp_path / "p", "forge_fnapply", FUNCTION_APPLY, "_scale_kernel", ["scale2"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "scale2: torch.ops.forge_fnapply.scale2(Tensor x) -> Tensor (from the traced examples; _Scale.apply, an " \
        "autograd.Function: its custom op has no backward ([kernels.NAME.autograd] or [ops.NAME.autograd] gives " \
        "one), so a compiled call needing gradients breaks the graph and runs eagerly)" in result.output, result.output


def test_check_names_the_method_a_launch_is_in(tmp_path: Path) -> None:
    """attorch launches its kernels in ``ActFuncAutoGrad.forward`` and ``.backward``: ``check`` said "launched in
    ActFuncAutoGrad()" for both. It names the method (and a nested def) now; a module-level function as before."""
    source = FUNCTION_APPLY.replace("        return _launch(x)\n", "        out = torch.empty_like(x)\n"
                                    "        _scale_kernel[(triton.cdiv(x.numel(), 1024),)](out, x, x.numel(), "
                                    "BLOCK=1024)\n        return out\n")
    manifest = one_file_project(tmp_path / "p", "forge_methods", source, "_scale_kernel", ["scale2"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "launched in _launch() line 14" in result.output and "launched in _Scale.forward() line 22" in \
        result.output, result.output


@pytest.mark.gpu
def test_an_autograd_function_op_under_torch_compile_on_the_gpu(tmp_path: Path) -> None:
    """The applied-ai hunt's ``autograd.Function.apply`` op with no backward in the manifest, from its wheel in a
    fresh process: compiled without gradients, its custom op; needing them, a graph break naming the op
    (fullgraph=True raises it) and the eager autograd's gradients."""
    fnapply = _installed(one_file_project(tmp_path / "f", "forge_fnapply", FUNCTION_APPLY, "_scale_kernel",
                                          ["scale2"]), tmp_path / "f_site")
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_fnapply
        x = torch.randn(4100, device="cuda")[1:]
        out = {}
        full = torch.compile(lambda t: forge_fnapply.scale2(t) + 1, backend="aot_eager", fullgraph=True)
        out["nograd"] = (full(x).double() - (x.double() * 2 + 1)).abs().max().item()  # the custom op
        xg = x.clone().requires_grad_()
        try:
            full(xg)
        except Exception as exc:
            out["fullgraph"] = str(exc)
        broken = torch.compile(lambda t: forge_fnapply.scale2(t) + 1, backend="aot_eager")
        y = broken(xg)
        y.backward(torch.ones_like(y))
        out["grad"] = (xg.grad.double() - 2).abs().max().item()
        out["value"] = (y.double() - (x.double() * 2 + 1)).abs().max().item()
        print(json.dumps(out))
        '''), fnapply)
    assert res["nograd"] < 1e-6 and res["value"] < 1e-6 and res["grad"] == 0, res
    assert "forge_fnapply.scale2: its inputs need gradients and the manifest gives it no backward" \
        in res.get("fullgraph", ""), res


INTERFACE = '''\
import torch

from k import scale2


def scaled(x):
    return scale2(x)


def setup(ctx, inputs, output):
    pass


def backward(ctx, grad):
    return scale2(grad)  # (the op is linear, doubling: its gradient is the op again, the package's custom op)


def examples(device="cpu"):
    x = torch.randn(4099, device=device, requires_grad=True)
    scaled(x).backward(torch.randn(4099, device=device))
'''
"""lightning-attention's ``lightning_attn_func``: an interface file's function over a kernel file's
``autograd.Function``, exported by ``[ops.NAME]``."""


def _interface_project(root: Path, name: str, autograd: str) -> Path:
    manifest = one_file_project(root, name, FUNCTION_APPLY, "_scale_kernel", ["scale2"])
    (root / "iface.py").write_text(INTERFACE)
    manifest.write_text(manifest.read_text() + '\n[ops.scaled]\nsource = "iface.py"\nexamples = "examples"\n' +
                        autograd)
    return manifest


def test_an_ops_entry_gets_its_backward_from_the_manifest(tmp_path: Path) -> None:
    """The lightning-attention hunt: ``check`` told an ``[ops.NAME]`` op whose examples differentiate it to give
    ``[kernels.NAME.autograd]``, which refuses an op that is not the kernel entry's. ``[ops.NAME.autograd]`` gives
    it one (host functions of its own file), and ``check`` says that a custom op without one breaks the graph."""
    bare = _interface_project(tmp_path / "bare", "forge_iface_bare", "")
    result = CliRunner().invoke(main, ["check", "--manifest", str(bare)])
    assert result.exit_code == 0, result.output
    assert "scaled: torch.ops.forge_iface_bare.scaled(Tensor x) -> Tensor (from the traced examples; its examples " \
        "differentiate its results: its custom op has no backward ([kernels.NAME.autograd] or [ops.NAME.autograd] " \
        "gives one)" in result.output, result.output
    given = _interface_project(tmp_path / "given", "forge_iface",
                               '\n[ops.scaled.autograd]\nsetup-context = "setup"\nbackward = "backward"\n')
    plan = make_plan(load_manifest(given), ["sm_90"])
    assert plan.modules["iface"]["autograd"] == {"scaled": ["setup", "backward"]}
    assert "no backward" not in plan.modules["iface"]["schema_notes"]["scaled"]
    assert "def setup(" in plan.modules["iface"]["host_source"] and \
        "def backward(" in plan.modules["iface"]["host_source"]  # (shipped: the wheel's custom op calls them)
    wrong = _interface_project(tmp_path / "wrong", "forge_iface_wrong",
                               '\n[ops.scaled.autograd]\nsetup-context = "setup"\nbackward = "backwards"\n')
    with pytest.raises(ForgeError, match=r"ops\.scaled\.autograd\.backward.*no host function 'backwards' in "
                                         r"iface\.py.*did you mean 'backward'"):
        make_plan(load_manifest(wrong), ["sm_90"])


@pytest.mark.gpu
def test_an_ops_entrys_backward_trains_compiled_on_the_gpu(tmp_path: Path) -> None:
    """That op's wheel, Triton blocked: ``torch.compile(fullgraph=True)`` of a training step through its custom op
    (no graph break) gives the eager gradients (2 per element), misaligned, two sizes."""
    site = _installed(_interface_project(tmp_path / "p", "forge_iface_gpu",
                                         '\n[ops.scaled.autograd]\nsetup-context = "setup"\nbackward = "backward"\n'),
                      tmp_path / "site")
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_iface_gpu as pkg
        out = {}
        step = torch.compile(lambda t, w: (pkg.scaled(t) * w).sum(), backend="aot_eager", fullgraph=True)
        for n in (4099, 1000):
            x = torch.randn(n + 1, device="cuda")[1:].requires_grad_()
            w = torch.randn(n, device="cuda")
            loss = step(x, w)
            loss.backward()
            out[n] = {"loss": abs(loss.item() - (x.detach().double() * 2 * w.double()).sum().item()),
                      "grad": (x.grad.double() - 2 * w.double()).abs().max().item()}
        print(json.dumps(out))
        '''), site)
    for n in ("4099", "1000"):
        assert res[n]["loss"] < 1e-3 and res[n]["grad"] < 1e-6, res


OPS_EXAMPLES_ELSEWHERE = {
    "mylib/__init__.py": "",
    "mylib/scale.py": '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x):
    y = torch.empty_like(x)
    _scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
''',
    "mylib/driver.py": '''\
from mylib.scale import scale


def scale_twice(x):
    return scale(scale(x))
''',
    "ex.py": '''\
import torch
from mylib.scale import scale
from mylib.driver import scale_twice


def examples_scale(device="cpu"):
    scale(torch.randn(4099, dtype=torch.float16, device=device))


def examples_driver(device="cpu"):
    scale_twice(torch.randn(1000, dtype=torch.float16, device=device))
''',
    "kernel_manifest.toml": '''\
[project]
name = "forge_opsex"
version = "0.1.0"
targets = ["sm_90"]

[kernels.scale]
source = "mylib/scale.py:_scale_kernel"
ops = ["scale"]
examples = "ex.py:examples_scale"

[ops.scale_twice]
source = "mylib/driver.py"
examples = "ex.py:examples_driver"

[exports]
examples_scale = "ex.py"
''',
}


def test_an_ops_examples_may_name_another_files_function_as_a_kernels_may(tmp_path: Path) -> None:
    """Session 47's lightllm hunt: ``[ops.NAME].examples = "file.py:function"`` (lightllm's flash decoding driver,
    a file with no kernel, exercised from a file of examples) was refused as "no host function
    'ex.py:examples_driver' in mylib/driver.py", though ``[kernels.NAME].examples`` takes the form and the README
    says an op's examples work as a kernel's."""
    manifest = _write_project(tmp_path, OPS_EXAMPLES_ELSEWHERE)
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "scale_twice: torch.ops.forge_opsex.scale_twice(Tensor x) -> Tensor (from the traced examples)" \
        in result.output
    text = manifest.read_text()
    for wrong, message in (('"ex.py:examples_driverr"', "ops.scale_twice.examples: no host function "
                            "'examples_driverr' in ex.py (did you mean 'examples_driver'?)"),
                           ('"nowhere.py:examples_driver"', "ops.scale_twice.examples: nowhere.py is no file of "
                            "the project")):
        manifest.write_text(text.replace('"ex.py:examples_driver"', wrong))
        result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert message in result.output, result.output


def test_a_file_of_examples_of_its_own_needs_no_export(tmp_path: Path) -> None:
    """Session 46's SGLang hunt and session 47's lightllm and applied-ai hunts: a file of examples that is no kernel
    or op file had to be listed under ``[exports]``, which ships its functions as the package's API. It is now a host
    module of no op, shipped without its examples; ``[exports]`` still exports one where wanted."""
    import zipfile

    from forge_aot.pipeline import build

    manifest = _write_project(tmp_path / "p", OPS_EXAMPLES_ELSEWHERE)
    manifest.write_text(manifest.read_text().split("[exports]")[0])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "scale_twice: torch.ops.forge_opsex.scale_twice(Tensor x) -> Tensor (from the traced examples)" \
        in result.output
    plan = make_plan(load_manifest(manifest))
    assert {e.assignment["BLOCK"] for e in plan.entries} == {1024}
    assert plan.modules["ex"]["ops"] == [] and "exports" not in plan.modules["ex"]
    wheel = build(manifest, out_dir=tmp_path / "dist", build_dir=tmp_path / "work").wheel
    with zipfile.ZipFile(wheel) as z:
        shipped = z.read("forge_opsex/_ops/ex.py").decode()
        init = z.read("forge_opsex/__init__.py").decode()
    assert "def examples_scale" not in shipped and "def examples_driver" not in shipped
    assert "examples_scale" not in init and "examples_driver" not in init


UNLISTED = {
    "pkg/__init__.py": "",
    "pkg/utils.py": '''\
import triton
import triton.language as tl


@triton.jit
def element_mul_kernel(x_ptr, g_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * tl.load(g_ptr), mask=offs < n)
''',
    "pkg/flce.py": '''\
import torch
import triton

from pkg.utils import element_mul_kernel


def scale_(x, g):
    element_mul_kernel[(triton.cdiv(x.numel(), 128),)](x, g, x.numel(), BLOCK=128)


def examples(device="cpu"):
    scale_(torch.randn(1000, device=device), torch.tensor(2.0, device=device))
''',
    "pkg/ce.py": '''\
import torch
import triton
import triton.language as tl


@triton.jit
def zero_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, 0.0, mask=offs < n)


def zero_(x):
    zero_kernel[(triton.cdiv(x.numel(), 128),)](x, x.numel(), BLOCK=128)


def examples(device="cpu"):
    zero_(torch.randn(1000, device=device))
''',
    "kernel_manifest.toml": '''\
[project]
name = "forge_unlisted"
version = "0.1.0"
targets = ["sm_90"]

[kernels.zero]
source = "pkg/ce.py:zero_kernel"
ops = ["zero_"]
examples = "examples"

[ops.scale_]
source = "pkg/flce.py"
examples = "examples"
''',
}


def test_an_ops_file_launching_a_kernel_with_no_entry_is_told_to_add_one(tmp_path: Path) -> None:
    """Liger's fused_linear_cross_entropy.py (an ``[ops]`` file) launches ``element_mul_kernel`` of ``utils.py``,
    which had no ``[kernels]`` entry: the message said the module was not one the build binds (it is)."""
    result = CliRunner().invoke(main, ["check", "--manifest", str(_write_project(tmp_path, UNLISTED))])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "flce.py:8, which launches element_mul_kernel (pkg/utils.py:5), a kernel the manifest has no entry " \
           "for: add one ([kernels.NAME] source = \"pkg/utils.py:element_mul_kernel\")" in result.output


@pytest.mark.gpu
def test_float_constexpr_and_own_autotuner_wheels_match_triton(tmp_path: Path) -> None:
    """On the GPU: SGLang's softcap with its float constexprs, and the GPTQ-style kernel under its own autotuner,
    from their wheels in a fresh process without Triton, against the same files run by Triton's JIT (misaligned
    inputs, odd sizes)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    softcap_root = tmp_path / "softcap"
    softcap_root.mkdir()
    (softcap_root / "k.py").write_text(SOFTCAP)
    (softcap_root / "kernel_manifest.toml").write_text(SOFTCAP_MANIFEST)
    own_root = tmp_path / "own"
    own = _own_autotuner_project(own_root, space=True)
    site = _installed(softcap_root / "kernel_manifest.toml", tmp_path / "w1")
    site2 = _installed(own, tmp_path / "w2")
    code = textwrap.dedent(f'''\
        import json, sys
        sys.modules["triton"] = None
        sys.path.insert(0, {str(site2)!r})
        import torch, forge_softcap, forge_gptqstyle
        torch.manual_seed(0)
        out = {{}}
        for dt in (torch.float16, torch.bfloat16):
            for n in (1000, 4099):
                x = (torch.randn(n + 1, device="cuda", dtype=dt) * 80)[1:]
                for c in (30.0, 50.0):
                    got = forge_softcap.softcap(x, c).double()
                    out[f"softcap {{dt}} {{n}} {{c}}"] = (got - torch.sigmoid(x.double() / c) * c).abs().max().item()
        for M, N in ((37, 300), (1000, 513), (5, 4097)):
            a = torch.randn(M, N + 1, device="cuda", dtype=torch.float16)[:, 1:]
            s = torch.randn(N + 1, device="cuda", dtype=torch.float16)[1:]
            got, ref = forge_gptqstyle.scale_rows(a, s).double(), a.double() * s.double()
            out[f"scale_rows {{M}}x{{N}}"] = ((got - ref).abs().max() / ref.abs().max()).item()
        print(json.dumps(out))
        ''')
    res = _run_fresh(code, site)
    assert len(res) == 11
    for name, err in res.items():
        assert err < (1e-3 if name.startswith("scale_rows") else 1e-4), (name, err)
    # and Triton's JIT on the same files agrees with the wheel (each file run through its own decorators)
    jit = textwrap.dedent(f'''\
        import json, sys
        sys.path[:0] = [{str(softcap_root)!r}, {str(own_root)!r}, {str(site)!r}, {str(site2)!r}]
        import torch, k, forge_softcap, forge_gptqstyle
        from gq import kernels
        out = {{}}
        x = (torch.randn(4100, device="cuda", dtype=torch.float16) * 80)[1:]
        out["softcap"] = (k.softcap(x, 30.0) - forge_softcap.softcap(x, 30.0)).abs().max().item()
        a = torch.randn(1000, 514, device="cuda", dtype=torch.float16)[:, 1:]
        s = torch.randn(514, device="cuda", dtype=torch.float16)[1:]
        out["scale_rows"] = (kernels.scale_rows(a, s) - forge_gptqstyle.scale_rows(a, s)).abs().max().item()
        print(json.dumps(out))
        ''')
    res = _run_fresh(jit, site)
    assert res == {"softcap": 0.0, "scale_rows": 0.0}, res


REQUIRES_GRAD = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale_with_grad(x: torch.Tensor):
    y = torch.empty_like(x)
    grad = torch.zeros_like(x) if x.requires_grad else None
    scale_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y, grad


def examples(device="cpu"):
    with torch.no_grad():
        scale_with_grad(torch.randn(1000, device=device, requires_grad=True))
'''


def test_meta_results_that_differ_are_named_with_requires_grad_as_the_likely_cause(tmp_path: Path) -> None:
    """Liger's ``fused_linear_cross_entropy_forward`` returns gradient buffers only where ``weight.requires_grad``:
    inside a custom op (its Meta implementation too) inputs do not require grad, so its results differ and it gets
    no custom op, as it should; the note said only "other result shapes"."""
    manifest = one_file_project(tmp_path / "p", "forge_reqgrad", REQUIRES_GRAD, "scale_kernel", ["scale_with_grad"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "result 1 is None there, a float32 tensor of size (1000) in the call; the call's inputs required grad" \
        in result.output


WAVES_PER_EU = '''\
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 128, "waves_per_eu": 2}, num_warps=4, num_stages=1)], key=["n"])
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x):
    y = torch.empty_like(x)
    scale_kernel[lambda META: (triton.cdiv(x.numel(), META["BLOCK"]),)](x, y, x.numel())
    return y


def examples(device="cpu"):
    scale(torch.randn(1000, device=device))
'''


def test_an_amd_option_in_a_decorators_config_reaches_the_gfx_binaries_only(tmp_path: Path) -> None:
    """flash-attn's AMD attention sets ``waves_per_eu`` in its ``triton.Config``s: refused as a missing parameter,
    under a manifest key the manifest does not have (``tune.meta.waves_per_eu``). It is a compile option of Triton's
    AMD backend: the gfx942 binaries are compiled with it (Triton's metadata says so), the sm_90 ones without
    (Triton's CUDA backend refuses the keyword)."""
    import json

    from forge_aot.pipeline import build

    manifest = one_file_project(tmp_path / "p", "forge_waves", WAVES_PER_EU, "scale_kernel", ["scale"])
    manifest.write_text(manifest.read_text().replace('targets = ["sm_90"]', 'targets = ["gfx942", "sm_90"]'))
    kp = make_plan(load_manifest(manifest)).kernels["k"]
    assert [c.id for c in kp.space] == ["BLOCK128-waves_per_eu2-w4-s1"]
    assert any("configs set waves_per_eu, compile options of Triton's AMD backend" in n for n in kp.notes)
    build(manifest, out_dir=tmp_path / "dist", build_dir=tmp_path / "work")
    found = {}
    for meta in (tmp_path / "work" / "triton-cache").glob("*/scale_kernel.json"):
        data = json.loads(meta.read_text())
        found.setdefault(data["target"]["backend"], set()).add(data.get("waves_per_eu"))
    assert found == {"hip": {2}, "cuda": {None}}


@pytest.mark.gpu
def test_the_plain_and_the_autotuned_handle_run_from_the_wheel_as_under_triton(tmp_path: Path) -> None:
    """On the GPU: SGLang's pattern, the plain kernel and its second, autotuned handle, from the wheel in a fresh
    process without Triton, against the same file under Triton's JIT (its autotuner timing both configs)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    manifest = one_file_project(tmp_path / "p", "forge_second", SECOND_HANDLE, "softcap_kernel", ["softcap"])
    manifest.write_text(manifest.read_text() + SECOND_HANDLE_ENTRY)
    site = _installed(manifest, tmp_path / "w")
    code = textwrap.dedent(f'''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_second
        out = {{}}
        for n in (4096, 70000, 4099):
            x = (torch.randn(n + 1, device="cuda", dtype=torch.float16) * 80)[1:]
            ref = torch.sigmoid(x.double() / 30.0) * 30.0
            for tuned in (False, True):
                got = forge_second.softcap(x, 30.0, autotune=tuned).double()
                out[f"{{n}} {{tuned}}"] = (got - ref).abs().max().item()
        torch.save(x, {str(tmp_path / "x.pt")!r})
        out["last"] = [forge_second.softcap(x, 30.0, autotune=t).tolist()[:64] for t in (False, True)]
        print(json.dumps(out))
        ''')
    res = _run_fresh(code, site)
    last = res.pop("last")
    assert len(res) == 6 and all(err < 1e-4 for err in res.values()), res
    jit = textwrap.dedent(f'''\
        import json, sys
        sys.path.insert(0, {str(tmp_path / "p")!r})
        import torch, k
        x = torch.load({str(tmp_path / "x.pt")!r})
        print(json.dumps([k.softcap(x, 30.0, autotune=t).tolist()[:64] for t in (False, True)]))
        ''')
    assert _run_fresh(jit, site) == last


VLLM_TRITON_UTILS = {
    "mylib/__init__.py": "",
    "mylib/triton_utils/importing.py": '''\
from importlib.util import find_spec

HAS_TRITON = find_spec("triton") is not None


class TritonPlaceholder:
    pass
''',
    "mylib/triton_utils/__init__.py": '''\
from mylib.triton_utils.importing import HAS_TRITON, TritonPlaceholder

if HAS_TRITON:
    import triton
    import triton.language as tl
else:
    triton = TritonPlaceholder()
    tl = TritonPlaceholder()
''',
    "mylib/softplus_op.py": '''\
import torch

from mylib.triton_utils import HAS_TRITON, tl, triton

TRITON3 = HAS_TRITON and int(triton.__version__.split(".")[0]) >= 3


@triton.jit
def _softplus_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, tl.where(x <= 20.0, tl.log(tl.exp(x) + 1), x), mask=offs < n)


def softplus(x, q_descale):
    assert q_descale is None, "the descale is not supported"
    y = torch.empty_like(x)
    _softplus_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def examples(device="cpu"):
    softplus(torch.randn(3000, device=device), None)
''',
    "kernel_manifest.toml": '''\
[project]
name = "forge_vllmstyle"
version = "0.1.0"
targets = ["sm_90"]

[kernels.softplus]
source = "mylib/softplus_op.py:_softplus_kernel"
ops = ["softplus"]
examples = "examples"
''',
}


@pytest.mark.slow
def test_vllms_triton_utils_with_its_flag_and_an_argument_always_none(tmp_path: Path) -> None:
    """vLLM's mamba ops import ``HAS_TRITON, tl, triton`` from ``vllm.triton_utils``, which imports Triton under
    ``if HAS_TRITON:`` (the flag from a sibling module) with placeholders in its ``else``: shipped as a project module,
    its Triton imports were refused ("host code imports Triton"). The block is the Triton import it is, and the flag
    stays importable. And vLLM's ``unified_attention`` takes ``q_descale`` only to assert it is None: the op had no
    custom op ("type unknown"); the argument is left out of the schema as an output buffer is (a call passing one
    runs as Python). The wheel, in a fresh process without Triton: the op's meta implementation and the flag."""
    manifest = _write_project(tmp_path / "p", VLLM_TRITON_UTILS)
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert ("softplus: torch.ops.forge_vllmstyle.softplus(Tensor x) -> Tensor (from the traced examples; without "
            "argument q_descale (None in every traced call, its type unknown") in result.output
    site = _installed(manifest, tmp_path)
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_vllmstyle
        from forge_vllmstyle._ops._local.mylib import triton_utils
        y = torch.ops.forge_vllmstyle.softplus(torch.empty(3000, device="meta"))
        print(json.dumps({"shape": list(y.shape), "flag": triton_utils.HAS_TRITON,
                          "triton": type(triton_utils.triton).__module__,
                          "cdiv": triton_utils.triton.cdiv(10, 4)}))
        '''), site)
    # the flag is the build's answer (its ``find_spec("triton")``: True, since session 44), its Triton the runtime's
    # (the small one of project modules, host_values.SmallTriton: host_triton's other names on first use)
    assert res == {"shape": [3000], "flag": True, "triton": "forge_vllmstyle._runtime.host_values", "cdiv": 3}


INT64_ANNOTATION = '''\
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({}, num_warps=4)], key=["num_elements"])
@triton.jit
def rows_copy_kernel(x_ptr, y_ptr, stride_row: tl.int64, n_cols: int, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row * stride_row + offs, mask=offs < n_cols)
    tl.store(y_ptr + row * stride_row + offs, v, mask=offs < n_cols)


def rows_copy(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    rows_copy_kernel[(x.shape[0],)](x, y, x.stride(0), x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


def examples(device="cpu"):
    rows_copy(torch.randn(64, 100, device=device))
'''


def test_scalar_annotations_type_parameters_as_tritons_jit_does(tmp_path: Path) -> None:
    """torchao's MoE kernels annotate row strides ``tl.int64`` so ``expert * stride`` cannot wrap: typed from the
    traced values they were compiled as i32 (silently wrong past 2**31). An annotation types the parameter as
    Triton's JIT does (``int`` is i32 there); a manifest type that disagrees is an error. And the decorator's key
    names ``num_elements``, which the kernel has no parameter of: Triton ignores it; so does the table, with a note."""
    manifest = one_file_project(tmp_path / "p", "forge_int64", INT64_ANNOTATION, "rows_copy_kernel", ["rows_copy"])
    plan = make_plan(load_manifest(manifest))
    kp = plan.kernels["k"]
    assert dict(kp.params)["stride_row"] == "i64" and dict(kp.params)["n_cols"] == "i32"
    assert "stride_row" in kp.spec_params  # still specialized (divisible by 16), as Triton does for integers
    assert kp.key == [] and any("key names num_elements, which rows_copy_kernel has no parameter of" in n
                                for n in kp.notes)
    from forge_aot.plan import job_for

    e = plan.entries[0]
    row = e.tables["default"][0]
    job = job_for(plan, e, row.preferences[0], next(iter(plan.binaries_for(e, row.key, row.preferences[0]))))
    assert job.signature["stride_row"] == "i64"
    manifest.write_text(manifest.read_text() + 'signature = { stride_row = "i32" }\n')
    with pytest.raises(ForgeError, match="'stride_row' of rows_copy_kernel is annotated as i64"):
        make_plan(load_manifest(manifest))


DRIVER_ALIAS = '''\
import torch
import triton
import triton.language as tl
import triton.runtime.driver as driver


def get_props():
    return driver.active.utils.get_device_properties(torch.cuda.current_device())


@triton.jit
def add1_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def add1(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    nsm = get_props()["multiprocessor_count"]
    add1_kernel[(min(nsm, triton.cdiv(x.numel(), 256)),)](x, y, x.numel(), BLOCK=256)
    return y


def examples(device="cpu"):
    add1(torch.randn(1000, device=device))
'''

CUSTOM_OP_IS_CUDA = '''\
import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def add1_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


@torch.library.custom_op("mylib::add1", mutates_args=())
def add1(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    assert x.is_cuda and y.is_cuda
    add1_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y


@add1.register_fake
def _(x):
    return torch.empty_like(x)


@triton_op("mylib::add2", mutates_args={})
def add2(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    wrap_triton(add1_kernel)[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y


ADD2 = torch.ops.mylib.add2.default  # torchao: register_sharding(torch.ops.torchao.<op>.default) at import


def examples(device="cpu"):
    add1(torch.randn(1000, device=device))
    add2(torch.randn(1000, device=device))
'''


def test_the_driver_module_imported_by_its_path_is_the_runtimes(tmp_path: Path) -> None:
    """FLA's backends write ``import triton.runtime.driver as driver``: refused ("host code uses 'get_props', defined
    with Triton"), where ``from triton.runtime import driver`` was not."""
    manifest = one_file_project(tmp_path / "p", "forge_driveralias", DRIVER_ALIAS, "add1_kernel", ["add1"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_torchaos_custom_ops_trace_on_the_gpu_and_a_triton_op_is_found_by_name(tmp_path: Path) -> None:
    """torchao's ``@torch.library.custom_op`` functions ``assert x.is_cuda``: run through torch's dispatcher while
    tracing, they saw the CPU tensors as CPU ones (the examples failed); the trace runs the op's own function. And it
    names its ``@triton_op`` by ``torch.ops.torchao.<op>.default`` at import: the name was never defined in the
    wheel (AttributeError at import); it is now, in the package's namespace, where host code looks it up."""
    manifest = one_file_project(tmp_path / "p", "forge_aoops", CUSTOM_OP_IS_CUDA, "add1_kernel", ["add1", "add2"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    site = _installed(manifest, tmp_path)
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_aoops
        import forge_aoops._ops.k as host
        meta = torch.empty(7, device="meta")
        print(json.dumps({"add2": str(host.ADD2), "shape": list(host.ADD2(meta).shape),
                          "op": list(torch.ops.forge_aoops.add2(meta).shape)}))
        '''), site)
    # (add1's meta implementation asserts is_cuda: torch.compile's fake tensors say they are, meta ones do not)
    assert res == {"add2": "forge_aoops__mylib.add2.default", "shape": [7], "op": [7]}


ELSEWHERE = {
    "pkg/__init__.py": "",
    "pkg/ops_a.py": '''\
import importlib

import torch
import triton
import triton.language as tl

importlib.import_module("pkg.backends")  # FLA's dispatch: a module named at run time


@triton.jit
def add1_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def add1(x: torch.Tensor, with_copy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    y = torch.empty_like(x)
    add1_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y, (y.clone() if with_copy else None)
''',
    "pkg/backends/__init__.py": "ENABLED = True\n",
    "pkg/model.py": '''\
import torch

from pkg.ops_a import add1


def model(x: torch.Tensor) -> torch.Tensor:
    return add1(x)[0] * 2


def examples(device="cpu"):
    x = torch.randn(1000, device=device)
    model(x)
    add1(x)
''',
    "kernel_manifest.toml": '''\
[project]
name = "forge_elsewhere"
version = "0.1.0"
targets = ["sm_90"]

[kernels.add1]
source = "pkg/ops_a.py:add1_kernel"
ops = ["add1"]
examples = "pkg/model.py:examples"

[ops.model]
source = "pkg/model.py"
examples = "examples"
''',
}


def test_an_op_that_another_files_examples_call_by_its_imported_name_is_recorded(tmp_path: Path) -> None:
    """FLA's ``chunk.py`` examples call ``chunk_gated_delta_rule_fwd_h``, imported from ``chunk_delta_h.py``, whose
    return annotation makes no schema: the calls were not recorded (only the defining file's name was), so the op
    had no custom op ("no examples call it directly"). And FLA's ``dispatch`` imports its backends module by a
    name made at run time: the wheel did not ship it and raised ModuleNotFoundError at import, after a silent build;
    ``check`` now warns."""
    result = CliRunner().invoke(main, ["check", "--manifest", str(_write_project(tmp_path, ELSEWHERE))])
    assert result.exit_code == 0, result.output
    assert "add1: torch.ops.forge_elsewhere.add1(Tensor x, bool with_copy=False) -> (Tensor, Tensor?)" \
        in result.output
    assert "warning: pkg/backends/__init__.py: host code imported pkg.backends by importlib.import_module, a name " \
           "the build cannot read" in result.output


def _vllmish(namespace: str) -> dict[str, str]:
    """vLLM's layout: the package ``__init__`` imports its kernel files, which define torch ops at import, one through
    a helper that keeps ``Library(ns, "FRAGMENT")`` (vLLM's ``direct_register_custom_op``), one with
    ``@torch.library.custom_op``; and an ``[ops]`` file importing the package. ``namespace``: the ops' namespace (one
    per test: this process keeps the ops a test defines)."""
    return {
        "vllmish/__init__.py": "from . import ops\nfrom .ops.act import silu_mul\n",
        "vllmish/ops/__init__.py": "from . import scale_op\nfrom .act import silu_mul\n",
        "vllmish/utils.py": f'''\
import torch
from torch.library import Library

lib = Library("{namespace}", "FRAGMENT")


def direct_register_custom_op(op_name, op_func, schema, fake_impl):
    lib.define(op_name + schema)
    lib.impl(op_name, op_func, "CUDA")
    lib._register_fake(op_name, fake_impl)


def block_for(n):
    return 256
''',
        "vllmish/ops/scale_op.py": '''\
import torch
import triton
import triton.language as tl

from vllmish.utils import block_for, direct_register_custom_op


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=block_for(x.numel()))
    return y


direct_register_custom_op("scale_rows", scale, "(Tensor x) -> Tensor", lambda x: torch.empty_like(x))


def examples(device="cpu"):
    scale(torch.randn(1000, device=device))
''',
        "vllmish/ops/act.py": f'''\
import torch
import triton
import triton.language as tl

from ..utils import block_for


@triton.jit
def silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)
    tl.store(y_ptr + offs, x * tl.sigmoid(x), mask=offs < n)


@torch.library.custom_op("{namespace}::silu_mul", mutates_args=())
def silu_mul(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    silu_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=block_for(x.numel()))
    return y


@silu_mul.register_fake
def _(x):
    return torch.empty_like(x)


def examples(device="cpu"):
    silu_mul(torch.randn(1000, device=device))
''',
        "vllmish/layer.py": '''\
import torch

import vllmish
from vllmish.ops.scale_op import scale


def layer(x: torch.Tensor) -> torch.Tensor:
    return vllmish.silu_mul(scale(x))


def examples(device="cpu"):
    layer(torch.randn(1000, device=device))
''',
        "kernel_manifest.toml": f'''\
[project]
name = "forge_{namespace}"
version = "0.1.0"
targets = ["sm_90"]

[kernels.scale]
source = "vllmish/ops/scale_op.py:scale_kernel"
ops = ["scale"]
examples = "examples"

[kernels.silu]
source = "vllmish/ops/act.py:silu_kernel"
ops = ["silu_mul"]
examples = "examples"

[ops.layer]
source = "vllmish/layer.py"
examples = "examples"
''',
    }


def test_kernel_files_their_package_init_imports_define_their_torch_ops_once(tmp_path: Path) -> None:
    """vLLM's package ``__init__`` imports its kernel files, which define torch ops at import: the build ran such a
    file twice, refused as "Tried to register an operator (...) multiple times". Binding it, the build imported the
    package above it first with Python's own import system (its ``__init__`` ran the project's file), then ran the
    host code; the compile worker ran the file under a name of its own, whose import of the package ran it again
    under its real name. Now the package's import of the file is the bound host module (as in the wheel), and the
    compile worker's module is the package's."""
    from forge_aot.introspect import forget_projects, load_kernel_module

    result = CliRunner().invoke(main, ["check", "--manifest", str(_write_project(tmp_path / "a", _vllmish("vllm_a")))])
    assert result.exit_code == 0, result.output
    assert "scale: torch.ops.forge_vllm_a.scale(Tensor x) -> Tensor" in result.output
    assert "layer: torch.ops.forge_vllm_a.layer(Tensor x) -> Tensor" in result.output
    _write_project(tmp_path / "b", _vllmish("vllm_b"))
    forget_projects()  # (project a's directories off sys.path)
    try:
        module = load_kernel_module(str(tmp_path / "b" / "vllmish" / "ops" / "scale_op.py"))
        assert sys.modules["vllmish.ops.scale_op"] is module and sys.modules["vllmish"].ops.scale_op is module
        assert load_kernel_module(str(tmp_path / "b" / "vllmish" / "ops" / "act.py")) is sys.modules["vllmish.ops.act"]
    finally:
        _forget_package("vllmish")
        forget_projects()


def test_an_autotuned_kernel_file_its_package_init_imports_registers_its_library_op_once(tmp_path: Path) -> None:
    """The same layout with the kernel under ``@triton.autotune``: the build imports such a file with Triton to read
    its configs, and that import ran ``direct_register_custom_op`` (``Library.define``) before the trace bound the
    host code, which ran it again: "Tried to register an operator (vllm_e::scale_rows...) multiple times". What
    introspection registered on the project's ``Library`` is taken back before the host code binds."""
    import torch

    files = _vllmish("vllm_e")
    files["vllmish/ops/scale_op.py"] = files["vllmish/ops/scale_op.py"].replace(
        "@triton.jit\n", '@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})], '
        'key=["n"])\n@triton.jit\n').replace(
        "scale_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=block_for(x.numel()))",
        "scale_kernel[lambda meta: (triton.cdiv(x.numel(), meta['BLOCK']),)](x, y, x.numel())")
    try:
        result = CliRunner().invoke(main, ["check", "--manifest", str(_write_project(tmp_path, files))])
        assert result.exit_code == 0, result.output
        assert "scale: scale_kernel [@triton.autotune]: 1 variants over (nothing), 2 configs in the space" \
            in result.output
        assert "scale: torch.ops.forge_vllm_e.scale(Tensor x) -> Tensor" in result.output
        # the op stands, defined once: by the bound host code (whose function is the traced one), not introspection's
        assert str(torch.ops.vllm_e.scale_rows.default._schema) == "vllm_e::scale_rows(Tensor x) -> Tensor"
    finally:
        _forget_package("vllmish")


@pytest.mark.slow
def test_a_wheel_of_kernel_files_their_package_init_imports_defines_their_ops_once(tmp_path: Path) -> None:
    """The wheel of that project in a fresh process without Triton or the project: the op first or the package
    first, each kernel file's module-level code runs once (its ``Library`` op defined once, in the package's
    namespace) and the package's modules are the bound host modules."""
    site = _installed(_write_project(tmp_path / "p", _vllmish("vllm_c")), tmp_path)
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        sys.modules["vllmish"] = None
        import torch, forge_vllm_c
        local = "forge_vllm_c._ops._local.vllmish"
        if sys.argv[1] == "package-first":
            __import__(local)
        y = torch.ops.forge_vllm_c.layer(torch.empty(5000, device="meta"))
        import forge_vllm_c._ops.scale_op as scale_host, forge_vllm_c._ops.act as act_host
        pkg = sys.modules[local]
        print(json.dumps({"shape": list(y.shape), "rows": str(torch.ops.forge_vllm_c__vllm_c.scale_rows.default),
                          "same": [pkg.ops.scale_op is scale_host, pkg.silu_mul is act_host.silu_mul]}))
        ''')
    for order in ("op-first", "package-first"):
        assert _run_fresh(check.replace("sys.argv[1]", repr(order)), site) == {
            "shape": [5000], "rows": "forge_vllm_c__vllm_c.scale_rows.default", "same": [True, True]}, order


GRID_PUTS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def gather_kernel(X, idx_ptr, Out, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    i = tl.load(idx_ptr + pid)
    offs = tl.arange(0, BLOCK)
    tl.store(Out + pid * BLOCK + offs, tl.load(X + i * BLOCK + offs))


def gather(x: torch.Tensor, n: int, prepared: dict) -> torch.Tensor:
    placeholder = torch.zeros(n, dtype=torch.int32, device=x.device)
    out = torch.empty(n, 16, dtype=x.dtype, device=x.device)

    def num_program(META, table):
        META["idx_ptr"] = table[META["BLOCK"]]
        return n

    def grid(META):
        return (num_program(META, prepared),)

    gather_kernel[grid](x, placeholder, out, BLOCK=16)
    return out


def examples(device="cpu"):
    x = torch.arange(64, dtype=torch.float32, device=device).view(4, 16)
    gather(x, 2, {16: torch.tensor([3, 1], dtype=torch.int32, device=device)})
'''


def test_arguments_a_grid_function_puts_in_are_recorded_for_the_runtime(tmp_path: Path) -> None:
    """vLLM's causal_conv1d: ``grid(META)`` calls ``num_program(META, ...)``, which sets ``META["batch_ptr"]``;
    Triton launches what the grid function leaves there, the runtime launched the tensor passed. The index names such
    arguments (``grid_args``) and the runtime reads them back (tests/test_c_launch.py::test_a_grid_function_*)."""
    manifest = one_file_project(tmp_path / "p", "forge_gridput", GRID_PUTS, "gather_kernel", ["gather"])
    kp = make_plan(load_manifest(manifest)).kernels["k"]
    assert kp.launches[0].grid_sets == ("idx_ptr",) and kp.spec_json()["grid_args"] == ["idx_ptr"]


CLONED_STATE = '''\
from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def decay_kernel(X, STATE, Out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
    s = tl.load(STATE + offs, mask=m, other=0.0)
    tl.store(Out + offs, (x + s).to(Out.dtype.element_ty), mask=m)
    tl.store(STATE + offs, s * 0.5 + x, mask=m)


def decay(x: torch.Tensor, state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.numel()
    if state is None:
        state = torch.zeros(n, dtype=torch.float32, device=x.device)
    else:
        state = state.clone().contiguous()
    out = torch.empty_like(x)
    decay_kernel[(1,)](x, state, out, n, BLOCK=triton.next_power_of_2(n))
    return out, torch.cat([state, state])


def examples(device="cpu"):
    x = torch.randn(100, dtype=torch.float16, device=device)
    decay(x)
    decay(x, torch.zeros(100, dtype=torch.float32, device=device))
'''


def test_an_optional_state_the_op_clones_is_an_input_not_an_output_buffer(tmp_path: Path) -> None:
    """vLLM's lightning attention clones ``kv_history`` when given one and makes zeros when not (which its kernel
    writes): taken for an output buffer a call passed, the op had no custom op. A call passing a tensor the op
    neither writes nor returns shows it is an input."""
    manifest = one_file_project(tmp_path / "p", "forge_cloned", CLONED_STATE, "decay_kernel", ["decay"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "decay: torch.ops.forge_cloned.decay(Tensor x, Tensor? state=None) -> (Tensor, Tensor)" in result.output


@pytest.mark.gpu
def test_grid_function_arguments_and_a_cloned_state_run_on_the_gpu(tmp_path: Path) -> None:
    """On the GPU, from the wheels in a fresh process without Triton: the gather whose grid function puts the index
    tensor in ``META`` launches that tensor (the placeholder of zeros would gather row 0 everywhere), against the
    same file under Triton's JIT; the decay op leaves the caller's state as it was, as the plain call and as the
    custom op, against a float64 reference."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gather_manifest = one_file_project(tmp_path / "g", "forge_gridput", GRID_PUTS, "gather_kernel", ["gather"])
    decay_manifest = one_file_project(tmp_path / "d", "forge_cloned", CLONED_STATE, "decay_kernel", ["decay"])
    site = _installed(gather_manifest, tmp_path / "w1")
    site2 = _installed(decay_manifest, tmp_path / "w2")
    code = textwrap.dedent(f'''\
        import json, sys
        sys.modules["triton"] = None
        sys.path[:0] = [{str(site2)!r}]
        import torch, forge_gridput, forge_cloned
        torch.manual_seed(0)
        out = {{}}
        for rows, n in ((37, 5), (300, 129)):
            x = torch.randn(rows * 16 + 3, device="cuda")[3:].view(rows, 16)
            idx = torch.randint(0, rows, (n,), dtype=torch.int32, device="cuda")
            got = forge_gridput.gather(x, n, {{16: idx}})
            out[f"gather {{rows}} {{n}}"] = (got - x[idx.long()]).abs().max().item()
        for n in (100, 77, 128):
            x = torch.randn(n + 1, device="cuda", dtype=torch.float16)[1:]
            state = torch.randn(n, device="cuda")
            before = state.clone()
            for name, fn in (("plain", forge_cloned.decay), ("custom op", torch.ops.forge_cloned.decay)):
                o, s = fn(x, state)
                ref_o = x.double() + before.double()
                ref_s = before.double() * 0.5 + x.double()
                out[f"decay {{name}} {{n}}"] = max((o.double() - ref_o).abs().max().item(),
                                                  (s[:n].double() - ref_s).abs().max().item(),
                                                  (s[n:].double() - ref_s).abs().max().item())
                out[f"state kept {{name}} {{n}}"] = bool(torch.equal(state, before))
            o, s = forge_cloned.decay(x)
            out[f"decay none {{n}}"] = max((o.double() - x.double()).abs().max().item(),
                                           (s[:n].double() - x.double()).abs().max().item())
        print(json.dumps(out))
        ''')
    res = _run_fresh(code, site)
    assert len(res) == 17, res
    for name, value in res.items():
        if name.startswith("state kept"):
            assert value is True, name
        else:
            assert value < (1e-3 if name.startswith("decay") else 1e-6), (name, value)
    # the gather file under Triton's JIT launches what its grid function leaves in META, as the wheel does
    jit = textwrap.dedent(f'''\
        import json, sys
        sys.path[:0] = [{str(tmp_path / "g")!r}]
        import torch, k, forge_gridput
        x = torch.randn(300 * 16, device="cuda").view(300, 16)
        idx = torch.randint(0, 300, (129,), dtype=torch.int32, device="cuda")
        print(json.dumps({{"jit": (k.gather(x, 129, {{16: idx}}) - forge_gridput.gather(x, 129, {{16: idx}}))
                          .abs().max().item()}}))
        ''')
    assert _run_fresh(jit, site) == {"jit": 0.0}


KWARGS_OPS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * scale, mask=offs < n)


def fused_scale(x: torch.Tensor, scale: float = 1.0, **kwargs) -> torch.Tensor:
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed")
    block = kwargs.pop("block", 128)
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), scale, BLOCK=block)
    return y


def scale_by_name(*args, **kwargs) -> torch.Tensor:
    return fused_scale(*args, **kwargs)


def examples(device="cpu"):
    x = torch.randn(1000, device=device)
    fused_scale(x, 0.5)
    scale_by_name(x, scale=2.0, block=128)
'''


def test_an_op_taking_kwargs_the_examples_leave_empty_is_a_custom_op(tmp_path: Path) -> None:
    """flash-linear-attention's public ops take ``**kwargs`` (deprecated keywords, ``chunk_size``): the schema leaves
    them out where every traced call leaves them empty (a call passing more runs as Python), and the op table
    records what the schema takes; an op whose examples pass something through them stays Python calls."""
    manifest = one_file_project(tmp_path / "p", "forge_kwargs", KWARGS_OPS, "scale_kernel",
                                ["fused_scale", "scale_by_name"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert ("fused_scale: torch.ops.forge_kwargs.fused_scale(Tensor x, float scale=1.0) -> Tensor (from the type "
            "annotations; without its **kwargs (empty in every traced call") in result.output
    assert "scale_by_name: Python calls only, no custom op (it takes *args and **kwargs and a traced call passes " \
           "something through them)" in result.output
    plan = make_plan(load_manifest(manifest))
    assert plan.modules["k"]["takes"] == {"fused_scale": [2, ["x", "scale"]]}


MIXED_IMPORT = {
    "pkg/__init__.py": "",
    "pkg/utils.py": '''\
import os, triton, math
import sys, triton.language as tl

LOG2 = math.log(2)


@triton.jit
def load_ptr(ptrs, mask):
    return tl.load(ptrs, mask=mask)


def blocks(n):
    return triton.cdiv(n, 1024)
''',
    "pkg/scale.py": '''\
import torch
import triton
import triton.language as tl
from .utils import *


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = load_ptr(x_ptr + offs, offs < n)
    tl.store(y_ptr + offs, x * 2, mask=offs < n)


def scale(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(blocks(n),)](x, y, n, BLOCK=1024)
    return y


def examples(device="cuda"):
    scale(torch.randn(3000, device=device, dtype=torch.float16))
''',
    "kernel_manifest.toml": '''\
[project]
name = "forge_mixedimport"
version = "0.1.0"
targets = ["sm_90"]

[kernels.scale]
source = "pkg/scale.py:scale_kernel"
ops = ["scale"]
examples = "examples"
''',
}


def test_an_import_of_triton_beside_other_modules_is_left_out_of_the_wheels_host_code(tmp_path: Path) -> None:
    """gemlite's ``triton_kernels/utils.py`` starts ``import torch, triton, math``: the statement was kept whole, so
    the wheel's first call imported Triton (``check`` and ``build`` said nothing). Its other modules stay imported,
    its Triton aliases are the runtime's (``tl = triton.language``), line numbers are kept."""
    site = _installed(_write_project(tmp_path / "p", MIXED_IMPORT), tmp_path / "w")
    shipped = (site / "forge_mixedimport" / "_ops" / "_local" / "pkg" / "utils.py").read_text().splitlines()
    assert shipped[:3] == ["import os, math", "import sys; tl = triton.language", ""]
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import forge_mixedimport._ops.scale as m
        from forge_mixedimport._ops._local.pkg import utils
        print(json.dumps({"blocks": m.blocks(3000), "log2": utils.LOG2 > 0, "tl": utils.tl.__name__,
                          "os": utils.os.__name__, "triton": sys.modules.get("triton") is not None}))
        ''')
    res = _run_fresh(code, site)
    assert res == {"blocks": 3, "log2": True, "tl": "triton.language", "os": "os", "triton": False}, res


HOPPER_ONLY = {
    "hopper_only.py": '''\
import functools

import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@functools.lru_cache
def get_device_props(device=None):
    props = torch.cuda.get_device_properties(device)
    return dict(major=props.major, sms=props.multi_processor_count)


def copy(x: torch.Tensor) -> torch.Tensor:
    if get_device_props(x.device.index)["major"] < 9:
        return x.clone()  # a torch fallback off Hopper, as lmdeploy's compact MoE path
    y = torch.empty_like(x)
    copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
''',
    "ex.py": '''\
import torch
from hopper_only import copy


def examples(device="cuda"):
    copy(torch.randn(3000, device=device))
''',
    "kernel_manifest.toml": '''\
[project]
name = "forge_hopperonly"
version = "0.1.0"
targets = ["sm_80", "sm_90"]

[kernels.copy]
source = "hopper_only.py:copy_kernel"
targets = ["sm_90"]
examples = "ex.py:examples"

[exports]
examples = "ex.py"
''',
}


def test_a_device_asking_kernel_whose_examples_live_in_another_file_is_traced_on_every_target(
        tmp_path: Path) -> None:
    """lmdeploy's compact MoE kernels run only where the host code sees a Hopper GPU; with the examples in a file of
    their own and targets sm_80 and sm_90, the build traced the examples as the A100 only (the other GPUs re-ran the
    asking module alone, whose file has no examples): "no traced call launches it"."""
    plan = make_plan(load_manifest(_write_project(tmp_path / "p", HOPPER_ONLY)))
    assert dict(plan.kernels["copy"].params)["x_ptr"] == "*fp32"
    # the examples file is one because the package exports its function: which the wheel ships (it had left the
    # function out, so ``forge_hopperonly.examples`` raised AttributeError)
    assert "def examples(" in plan.modules["ex"]["host_source"]
    # unexported (session 47): traced as well, on every target, and shipped without the examples
    files = dict(HOPPER_ONLY)
    files["kernel_manifest.toml"] = files["kernel_manifest.toml"].split("[exports]")[0]
    plan = make_plan(load_manifest(_write_project(tmp_path / "q", files)))
    assert dict(plan.kernels["copy"].params)["x_ptr"] == "*fp32"
    assert "def examples(" not in plan.modules["ex"]["host_source"]


LOCAL_IMPORT_EXAMPLES = {
    "pkg/__init__.py": "",
    "pkg/scale.py": '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x):
    y = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y


def scale_twice(x):
    return scale(scale(x))
''',
    "pkg/examples.py": '''\
import torch


def examples(device="cuda"):
    from pkg.scale import scale
    import pkg.scale

    scale(torch.randn(3000, device=device, dtype=torch.float16))
    pkg.scale.scale_twice(torch.randn(1000, device=device, dtype=torch.float16))
''',
    "kernel_manifest.toml": '''\
[project]
name = "forge_localimport"
version = "0.1.0"
targets = ["sm_90"]

[kernels.scale]
source = "pkg/scale.py:scale_kernel"
ops = ["scale", "scale_twice"]
examples = "pkg/examples.py:examples"

[exports]
examples = "pkg/examples.py"
''',
}


def test_ops_an_examples_function_imports_inside_itself_are_recorded(tmp_path: Path) -> None:
    """lmdeploy-style examples import the op inside the function (``from ...w8a8_triton_kernels import ...``) or
    call it as ``module.op``: only ops bound as the examples module's globals were recorded, so the op had no
    schema and the note said no examples called it."""
    result = CliRunner().invoke(main, ["check", "--manifest", str(_write_project(tmp_path / "p",
                                                                                 LOCAL_IMPORT_EXAMPLES))])
    assert result.exit_code == 0, result.output
    assert "scale: torch.ops.forge_localimport.scale(Tensor x) -> Tensor (from the traced examples)" in result.output
    assert "scale_twice: torch.ops.forge_localimport.scale_twice(Tensor x) -> Tensor (from the traced examples)" \
        in result.output


ARCH_PRUNE = '''\
import torch
import triton
import triton.language as tl


def _config_prune_func(configs, nargs, **kwargs):
    major = torch.cuda.get_device_capability()[0]
    return configs[:2] if major >= 9 else configs[2:]


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 8), (128, 8), (64, 4), (32, 2))],
                 key=["n"], prune_configs_by={"early_config_prune": _config_prune_func})
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    scale_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    return y


def examples(device="cpu"):
    scale(torch.randn(1000, device=device))
'''


def test_a_pruning_hook_that_asks_the_gpu_prunes_for_each_target(tmp_path: Path) -> None:
    """lmdeploy's fused MoE prunes its autotune configs by ``torch.cuda.get_device_capability()``: the hook ran
    outside the per-target device answers and failed on the CPU build machine (its rows took the whole space, the
    Hopper config first on every target). It runs as a GPU of each target, each target's rows taking its configs."""
    manifest = one_file_project(tmp_path / "p", "forge_archprune", ARCH_PRUNE, "scale_kernel", ["scale"])
    manifest.write_text(manifest.read_text().replace('targets = ["sm_90"]', 'targets = ["sm_80", "sm_90"]'))
    plan = make_plan(load_manifest(manifest))
    assert not any("unpruned" in n for n in plan.kernels["k"].notes), plan.kernels["k"].notes
    firsts = {e.target: e.tables["default"][0].preferences[0].meta["BLOCK"] for e in plan.entries}
    assert firsts == {"sm_80": 64, "sm_90": 256}, firsts


UNSLOTH_LOGGED = '''\
import logging

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def log_kernel_info(compiled_kernel: triton.compiler.CompiledKernel):
    kernel_name = compiled_kernel.name
    nregs = compiled_kernel.n_regs
    nspills = compiled_kernel.n_spills
    metadata = compiled_kernel.metadata
    logger.debug(f"{kernel_name}: n_regs={nregs} n_spills={nspills} metadata={metadata}")
    return kernel_name, metadata.num_warps


def scale(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    kernel = _scale_kernel if x.numel() > 0 else None
    compiled_kernel: triton.compiler.CompiledKernel = kernel[(triton.cdiv(x.numel(), 256),)](
        x, y, x.numel(), BLOCK=256, num_warps=4)
    assert log_kernel_info(compiled_kernel) == ("_scale_kernel", 4)
    # Unsloth logs kernel.best_config after an autotuned launch: None where no binary ran (the trace, a Meta call)
    assert kernel.best_config is None or kernel.best_config.num_warps == 4
    return y


def examples(device="cpu"):
    scale(torch.randn(1000, device=device))
'''


def test_what_a_launch_returns_is_a_compiled_kernel_as_tritons(tmp_path: Path) -> None:
    """Unsloth's MoE GEMMs (``grouped_gemm/interface.py``) log what ``kernel[grid](**kernel_args)`` returns, Triton's
    ``CompiledKernel``: ``.name``, ``.n_regs``, ``.n_spills``, ``.metadata``, after every launch, the kernel picked
    into a local first (``kernel = A if ... else B``). The build's trace returned None there and the examples failed;
    so did the wheel's launch (and its Meta implementation's). Now the trace and a Meta implementation return a
    placeholder compiled kernel (no binary runs there), the wheel's launch its binary's (tests/test_c_launch_gpu.py)."""
    manifest = one_file_project(tmp_path / "p", "forge_unsloth_logged", UNSLOTH_LOGGED, "_scale_kernel", ["scale"])
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "scale: torch.ops.forge_unsloth_logged.scale(Tensor x) -> Tensor" in result.output, result.output
    site = _installed(manifest, tmp_path / "w")
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_unsloth_logged
        y = torch.ops.forge_unsloth_logged.scale(torch.empty(5000, device="meta"))  # the Meta implementation
        print(json.dumps({"shape": list(y.shape), "compiled": "forge_unsloth_logged._runtime.compiled" in sys.modules}))
        ''')
    assert _run_fresh(check, site) == {"shape": [5000], "compiled": True}



def test_a_launch_result_asks_the_driver_its_figures_once() -> None:
    """Unsloth logs ``n_regs``, ``n_spills`` and ``metadata`` after every launch (its f-string is built whatever the
    log level): the launch result reads them from one ``CompiledKernel``, made on the first read, so the driver's
    function attributes (about 0.13 ms each on the H100 host) are asked once per binary, not per launch."""
    from forge_aot.runtime.fastpath import Launched

    asked = []

    class Driver:
        def function_attributes(self, function):
            asked.append(function)
            return (40, 0, 1024)

    class Launcher:  # the figures a _BinaryLauncher holds
        symbol, shared, block, global_scratch, profile_scratch, function, cuda = "k", 0, 128, 0, 0, 7, False
        drv = Driver()

    class Kernel:
        function = "k"

    class Config:
        num_stages = 3

    kernel = Kernel()
    kernel.targets = {"sm_90": {"backend": "cuda", "arch": 90, "warp_size": 32}}
    result = Launched(kernel, Launcher(), Config(), {}, "sm_90")
    for _ in range(3):
        assert (result.name, result.n_regs, result.n_spills, result.metadata.num_warps) == ("k", 40, 0, 4)
    assert asked == [7]

FIND_SPEC = {
    "xfm/__init__.py": "",
    "xfm/utils.py": '''\
import importlib.util

import torch.utils._triton
from torch.utils._triton import has_triton as torch_has_triton


def is_triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None and torch_has_triton() \\
        and torch.utils._triton.has_triton_package()
''',
    "xfm/double.py": '''\
from importlib.util import find_spec

import torch

from xfm.utils import is_triton_available

HAS_TRITON = find_spec("triton") is not None

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def double(x: torch.Tensor) -> torch.Tensor:
    if not (HAS_TRITON and is_triton_available()):
        raise RuntimeError("the torch fallback")
    y = torch.empty_like(x)
    double_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y


def examples(device="cpu"):
    double(torch.randn(1000, device=device))
''',
    "kernel_manifest.toml": '''\
[project]
name = "forge_find_spec"
version = "0.1.0"
targets = ["sm_90"]

[kernels.double]
source = "xfm/double.py:double_kernel"
ops = ["double"]
examples = "examples"
''',
}


def test_a_triton_installed_test_by_find_spec_answers_as_the_build_did(tmp_path: Path) -> None:
    """``HAS_TRITON = importlib.util.find_spec("triton") is not None`` (xformers' and many utils modules' test), and
    torch's ``has_triton()`` (torchao's): the wheel's host code asked them again in a process without Triton, got
    False and took the library's fallback, silently. The build, which imports Triton, answers them: the shipped code
    reads True, in the kernel file and in a helper module it imports. While the build traces, torch's own
    ``has_triton()`` answers as the GPU traced for (it asks the device; a CPU machine's cached False had stood)."""
    import torch.utils._triton

    torch.utils._triton.has_triton.cache_clear()
    assert not torch.utils._triton.has_triton() or torch.cuda.is_available()  # cached False, as on a CPU machine
    site = _installed(_write_project(tmp_path / "p", FIND_SPEC), tmp_path)
    shipped = (site / "forge_find_spec" / "_ops" / "double.py").read_text()
    assert "HAS_TRITON = (True) is not None" in shipped and "find_spec(" not in shipped, shipped
    helper = (site / "forge_find_spec" / "_ops" / "_local" / "xfm" / "utils.py").read_text()
    assert "return (True) is not None and (True) \\\n        and (True)\n" in helper, helper
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_find_spec
        y = torch.ops.forge_find_spec.double(torch.empty(5000, device="meta"))  # raised "the torch fallback"
        print(json.dumps({"shape": list(y.shape)}))
        ''')
    assert _run_fresh(check, site) == {"shape": [5000]}


SAGE_KERNEL = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def {kernel}(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * {factor}, mask=offs < n)


def per_block_int8(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty({shape}, device=x.device, dtype=x.dtype)
    n = x.numel()
    {kernel}[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)
    return y
'''
SAGE = {
    # SageAttention 1.0.6's layout: per_block_int8 defined in two files, both imported by the package under aliases
    "sage/__init__.py": "from .core import sageattn\n",
    "sage/quant.py": SAGE_KERNEL.format(kernel="quant_kernel", factor=2, shape="x.shape"),
    "sage/quant_varlen.py": SAGE_KERNEL.format(kernel="quant_varlen_kernel", factor=3, shape="(x.numel() + 1,)"),
    "sage/core.py": textwrap.dedent('''\
        import torch

        from .quant import per_block_int8
        from .quant_varlen import per_block_int8 as per_block_int8_varlen


        def sageattn(x: torch.Tensor, varlen: bool = False) -> torch.Tensor:
            return per_block_int8_varlen(x) if varlen else per_block_int8(x)


        def examples(device="cpu"):
            for varlen in (False, True):
                sageattn(torch.randn(1000, device=device, dtype=torch.float16), varlen)
        '''),
    # an exported class: its package routes host code's calls of ops by name to their custom ops (torch_ops)
    "sage/layer.py": "import torch\n\nfrom .quant_varlen import per_block_int8\n\n\nclass Quant(torch.nn.Module):\n"
                     "    def forward(self, x):\n        return per_block_int8(x)\n\n\n"
                     "def sageattn(x):  # only shares the op's name (SageAttention: forward in six files)\n"
                     "    return x\n",
    "kernel_manifest.toml": textwrap.dedent('''\
        [project]
        name = "forge_sage"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.quant]
        source = "sage/quant.py:quant_kernel"
        ops = ["per_block_int8"]
        examples = "sage/core.py:examples"

        [kernels.quant_varlen]
        source = "sage/quant_varlen.py:quant_varlen_kernel"
        examples = "sage/core.py:examples"

        [ops.per_block_int8_varlen]
        source = "sage/quant_varlen.py"
        function = "per_block_int8"

        [ops.sageattn]
        source = "sage/core.py"
        examples = "examples"

        [exports]
        Quant = "sage/layer.py"
        '''),
}


def test_an_op_exported_under_another_name_beside_its_namesake(tmp_path: Path) -> None:
    """SageAttention defines ``per_block_int8`` in two files (and ``forward`` in six); both could not be exported:
    "op 'per_block_int8' is also exported by kernels.quant", and no manifest key renamed one. ``[ops.NAME] function``
    exports a host function under the entry's name: here the package's ``per_block_int8_varlen`` and its custom op,
    each reaching its own file's function, in a fresh process without Triton."""
    site = _installed(_write_project(tmp_path / "p", SAGE), tmp_path)
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_sage
        x = torch.empty(1000, device="meta", dtype=torch.float16)
        shapes = {op: list(getattr(torch.ops.forge_sage, op)(x).shape) for op in ("per_block_int8",
                  "per_block_int8_varlen")}
        refused = {}
        for op in ("per_block_int8", "per_block_int8_varlen"):
            try:
                getattr(forge_sage, op)(torch.randn(8, dtype=torch.float16))
            except Exception as exc:
                refused[op] = str(exc).split("(")[0]
        forge_sage.Quant()  # binds its module
        import forge_sage._ops.core
        routed = {m: getattr(sys.modules[f"forge_sage._ops.{m}"], "per_block_int8").__kwdefaults__["_op"]
                  for m in ("quant", "quant_varlen", "layer")}
        namesakes = {m: hasattr(sys.modules[f"forge_sage._ops.{m}"].sageattn, "__forge_host__") for m in ("core",
                     "layer")}
        print(json.dumps({"shapes": shapes, "refused": refused, "all": sorted(forge_sage.__all__), "routed": routed,
                          "namesakes": namesakes}))
        ''')
    out = _run_fresh(check, site)
    # the op's own function is routed; layer's function that only shares the op's name is left alone (before, host
    # code calling it under a custom op's backward or torch.compile reached torch.ops.forge_sage.sageattn)
    assert out["namesakes"] == {"core": True, "layer": False}, out
    # each module's global reaches its own function's op: the layer's is quant_varlen's function, imported by its
    # name (bound after quant_varlen, so routed there already), not the op of that name
    assert out["routed"] == {"quant": "per_block_int8", "quant_varlen": "per_block_int8_varlen",
                             "layer": "per_block_int8_varlen"}, out
    assert out["shapes"] == {"per_block_int8": [1000], "per_block_int8_varlen": [1001]}, out
    assert out["refused"] == {"per_block_int8": "quant_kernel", "per_block_int8_varlen": "quant_varlen_kernel"}, out
    assert out["all"] == ["Quant", "per_block_int8", "per_block_int8_varlen", "preload", "sageattn"]


@pytest.mark.parametrize(("edits", "message"), [
    ([('[ops.per_block_int8_varlen]\nsource = "sage/quant_varlen.py"\nfunction = "per_block_int8"\n', ""),
      ('source = "sage/quant_varlen.py:quant_varlen_kernel"\n',
       'source = "sage/quant_varlen.py:quant_varlen_kernel"\nops = ["per_block_int8"]\n')],
     "kernels.quant_varlen.ops: op 'per_block_int8' is also exported by kernels.quant: export this file's under "
     "another name ([ops.<name>] source = \"sage/quant_varlen.py\", function = \"per_block_int8\")"),
    ([('function = "per_block_int8"', 'function = "per_block_int9"')],
     "ops.per_block_int8_varlen.function: no host function 'per_block_int9' in sage/quant_varlen.py"),
    ([('source = "sage/quant_varlen.py"\nfunction', 'source = "sage/quant.py"\nfunction')],
     "ops.per_block_int8_varlen.function: sage/quant.py's 'per_block_int8' is exported already, by kernels.quant"),
    ([('function = "per_block_int8"\n', "")],
     "ops.per_block_int8_varlen.source: 'sage/quant_varlen.py' defines kernels of this manifest"),
])
def test_a_renamed_op_is_checked(tmp_path: Path, edits: list[tuple[str, str]], message: str) -> None:
    files = dict(SAGE)
    for old, new in edits:
        assert old in files["kernel_manifest.toml"]
        files["kernel_manifest.toml"] = files["kernel_manifest.toml"].replace(old, new)
    result = CliRunner().invoke(main, ["check", "--manifest", str(_write_project(tmp_path, files))])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert message in result.output, result.output


def test_development_mode_binds_a_renamed_op_to_its_own_function(tmp_path: Path) -> None:
    from forge_aot.dev import load_dev_ops

    manifest = _write_project(tmp_path / "p", SAGE)
    sys.path.insert(0, str(manifest.parent))
    try:
        ops = load_dev_ops(manifest)
    finally:
        sys.path.remove(str(manifest.parent))
        _forget_package("sage")
    assert {"per_block_int8", "per_block_int8_varlen", "sageattn"} <= set(ops)
    assert ops["per_block_int8"].__module__.endswith("._ops.quant")
    assert ops["per_block_int8_varlen"].__module__.endswith("._ops.quant_varlen")


KWARGS_PRUNE = '''\
import torch
import triton
import triton.language as tl


def prune_by_dtype(configs, args, **kwargs):
    x = kwargs["x_ptr"]  # Unsloth's prune_kernel_configs_fwd: the launch passes everything by keyword
    return [c for c in configs if c.kwargs["BLOCK"] * x.element_size() <= 512]


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=4) for b in (512, 256, 128)], key=["n"],
                 prune_configs_by={"early_config_prune": prune_by_dtype})
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    kernel_args = {"x_ptr": x, "y_ptr": y, "n": x.numel()}
    scale_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](**kernel_args)
    return y


def examples(device="cpu"):
    for dtype in (torch.float16, torch.float32):
        scale(torch.randn(1000, device=device, dtype=dtype))
'''


def test_a_pruning_hook_reads_the_arguments_a_call_passes_by_keyword(tmp_path: Path) -> None:
    """Triton hands an ``early_config_prune`` the call's keyword arguments as ``**kwargs``; Unsloth's MoE GEMMs launch
    ``kernel[grid](**kernel_args)`` and their pruner reads ``kwargs["x_ptr"]``. The build passed only the runtime
    arguments some launch site names by keyword (none there): KeyError, and every row took the space unpruned."""
    manifest = one_file_project(tmp_path / "p", "forge_kwprune", KWARGS_PRUNE, "scale_kernel", ["scale"],
                                extra='signature = { x_ptr = "*T" }\ndtypes = { T = ["fp16", "fp32"] }\n')
    plan = make_plan(load_manifest(manifest))
    assert not any("pruning hook" in n for n in plan.kernels["k"].notes), plan.kernels["k"].notes
    blocks = {e.assignment["T"]: [c.meta["BLOCK"] for c in e.tables["default"][0].preferences] for e in plan.entries}
    assert blocks == {"fp16": [256, 128], "fp32": [128]}, blocks


TRITON_OP_AUTOGRAD = '''\
import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


@triton_op("mylib::scale2", mutates_args=())
def scale2(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    wrap_triton(scale_kernel)[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y


def _setup(ctx, inputs, output):
    pass


def _backward(ctx, grad):
    return scale2(grad)


scale2.register_autograd(_backward, setup_context=_setup)


def examples(device="cpu"):
    for dtype in (torch.float16, torch.float32):
        scale2(torch.randn(1000, device=device, dtype=dtype))
        scale2(torch.randn(1000, device=device, dtype=dtype, requires_grad=True)).sum().backward()
'''


def test_a_triton_op_trains_through_the_autograd_registered_on_it(tmp_path: Path) -> None:
    """PyTorch's way to train through a ``@triton_op`` is ``op.register_autograd(backward, setup_context=...)``
    (axolotl 0.19's Gemma-4 fused RMSNorm + RoPE); the runtime's ``triton_op`` returned the bare function: "'function'
    object has no attribute 'register_autograd'" at import, so the build refused the file. A call that needs
    gradients now goes through the op with that autograd (its output has a grad_fn); others run the function."""
    manifest = one_file_project(tmp_path / "p", "forge_tritonop_ag", TRITON_OP_AUTOGRAD, "scale_kernel", ["scale2"],
                                extra='signature = { x_ptr = "*T" }\ndtypes = { T = ["fp16", "fp32"] }\n')
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    site = _installed(manifest, tmp_path / "w")
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_tritonop_ag
        try:  # no gradient needed: the function itself, whose launch refuses a CPU tensor
            forge_tritonop_ag.scale2(torch.randn(7))
        except Exception as exc:
            plain = type(exc).__name__
        # a gradient needed: through the op and its autograd (a meta input: the op's fake, no launch)
        trained = forge_tritonop_ag.scale2(torch.empty(7, device="meta", requires_grad=True))
        by_op = torch.ops.forge_tritonop_ag.scale2(torch.empty(7, device="meta", dtype=torch.float16))
        print(json.dumps({"plain": plain, "trained": [list(trained.shape), type(trained.grad_fn).__name__],
                          "op": [list(by_op.shape), str(by_op.dtype)]}))
        ''')
    out = _run_fresh(check, site)
    assert out["plain"] == "UnsupportedDeviceError" and out["op"] == [[7], "torch.float16"], out
    assert out["trained"][0] == [7] and out["trained"][1] not in ("NoneType", ""), out


CUSTOM_OP_FAKE = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)
    tl.store(y_ptr + offs, (x * tl.sigmoid(x)).to(y_ptr.dtype.element_ty), mask=offs < n)


@torch.library.custom_op("mylib::silu", mutates_args=())
def silu(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device="cuda")  # axolotl's geglu_forward allocates so
    n = x.numel()
    silu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y


@silu.register_fake
def _(x):
    return torch.empty_like(x)


def examples(device="cpu"):
    silu(torch.randn(1000, device=device, dtype=torch.float16))
'''


def test_a_custom_ops_meta_implementation_is_the_fake_its_author_registered(tmp_path: Path) -> None:
    """axolotl's ``geglu_forward``/``swiglu_forward``: a ``@torch.library.custom_op`` allocating its output on
    ``"cuda"``, with a ``register_fake`` returning ``empty_like``. The package op's Meta implementation ran the body
    (launches skipped), whose allocation needs CUDA: ``torch.ops.<package>.silu`` on meta tensors raised "Torch not
    compiled with CUDA enabled" on a CPU-only torch (and allocated on the GPU elsewhere); it takes the author's
    fake."""
    manifest = one_file_project(tmp_path / "p", "forge_opfake", CUSTOM_OP_FAKE, "silu_kernel", ["silu"])
    site = _installed(manifest, tmp_path / "w")
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_opfake
        y = torch.ops.forge_opfake.silu(torch.empty(5, 33, device="meta", dtype=torch.float16))
        print(json.dumps([list(y.shape), str(y.dtype), y.device.type]))
        ''')
    assert _run_fresh(check, site) == [[5, 33], "torch.float16", "meta"]


CUSTOM_OP_CALLERS = {
    # axolotl's LoRA MLP (lora.py) calls its swiglu_forward custom op, which allocates on "cuda" (swiglu.py)
    "mylib/__init__.py": "",
    "mylib/act.py": CUSTOM_OP_FAKE.replace("def examples", "def _unused_examples"),
    "mylib/mlp.py": "import torch\n\nfrom .act import silu\n\n\n"
                    "def mlp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:\n    return silu(x @ w)\n",
    "ex.py": textwrap.dedent('''\
        import torch

        from mylib.act import silu
        from mylib.mlp import mlp


        def examples(device="cpu"):
            x = torch.randn(5, 33, dtype=torch.float16, device=device)
            silu(x)
            mlp(x, torch.randn(33, 77, dtype=torch.float16, device=device))
        '''),
    "kernel_manifest.toml": textwrap.dedent('''\
        [project]
        name = "forge_opcallers"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.silu]
        source = "mylib/act.py:silu_kernel"
        ops = ["silu"]
        examples = "ex.py:examples"

        [ops.mlp]
        source = "mylib/mlp.py"

        [exports]
        examples = "ex.py"
        '''),
}


def test_a_custom_op_another_module_calls_runs_its_body_as_a_direct_call_does(tmp_path: Path) -> None:
    """The trace runs host code with its tensors answering as CUDA ones (a torch-function mode); a direct call of a
    ``@torch.library.custom_op`` ran its function under that mode, but a call from another module went through
    torch's dispatcher, outside it: the body's ``device="cuda"`` allocation raised on a CPU build machine (axolotl's
    LoRA MLP calling ``swiglu_forward``). The op's body now runs under the mode either way."""
    result = CliRunner().invoke(main, ["check", "--manifest", str(_write_project(tmp_path, CUSTOM_OP_CALLERS))])
    assert result.exit_code == 0, result.output
    assert "mlp: torch.ops.forge_opcallers.mlp(Tensor x, Tensor w) -> Tensor" in result.output, result.output


HEURISTIC_ASKS_GPU = '''\
import torch
import triton
import triton.language as tl


def get_num_stages(BLOCK):
    # FlagAttention's paged.py: a launch option chosen per GPU, in a heuristic
    return 3 if torch.cuda.get_device_capability() == (8, 0) else 1


@triton.heuristics({"num_stages": lambda args: get_num_stages(args["BLOCK"])})
@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def copy(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    copy_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


def examples(device="cpu"):
    copy(torch.randn(1000, device=device))
'''


def test_a_heuristic_asking_the_gpu_answers_as_each_target(tmp_path: Path) -> None:
    """FlagAttention's paged attention picks ``num_stages`` in a ``@triton.heuristics`` by
    ``torch.cuda.get_device_capability()``: the plan evaluated heuristics outside the target GPU's answers, and a
    CPU build machine's torch raised ("Torch not compiled with CUDA enabled", a traceback from ``check``). Each
    target's binaries now carry the value its GPU gives, as the wheel computes it there; a heuristic that fails
    is a clean error naming it."""
    manifest = one_file_project(tmp_path / "p", "forge_heurgpu", HEURISTIC_ASKS_GPU, "copy_kernel", ["copy"])
    manifest.write_text(manifest.read_text().replace('targets = ["sm_90"]', 'targets = ["sm_80", "sm_90"]'))
    plan = make_plan(load_manifest(manifest))
    stages = {e.target: {dict(b.heur)["num_stages"] for row in e.tables["default"]
                         for b in plan.binaries_for(e, row.key, row.preferences[0])} for e in plan.entries}
    assert stages == {"sm_80": {3}, "sm_90": {1}}, stages
    broken = manifest.parent / "k.py"
    broken.write_text(HEURISTIC_ASKS_GPU.replace("return 3 if", "return 1 // 0 if"))
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "the heuristic for num_stages of copy_kernel failed: ZeroDivisionError" in result.output, result.output


DEVICE_OF = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    device = torch.cuda.device_of(x)  # FlagAttention's every op (total.py, flash.py, paged.py...)
    with torch.cuda.device(device):
        scale_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


def examples(device="cpu"):
    scale(torch.randn(1000, device=device))
'''


def test_a_device_switch_by_device_of_switches_nothing_on_meta_tensors(tmp_path: Path) -> None:
    """``with torch.cuda.device(torch.cuda.device_of(x)):`` in host code: the Meta implementation replaces
    ``torch.cuda.device`` (a meta tensor has no device to switch to), and torch read a ``device_of`` object, an
    instance of the class replaced, as no device: "'<' not supported between instances of 'NoneType' and 'int'"
    from ``torch.ops.<package>.<op>`` on meta tensors."""
    site = _installed(one_file_project(tmp_path / "p", "forge_deviceof", DEVICE_OF, "scale_kernel", ["scale"]),
                      tmp_path / "w")
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_deviceof
        y = torch.ops.forge_deviceof.scale(torch.empty(300, device="meta"))
        print(json.dumps([list(y.shape), y.device.type]))
        ''')
    assert _run_fresh(check, site) == [[300], "meta"]


HELPER_LAUNCH = {
    # mlstm_kernels 2.0.6: the op file (fwbw.py) calls a helper module (fw_recurrent.py) that launches the kernel,
    # imported through its package __init__, with num_stages= and num_warps=
    "kernel_manifest.toml": textwrap.dedent('''\
        [project]
        name = "forge_helperlaunch"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.add]
        source = "pkg/kernels/add.py:add_kernel"
        examples = "pkg/host/op.py:examples"
        signature = { x_ptr = "*T", y_ptr = "*T", out_ptr = "*T" }
        dtypes = { T = ["fp32", "fp16"] }

        [ops.my_add]
        source = "pkg/host/op.py"
        '''),
    "pkg/__init__.py": "",
    "pkg/host/__init__.py": "",
    "pkg/host/launch.py": textwrap.dedent('''\
        import torch
        import triton

        from ..kernels import add_kernel


        def launch_add(x, y, num_warps=None):
            out = torch.empty_like(x)
            n = x.numel()
            num_warps = 4 if num_warps is None else num_warps
            add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK_SIZE=1024, num_warps=num_warps, num_stages=1)
            return out
        '''),
    "pkg/host/op.py": textwrap.dedent('''\
        import torch

        from .launch import launch_add


        def my_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return launch_add(x, y)


        def examples(device="cpu"):
            for dt in (torch.float32, torch.float16):
                x = torch.randn(1000, dtype=dt, device=device)
                my_add(x, x)
        '''),
    "pkg/kernels/__init__.py": "from .add import add_kernel\n",
    "pkg/kernels/add.py": textwrap.dedent('''\
        import triton
        import triton.language as tl


        @triton.jit
        def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
            offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
            mask = offs < n_elements
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
        '''),
}


def test_launch_options_in_a_helper_module_the_op_file_imports_are_call_site_options(tmp_path: Path) -> None:
    """mlstm_kernels launches every chunkwise kernel from a helper module (``fw_recurrent.py``) that its op file
    reaches through another (``fwbw.py`` -> ``fw.py``), passing ``num_warps=``/``num_stages=``: only the kernel file's
    and op files' launches counted, so those options were not built and the examples were refused ("the call passes
    num_stages=1, but num_stages was not built as a call-site option"). The project's helper modules' launches count
    too."""
    result = CliRunner().invoke(main, ["check", "--manifest", str(_write_project(tmp_path, HELPER_LAUNCH))])
    assert result.exit_code == 0, result.output
    assert "launched in launch_add() in pkg/host/launch.py line 11: passes BLOCK_SIZE, num_warps, num_stages" \
        in result.output, result.output


RESULTS_BY_TWO_FLAGS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x: torch.Tensor, return_lse: bool = False, return_total: bool = False):
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    if True in (return_lse, return_total):  # FlagAttention's flash attention: has_extra_return
        return y, (x.sum() if return_lse else None), (x.amax() if return_total else None)
    return y


def examples(device="cpu"):
    x = torch.randn(1000, device=device)
    scale(x)
    scale(x, return_lse=True)
'''


def test_results_whose_structure_follows_an_argument_the_examples_left_alone_are_refused(tmp_path: Path) -> None:
    """FlagAttention's flash attention returns one tensor, or a tuple where any of three flags is set; examples that
    vary one flag give a rule by that flag alone, and a call setting another had its extra results dropped by the
    custom op (torch.compile's path) silently. The op now refuses such a call, saying what to add to the examples."""
    manifest = one_file_project(tmp_path / "p", "forge_twoflags", RESULTS_BY_TWO_FLAGS, "scale_kernel", ["scale"])
    site = _installed(manifest, tmp_path / "w")
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_twoflags
        x = torch.empty(1000, device="meta")
        shapes = [list(torch.ops.forge_twoflags.scale(x, True)[0].shape)]
        try:
            torch.ops.forge_twoflags.scale(x, False, True)
            refused = ""
        except Exception as exc:
            refused = str(exc)
        print(json.dumps({"shapes": shapes, "refused": refused}))
        ''')
    out = _run_fresh(check, site)
    assert out["shapes"] == [[1000]], out
    assert "returned 3 results where the build saw one for return_lse=False" in out["refused"], out


def test_a_kernel_only_the_examples_launch_is_noted(tmp_path: Path) -> None:
    """The flashinfer hunt: its page kernel is launched from CUDA-side host code, so the hunt's examples file
    launched it directly; ``check`` listed the launch and said nothing of the wheel having no way to reach the
    binaries. It now notes that only build-time code launches it; a kernel an op launches is not noted."""
    kernel = textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def fill_kernel(out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, offs, mask=offs < n)
        ''')
    op = textwrap.dedent('''\


        def filled(n: int, device: str = "cuda") -> torch.Tensor:
            out = torch.empty(n, dtype=torch.int32, device=device)
            fill_kernel[(triton.cdiv(n, 128),)](out, n, BLOCK=128)
            return out
        ''')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "page.py").write_text(kernel)
    (tmp_path / "examples.py").write_text(textwrap.dedent('''\
        import torch
        from pkg.page import fill_kernel


        def examples(device="cpu"):
            out = torch.empty(300, dtype=torch.int32, device=device)
            fill_kernel[(3,)](out, 300, BLOCK=128)
        '''))
    manifest = tmp_path / "kernel_manifest.toml"
    head = '[project]\nname = "forge_examples_only"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n'
    manifest.write_text(head + '[kernels.fill]\nsource = "pkg/page.py:fill_kernel"\n'
                        'examples = "examples.py:examples"\n')
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "note: only build-time code launches it (examples() in examples.py line 7): no op or export of the " \
        "package does, so its binaries serve only code that launches the kernel's handle itself" in result.output, \
        result.output
    (tmp_path / "pkg" / "page.py").write_text(kernel + op)
    (tmp_path / "examples.py").write_text("from pkg.page import filled\n\n\ndef examples(device='cpu'):\n"
                                          "    filled(300, device)\n")
    manifest.write_text(head + '[kernels.fill]\nsource = "pkg/page.py:fill_kernel"\nops = ["filled"]\n'
                        'examples = "examples.py:examples"\n')
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "only build-time code launches it" not in result.output and "filled: torch.ops" in result.output, \
        result.output
