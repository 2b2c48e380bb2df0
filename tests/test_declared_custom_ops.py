"""Ops' custom ops in the styles session 49's hunts met (scattermoe, native-sparse-attention-triton): a
``@torch.library.custom_op`` whose ``mutates_args`` leaves out an argument its kernel writes, an autograd Function
applied inside a function (whose custom op has no backward either), a 0-dim tensor given a factory as a size."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from forge_aot.manifest import load_manifest
from forge_aot.plan import make_plan
from tests.test_localmods import _installed, _run_fresh, one_file_project

MUTATES_TOO_LITTLE = '''\
from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def _two(x_ptr, dw_ptr, db_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(dw_ptr + offs, x * 2, mask=m)
    if db_ptr is not None:
        tl.store(db_ptr + offs, x + 1, mask=m)


@torch.library.custom_op("mylib::two", mutates_args={"DW"})
def two_compileable(DW: torch.Tensor, Db: Optional[torch.Tensor], x: torch.Tensor) -> None:
    n = x.numel()
    _two[(triton.cdiv(n, 128),)](x, DW, Db, n, BLOCK=128)


def two(x, has_bias=False):
    DW = torch.zeros_like(x)
    Db = torch.zeros_like(x) if has_bias else None
    two_compileable(DW, Db, x)
    return DW, Db


def examples(device="cpu"):
    x = torch.randn(1000, device=device)
    two(x, has_bias=True)
    two(x, has_bias=False)
'''
"""scattermoe's ``groupXtY_compileable``: ``mutates_args={"DW"}``, and its kernel writes ``Db`` where given."""


def test_a_declared_custom_op_gets_the_writes_its_mutates_args_leaves_out(tmp_path: Path) -> None:
    """The schema marks ``Db`` written, saying why; before, the author's schema was taken as it was, and the wheel's
    guard refused every call through the custom op that passed ``Db`` (torch.compile, ``torch.ops``), even at the
    examples' own shapes, telling to add an example call that was already there."""
    manifest = one_file_project(tmp_path / "p", "forge_mutates", MUTATES_TOO_LITTLE, "_two", ["two_compileable"])
    plan = make_plan(load_manifest(manifest))
    assert plan.modules["k"]["schemas"]["two_compileable"] == "(Tensor(a0!) DW, Tensor(a1!)? Db, Tensor x) -> ()"
    assert plan.modules["k"]["schema_notes"]["two_compileable"].startswith(
        "from its @torch.library.custom_op, with Db marked written")


def test_a_declared_custom_ops_schema_stays_where_it_names_every_write(tmp_path: Path) -> None:
    source = MUTATES_TOO_LITTLE.replace('mutates_args={"DW"}', 'mutates_args={"DW", "Db"}')
    plan = make_plan(load_manifest(one_file_project(tmp_path / "p", "forge_mutates2", source, "_two",
                                                    ["two_compileable"])))
    assert plan.modules["k"]["schemas"]["two_compileable"] == "(Tensor(a0!) DW, Tensor(a1!)? Db, Tensor x) -> ()"
    assert plan.modules["k"]["schema_notes"]["two_compileable"] == "from its @torch.library.custom_op"


@pytest.mark.gpu
def test_a_declared_custom_op_writing_more_than_it_says_runs_compiled_on_the_gpu(tmp_path: Path) -> None:
    """Through ``torch.ops`` and compiled with fullgraph=True, with and without ``Db``, against torch, Triton
    blocked; a misaligned odd length."""
    site = _installed(one_file_project(tmp_path / "p", "forge_mutates", MUTATES_TOO_LITTLE, "_two",
                                       ["two_compileable"]), tmp_path)
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_mutates
        x = torch.randn(4100, device="cuda")[1:]
        out = {}
        def run(fn, bias):
            dw, db = torch.full_like(x, float("nan")), torch.full_like(x, float("nan")) if bias else None
            fn(dw, db, x)
            return max((dw - x * 2).abs().max().item(), (db - (x + 1)).abs().max().item() if bias else 0.0)
        for bias in (True, False):
            out[f"op_{bias}"] = run(torch.ops.forge_mutates.two_compileable, bias)
            out[f"compiled_{bias}"] = run(torch.compile(forge_mutates.two_compileable, fullgraph=True,
                                                  backend="aot_eager"), bias)
            out[f"plain_{bias}"] = run(forge_mutates.two_compileable, bias)
        print(json.dumps(out))
        '''), site)
    assert max(res.values()) == 0.0, res


APPLIED_INSIDE = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, y_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * s, mask=m)


def _launch(x, s):
    y = torch.empty_like(x)
    _scale[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), s, BLOCK=256)
    return y


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _launch(x, 2.0)

    @staticmethod
    def backward(ctx, g):
        return _launch(g, 2.0)


scale_apply = Scale.apply


def scale_wrapped(x):
    return Scale.apply(x)


def scale_inference(x):
    return _launch(x, 3.0)


def examples(device="cpu"):
    x = torch.randn(1000, device=device, requires_grad=True)
    scale_apply(x).sum().backward()
    scale_wrapped(x).sum().backward()
    scale_inference(x.detach())
'''


def test_an_op_whose_examples_differentiate_it_is_noted_to_break_compiled_training(tmp_path: Path) -> None:
    """scattermoe's ``parallel_linear`` and NSA's ``topk_sparse_attention`` return ``Fn.apply(...)`` from a function:
    only ``op = Fn.apply`` was noted. Now any op whose examples' results need gradients is, as its custom op (with no
    ``[kernels.NAME.autograd]``) breaks a compiled training graph the same way; an op used without gradients is not."""
    manifest = one_file_project(tmp_path / "p", "forge_applied", APPLIED_INSIDE, "_scale",
                                ["scale_apply", "scale_wrapped", "scale_inference"])
    notes = make_plan(load_manifest(manifest)).modules["k"]["schema_notes"]
    tail = ": its custom op has no backward ([kernels.NAME.autograd] or [ops.NAME.autograd] gives one), so a " \
        "compiled call needing gradients breaks the graph and runs eagerly"
    assert notes["scale_apply"] == "from the traced examples; Scale.apply, an autograd.Function" + tail
    assert notes["scale_wrapped"] == "from the traced examples; its examples differentiate its results" + tail
    assert notes["scale_inference"] == "from the traced examples"


SIZE_FROM_A_TENSOR = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def fill_kernel(x_ptr, s_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1, mask=m)


def op_implicit(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    scratch = torch.zeros(2, cu_seqlens[-1], dtype=torch.int32, device=x.device)
    y = torch.empty_like(x)
    fill_kernel[(triton.cdiv(x.numel(), 256),)](x, scratch, y, x.numel(), BLOCK=256)
    return y


def op_sized_by_values(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    y = torch.empty(cu_seqlens[-1], dtype=x.dtype, device=x.device)
    scratch = torch.zeros(2, dtype=torch.int32, device=x.device)
    fill_kernel[(triton.cdiv(x.numel(), 256),)](x, scratch, y, x.numel(), BLOCK=256)
    return y


def examples(device):
    x = torch.randn(1000, device=device)
    cu = torch.tensor([0, 400, 1000], dtype=torch.int32, device=device)
    op_implicit(x, cu)
    op_sized_by_values(x, cu)
'''


def test_a_0_dim_tensor_given_a_factory_as_a_size_is_read_as_cu_seqlens_item_would_be(tmp_path: Path) -> None:
    """NSA's ``count_query`` sizes a scratch buffer ``torch.zeros(h, cu_seqblocks[-1])``: its Meta implementation
    failed ("Tensor.item() cannot be called on meta tensors", though the host code calls no ``.item()``) and the op
    got no custom op, where ``cu_seqblocks[-1].item()`` got one. Now both do; an op whose result is sized so is
    refused as one reading ``.item()`` is, and the note names the host line."""
    manifest = one_file_project(tmp_path / "p", "forge_sized", SIZE_FROM_A_TENSOR, "fill_kernel",
                                ["op_implicit", "op_sized_by_values"])
    mod = make_plan(load_manifest(manifest)).modules["k"]
    assert mod["schemas"]["op_implicit"] == "(Tensor x, Tensor cu_seqlens) -> Tensor", mod["schema_notes"]
    assert mod["schemas"]["op_sized_by_values"] is None
    assert "the shapes of its results follow tensor values its host code reads" in \
        mod["schema_notes"]["op_sized_by_values"]


FIRST_CALL_COMPILED = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


@torch.library.custom_op("mylib::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _double[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y


@double.register_fake
def _(x):
    return torch.empty_like(x)


def double_twice(x, **options):
    return double(double(x))


def examples(device="cpu"):
    double_twice(torch.randn(1000, device=device), verbose=True)
'''
"""scattermoe's ``group``: an op with no custom op (here: a call passes ``**options``) calling a
``@torch.library.custom_op``."""

COMPILE_FIRST = textwrap.dedent('''\
    import json, sys
    sys.modules["triton"] = None
    import torch, forge_first
    device = sys.argv[1] if len(sys.argv) > 1 else "meta"
    x = torch.randn(4099, device=device)[1:]
    compiled = torch.compile(lambda t: forge_first.double_twice(t) + 1, fullgraph=True, backend="aot_eager")
    first, again = compiled(x), compiled(x)  # the first call of the op in this process is inside the compile
    out = {"shape": list(first.shape), "device": first.device.type, "loaded": "forge_first._ops.k" in sys.modules}
    if device != "meta":
        out["err"] = max((first - (x * 4 + 1)).abs().max().item(), (again - (x * 4 + 1)).abs().max().item())
    print(json.dumps(out))
    ''')


def test_an_ops_first_call_inside_torch_compile_is_traced_through(tmp_path: Path) -> None:
    """An op with no custom op whose first call in a process is inside ``torch.compile(fullgraph=True)``: Dynamo
    traced its first-call loading (host module, index files) and stopped (``posix.stat``); after one eager call the
    same compile worked. The loading now runs while Dynamo traces, not traced, and the trace goes on into the host
    code and the custom op it calls. On meta tensors here (the custom op's Meta implementation runs)."""
    site = _installed(one_file_project(tmp_path / "p", "forge_first", FIRST_CALL_COMPILED, "_double",
                                       ["double", "double_twice"]), tmp_path)
    assert _run_fresh(COMPILE_FIRST, site) == {"shape": [4098], "device": "meta", "loaded": True}


@pytest.mark.gpu
def test_an_ops_first_call_inside_torch_compile_runs_on_the_gpu(tmp_path: Path) -> None:
    site = _installed(one_file_project(tmp_path / "p", "forge_first", FIRST_CALL_COMPILED, "_double",
                                       ["double", "double_twice"]), tmp_path)
    res = _run_fresh(COMPILE_FIRST.replace('sys.argv[1] if len(sys.argv) > 1 else "meta"', '"cuda"'), site)
    assert res == {"shape": [4098], "device": "cuda", "loaded": True, "err": 0.0}, res


COMPILED_HELPER = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


@torch.compile(fullgraph=True)
def _order(x):
    return torch.argsort(x).to(torch.int32)


def scale_sorted(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _scale[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y[_order(x)]


def examples(device="cpu"):
    scale_sorted(torch.randn(1000, device=device))
'''
"""Cut Cross-Entropy's ``@torch.compile(fullgraph=True)`` helper (``sort_logit_avg``, in its backward)."""


def test_host_codes_compiled_helpers_run_eagerly_where_there_is_no_triton(tmp_path: Path) -> None:
    """The Cut Cross-Entropy wheel, on an H200 with Triton blocked, failed in its backward: the helper compiled with
    Inductor, which needs Triton for the GPU (``TritonMissing``). In a process without Triton the packaged host
    module's ``torch.compile`` now gives the function back as it is; with Triton it stays the compiled helper."""
    site = _installed(one_file_project(tmp_path / "p", "forge_cmp", COMPILED_HELPER, "_scale", ["scale_sorted"]),
                      tmp_path)
    probe = textwrap.dedent('''\
        import json, sys
        if sys.argv[-1] == "blocked":
            sys.modules["triton"] = None
        import torch, forge_cmp
        from forge_cmp._ops import k
        x = torch.randn(7)
        print(json.dumps({"compiled": hasattr(k._order, "_torchdynamo_orig_callable"),
                          "sorted": torch.equal(k._order(x), torch.argsort(x).to(torch.int32)),
                          "compile_back": torch.compile is not None and "lambda" not in repr(torch.compile)}))
        ''')
    assert _run_fresh(probe.replace('sys.argv[-1] == "blocked"', "True"), site) == \
        {"compiled": False, "sorted": True, "compile_back": True}
    assert _run_fresh(probe.replace('sys.argv[-1] == "blocked"', "False"), site)["compiled"] is True


def test_a_project_modules_compiled_helpers_run_eagerly_where_there_is_no_triton(tmp_path: Path) -> None:
    """The same helper in a project module the kernel file imports (shipped as ``_ops._local.helpers``, loaded by
    its own loader): eager without Triton, compiled with it; the op's results are the same either way."""
    helper = COMPILED_HELPER[COMPILED_HELPER.index("@torch.compile"):COMPILED_HELPER.index("def scale_sorted")]
    kernel_file = COMPILED_HELPER.replace(helper, "").replace("import torch\n",
                                                              "import torch\nfrom helpers import _order\n")
    manifest = one_file_project(tmp_path / "p", "forge_cmp_local", kernel_file, "_scale", ["scale_sorted"])
    (manifest.parent / "helpers.py").write_text('"""Project helpers."""\nimport torch\n\n\n' + helper)
    site = _installed(manifest, tmp_path)
    probe = textwrap.dedent('''\
        import json, sys
        if BLOCKED:
            sys.modules["triton"] = None
        import torch, forge_cmp_local
        from forge_cmp_local._ops._local import helpers
        from forge_cmp_local._ops import k
        x = torch.randn(7)
        print(json.dumps({"compiled": hasattr(helpers._order, "_torchdynamo_orig_callable"),
                          "same": k._order is helpers._order,
                          "sorted": torch.equal(helpers._order(x), torch.argsort(x).to(torch.int32)),
                          "compile_back": "lambda" not in repr(torch.compile)}))
        ''')
    assert _run_fresh(probe.replace("BLOCKED", "True"), site) == \
        {"compiled": False, "same": True, "sorted": True, "compile_back": True}
    assert _run_fresh(probe.replace("BLOCKED", "False"), site)["compiled"] is True
