"""Exported ops as torch custom ops: schemas from annotations or from the traced examples, a fake
implementation that runs the host code with launches skipped, and torch.compile(fullgraph=True) tracing them
as one op (CPU: no kernel runs; the GPU test runs them)."""

from __future__ import annotations

import textwrap

import pytest

from forge_aot import runtime as rt
from forge_aot.index import build_index
from forge_aot.manifest import load_manifest
from forge_aot.plan import make_plan
from tests.conftest import FIXTURES, REPO


def _ops(manifest, namespace: str):
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    index = build_index(plan, None, "jit", {m: s["path"] for m, s in plan.modules.items()})
    sources = {m: (s["path"], s["host_source"]) for m, s in plan.modules.items()}
    from forge_aot.trace import as_target

    with as_target("sm_90", tag=False):  # host code that asks the driver at import (fused_softmax): no GPU here
        return index, rt.register_torch_ops(namespace, index, rt.bind_ops(namespace, index, None, sources))


def test_schemas_from_annotations_and_from_traced_examples() -> None:
    plan = make_plan(load_manifest(REPO / "kernel_manifest.toml"), ["sm_90"])
    assert plan.modules["softmax"]["schemas"] == {"softmax": "(Tensor x) -> Tensor"}
    assert plan.modules["softmax"]["schema_notes"] == {"softmax": "from the type annotations"}
    real = make_plan(load_manifest(FIXTURES / "realworld" / "kernel_manifest.toml"), ["sm_90"])
    assert real.modules["rms_norm"]["schemas"]["rms_norm"] == (
        "(Tensor x, Tensor weight, float eps=1e-06, float offset=0.0, str casting_mode='llama') -> Tensor")
    assert real.modules["layer_norm"]["schemas"]["layer_norm"].startswith("(Tensor x, int[] normalized_shape,")
    assert "float? sm_scale=None" in real.modules["flash_attention"]["schemas"]["attention"]


def test_an_annotated_parameter_defaulting_to_none_is_optional_in_the_schema() -> None:
    """``scale: float = None`` (flash-linear-attention's ops): torch infers ``float scale=None``, whose op then refuses
    an explicit None; the schema says ``float?``, and stays as it was where the annotation says Optional."""
    import torch

    from forge_aot.schema import op_schema

    namespace = {"torch": torch}
    exec("def op(x: torch.Tensor, scale: float = None, w: torch.Tensor | None = None, sizes: list[int] = None,\n"
         "       n: int = 3) -> torch.Tensor:\n    return x\n", namespace)  # annotations as objects, as written
    schema, why, _ = op_schema(namespace["op"], [])
    assert why == "from the type annotations"
    assert schema == "(Tensor x, float? scale=None, Tensor? w=None, SymInt[]? sizes=None, SymInt n=3) -> Tensor", schema
    lib = torch.library.Library("forge_test_none_default", "DEF")
    lib.define("op" + schema)
    lib.impl("op", lambda x, scale=None, w=None, sizes=None, n=3: x.clone(), "CPU")
    assert torch.ops.forge_test_none_default.op(torch.ones(2), None, None, None).tolist() == [1.0, 1.0]


def test_defaults_the_traced_schema_spells_as_torch_takes_them() -> None:
    """lmdeploy's ops, typed from the traced calls: ``quant_policy: QuantPolicy = QuantPolicy.NONE`` (an IntEnum) was
    written ``int quant_policy=<QuantPolicy.NONE: 0>``, which torch's parser refuses, and the wheel's custom op was
    silently missing; ``max_seqlen_q: int = None`` was ``int max_seqlen_q=None``, whose op refuses the None. A
    default no schema spells leaves the op without a custom op, saying why, instead of a schema that does not parse."""
    import enum

    import torch

    from forge_aot.schema import schema_and_buffer

    class Policy(enum.IntEnum):
        NONE = 0
        INT8 = 8

    seen = []

    def fill(x, policy=Policy.NONE, max_len: int = None, mode: str = "a"):  # noqa: RUF013 (as lmdeploy writes it)
        seen.append((policy == Policy.NONE, max_len))
        return x * 2

    x = torch.ones(3)
    calls = [((x,), {"max_len": 7}, x * 2, []), ((x, Policy.INT8), {"max_len": 9, "mode": "b"}, x * 2, [])]
    schema, how, _, _ = schema_and_buffer(fill, calls)
    assert schema == "(Tensor x, int policy=0, int? max_len=None, str mode='a') -> Tensor", schema
    assert how == "from the traced examples"
    lib = torch.library.Library("forge_test_enum_default", "DEF")
    lib.define("fill" + schema)
    lib.impl("fill", fill, "CPU")
    assert torch.ops.forge_test_enum_default.fill(x, max_len=None).tolist() == [2.0, 2.0, 2.0]
    assert seen == [(True, None)]

    def seeded(x, seed=2**70):
        return x * 2

    schema, how, _, _ = schema_and_buffer(seeded, [((x, 3), {}, x * 2, [])])
    assert schema is None and how.startswith(f"its schema (Tensor x, int seed={2**70}) -> Tensor does not parse: "), how


def test_an_annotated_tensor_a_traced_call_passes_none_is_optional_in_the_schema() -> None:
    """gemlite's ``gemv_forward(..., scales_x: Tensor, ...)`` is called with ``scales_x=None``: the annotation's
    ``Tensor`` would make ``torch.ops`` refuse the very calls the examples make."""
    import torch

    from forge_aot.schema import op_schema

    namespace = {"torch": torch}
    exec("def op(x: torch.Tensor, scales_x: torch.Tensor, n: int) -> torch.Tensor:\n    return x * 2\n", namespace)
    x = torch.ones(2)
    schema, why, _ = op_schema(namespace["op"], [((x, None, 3), {}, x * 2), ((x,), {"scales_x": x, "n": 1}, x * 2)])
    assert why == "from the type annotations"
    assert schema == "(Tensor x, Tensor? scales_x, SymInt n) -> Tensor", schema
    schema, _, _ = op_schema(namespace["op"], [((x, x, 3), {}, x * 2)])
    assert schema == "(Tensor x, Tensor scales_x, SymInt n) -> Tensor", schema


def test_an_input_a_kernel_writes_only_under_a_flag_the_op_never_passes_is_read_only(tmp_path) -> None:
    """FlashInfer's ``rms_norm(x, weight, out)`` launches with ``HAS_OUTPUT=True``, its kernel storing to ``o_ptr if
    HAS_OUTPUT else x_ptr``: the schema marks ``out`` written, not ``x``."""
    from tests.test_localmods import one_file_project

    kernel = textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def scale_kernel(x_ptr, o_ptr, n, HAS_OUTPUT: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n)
            dst = o_ptr if HAS_OUTPUT else x_ptr
            tl.store(dst + offs, x * 2, mask=offs < n)


        def scale_out(x, out):
            scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), HAS_OUTPUT=True, BLOCK=1024)


        def scale_(x):
            scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, x, x.numel(), HAS_OUTPUT=False, BLOCK=1024)


        def examples(device="cuda"):
            x = torch.randn(1000, device=device)
            scale_out(x, torch.empty_like(x))
            scale_(x)
        ''')
    manifest = one_file_project(tmp_path / "p", "forge_test_flag_writes", kernel, "scale_kernel",
                                ["scale_out", "scale_"])
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    assert plan.modules["k"]["schemas"] == {"scale_out": "(Tensor x, Tensor(a!) out) -> ()",
                                            "scale_": "(Tensor(a!) x) -> ()"}
    # the index tells the runtime's guard what each flag writes (runtime/guard.py, tests/test_guard.py)
    assert plan.kernels["k"].spec_json()["writes_when"] == [[[["HAS_OUTPUT", False]], ["x_ptr"]],
                                                            [[["HAS_OUTPUT", True]], ["o_ptr"]]]


TWO_LEFT_OUT = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def acc_kernel(x_ptr, a_ptr, b_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.atomic_add(a_ptr + offs, x, mask=offs < n)
        tl.atomic_add(b_ptr + offs, 2 * x, mask=offs < n)


    def accumulate(x: torch.Tensor, a: torch.Tensor = None, scale: float = 1.0, b: torch.Tensor = None):
        if a is None:
            a = torch.zeros_like(x, dtype=torch.float32)
        if b is None:
            b = torch.zeros_like(x, dtype=torch.float32)
        acc_kernel[(triton.cdiv(x.numel(), 128),)](x * scale, a, b, x.numel(), BLOCK=128)
        return a, b


    def accumulate_grouped(x, group=None, hook=None):
        assert group is None and hook is None  # (flash-attn's process_group: taken, never used here)
        return accumulate(x)


    def examples(device="cuda"):
        accumulate(torch.randn(300, device=device))
        accumulate(torch.randn(300, device=device), scale=0.5)
        accumulate_grouped(torch.randn(300, device=device))
    ''')
"""TransformerEngine's ``compute_grouped_dbias_dscales(..., dbias=None, dscales=None)`` fills both buffers when None;
an op taking two arguments every call leaves None that nothing types."""


def test_two_output_buffers_and_two_untyped_nones_are_left_out_of_the_schema(tmp_path) -> None:
    """A custom op had left out one such argument at most: with two output buffers (TransformerEngine's) or two
    untyped always-None arguments the op ran as Python, every call, and ``torch.compile`` broke its graph there.
    Both are left out now; a call passing one runs as Python. (Before that, the schema had left out whichever
    buffer a set's order gave first and kept the other as a plain ``Tensor? b=None``.)"""
    from tests.test_localmods import one_file_project

    manifest = one_file_project(tmp_path / "p", "forge_test_two_buffers", TWO_LEFT_OUT, "acc_kernel",
                                ["accumulate", "accumulate_grouped"])
    module = make_plan(load_manifest(manifest), ["sm_90"]).modules["k"]
    assert module["schemas"] == {"accumulate": "(Tensor x, float scale=1.0) -> (Tensor, Tensor)",
                                 "accumulate_grouped": "(Tensor x) -> (Tensor, Tensor)"}
    assert module["buffers"] == {"accumulate": [["a", 1], ["b", 3]],
                                 "accumulate_grouped": [["group", 1], ["hook", 2]]}
    assert module["schema_notes"]["accumulate"].endswith(
        "without its output buffers a and b (None in every traced call: a call passing one runs as Python, the "
        "others as the custom op)")
    assert module["schema_notes"]["accumulate_grouped"].endswith(
        "without arguments group and hook (None in every traced call, its type unknown: a call passing one runs as "
        "Python, the others as the custom op)")


@pytest.mark.gpu
def test_an_op_with_two_left_out_arguments_runs_compiled_on_the_gpu(tmp_path) -> None:
    """The wheel of that op, Triton blocked: ``torch.compile(fullgraph=True)`` takes its custom op (no graph break)
    and gives the eager results; a call passing a buffer runs as Python and accumulates into it."""
    from tests.test_localmods import _installed, _run_fresh, one_file_project

    site = _installed(one_file_project(tmp_path / "p", "forge_test_two_buffers_gpu", TWO_LEFT_OUT, "acc_kernel",
                                       ["accumulate", "accumulate_grouped"]), tmp_path)
    probe = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_test_two_buffers_gpu as pkg
        out = {}
        for n in (1000, 4099):
            x = torch.randn(n + 1, device="cuda")[1:]  # misaligned
            want_a, want_b = (x.double() * 0.5), (x.double())
            a, b = pkg.accumulate(x, scale=0.5)
            counts = torch._dynamo.utils.counters
            counts.clear()
            f = torch.compile(lambda t: pkg.accumulate(t, scale=0.5), fullgraph=True, backend="aot_eager")
            ca, cb = f(x)
            ga, gb = torch.compile(pkg.accumulate_grouped, fullgraph=True, backend="aot_eager")(x)
            mine = torch.full((n,), 3.0, device="cuda")
            pa, pb = pkg.accumulate(x, mine, 0.5)
            out[n] = {"eager": max((a.double() - want_a).abs().max().item(), (b.double() - want_b).abs().max().item()),
                      "compiled_same": torch.equal(a, ca) and torch.equal(b, cb),
                      "grouped": max((ga.double() - x.double()).abs().max().item(),
                                     (gb.double() - 2 * x.double()).abs().max().item()),
                      "breaks": sum(counts["graph_break"].values()),
                      "passed": pa is mine and (pa.double() - (3 + want_a)).abs().max().item() < 1e-5}
        out["custom_op"] = hasattr(torch.ops.forge_test_two_buffers_gpu, "accumulate")
        print(json.dumps(out))
        ''')
    res = _run_fresh(probe, site)
    assert res["custom_op"] is True
    for n in ("1000", "4099"):
        assert res[n]["eager"] < 1e-6 and res[n]["grouped"] < 1e-6, res
        assert res[n]["compiled_same"] and res[n]["passed"] and res[n]["breaks"] == 0, res


def test_a_return_annotation_the_traced_results_disagree_with_gives_way_to_them() -> None:
    """mlstm_kernels annotates ``-> tuple[torch.Tensor, torch.Tensor]`` over ``return a, b, c``: the schema said two
    results, and ``torch.ops`` crashed the process on the op. The traced results decide, and the note says why."""
    import torch

    from forge_aot.schema import op_schema

    namespace = {"torch": torch}
    exec("def op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n    return x + 1, x + 2, x + 3\n",
         namespace)
    x = torch.ones(2)
    schema, why, _ = op_schema(namespace["op"], [((x,), {}, namespace["op"](x))])
    assert schema == "(Tensor x) -> (Tensor, Tensor, Tensor)", schema
    assert why == "from the traced examples; its return annotation disagrees with what the traced calls return"
    exec("def two(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n    return x + 1, x + 2\n", namespace)
    assert op_schema(namespace["two"], [((x,), {}, namespace["two"](x))])[:2] == (
        "(Tensor x) -> (Tensor, Tensor)", "from the type annotations")


def test_results_that_alias_inputs_or_each_other_get_no_custom_op() -> None:
    """A custom op's results may alias neither its inputs nor each other (torch.compile would reuse their memory):
    annotations say nothing of that, so the traced calls are checked for annotated host functions too (SGLang's
    ``static_quant_fp8`` returns the caller's ``x_s``; Liger's sparsemax returns ``out_flat`` and a view of it, which
    had been checked against the inputs only)."""
    import torch

    from forge_aot.schema import op_schema

    namespace = {"torch": torch}
    exec("def op(x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n    return x, s\n",
         namespace)
    x, s, out = torch.ones(4), torch.ones(1), torch.zeros(4)
    schema, why, _ = op_schema(namespace["op"], [((x, s), {}, (out, s))])
    assert schema is None and why.startswith("it returns one of its inputs or a view of one"), why
    schema, why, _ = op_schema(namespace["op"], [((x, s), {}, (out.view(2, 2), out))])
    assert schema is None and why.startswith("two of its results share memory"), why
    schema, why, _ = op_schema(namespace["op"], [((x, s), {}, (out, torch.zeros(1)))])
    assert why == "from the type annotations" and schema == "(Tensor x, Tensor s) -> (Tensor, Tensor)"
    namespace = {"torch": torch}
    exec("def op(x, s):\n    return x, s\n", namespace)  # from the traced calls alike
    schema, why, _ = op_schema(namespace["op"], [((x, s), {}, (out[:2], out[2:]))])
    assert schema is None and why.startswith("two of its results share memory"), why


def test_an_argument_annotated_with_no_schema_type_is_named_as_such() -> None:
    """vLLM's ``fused_moe(..., custom_routing_function: Optional[Callable] = None)``: None in every traced call and
    annotated, with a type no schema has; the message had said "annotate it". Since session 42 such an argument is
    left out of the schema (a call passing one runs as Python; since session 50 several are): the op has a custom
    op."""
    import torch

    from forge_aot.schema import op_schema

    namespace = {"torch": torch}
    exec("from typing import Callable, Optional\n\n"
         "def op(x: torch.Tensor, fn: Optional[Callable] = None) -> torch.Tensor:\n    return x.clone()\n",
         namespace)  # as the library writes it (annotations as objects)
    schema, why, _ = op_schema(namespace["op"], [((torch.ones(2),), {}, torch.ones(2))])
    assert schema == "(Tensor x) -> Tensor" and why.endswith("without argument fn (None in every traced call, its "
                                                             "type unknown: a call passing one runs as Python, the "
                                                             "others as the custom op)"), why
    exec("def op2(x: torch.Tensor, fn: Optional[Callable] = None, gn: Optional[Callable] = None) -> torch.Tensor:\n"
         "    return x.clone()\n", namespace)  # two such: both left out (session 50; one at most before)
    schema, why, _ = op_schema(namespace["op2"], [((torch.ones(2),), {}, torch.ones(2))])
    assert schema == "(Tensor x) -> Tensor" and why.endswith("without arguments fn and gn (None in every traced call, "
                                                             "its type unknown: a call passing one runs as Python, "
                                                             "the others as the custom op)"), why


def test_fake_implementation_gives_the_host_codes_shapes_without_launching() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    _ops(REPO / "kernel_manifest.toml", "forge_test_fake")
    with FakeTensorMode():
        x = torch.empty(8, 1000, device="cuda", dtype=torch.float16)
        y = torch.ops.forge_test_fake.softmax(x)
        assert y.shape == (8, 1000) and y.dtype == torch.float16 and y.device.type == "cuda"
        a = torch.empty(64, 32, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(32, 48, device="cuda", dtype=torch.bfloat16)
        assert torch.ops.forge_test_fake.matmul(a, b).shape == (64, 48)


class _Captured(Exception):
    pass


def test_torch_compile_fullgraph_traces_the_op_as_one_custom_op() -> None:
    import torch

    _, ops = _ops(FIXTURES / "realworld" / "kernel_manifest.toml", "forge_test_compile")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)

        def run(*args):
            raise _Captured  # nothing to run on a CPU machine: the graph is what this test checks
        return run

    def f(x, w):
        return ops["rms_norm"](x, w, 1e-6, 0.0, "llama") * 2

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    with pytest.raises(_Captured):
        compiled(torch.randn(4, 2048, dtype=torch.float16), torch.randn(2048, dtype=torch.float16))
    (gm,) = graphs
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "forge_test_compile.rms_norm" in targets, targets  # one opaque op, no graph break


def test_custom_op_autograd_runs_the_manifests_backward_through_custom_ops() -> None:
    """The rms_norm custom op's autograd (manifest ``autograd``): on meta tensors, backward runs the file's
    backward, whose rms_norm_grad call goes through its own custom op (launches skipped: nothing runs)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    _ops(FIXTURES / "realworld" / "kernel_manifest.toml", "forge_test_autograd")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("forge_test_autograd::rms_norm", "Autograd")

    seen: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(6, 1000, device="meta", dtype=torch.float16, requires_grad=True)
    w = torch.randn(1000, device="meta", dtype=torch.float16, requires_grad=True)
    y = torch.ops.forge_test_autograd.rms_norm(x, w, 1e-6, 0.0, "llama")
    with Record():
        y.backward(torch.randn_like(y))
    assert x.grad.shape == x.shape and x.grad.dtype == x.dtype
    assert w.grad.shape == w.shape and w.grad.dtype == w.dtype
    assert "forge_test_autograd.rms_norm_grad.default" in seen, seen


def test_torch_compile_traces_the_backward_as_the_backward_custom_op() -> None:
    import torch
    from torch._dynamo.backends.common import aot_autograd

    _, ops = _ops(FIXTURES / "realworld" / "kernel_manifest.toml", "forge_test_compile_bwd")
    graphs: dict[str, object] = {}

    def capture(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = gm
            return gm  # runs the graph: on meta tensors the custom ops' Meta implementations run
        return compiler

    def f(x, w):
        return ops["rms_norm"](x, w, 1e-6, 0.0, "gemma").sum()

    compiled = torch.compile(f, fullgraph=True, backend=aot_autograd(fw_compiler=capture("fw"),
                                                                     bw_compiler=capture("bw")))
    x = torch.randn(3, 2048, device="meta", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(2048, device="meta", dtype=torch.bfloat16, requires_grad=True)
    compiled(x, w).backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape

    def targets(kind):
        return [str(n.target) for n in graphs[kind].graph.nodes if n.op == "call_function"]
    assert "forge_test_compile_bwd.rms_norm.default" in targets("fw"), targets("fw")
    assert "forge_test_compile_bwd.rms_norm_grad.default" in targets("bw"), targets("bw")


def test_autograd_needs_a_schema_and_existing_functions(tmp_path) -> None:
    import shutil

    from forge_aot.errors import ForgeError, ManifestError

    shutil.copytree(FIXTURES, tmp_path / "fixtures", ignore=shutil.ignore_patterns("build", "tuning", "tune"))
    root = tmp_path / "fixtures" / "realworld"
    manifest = root / "kernel_manifest.toml"
    text = manifest.read_text().replace('tuning-data = "tuning"\n', "")
    manifest.write_text(text.replace('backward = "rms_norm_custom_backward"', 'backward = "rms_norm_custom_bakward"'))
    with pytest.raises(ForgeError, match=r"no host function 'rms_norm_custom_bakward'.*rms_norm_custom_backward"):
        make_plan(load_manifest(manifest), ["sm_90"])
    manifest.write_text(text.replace("rms_norm = { setup-context", "layer_norm = { setup-context"))
    with pytest.raises(ManifestError, match="'layer_norm' is not one of this entry's ops"):
        load_manifest(manifest)


def test_backward_routing_reaches_custom_ops_and_names_an_op_without_schema() -> None:
    """Host code's calls of ops by name, while a custom op's backward runs (``ROUTING.custom``): an op with a
    schema goes through its custom op (fake tensors need its Meta implementation), one without raises a clear
    error naming it (its host code would run on fake tensors); outside a backward both call the host code."""
    import types

    import torch

    from forge_aot.runtime import torch_ops

    lib = torch.library.Library("forge_test_route", "FRAGMENT")
    lib.define("scaled(Tensor x) -> Tensor")
    lib.impl("scaled", lambda x: x * 3, "CompositeExplicitAutograd")
    module = types.ModuleType("forge_test_route_host")
    module.scaled = lambda x: x * 2  # the host code (a custom op's real implementation would launch it)
    module.plain = lambda x: x + 1
    torch_ops.route_in_module(module, "forge_test_route", {"scaled": True, "plain": False})
    x = torch.ones(3)
    assert torch.equal(module.scaled(x), x * 2) and torch.equal(module.plain(x), x + 1)
    assert module.scaled.__forge_host__(x).equal(x * 2)
    torch_ops.ROUTING.custom = True
    try:
        assert torch.equal(module.scaled(x), x * 3)  # through torch.ops.forge_test_route.scaled
        with pytest.raises(rt.ForgeRuntimeError, match=r"forge_test_route\.plain is called from a custom op's "
                                                       r"backward but is no custom op itself.*type annotations"):
            module.plain(x)
    finally:
        torch_ops.ROUTING.custom = False
    torch_ops.route_in_module(module, "forge_test_route", {"scaled": True})  # routing twice wraps once
    assert torch.equal(module.scaled(x), x * 2)


def test_compiled_host_code_calling_an_op_by_name_takes_its_custom_op() -> None:
    """An exported class's ``forward`` (host code) calling its file's op by name: under torch.compile the routed
    name takes the custom op, as the exported op does (Dynamo sees one opaque op, never the runtime's launch);
    eagerly, and where the call needs gradients the op has no backward for, the host code runs."""
    import types

    import torch

    from forge_aot.runtime import torch_ops

    lib = torch.library.Library("forge_test_route_compiled", "FRAGMENT")
    lib.define("scaled(Tensor x) -> Tensor")
    lib.impl("scaled", lambda x: x * 3, "CompositeExplicitAutograd")
    module = types.ModuleType("forge_test_route_compiled._ops.m")  # the op's own host module
    module.scaled = lambda x: x * 2  # the host code
    torch_ops.route_in_module(module, "forge_test_route_compiled", {"scaled": True}, {"scaled": ("m", "(...)")})
    compiled = torch.compile(lambda x: module.scaled(x) + 1, fullgraph=True, backend="eager")
    x = torch.ones(3)
    assert torch.equal(compiled(x), x * 3 + 1) and torch.equal(module.scaled(x), x * 2)
    # a call needing gradients, and no backward in the manifest: the graph breaks there, saying why (fullgraph=True
    # raises it: a real op's host code launches through the runtime, which Dynamo cannot trace either, and said
    # "missing_mp_subscript" or "posix.stat"), and the host code runs eagerly
    with pytest.raises(Exception, match=r"forge_test_route_compiled\.scaled: its inputs need gradients and the "
                                        r"manifest gives it no backward \(\[kernels\.NAME\.autograd\]\)"):
        compiled(x.clone().requires_grad_())
    broken = torch.compile(lambda x: module.scaled(x) + 1, backend="eager")
    assert torch.equal(broken(x.clone().requires_grad_()), x * 2 + 1)


def test_a_traced_call_its_custom_op_does_not_take_runs_the_host_code_eagerly() -> None:
    """Where a compiled call does not take the custom op (it needs gradients the op has no backward for, or passes
    the output buffer the schema leaves out), the host code runs with Dynamo disabled, both for the exported op and
    for host code calling it by name: traced, it reached the runtime's launch, which torch 2.11's Dynamo recursed
    in (``fastpath.Launched``, on the H200 hosts). The host functions here record whether they were traced."""
    import types

    import torch

    from forge_aot.runtime import torch_ops
    from forge_aot.runtime.exports import export

    lib = torch.library.Library("forge_test_eager_host", "FRAGMENT")
    lib.define("scaled(Tensor x) -> Tensor")
    lib.impl("scaled", lambda x: x * 3, "CompositeExplicitAutograd")
    traced: list[bool] = []

    def host(x):
        traced.append(torch.compiler.is_compiling())
        return x * 2

    exported = export(lambda op: host, "forge_test_eager_host", "scaled", True, ("m", "(Tensor x) -> Tensor"))
    module = types.ModuleType("forge_test_eager_host._ops.m")
    module.scaled = host
    torch_ops.route_in_module(module, "forge_test_eager_host", {"scaled": True}, {"scaled": ("m", "(...)")})
    x = torch.ones(3)
    for fn in (exported, module.scaled):
        torch._dynamo.reset()
        traced.clear()
        assert torch.equal(torch.compile(lambda t, fn=fn: fn(t) + 1, fullgraph=True, backend="eager")(x), x * 3 + 1)
        xg = x.clone().requires_grad_()
        y = torch.compile(lambda t, fn=fn: fn(t) + 1, backend="eager")(xg)
        y.sum().backward()
        assert torch.equal(y, x * 2 + 1) and torch.equal(xg.grad, torch.full((3,), 2.0)) and traced == [False]


def test_without_grad_reads_the_flag_export_sets_not_is_exporting(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's Dynamo folds ``torch.compiler.is_exporting()`` to True in any trace (pytorch#176347; measured
    on the H200 hosts with ``scripts/probe_compile_grad.py``), so a compiled call needing gradients through an op
    with no backward took its custom op and got no gradient. ``without_grad`` reads the flag torch.export sets
    (``torch.compiler._is_exporting_flag``) instead; a fold cannot be staged in 2.13's Dynamo (it evaluates a
    replaced ``is_exporting`` eagerly), so the decision is checked as such, and on the GPU hosts' 2.11 by
    ``test_an_autograd_function_op_under_torch_compile_on_the_gpu``."""
    import torch

    from forge_aot.runtime.exports import without_grad

    x = torch.ones(3, requires_grad=True)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)  # what 2.11's Dynamo answers in a compile
    assert not without_grad(False, (x,), {}, "ns.op")  # not exporting: the graph breaks (eagerly, a no-op)
    assert without_grad(True, (x,), {}, "ns.op") and without_grad(False, (x.detach(),), {}, "ns.op")
    monkeypatch.setattr(torch.compiler, "_is_exporting_flag", True)  # as torch.export sets it
    assert without_grad(False, (x,), {}, "ns.op")  # export takes the custom op (it cannot break)
    monkeypatch.delattr(torch.compiler, "_is_exporting_flag")  # a torch without the flag: is_exporting() decides
    assert without_grad(False, (x,), {}, "ns.op")


@pytest.mark.gpu
def test_compiled_training_step_through_custom_op_autograd_matches_eager() -> None:
    """torch.compile(fullgraph=True) trains through forge_realworld.rms_norm: the forward and the backward are
    the package's custom ops (the backward is the manifest's), the gradients those of eager mode (the file's
    own autograd.Function) and of an fp32 torch reference."""
    import torch

    forge_realworld = pytest.importorskip("forge_realworld")
    import sys

    if str(FIXTURES / "realworld") not in sys.path:  # the fixture project's root, as for its authors
        sys.path.insert(0, str(FIXTURES / "realworld"))
    from tests.fixtures.realworld.kernels.rms_norm import rms_norm_reference

    for dtype, mode, offset, shape in ((torch.float16, "llama", 0.0, (5, 3, 2048)),
                                       (torch.bfloat16, "gemma", 1.0, (7, 1000))):
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = torch.randn(shape[-1], device="cuda", dtype=dtype)
        dy = torch.randn(shape, device="cuda", dtype=dtype)

        def step(fn, x=x, w=w, dy=dy, mode=mode, offset=offset):
            xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = fn(xg, wg, 1e-6, offset, mode)
            (y.float() * dy.float()).sum().backward()
            return y.detach(), xg.grad, wg.grad

        eager = step(forge_realworld.rms_norm)
        compiled = step(torch.compile(forge_realworld.rms_norm, fullgraph=True))
        ref = step(rms_norm_reference)
        assert torch.equal(compiled[0], eager[0])  # the same kernel on the same inputs
        for got, want in zip(compiled[1:], eager[1:]):  # the backward recomputes the inverse RMS: same kernels
            assert torch.allclose(got.float(), want.float(), rtol=1e-3, atol=1e-3)
        for got, want in zip(compiled, ref):
            err = ((got.float() - want.float()).norm() / want.float().norm()).item()
            assert err < 2e-2, err


@pytest.mark.gpu
def test_compiled_and_exported_ops_match_eager(packaged) -> None:
    import torch

    x = torch.randn(37, 1000, device="cuda")
    a = torch.randn(300, 200, device="cuda", dtype=torch.float16)
    b = torch.randn(200, 120, device="cuda", dtype=torch.float16)

    def f(x, a, b):
        return packaged.softmax(x) * 2, packaged.matmul(a, b)

    eager = f(x, a, b)
    compiled = torch.compile(f, fullgraph=True)(x, a, b)
    for got, want in zip(compiled, eager):
        assert torch.equal(got, want)
    assert hasattr(torch.ops.forge_kernels, "softmax")

    class M(torch.nn.Module):
        def forward(self, x):
            return packaged.softmax(x) + 1

    exported = torch.export.export(M(), (x,))
    assert any("forge_kernels.softmax" in str(n.target) for n in exported.graph.nodes)
    assert torch.equal(exported.module()(x), packaged.softmax(x) + 1)


@pytest.mark.gpu
def test_library_style_op_compiles_fullgraph() -> None:
    import torch

    forge_realworld = pytest.importorskip("forge_realworld")
    x = torch.randn(8, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, device="cuda", dtype=torch.float16)
    compiled = torch.compile(lambda x, w: forge_realworld.rms_norm(x, w) * 2, fullgraph=True)
    assert torch.equal(compiled(x, w), forge_realworld.rms_norm(x, w) * 2)


@pytest.mark.gpu
def test_ops_with_arguments_none_in_every_example_compile_fullgraph_and_match_eager() -> None:
    """FlagGems' mean_dim (keyword-only ``dtype``, ``with torch.cuda.device(x.device)``), the TMA attention (its
    ``sm_scale`` from the head size) and flash-linear-attention's recurrence (``(o, None)`` without a final state)
    under torch.compile(fullgraph=True): one custom op each, results equal to the eager calls."""
    import torch

    forge_realworld = pytest.importorskip("forge_realworld")
    x = torch.randn(8, 33, 517, device="cuda", dtype=torch.float16)
    q = torch.randn(2, 37, 4, 64, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    g = torch.randn(2, 37, 4, device="cuda", dtype=torch.float32).sigmoid().log()
    a = torch.randn(1, 2, 1000, 64, device="cuda", dtype=torch.float16)

    def step(x, q, k, v, g, a):
        o1, h1 = forge_realworld.fused_recurrent_gla(q, k, v)
        o2, h2 = forge_realworld.fused_recurrent_gla(q, k, v, g=g, output_final_state=True)
        return (forge_realworld.mean_dim(x, 1, dtype=torch.float16), forge_realworld.mean_dim(x, -1, keepdim=True),
                o1, h1, o2, h2, forge_realworld.attention_tma(a, a, a, True))

    eager = step(x, q, k, v, g, a)
    compiled = torch.compile(step, fullgraph=True)(x, q, k, v, g, a)
    assert eager[3] is None and compiled[3] is None
    for want, got in zip(eager, compiled):
        if want is not None:
            assert torch.equal(want, got)
    assert torch.allclose(eager[0].double(), x.double().mean(1), atol=2e-3, rtol=2e-3)


DYNAMIC_KERNEL = '''\
"""Host code that picks a block size from a size, as most Triton host code does."""

import torch
import triton
import triton.language as tl


@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def double(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    BLOCK = min(triton.next_power_of_2(n), 1024)
    double_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out


def double_padded(x: torch.Tensor) -> torch.Tensor:
    """The output's size is the power of two itself: it must follow the input's size exactly."""
    n = x.numel()
    out = x.new_zeros(triton.next_power_of_2(n))
    double_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out


def examples(device="cpu"):
    for n in (1000, 5000):
        double(torch.randn(n, device=device, dtype=torch.float16))
        double_padded(torch.randn(n, device=device, dtype=torch.float16))
'''


def _dynamic_ops(root, namespace: str, kernel: str, ops: list[str]):
    """The ops of a one-file project (``kernel``, whose kernel is ``double_kernel``) as torch.ops.<namespace>."""
    import torch

    (root / "kernels").mkdir()
    (root / "kernels" / "double.py").write_text(kernel)
    (root / "kernel_manifest.toml").write_text(
        f'[project]\nname = "{namespace}"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.double]\n'
        f'source = "kernels/double.py:double_kernel"\nops = {ops!r}\n'.replace("'", '"')
        + 'signature = { x_ptr = "*fp16", out_ptr = "*fp16", n = "i32" }\nexamples = "examples"\n')
    _ops(root / "kernel_manifest.toml", namespace)
    return getattr(torch.ops, namespace)


def _export(fn, args, dynamic):
    """torch.export of ``fn(*args)`` with ``dynamic`` as the dynamic shapes of its arguments (None: all static)."""
    import torch

    class M(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    return torch.export.export(M(), args, dynamic_shapes=None if dynamic is None else (dynamic,))


def test_fake_implementation_keeps_sizes_symbolic_where_host_code_picks_block_sizes(tmp_path) -> None:
    """torch.export with a dynamic size: the host code's ``triton.next_power_of_2(n)`` (a block size for a launch
    the fake implementation skips) does not make torch specialize n, so the op exports for every n; where that
    value is an output's size, the size is specialized as it must be (an export error naming the constant)."""
    import torch
    from torch.export import Dim

    ops = _dynamic_ops(tmp_path, "forge_test_dynamic", DYNAMIC_KERNEL, ["double", "double_padded"])
    x = torch.randn(5000, dtype=torch.float16)
    n = Dim("n", min=2, max=1 << 20)
    exported = _export(lambda x: ops.double(x) + 1, (x,), ({0: n},))
    (out,) = next(node for node in exported.graph.nodes if node.op == "output").args[0]
    (size,) = out.meta["val"].shape
    assert isinstance(size, torch.SymInt) and str(size) in {str(s) for s in exported.range_constraints}
    with pytest.raises(Exception, match="specialized it to be a constant"):
        _export(lambda x: ops.double_padded(x) + 1, (x,), ({0: n},))
    # Static shapes: unchanged, the padded output its exact size.
    assert _export(lambda x: ops.double_padded(x) + 1, (x,), None).module()  # exports
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert ops.double_padded(torch.empty(5000, device="cuda", dtype=torch.float16)).shape == (8192,)


def test_library_style_ops_export_with_a_dynamic_token_dimension() -> None:
    """The library fixtures' ops (forward, and RMSNorm's backward op) under torch.export with a dynamic token (or
    sequence) dimension: no specialization, outputs symbolic in it."""
    import torch
    from torch.export import Dim

    _ops(FIXTURES / "realworld" / "kernel_manifest.toml", "forge_test_dynamic_rw")
    ops = torch.ops.forge_test_dynamic_rw
    tokens = Dim("tokens", min=2, max=1 << 16)
    h = torch.float16
    x, w, b = torch.randn(300, 2048, dtype=h), torch.randn(2048, dtype=h), torch.randn(2048, dtype=h)
    q = torch.randn(2, 4, 300, 64, dtype=h)
    cases = [(lambda x, w: ops.rms_norm(x, w), (x, w), ({0: tokens}, None)),
             (lambda x, w, b: ops.layer_norm(x, [2048], w, b, 1e-5), (x, w, b), ({0: tokens}, None, None)),
             (lambda a, b: ops.matmul(a, b), (torch.randn(300, 512, dtype=h), torch.randn(512, 256, dtype=h)),
              ({0: tokens}, None)),
             (lambda q, k, v: ops.attention(q, k, v), (q, q.clone(), q.clone()), ({2: tokens},) * 3),
             # the backward's host code computes rows_per_program = math.ceil(n_rows / sm_count): symbolic too
             (lambda dy, x, w: ops.rms_norm_grad(dy, x, w, 1e-6, 0.0, "llama"), (x.clone(), x, w),
              ({0: tokens}, {0: tokens}, None))]
    for fn, args, dynamic in cases:
        exported = _export(fn, args, dynamic)
        out = next(n for n in exported.graph.nodes if n.op == "output").args[0][0]
        assert any(isinstance(d, torch.SymInt) for d in out.meta["val"].shape), out.meta["val"].shape


def test_fake_implementation_never_gives_a_static_size_that_a_block_size_decides(tmp_path) -> None:
    """Values computed from a symbolic size's example may reach an output through arithmetic or a branch, or match
    a static size by coincidence: the fake implementation checks by running the host code with other values, so
    the first two specialize (an export error, never a wrong static size) and the third stays dynamic."""
    import torch
    from torch.export import Dim

    kernel = DYNAMIC_KERNEL.split("def examples")[0] + textwrap.dedent('''\
        def doubled_pad(x: torch.Tensor) -> torch.Tensor:
            return x.new_zeros(2 * triton.next_power_of_2(x.numel()))


        def branch(x: torch.Tensor) -> torch.Tensor:
            return x.new_empty(x.numel()) if triton.next_power_of_2(x.numel()) <= 8192 else x.new_empty(2, x.numel())


        def rows(a: torch.Tensor) -> torch.Tensor:
            """A block size equal to a static size (512) by coincidence."""
            out = torch.empty_like(a)
            BLOCK_M = triton.next_power_of_2(a.shape[0])
            double_kernel[(1,)](a, out, a.numel(), BLOCK=min(BLOCK_M, 1024))
            return out


        def examples(device="cpu"):
            for n in (1000, 5000):
                x = torch.randn(n, device=device, dtype=torch.float16)
                double(x), double_padded(x), doubled_pad(x), branch(x)
            rows(torch.randn(300, 512, device=device, dtype=torch.float16))
        ''')
    ops = _dynamic_ops(tmp_path, "forge_test_dynamic2", kernel,
                       ["double", "double_padded", "doubled_pad", "branch", "rows"])
    n = Dim("n", min=2, max=1 << 20)
    x = torch.randn(5000, dtype=torch.float16)
    for fn in (ops.doubled_pad, ops.branch):
        with pytest.raises(Exception, match="specialized it to be a constant"):
            _export(fn, (x,), ({0: n},))
    exported = _export(ops.rows, (torch.randn(300, 512, dtype=torch.float16),), ({0: Dim("m", min=2, max=1 << 16)},))
    (out,) = next(node for node in exported.graph.nodes if node.op == "output").args[0]
    assert isinstance(out.meta["val"].shape[0], torch.SymInt) and out.meta["val"].shape[1] == 512


CUSTOM_OP_FILE = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * alpha, mask=m)


@torch.library.custom_op("forge_test_lib::scale", mutates_args=())
def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
    out = torch.empty_like(x)
    _scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), alpha, BLOCK=1024)
    return out


@torch.library.custom_op("forge_test_lib::scale_", mutates_args={"x"})
def scale_(x: torch.Tensor, alpha: float) -> None:
    _scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, x, x.numel(), alpha, BLOCK=1024)


def examples(device="cpu"):
    scale(torch.randn(1000, device=device), 2.0)
    scale_(torch.randn(1000, device=device), 2.0)
'''


def test_a_torch_library_custom_op_keeps_its_schema_and_gets_the_packages_meta(tmp_path) -> None:
    # vLLM / SGLang register their Triton ops with @torch.library.custom_op (no register_fake here): the package's
    # op takes the decorator's schema, and its Meta implementation runs the author's function with launches skipped
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "scale.py").write_text(CUSTOM_OP_FILE)
    (tmp_path / "kernel_manifest.toml").write_text(textwrap.dedent('''\
        [project]
        name = "forge_test_customop"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.scale]
        source = "kernels/scale.py:_scale_kernel"
        ops = ["scale", "scale_"]
        signature = { x_ptr = "*fp32", out_ptr = "*fp32", n = "i32", alpha = "fp32" }
        examples = "examples"
    '''))
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    # one that writes its argument (mutates_args) keeps that schema too: a mutating custom op (since session 25)
    assert plan.modules["scale"]["schemas"] == {"scale": "(Tensor x, float alpha) -> Tensor",
                                                "scale_": "(Tensor(a0!) x, float alpha) -> ()"}
    _ops(tmp_path / "kernel_manifest.toml", "forge_test_customop")
    with FakeTensorMode():
        y = torch.ops.forge_test_customop.scale(torch.empty(37, 5, device="cuda"), 3.0)
        assert y.shape == (37, 5) and y.device.type == "cuda"
        assert torch.ops.forge_test_customop.scale_(torch.empty(37, 5, device="cuda"), 3.0) is None
    assert torch.ops.forge_test_customop.scale_.default._schema.arguments[0].alias_info.is_write


def test_the_kernel_files_annotations_stay_objects_at_build_time_and_in_development(tmp_path) -> None:
    """forge-aot's own modules use ``from __future__ import annotations``; compiling the user's file inside them must
    not hand it that flag. vLLM's ``direct_register_custom_op`` calls ``torch.library.infer_schema`` at import, on an
    ``@torch.inference_mode()`` function: with its annotations turned into strings it fails ("Unsupported type
    annotation torch.Tensor. It is not a type")."""
    import torch

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "scale.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def scale_kernel(X, Y, n, s, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * s, mask=offs < n)


        @torch.inference_mode()
        def scale(x: torch.Tensor, y: torch.Tensor, s: float) -> None:
            scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), s, BLOCK=1024)


        SCHEMA = torch.library.infer_schema(scale, mutates_args=["y"])
        assert scale.__wrapped__.__annotations__["s"] is float


        def examples(device="cpu"):
            x = torch.empty(4096, dtype=torch.float16, device=device)
            scale(x, torch.empty_like(x), 2.0)
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(textwrap.dedent('''\
        [project]
        name = "forge_test_annotations"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.scale]
        source = "kernels/scale.py:scale_kernel"
        ops = ["scale"]
        signature = { X = "*fp16" }
        examples = "examples"
    '''))
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))  # the decorators' reading and the trace
    assert plan.modules["scale"]["schemas"] == {"scale": "(Tensor x, Tensor(a!) y, float s) -> ()"}
    _ops(tmp_path / "kernel_manifest.toml", "forge_test_annotations")  # the host module run as development does
    assert torch.ops.forge_test_annotations.scale.default._schema.arguments[2].type.kind() == "FloatType"


def test_an_op_that_writes_its_out_argument_is_a_mutating_custom_op() -> None:
    """vLLM's calling convention, ``silu_and_mul_out(out, x)`` writing ``out`` and returning None: the traced
    launches pass ``out`` where the kernel stores, so its schema marks ``out`` written (``Tensor(a!)``) and returns
    ``()``; torch.compile(fullgraph=True) takes it as one op, functionalized (AOTAutograd's graph has it under
    ``auto_functionalized`` and returns the written ``out`` for the copy back into the caller's tensor), and on
    meta tensors the eager op and the compiled function run without a graph break."""
    import torch

    real = make_plan(load_manifest(FIXTURES / "realworld" / "kernel_manifest.toml"), ["sm_90"])
    assert real.modules["silu_and_mul"]["schemas"]["silu_and_mul_out"] == "(Tensor(a!) out, Tensor x) -> ()"
    assert real.modules["silu_and_mul"]["schema_notes"]["silu_and_mul_out"].endswith("writes out")
    # the ops that return their outputs keep pure schemas: nothing they are given is written
    assert real.modules["rms_norm"]["schemas"]["rms_norm"].startswith("(Tensor x, Tensor weight,")
    _, ops = _ops(FIXTURES / "realworld" / "kernel_manifest.toml", "forge_test_mutating")
    out = torch.empty(3, 1000, device="meta", dtype=torch.bfloat16)
    x = torch.empty(3, 2000, device="meta", dtype=torch.bfloat16)
    assert torch.ops.forge_test_mutating.silu_and_mul_out(out, x) is None  # the Meta implementation
    graphs = []

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def inner(g, _):
            graphs.append(g)
            return g
        return aot_module_simplified(gm, example_inputs, fw_compiler=inner)

    def f(out, x):
        ops["silu_and_mul_out"](out, x)
        return out * 2

    torch.compile(f, fullgraph=True, backend=backend)(out, x)
    (gm,) = graphs
    text = str(gm.graph)
    assert "forge_test_mutating.silu_and_mul_out" in text and "auto_functionalized" in text, text
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    assert len(output.args[0]) == 2  # the written out (copied back into the caller's tensor) and out * 2


def test_an_argument_none_in_every_call_takes_the_type_the_ops_code_gives_it(realworld_plan) -> None:
    """Library ops leave optional arguments None in every example: FlagGems' ``mean_dim(x, dim, keepdim=False, *,
    dtype=None)`` fills ``dtype = x.dtype`` itself, the TMA attention ``sm_scale``; flash-linear-attention's op passes
    ``scale`` on to a function that sets ``scale = K ** -0.5`` and returns ``(o, None)`` without a final state. The
    schema takes the type of what the code put there (optional, default None), keeps keyword-only arguments
    keyword-only, and types a result that is None in some calls ``Tensor?``; all three become custom ops that
    torch.compile(fullgraph=True) traces whole (on meta tensors here: FlagGems' ``with torch.cuda.device(x.device)``
    switches nothing on a meta device)."""
    import torch

    schemas = {m: realworld_plan.modules[m]["schemas"] for m in ("gems_mean", "flash_attention_tma", "fused_recurrent")}
    notes = {m: realworld_plan.modules[m]["schema_notes"] for m in schemas}
    assert schemas["gems_mean"]["mean_dim"] == \
        "(Tensor x, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor"
    assert notes["gems_mean"]["mean_dim"] == "from the traced examples; dtype as the op's code fills it in"
    assert "float? sm_scale=None) -> Tensor" in schemas["flash_attention_tma"]["attention_tma"]
    assert schemas["fused_recurrent"]["fused_recurrent_gla"] == (
        "(Tensor q, Tensor k, Tensor v, Tensor? g=None, float? scale=None, Tensor? initial_state=None, "
        "bool output_final_state=False) -> (Tensor, Tensor?)")

    _, ops = _ops(FIXTURES / "realworld" / "kernel_manifest.toml", "forge_test_nones")
    ns = torch.ops.forge_test_nones
    x = torch.empty(8, 33, 512, device="meta", dtype=torch.float16)
    assert ns.mean_dim(x, 1).shape == (8, 512)
    assert ns.mean_dim(x, 1, keepdim=True, dtype=torch.float32).dtype == torch.float32
    q = torch.empty(2, 64, 4, 64, device="meta", dtype=torch.bfloat16)
    o, h = ns.fused_recurrent_gla(q, q, q)
    assert o.shape == q.shape and h is None
    g = torch.empty(2, 64, 4, device="meta", dtype=torch.float32)
    o, h = ns.fused_recurrent_gla(q, q, q, g, output_final_state=True)
    assert h.shape == (2, 4, 64, 64) and h.dtype == torch.float32

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    def step(x, q):
        m = ops["mean_dim"](x, -1, dtype=torch.float32)
        o, h = ops["fused_recurrent_gla"](q, q, q)
        return m * 2, o + 1, h

    m, o, h = torch.compile(step, fullgraph=True, backend=backend)(x, q)
    assert m.shape == (8, 33) and m.dtype == torch.float32 and o.shape == q.shape and h is None
    (gm,) = graphs
    text = str(gm.graph)
    assert "forge_test_nones.mean_dim" in text and "forge_test_nones.fused_recurrent_gla" in text, text
    assert torch.cuda.device is not None and torch.cuda.device.__module__ == "torch.cuda"  # torch's own again


def test_a_none_the_code_never_fills_in_still_names_the_argument() -> None:
    from forge_aot.schema import op_schema
    from forge_aot.trace import _with_nones_replaced

    def helper(x, scale):
        return x

    def op(x: object, scale=None):
        return helper(x, scale)

    import torch

    x = torch.ones(3)
    result, replaced = _with_nones_replaced(op, (x,), {})
    assert result is x and replaced == {}
    schema, why, rule = op_schema(op, [((torch.ones(3),), {}, torch.ones(3), [], replaced)])
    # (since session 42 the one such argument is left out of the schema; since session 50 two are too)
    assert schema == "(Tensor x) -> Tensor" and rule is None and "without argument scale (None in every" in why

    def op2(x: object, scale=None, shift=None):
        return helper(x, scale)

    schema, why, rule = op_schema(op2, [((torch.ones(3),), {}, torch.ones(3), [], replaced)])
    assert schema == "(Tensor x) -> Tensor" and rule is None and "without arguments scale and shift" in why


def test_a_result_whose_structure_an_argument_selects_gets_a_padded_schema_and_a_rule() -> None:
    """flash-attn's ``layer_norm_fn`` returns ``y``, or ``(y, residual)`` with ``prenorm=True``: the schema returns
    their union padded with None, and the rule records which argument selects the structure (a bool before an
    int that would explain it too); where no argument does, there is no schema and the reason says why."""
    import torch

    from forge_aot.schema import op_schema

    def norm(x, mode, n=1, prenorm=False):
        return (x + 1, x + 2) if prenorm else x + 1

    t = torch.ones(3)
    calls = [((t, "a"), {"n": 1}, norm(t, "a"), [], {}),
             ((t, "a", 2), {"prenorm": True}, norm(t, "a", prenorm=True), [], {}),
             ((t, "b", 2, True), {}, norm(t, "b", prenorm=True), [], {})]
    schema, why, rule = op_schema(norm, calls)
    assert schema == "(Tensor x, str mode, int n=1, bool prenorm=False) -> (Tensor, Tensor?)"
    assert "structure prenorm selects" in why
    assert rule == {"argument": "prenorm", "position": 3, "default": False, "arities": [[False, 0], [True, 2]],
                    "width": 2}
    # n explains these calls too (1 one value, 2 a pair), but prenorm is a bool; a call that neither explains:
    calls.append(((t, "a", 2), {"prenorm": True}, norm(t, "a"), [], {}))
    schema, why, rule = op_schema(norm, calls)
    assert schema is None and rule is None and "several kinds of results" in why


def test_an_op_whose_result_structure_follows_prenorm_is_one_custom_op_in_both_structures(realworld_plan) -> None:
    """mamba's and flash-attn's ``layer_norm_fn`` / ``rms_norm_fn``: custom ops returning ``(Tensor, Tensor?)``;
    the exported functions give each call the host code's own structure, eagerly (meta tensors, through the
    custom op itself) and under torch.compile(fullgraph=True), where both structures trace as the one op. A
    residual that is the input itself (prenorm with no residual in the input's dtype) comes back as a copy (a
    custom op's outputs may not alias its inputs). A compiled call that needs gradients uses the custom op where the
    manifest gives it a backward (these two ops), and not where it has none (Liger's GeGLU: the custom op would
    drop the gradients silently): there it runs the host code, which Dynamo cannot trace whole, so fullgraph=True
    says so."""
    import torch

    from forge_aot.runtime.torch_ops import unpad

    mod = realworld_plan.modules["add_norm"]
    assert mod["schemas"]["layer_norm_fn"].endswith("bool is_rms_norm=False) -> (Tensor, Tensor?)")
    assert mod["results"]["rms_norm_fn"] == {"argument": "prenorm", "position": 4, "default": False,
                                             "arities": [[False, 0], [True, 2]], "width": 2}
    _, ops = _ops(FIXTURES / "realworld" / "kernel_manifest.toml", "forge_test_prenorm")
    ns = torch.ops.forge_test_prenorm
    x = torch.empty(6, 1000, device="meta", dtype=torch.float16)
    w = torch.empty(1000, device="meta", dtype=torch.float16)
    y, r = ns.rms_norm_fn(x, w, None)
    assert y.shape == x.shape and r is None
    y, r = ns.rms_norm_fn(x, w, None, None, True)  # prenorm by position: r is x (reshaped) in the host code
    assert r.shape == x.shape and r.dtype == x.dtype and r.untyped_storage()._cdata != x.untyped_storage()._cdata
    y, r = ns.rms_norm_fn(x, w, None, prenorm=True, residual_in_fp32=True)
    assert r.dtype == torch.float32
    with pytest.raises(rt.ForgeRuntimeError, match=r"results only for prenorm in \[False, True\], not 2"):
        unpad(("prenorm", 4, False, ((False, 0), (True, 2)), 2), (y, r), (x, w, None), {"prenorm": 2}, "ns.op")

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    def block(x, w, b, res):
        hidden, residual = ops["layer_norm_fn"](x, w, b, residual=res, prenorm=True)
        out = ops["rms_norm_fn"](hidden, w, None, eps=1e-5)  # one tensor, as the host code returns it
        return out * 2, residual

    b = torch.empty(1000, device="meta", dtype=torch.float16)
    out, residual = torch.compile(block, fullgraph=True, backend=backend)(x, w, b, torch.empty_like(x))
    assert isinstance(out, torch.Tensor) and out.shape == x.shape and residual.shape == x.shape
    (gm,) = graphs
    text = str(gm.graph)
    assert "forge_test_prenorm.layer_norm_fn" in text and "forge_test_prenorm.rms_norm_fn" in text, text

    # a call that needs gradients: these ops have a backward in the manifest (add_norm_grad), so the custom op; Liger's
    # GeGLU has none, so its host code (the file's autograd.Function), which Dynamo cannot trace whole
    wg = torch.empty(1000, device="meta", dtype=torch.float16, requires_grad=True)
    torch._dynamo.reset()
    out, _ = torch.compile(block, fullgraph=True, backend=backend)(x, wg, b, torch.empty_like(x))
    assert out.requires_grad and len(graphs) == 2 and "forge_test_prenorm.rms_norm_fn" in str(graphs[1].graph)
    assert "geglu" in ops and not realworld_plan.modules["geglu"].get("autograd")

    def mlp(a, b):
        return ops["geglu"](a, b) * 2

    a = torch.empty(4, 1000, device="meta", dtype=torch.float16)
    with pytest.raises(torch._dynamo.exc.Unsupported):  # Dynamo in the host code, not a graph with the op
        torch.compile(mlp, fullgraph=True, backend=backend)(a.clone().requires_grad_(), a)
    assert len(graphs) == 2
    with torch.no_grad():  # inference: the custom op
        torch.compile(mlp, fullgraph=True, backend=backend)(a, a)
    assert len(graphs) == 3 and "forge_test_prenorm.geglu" in str(graphs[2].graph)


def test_meta_implementation_answers_device_questions_about_a_meta_device_for_the_current_gpu(monkeypatch) -> None:
    """mamba's backward: ``torch.cuda.get_device_properties(x.device)`` sizes its scratch by the SM count, and a
    Meta implementation gets meta tensors; the question is answered for the current GPU (None), any other device
    passed through, and torch's own function back afterwards."""
    import torch

    from forge_aot.runtime.fake_env import meta_switches_nothing

    asked = []

    def props(device=None):
        asked.append(device)
        return "props"

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    with meta_switches_nothing():
        x = torch.empty(2, device="meta")
        assert torch.cuda.get_device_properties(x.device) == "props"
        torch.cuda.get_device_properties(torch.device("cuda", 1))
        with torch.cuda.device(x.device.index):  # None on a meta tensor: switches nothing (CPU-only torch too)
            pass
    assert asked == [None, torch.device("cuda", 1)] and torch.cuda.get_device_properties is props


VALUE_READS = DYNAMIC_KERNEL.split("def examples")[0] + textwrap.dedent('''\
    def doubled_if_any(x):
        """Reads values (a host sync) that no result's shape follows: a custom op with stand-ins."""
        out = torch.empty_like(x)
        if (x > 0).any() and torch.equal(x[:1], x[:1]):
            double_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, (x != 0).sum().item(), BLOCK=1024)
        return out


    def positives(x):
        """A result whose size is a value the host code reads: no Meta implementation can give it."""
        out = torch.empty(int((x > 0).sum()), device=x.device, dtype=x.dtype)
        double_kernel[(1,)](x, out, out.numel(), BLOCK=1024)
        return out


    def varlen_double(x, cu_seqlens):
        """FLA's varlen chunking: chunk indices from ``cu_seqlens.tolist()`` (a host sync), an output of x's shape."""
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        chunks = torch.cat([torch.arange(triton.cdiv(n, 64)) for n in lens]).to(x.device)
        out = torch.empty_like(x)
        double_kernel[(max(len(chunks), 1),)](x, out, x.numel(), BLOCK=1024)
        return out


    def examples(device="cpu"):
        x = torch.randn(1000, device=device, dtype=torch.float16)
        doubled_if_any(x), positives(x)
        varlen_double(x, torch.tensor([0, 300, 1000], device=device))
    ''')


def test_host_code_that_reads_tensor_values_is_a_custom_op_unless_a_result_size_follows_them(tmp_path) -> None:
    """Liger's ``(target != ignore).sum().item()``: the Meta implementation answers value reads with stand-ins, and
    the build runs it on every traced call (other stand-ins too): an op whose result size follows a value gets no
    custom op (a plain Python op, with the reason), rather than a wrong shape or an error while a model compiles."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    (tmp_path / "p").mkdir()
    ops = _dynamic_ops(tmp_path / "p", "forge_test_reads", VALUE_READS, ["doubled_if_any", "positives",
                                                                         "varlen_double"])
    plan = make_plan(load_manifest(tmp_path / "p" / "kernel_manifest.toml"), ["sm_90"])
    schemas, notes = plan.modules["double"]["schemas"], plan.modules["double"]["schema_notes"]
    assert schemas["doubled_if_any"] == "(Tensor x) -> Tensor", notes
    assert schemas["varlen_double"] == "(Tensor x, Tensor cu_seqlens) -> Tensor", notes
    assert schemas["positives"] is None
    assert "follow tensor values its host code reads" in notes["positives"], notes["positives"]
    assert not hasattr(ops, "positives")
    with FakeTensorMode():
        y = ops.doubled_if_any(torch.empty(77, device="cuda", dtype=torch.float16))
        assert y.shape == (77,) and y.device.type == "cuda"
        cu = torch.empty(4, device="cuda", dtype=torch.int64)
        assert ops.varlen_double(torch.empty(77, device="cuda", dtype=torch.float16), cu).shape == (77,)
    exported = _export(ops.doubled_if_any, (torch.randn(300, dtype=torch.float16),), None)
    assert [str(n.target) for n in exported.graph.nodes if n.op == "call_function"] == [
        "forge_test_reads.doubled_if_any.default"]


def test_stand_ins_answer_every_value_read_of_meta_tensors_and_leave_real_ones_alone() -> None:
    import torch

    from forge_aot.runtime.errors import ForgeRuntimeError
    from forge_aot.runtime.torch_ops import fake_call, stand_ins

    m = torch.empty(2, 3, dtype=torch.int32, device="meta")
    with stand_ins() as reads:
        assert m.tolist() == [[0, 1, 2], [3, 4, 5]] and m.sum().item() == 1 and int(m[0, 0]) == 1
        assert m.float().mean().item() == 1.0 and bool(m.any()) and torch.equal(m, m)
        assert torch.empty(0, 2, device="meta").tolist() == [] and torch.empty((), device="meta").tolist() == 1.0
        assert torch.tensor([5, 6]).tolist() == [5, 6] and torch.tensor(2.5).item() == 2.5  # real data: real values
    assert reads.used
    with stand_ins(3):
        assert torch.empty(4, dtype=torch.int64, device="meta").tolist() == [0, 3, 6, 9]
    with pytest.raises(ForgeRuntimeError, match="follow tensor values"):
        fake_call(lambda x: x.new_empty(int(x.sum())), (torch.empty(8, device="meta"),), {})
    out = fake_call(lambda x: x.new_empty(8 if x.sum().item() else 9), (torch.empty(8, device="meta"),), {})
    assert out.shape == (8,)


def test_addresses_of_meta_and_fake_tensors_compare_as_on_the_gpu() -> None:
    """lmdeploy's ``fill_kv_cache_blocked_fp8`` asks ``k_caches.data_ptr() == v_caches.data_ptr()``: on the fake
    tensors of torch.compile's tracing that raised "Cannot access data pointer of Tensor" and the op's
    ``torch.compile(fullgraph=True)`` failed. A Meta implementation's address reads answer from the storage's
    identity and offset: views of one storage compare as on the GPU, and no data value counts as read."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from forge_aot.runtime.torch_ops import fake_call, stand_ins

    m = torch.empty(2, 8, dtype=torch.float16, device="meta")
    with stand_ins() as reads:
        assert m.data_ptr() == m[0].data_ptr() == m.view(16).data_ptr() and m.data_ptr() % 512 == 0
        assert m[1].data_ptr() == m.data_ptr() + 16 and m.data_ptr() != torch.empty_like(m).data_ptr()
        real = torch.empty(3)
        assert real.data_ptr() == real.untyped_storage().data_ptr()  # a real tensor's own address
    assert not reads.used

    def copy_into(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        return dst.clone() if src.data_ptr() == dst.data_ptr() else dst + 1

    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.empty(8, device="meta"))
        assert fake_call(copy_into, (x, x[:]), {}).shape == (8,)
        assert fake_call(copy_into, (x, torch.empty_like(x)), {}).shape == (8,)


def test_annotations_that_make_no_schema_are_named_so() -> None:
    """lmdeploy's ``quant_fp8`` annotates its parameters but not its result: the note said "no type annotations"."""
    import torch

    from forge_aot.schema import op_schema

    namespace = {"torch": torch}
    exec("def op(x: torch.Tensor, n: int):\n    return x\n\n\ndef bare(x, n):\n    return x\n", namespace)
    assert op_schema(namespace["op"], [])[1] == (
        "annotations that make no schema (No return type annotation was provided. Please add one), and no traced "
        "call reaches it (from the examples or another op's code, one that binds its parameters)")
    assert op_schema(namespace["bare"], [])[1].startswith("no type annotations, and no traced call reaches it")


def test_an_op_returning_a_view_of_an_input_is_no_custom_op_and_a_class_is_no_op(tmp_path) -> None:
    """Liger's swiglu forward returns ``a.view(-1, n_cols)``: its output shares the input's memory, which a custom
    op's schema may not say (torch's own custom_op refuses it), so the op stays Python calls, with the reason (before,
    only ``return a`` itself was caught). An ``autograd.Function`` listed as an op is refused, naming [exports]."""
    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def double_kernel(a, c, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(c + offs, tl.load(a + offs, mask=offs < n) * 2, mask=offs < n)


        def double_forward(a):
            a = a.view(-1, a.shape[-1])
            c = torch.empty_like(a)
            double_kernel[(triton.cdiv(a.numel(), 256),)](a, c, a.numel(), BLOCK=256)
            return a, c


        def double(a):
            c = torch.empty_like(a)
            double_kernel[(triton.cdiv(a.numel(), 256),)](a, c, a.numel(), BLOCK=256)
            return c


        class DoubleFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                return double(a)


        def examples(device="cpu"):
            double_forward(torch.empty(4, 8, 32, device=device))
            double(torch.empty(4, 8, 32, device=device))
    '''))
    manifest = tmp_path / "kernel_manifest.toml"
    head = ('[project]\nname = "forge_test_views"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.double]\n'
            'source = "k.py:double_kernel"\nsignature = { a = "*fp32" }\nexamples = "examples"\n')
    manifest.write_text(head + 'ops = ["double_forward", "double"]\n')
    plan = make_plan(load_manifest(manifest))
    assert plan.modules["k"]["schemas"] == {"double": "(Tensor a) -> Tensor", "double_forward": None}
    assert "a view of one" in plan.modules["k"]["schema_notes"]["double_forward"]
    manifest.write_text(head + 'ops = ["double", "DoubleFunction"]\n')
    from forge_aot.errors import ManifestError

    with pytest.raises(ManifestError, match=r"kernels.double.ops\[1\]: 'DoubleFunction' is a class in k.py: an op "
                                            r"must be a function .*\[exports\] DoubleFunction"):
        make_plan(load_manifest(manifest))


def test_an_op_only_other_ops_call_takes_its_schema_from_those_calls(tmp_path) -> None:
    """SGLang's extend attention calls the prefill file's op from inside its own. The inner op's schema came from the
    calls examples made themselves only (none here); since session 48 (Cut Cross-Entropy's training path calls its
    LSE op with other arguments than the examples do) the other op's calls count too: under torch.compile they reach
    the inner custom op through routing. An op no traced call reaches says so."""
    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def copy_kernel(a, c, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(c + offs, tl.load(a + offs, mask=offs < n), mask=offs < n)


        def inner(a):
            c = torch.empty_like(a)
            copy_kernel[(triton.cdiv(a.numel(), 256),)](a, c, a.numel(), BLOCK=256)
            return c


        def outer(a):
            return inner(a)


        def examples(device="cpu"):
            outer(torch.empty(1000, device=device))
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_test_inner"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.copy]\n'
        'source = "k.py:copy_kernel"\nsignature = { a = "*fp32" }\nexamples = "examples"\nops = ["outer", "inner"]\n')
    module = make_plan(load_manifest(tmp_path / "kernel_manifest.toml")).modules["k"]
    assert module["schemas"] == {"outer": "(Tensor a) -> Tensor", "inner": "(Tensor a) -> Tensor"}
    (tmp_path / "k.py").write_text((tmp_path / "k.py").read_text().replace("    return inner(a)", (
        "    c = torch.empty_like(a)\n    copy_kernel[(triton.cdiv(a.numel(), 256),)](a, c, a.numel(), BLOCK=256)\n"
        "    return c")))
    module = make_plan(load_manifest(tmp_path / "kernel_manifest.toml")).modules["k"]
    assert module["schemas"]["inner"] is None
    assert "no traced call reaches it" in module["schema_notes"]["inner"]


def test_legacy_tensor_annotations_read_as_tensors() -> None:
    """flash-linear-attention annotates ``cu_seqlens: torch.LongTensor | None``: a Tensor for the op's schema (it
    had given no custom op), with or without ``from __future__ import annotations``."""
    import torch

    from forge_aot.schema import op_schema

    def a(x: torch.Tensor, cu_seqlens: torch.LongTensor | None = None) -> torch.Tensor:
        return x

    ns: dict = {}
    exec("from __future__ import annotations\nimport typing\nimport torch\n\n\n"
         "def b(x: torch.FloatTensor, idx: typing.Optional[torch.cuda.LongTensor] = None) -> torch.Tensor:\n"
         "    return x\n", ns)
    b = ns["b"]

    assert op_schema(a, [])[0] == "(Tensor x, Tensor? cu_seqlens=None) -> Tensor"
    assert op_schema(b, [])[0] == "(Tensor x, Tensor? idx=None) -> Tensor"
    # FLA 0.3.0 decorates its ops with @torch.compiler.disable: the annotations are read where the op was written,
    # not in the decorator's module (which has no ``Optional``: "no schema type", no custom op before)
    ns = {}
    exec("from typing import Optional\nimport torch\n\n\n@torch.compiler.disable\n"
         "def c(x: torch.Tensor, cu_seqlens: Optional[torch.LongTensor] = None) -> torch.Tensor:\n"
         "    return x\n", ns)
    assert op_schema(ns["c"], [])[0] == "(Tensor x, Tensor? cu_seqlens=None) -> Tensor"


def test_an_autograd_functions_apply_is_an_op(tmp_path) -> None:
    """Triton's tutorial 05 exports ``layer_norm = LayerNorm.apply``: a Function's ``apply`` bound to a top-level
    name is the file's op. Its schema comes from ``forward``'s parameters, less the ``ctx`` a forward without
    ``setup_context`` takes; the exported op carries the op's name, the Function's docstring and those parameters;
    its custom op runs on meta tensors, and the eager call differentiates through the Function's own backward."""
    import inspect

    import torch

    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def scale_kernel(a, c, n, s, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(c + offs, tl.load(a + offs, mask=offs < n) * s, mask=offs < n)


        class Scale(torch.autograd.Function):
            """a * s, the tutorial's way: forward(ctx, ...)."""

            @staticmethod
            def forward(ctx, a, s=2.0):
                c = torch.empty_like(a)
                scale_kernel[(triton.cdiv(a.numel(), 256),)](a, c, a.numel(), s, BLOCK=256)
                ctx.s = s
                return c

            @staticmethod
            def backward(ctx, dc):
                return scale(dc, ctx.s), None


        class Triple(torch.autograd.Function):
            """a * 3, the newer way: forward without ctx, setup_context beside it."""

            @staticmethod
            def forward(a):
                return scale(a, 3.0)

            @staticmethod
            def setup_context(ctx, inputs, output):
                pass

            @staticmethod
            def backward(ctx, dc):
                return scale(dc, 3.0)


        scale = Scale.apply
        triple = Triple.apply
        not_an_op = torch.nn.Module.apply  # an attribute of a class the file does not define: not the file's


        def examples(device="cpu"):
            x = torch.randn(1000, device=device, requires_grad=True)
            scale(x, 0.5).sum().backward()
            triple(x)
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_test_apply"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.scale]\n'
        'source = "k.py:scale_kernel"\nsignature = { a = "*fp32" }\nexamples = "examples"\n'
        'ops = ["scale", "triple"]\n')
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"), ["sm_90"])
    assert plan.modules["k"]["schemas"] == {"scale": "(Tensor a, float s=2.0) -> Tensor",
                                            "triple": "(Tensor a) -> Tensor"}
    (tmp_path / "kernel_manifest.toml").write_text(
        (tmp_path / "kernel_manifest.toml").read_text().replace('"triple"]', '"not_an_op"]'))
    from forge_aot.errors import ManifestError

    with pytest.raises(ManifestError, match="no host function 'not_an_op'"):
        make_plan(load_manifest(tmp_path / "kernel_manifest.toml"), ["sm_90"])

    from forge_aot.runtime.exports import export

    index = build_index(plan, None, "jit", {m: s["path"] for m, s in plan.modules.items()})
    bound = rt.bind_ops("forge_test_apply", index, None,
                        {m: (s["path"], s["host_source"]) for m, s in plan.modules.items()})
    rt.register_torch_ops("forge_test_apply", index, bound)
    exported = export(lambda op: bound[op], "forge_test_apply", "scale", custom=True,
                      spec=("k", plan.modules["k"]["schemas"]["scale"]))
    x = torch.empty(300, 7, device="meta")
    assert torch.ops.forge_test_apply.scale(x, 4.0).shape == (300, 7)
    assert torch.ops.forge_test_apply.triple(x).shape == (300, 7)
    from forge_aot.runtime.torch_ops import call_without_launches

    call_without_launches(exported, x)  # the first call loads the host function: its name, docstring, parameters
    assert exported.__name__ == "scale" and exported.__module__ == "forge_test_apply._ops.k"
    assert exported.__doc__ == "a * s, the tutorial's way: forward(ctx, ...)."
    assert str(inspect.signature(exported)) == "(a, s=2.0)"
    leaf = torch.empty(5, device="meta", requires_grad=True)
    call_without_launches(lambda: exported(leaf, 0.5).sum().backward())  # the Function's own backward
    assert leaf.grad is not None and leaf.grad.shape == (5,)


def test_a_meta_implementation_under_fake_gpu_tensors_sees_their_gpu() -> None:
    """torch.compile's FakeTensorMode calls a Meta kernel with tensors that say ``meta``; the runtime runs the host
    code as a fake implementation instead (bitsandbytes' ``assert x.is_cuda`` holds, allocations on ``x.device`` are
    fake tensors of that device), and leaves the mode as it was, also where the host code raises: there the error is
    the host code's own where torch has the GPU; a CPU-only torch, which cannot run every op on fake CUDA tensors,
    runs the call as a Meta kernel (whose tensors say ``meta``) instead."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from forge_aot.runtime.torch_ops import fake_call

    lib = torch.library.Library("forge_test_fake_gpu", "DEF")
    lib.define("op(Tensor x) -> Tensor")
    seen = []

    def host(x):
        seen.append((str(x.device), x.is_cuda))
        assert x.is_cuda
        if x.shape[0] == 3:
            raise ValueError("three rows")
        return torch.empty(x.shape[0] * 2, device=x.device)

    lib.impl("op", lambda x: fake_call(host, (x,), {}), "Meta")
    with FakeTensorMode() as mode:
        y = torch.ops.forge_test_fake_gpu.op(torch.empty(5, device="cuda"))
        assert y.shape == (10,) and str(y.device) == "cuda:0" and type(y).__name__ == "FakeTensor"
        with pytest.raises(ValueError if torch.cuda.is_available() else AssertionError) as raised:
            torch.ops.forge_test_fake_gpu.op(torch.empty(3, device="cuda"))
        if not torch.cuda.is_available():  # the Meta kernel's error, the fake GPU call's behind it (flashinfer's
            # merge_states asked torch.cuda.get_device_properties there; the Meta kernel's own error hid that)
            assert isinstance(raised.value.__context__, ValueError) and "three rows" in str(raised.value.__context__)
        assert not mode.in_kernel_invocation and not torch._C._meta_in_tls_dispatch_include()
        assert torch.ops.forge_test_fake_gpu.op(torch.empty(4, device="cuda")).shape == (8,)
    assert seen[0] == ("cuda:0", True) and ("meta", False) not in seen[:2]
    with FakeTensorMode(), pytest.raises(AssertionError):  # fake CPU tensors: a Meta kernel's meta tensors, as before
        torch.ops.forge_test_fake_gpu.op(torch.empty(5))
    assert seen[-1] == ("meta", False)


def test_an_output_buffer_left_none_by_every_example_is_left_out_of_the_schema(tmp_path) -> None:
    """mamba's ``_bmm_chunk_bwd(a, dout, residual=None, out=None)``: ``out = torch.empty_like(x) if out is None else
    out``. Typed ``Tensor? out=None`` (what the op's code puts there), the schema would say a caller's ``out`` is
    neither written nor returned, which it is; a schema without the buffer is the op's custom op for the calls that
    leave it None (the others run as Python: tests/test_chunk_bmm_bwd.py), also where type annotations give the
    schema; also where the op's code copies the buffer to a local it tests (vLLM's ``x_q = out_q``). A scratch the
    op's code makes for a None argument that it neither writes nor returns keeps its type; an example passing the
    buffer costs the op its custom op."""
    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def scale_kernel(a, c, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(c + offs, tl.load(a + offs, mask=offs < n) * 2, mask=offs < n)


        def scale(x, out=None):
            out = torch.empty_like(x) if out is None else out
            scale_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
            return out


        def scale_like(x, like=None):
            like = torch.empty_like(x) if like is None else like
            c = torch.empty(like.shape, dtype=like.dtype)
            scale_kernel[(triton.cdiv(x.numel(), 256),)](x, c, x.numel(), BLOCK=256)
            return c


        def scale_annotated(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            return scale(x, out)


        @torch.inference_mode()
        def scale_copied(x: torch.Tensor, out_q: torch.Tensor | None = None) -> torch.Tensor:
            x_q = out_q  # vLLM's per_token_group_quant_fp8: the buffer copied to a local, that local tested
            if x_q is None:
                x_q = torch.empty_like(x)
            scale_kernel[(triton.cdiv(x.numel(), 256),)](x, x_q, x.numel(), BLOCK=256)
            return x_q


        def examples(device="cpu"):
            scale(torch.randn(1000, device=device))
            scale_like(torch.randn(1000, device=device))
            scale_annotated(torch.randn(1000, device=device))
            scale_copied(torch.randn(1000, device=device))
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_test_out_buffer"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.scale]\n'
        'source = "k.py:scale_kernel"\nsignature = { a = "*fp32" }\nexamples = "examples"\n'
        'ops = ["scale", "scale_like", "scale_annotated", "scale_copied"]\n')
    module = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"), ["sm_90"]).modules["k"]
    assert module["schemas"]["scale"] == "(Tensor x) -> Tensor"
    assert module["schema_notes"]["scale"] == ("from the traced examples; without its output buffer out (None in "
                                               "every traced call: a call passing one runs as Python, the others "
                                               "as the custom op)")
    assert module["schemas"]["scale_like"] == "(Tensor x, Tensor? like=None) -> Tensor"
    assert module["schemas"]["scale_annotated"] == "(Tensor x) -> Tensor"
    assert module["schema_notes"]["scale_annotated"].startswith("from the type annotations; without its output")
    assert module["schemas"]["scale_copied"] == "(Tensor x) -> Tensor"
    assert module["buffers"] == {"scale": [["out", 1]], "scale_annotated": [["out", 1]], "scale_copied": [["out_q", 1]]}

    (tmp_path / "k.py").write_text((tmp_path / "k.py").read_text() + "    scale(torch.randn(10), torch.empty(10))\n")
    module = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"), ["sm_90"]).modules["k"]
    assert module["schemas"]["scale"] is None
    assert module["buffers"] == {"scale_annotated": [["out", 1]], "scale_copied": [["out_q", 1]]}
    assert module["schema_notes"]["scale"] == ("argument out is an output buffer the op writes or returns, and "
                                               "some traced call passes one (a custom op's outputs may not alias "
                                               "its inputs)")


def test_an_in_place_torch_write_into_an_argument_marks_it_written(tmp_path) -> None:
    """What an op writes is also what its host code changes in place with torch (the examples' version counters):
    ``x.mul_(2)`` before the launch makes ``x`` a ``Tensor(a!)``, as a launch writing through it would; an in-place
    op on a tensor the op made itself changes nothing."""
    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def copy_kernel(a, c, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(c + offs, tl.load(a + offs, mask=offs < n), mask=offs < n)


        def doubled_copy(x):
            x.mul_(2)
            c = torch.empty_like(x)
            copy_kernel[(triton.cdiv(x.numel(), 256),)](x, c, x.numel(), BLOCK=256)
            return c


        def fresh_doubled(x):
            c = torch.empty_like(x)
            copy_kernel[(triton.cdiv(x.numel(), 256),)](x, c, x.numel(), BLOCK=256)
            return c.mul_(2)


        def examples(device="cpu"):
            doubled_copy(torch.randn(1000, device=device))
            fresh_doubled(torch.randn(1000, device=device))
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_test_inplace"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.copy]\n'
        'source = "k.py:copy_kernel"\nsignature = { a = "*fp32" }\nexamples = "examples"\n'
        'ops = ["doubled_copy", "fresh_doubled"]\n')
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"), ["sm_90"])
    module = plan.modules["k"]
    assert module["schemas"]["doubled_copy"] == "(Tensor(a!) x) -> Tensor"
    assert module["schemas"]["fresh_doubled"] == "(Tensor x) -> Tensor"
    # the index tells the runtime's guard what the kernel writes through
    assert plan.kernels["copy"].spec_json()["writes"] == ["c"]


def test_an_argument_none_in_every_call_takes_its_own_annotation_where_the_whole_signature_gives_none() -> None:
    """flash-attn's ``cross_entropy_loss(logits, labels, ..., precomputed_lse: Optional[torch.Tensor] = None, ...)``
    has no result annotation, so ``infer_schema`` takes none of its annotations and the schema comes from the traced
    calls, where every call leaves ``precomputed_lse`` None: its own annotation types it (the message had said
    "annotate it" of an annotated argument; session 38's hunt). Parameters neither annotated nor ever given a value
    are left out of the schema."""
    import torch

    from forge_aot.schema import op_schema

    # (this file's annotations are strings, read where it was written: as flash-attn's Optional[...] are)
    def op(x: torch.Tensor, lse: torch.Tensor | None = None, scale: float | None = None,
           plain: torch.Tensor = None, ignore_index: int = -100):
        return x * 2

    call = ((torch.ones(3),), {}, torch.ones(3) * 2, [], {})
    schema, how, _ = op_schema(op, [call])
    assert schema == ("(Tensor x, Tensor? lse=None, float? scale=None, Tensor? plain=None, int ignore_index=-100) "
                      "-> Tensor")
    assert how == "from the traced examples; lse as annotated, scale as annotated, plain as annotated"

    def unannotated(x: torch.Tensor, process_group=None, group_size=None):
        return x * 2

    # (such parameters are left out of the schema, a call passing one running as Python: since session 50 two too)
    schema, how, _ = op_schema(unannotated, [call])
    assert schema == "(Tensor x) -> Tensor" and how.endswith(
        "without arguments process_group and group_size (None in every traced call, its type unknown: a call passing "
        "one runs as Python, the others as the custom op)"), how

    def untyped_kept(x: torch.Tensor, process_group=None):
        return x * process_group  # (a call passing one: its type is that call's, nothing left out)

    assert op_schema(untyped_kept, [call, ((torch.ones(3), 2.0), {}, torch.ones(3) * 2, [], {})])[0] == \
        "(Tensor x, float? process_group=None) -> Tensor"
