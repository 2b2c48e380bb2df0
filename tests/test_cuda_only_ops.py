"""Ops registered for CUDA only, called by the examples as the library's callers call them.

vLLM registers its Triton ops with ``direct_register_custom_op``: ``Library("vllm", "FRAGMENT")``, ``define``, then
``impl(name, fn, dispatch_key="CUDA")``, and its callers use ``torch.ops.vllm.<name>``. On the CPU build machine the
examples' tensors are CPU tensors answering as CUDA ones, and torch's dispatcher routes by where a tensor is: such a
call found no kernel and the build stopped (found by session 38's hunt over vLLM's LoRA ``sgmv_shrink``). While the
build binds host code and runs its examples, a CUDA registration serves CPU too
(``ongpu.cuda_registrations_serve_cpu``; on a machine with a GPU too, whose examples run on CPU tensors as well),
through the trace's recorder, so the call counts as the op's example (what it writes goes into its schema); a list of
tensors is ``Tensor[]``.

CPU: the plan of a vLLM-style file (an op under ``@torch.inference_mode()`` taking a list of weights, registered for
CUDA only, called by ``torch.ops``), and of a ``custom_op(device_types="cuda")`` file (which torch's custom-op
machinery already let run). GPU: the wheel in a fresh process, the op called both ways, against torch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

VLLM_STYLE = '''\
import torch
import triton
import triton.language as tl
from torch.library import Library

lib = Library("hunt_vllmish", "FRAGMENT")


@triton.jit
def _scaled_sum_kernel(x_ptr, w_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(out_ptr + offs, mask=mask) + tl.load(x_ptr + offs, mask=mask) * tl.load(w_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, acc * scale, mask=mask)


@torch.inference_mode()
def _scaled_sum(inputs: torch.Tensor, weights: list[torch.Tensor], output: torch.Tensor, scale: float) -> None:
    for w in weights:
        n = inputs.numel()
        _scaled_sum_kernel[(triton.cdiv(n, 1024),)](inputs, w, output, n, scale, BLOCK=1024)


def _scaled_sum_fake(inputs, weights, output, scale) -> None:
    return


def direct_register_custom_op(op_name, op_func, mutates_args, fake_impl=None, dispatch_key="CUDA"):
    lib.define(op_name + torch.library.infer_schema(op_func, mutates_args=mutates_args))
    lib.impl(op_name, op_func, dispatch_key=dispatch_key)
    if fake_impl is not None:
        lib._register_fake(op_name, fake_impl)


direct_register_custom_op("scaled_sum", _scaled_sum, ["output"], fake_impl=_scaled_sum_fake)
scaled_sum = torch.ops.hunt_vllmish.scaled_sum


def examples(device="cuda"):
    for n in (1000, 4099):
        x = torch.randn(n, device=device)
        out = torch.zeros(n, device=device)
        scaled_sum(x, [torch.randn(n, device=device) for _ in range(2)], out, 0.5)
'''

VLLM_SIGNATURE = 'x_ptr = "*fp32", w_ptr = "*fp32", out_ptr = "*fp32"'

CUSTOM_OP_STYLE = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


@torch.library.custom_op("hunt_cuda_only::double", mutates_args=(), device_types="cuda")
def double(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _double_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out


def examples(device="cuda"):
    double(torch.randn(3000, device=device))
'''


def _project(root: Path, name: str, source: str, kernel: str, op: str,
             signature: str = 'x_ptr = "*fp32", out_ptr = "*fp32"') -> Path:
    root.mkdir(parents=True)
    (root / "k.py").write_text(source)
    (root / "kernel_manifest.toml").write_text(textwrap.dedent(f'''\
        [project]
        name = "{name}"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.k]
        source = "k.py:{kernel}"
        ops = ["{op}"]
        signature = {{ {signature} }}
        examples = "examples"
    '''))
    return root / "kernel_manifest.toml"


def _plan(manifest: Path):
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    return make_plan(load_manifest(manifest), ["sm_90"])


def test_an_op_registered_for_cuda_only_runs_in_the_examples_and_types_what_it_writes(tmp_path: Path) -> None:
    plan = _plan(_project(tmp_path / "p", "forge_test_vllmish", VLLM_STYLE, "_scaled_sum_kernel", "_scaled_sum",
                          VLLM_SIGNATURE))
    mod = plan.modules["k"]
    assert mod["schemas"]["_scaled_sum"] == ("(Tensor inputs, Tensor[] weights, Tensor(a!) output, float scale) -> ()")
    assert mod["schema_notes"]["_scaled_sum"] == "from the traced examples; writes output"
    assert {e.kernel for e in plan.entries} == {"k"}


def test_a_custom_op_for_cuda_only_runs_in_the_examples(tmp_path: Path) -> None:
    plan = _plan(_project(tmp_path / "p", "forge_test_cuda_only", CUSTOM_OP_STYLE, "_double_kernel", "double"))
    assert plan.modules["k"]["schemas"]["double"] == "(Tensor x) -> Tensor"
    assert {e.kernel for e in plan.entries} == {"k"}


def test_outside_the_build_a_cuda_registration_serves_cuda_only() -> None:
    """The build's CPU mirror is for its own examples: a registration made outside it stays CUDA's alone."""
    import torch

    lib = torch.library.Library("forge_test_cuda_alone", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, dispatch_key="CUDA")
    with pytest.raises(NotImplementedError, match="CPU"):
        torch.ops.forge_test_cuda_alone.twice(torch.ones(2))


@pytest.mark.gpu
def test_the_wheel_runs_the_op_both_ways_in_a_fresh_process(tmp_path: Path) -> None:
    from tests.test_localmods import _installed, _run_fresh

    manifest = _project(tmp_path / "p", "forge_test_vllmish", VLLM_STYLE, "_scaled_sum_kernel", "_scaled_sum",
                        VLLM_SIGNATURE)
    target = _installed(manifest, tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_test_vllmish
        errs = []
        for n in (1000, 4099, 77):
            x = torch.randn(n + 1, device="cuda")[1:]  # 4 bytes past the allocation
            ws = [torch.randn(n, device="cuda") for _ in range(2)]
            want = torch.zeros(n, dtype=torch.float64, device="cuda")
            for w in ws:
                want = (want + x.double() * w.double()) * 0.5
            out = torch.zeros(n, device="cuda")
            forge_test_vllmish._scaled_sum(x, ws, out, 0.5)  # the exported op
            errs.append((out.double() - want).abs().max().item())
            out = torch.zeros(n, device="cuda")
            import forge_test_vllmish._ops.k as host  # the library's own way: torch.ops.<its namespace>
            host.scaled_sum(x, ws, out, 0.5)
            errs.append((out.double() - want).abs().max().item())
        torch.cuda.synchronize()
        print(json.dumps({"max_err": max(errs), "triton": sys.modules.get("triton") is not None}))
        ''')
    res = _run_fresh(code, target)
    assert res["max_err"] < 1e-5 and not res["triton"], res



# vLLM's layout: the library object and its registration helper in a utils module, the ops registered by the kernel
# files and called by name (``torch.ops.vllm.<op>``) wherever they are used.
VLLM_UTILS = '''\
import torch
from torch.library import Library

hunt_lib = Library("hunt_vllmlib", "FRAGMENT")


def direct_register_custom_op(op_name, op_func, mutates_args, fake_impl=None, target_lib=None,
                              dispatch_key="CUDA"):
    my_lib = target_lib or hunt_lib
    my_lib.define(op_name + torch.library.infer_schema(op_func, mutates_args=mutates_args))
    my_lib.impl(op_name, op_func, dispatch_key=dispatch_key)
    if fake_impl is not None:
        my_lib._register_fake(op_name, fake_impl)
'''

VLLM_KERNELS = '''\
import torch
import triton
import triton.language as tl

from vllmish.utils import direct_register_custom_op


@triton.jit
def _shift_kernel(x_ptr, out_ptr, n, shift, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + shift, mask=mask)


def _shifted(x: torch.Tensor, output: torch.Tensor, shift: float) -> None:
    n = x.numel()
    _shift_kernel[(triton.cdiv(n, 1024),)](x, output, n, shift, BLOCK=1024)


def _shifted_fake(x, output, shift) -> None:
    return


direct_register_custom_op("shifted", _shifted, ["output"], fake_impl=_shifted_fake)


def shift_by(x: torch.Tensor, shift: float) -> torch.Tensor:
    out = torch.empty_like(x)
    torch.ops.hunt_vllmlib.shifted(x, out, shift)
    assert torch.ops.hunt_vllmlib.shifted.default.name() == "hunt_vllmlib::shifted"
    return out


def examples(device="cuda"):
    for n in (1000, 4099):
        shift_by(torch.randn(n, device=device), 0.25)
'''


def _vllm_project(root: Path, namespace: str = "hunt_vllmlib") -> Path:
    """(Each test its own namespace: what a plan's examples define stays defined in the test process.)"""
    (root / "vllmish" / "ops").mkdir(parents=True)
    (root / "vllmish" / "__init__.py").write_text("")
    (root / "vllmish" / "ops" / "__init__.py").write_text("")
    (root / "vllmish" / "utils.py").write_text(VLLM_UTILS.replace("hunt_vllmlib", namespace))
    (root / "vllmish" / "ops" / "shift.py").write_text(VLLM_KERNELS.replace("hunt_vllmlib", namespace))
    (root / "kernel_manifest.toml").write_text(textwrap.dedent('''\
        [project]
        name = "forge_test_vllmlib"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.shift]
        source = "vllmish/ops/shift.py:_shift_kernel"
        ops = ["shift_by"]
        signature = { x_ptr = "*fp32", out_ptr = "*fp32" }
        examples = "examples"
    '''))
    return root / "kernel_manifest.toml"


def test_shipped_code_defines_a_librarys_ops_in_the_packages_namespace_across_files(tmp_path: Path) -> None:
    plan = _plan(_vllm_project(tmp_path / "p"))
    (mod,) = plan.modules.values()
    host = mod["host_source"]
    assert "triton._ops_namespace('hunt_vllmlib').shifted(x, out, shift)" in host
    assert "triton._ops_namespace('hunt_vllmlib').shifted.default.name() == triton._op_name('hunt_vllmlib::shifted')" \
        in host
    assert "torch.ops.hunt_vllmlib" not in host
    utils, _ = mod["local_sources"]["vllmish.utils"]
    assert 'hunt_lib = Library(triton._namespace(\'hunt_vllmlib\'), "FRAGMENT")' in utils
    # line for line: tracebacks point at the author's lines
    assert len(utils.splitlines()) == len(VLLM_UTILS.splitlines())


def test_library_namespaces_are_the_literal_definitions_torch_does_not_own() -> None:
    from forge_aot.sourcesplit import library_namespaces, rename_library_namespaces

    text = textwrap.dedent('''\
        import torch
        a = torch.library.Library("mine", "DEF")
        b = Library("frag", kind="FRAGMENT")
        c = Library("aten", "FRAGMENT")  # adds to torch's own
        d = Library("theirs", "IMPL")  # implements another library's ops
        e = Library(name_from_elsewhere, "DEF")
        x = torch.ops.mine.op(torch.ops.theirs.op, "frag::op", "frag::", "aten::add", torch.ops.aten.add, "mine::o.out")
        ''')
    assert library_namespaces([text]) == {"mine", "frag"}
    renamed = rename_library_namespaces(text, {"mine", "frag"})
    assert 'Library(triton._namespace(\'mine\'), "DEF")' in renamed
    assert 'Library(triton._namespace(\'frag\'), kind="FRAGMENT")' in renamed
    assert ('x = triton._ops_namespace(\'mine\').op(torch.ops.theirs.op, triton._op_name(\'frag::op\'), "frag::", '
            '"aten::add", torch.ops.aten.add, triton._op_name(\'mine::o.out\'))') in renamed
    assert 'Library("aten", "FRAGMENT")' in renamed and 'Library("theirs", "IMPL")' in renamed
    assert rename_library_namespaces(renamed, {"mine", "frag"}) == renamed  # renamed references stay as they are


@pytest.mark.slow
def test_the_wheel_and_the_library_define_their_ops_side_by_side_in_one_process(tmp_path: Path) -> None:
    """A process importing the library and the wheel of its kernels (vLLM with its Triton kernels built ahead of
    time): each defines its own ops; the wheel's are ``<package>__<namespace>::<op>``."""
    from tests.test_localmods import _installed, _run_fresh

    root = tmp_path / "p"
    target = _installed(_vllm_project(root, "hunt_vllmwheel"), tmp_path)
    code = textwrap.dedent(f'''\
        import json, sys
        import torch
        sys.path.insert(0, {str(root)!r})
        import vllmish.ops.shift  # the library itself: defines hunt_vllmwheel::shifted
        sys.modules["triton"] = None  # the wheel never imports Triton
        import forge_test_vllmlib
        import forge_test_vllmlib._ops.shift as host  # binds the host code: its registrations run
        ours = torch.ops.forge_test_vllmlib__hunt_vllmwheel.shifted.default
        theirs = torch.ops.hunt_vllmwheel.shifted.default
        print(json.dumps({{"ours": ours.name(), "theirs": theirs.name(),
                          "utils": host.direct_register_custom_op.__module__}}))
        ''')
    res = _run_fresh(code, target)
    assert res == {"ours": "forge_test_vllmlib__hunt_vllmwheel::shifted", "theirs": "hunt_vllmwheel::shifted",
                   "utils": "forge_test_vllmlib._ops._local.vllmish.utils"}, res


@pytest.mark.gpu
def test_the_wheels_op_runs_beside_the_librarys_own_in_one_process(tmp_path: Path) -> None:
    from tests.test_localmods import _installed, _run_fresh

    root = tmp_path / "p"
    target = _installed(_vllm_project(root, "hunt_vllmgpu"), tmp_path)
    code = textwrap.dedent(f'''\
        import json, sys
        import torch
        sys.path.insert(0, {str(root)!r})
        import vllmish.ops.shift as theirs  # the library itself (with Triton: it compiles its own kernel)
        import forge_test_vllmlib
        errs = []
        for n in (1000, 4099, 77):
            x = torch.randn(n + 1, device="cuda")[1:]  # 4 bytes past the allocation
            want = x.double() + 0.25
            errs.append((forge_test_vllmlib.shift_by(x, 0.25).double() - want).abs().max().item())
            errs.append((theirs.shift_by(x, 0.25).double() - want).abs().max().item())
        torch.cuda.synchronize()
        print(json.dumps({{"max_err": max(errs)}}))
        ''')
    res = _run_fresh(code, target)
    assert res["max_err"] < 1e-6, res
