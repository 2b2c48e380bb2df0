"""PyTorch's own route for Triton kernels (tests/fixtures/realworld/kernels/rotary.py): launches through
``torch.library.wrap_triton(kernel)[grid](...)`` under ``with torch.cuda.device(...)`` (flash-attn's rotary) and an
op decorated ``@torch.library.triton_op`` (torchao), packaged unchanged.

CPU: the host code's rewrite to the runtime's stand-ins, the launch sites, the schemas, a mutating triton_op.
GPU: the wheel against torch in fp64 and against the same file under Triton's JIT, torch.compile over the op."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from forge_aot import runtime as rt
from forge_aot.sourcesplit import parse_source
from tests.conftest import HALF_TOL, REALWORLD, offset_view, poison_allocator, relative_error

SOURCE = REALWORLD / "kernels" / "rotary.py"


def test_torch_librarys_triton_entry_points_bind_the_runtimes_stand_ins() -> None:
    src = parse_source(SOURCE, {"apply_rotary", "rotary"})
    host = src.host_source.splitlines()
    original = SOURCE.read_text().splitlines()
    assert len(host) == len(original)
    at = original.index("from torch.library import triton_op, wrap_triton")
    assert host[at] == "triton_op = triton._triton_op; wrap_triton = triton._wrap_triton"
    launch = next(i for i, line in enumerate(original) if "torch.library.wrap_triton(_rotary_kernel)" in line)
    assert host[launch] == original[launch].replace("torch.library.wrap_triton", "triton._wrap_triton")
    assert {(s.function, s.keywords) for s in src.launches} == {("_launch", ("BLOCK_K", "BLOCK_M")),
                                                                 ("rotary", ("BLOCK_K", "BLOCK_M"))}
    assert src.mutating_ops == {}
    compile(src.host_source, str(SOURCE), "exec")


def test_a_triton_op_that_writes_its_arguments_is_no_custom_op(tmp_path: Path) -> None:
    f = tmp_path / "k.py"
    f.write_text("import torch\nimport triton\nfrom torch.library import triton_op as top, custom_op, "
                 "wrap_triton\n\n@triton.jit\ndef k(x):\n    pass\n\n"
                 "@top('t::scale_', mutates_args={'x'})\ndef scale_(x: torch.Tensor) -> None:\n"
                 "    wrap_triton(k)[(1,)](x)\n")
    src = parse_source(f, {"scale_"})
    assert src.mutating_ops == {"scale_": "{'x'}"}
    # custom_op too: the package defines the library's ops in its own namespace (host_driver._custom_op)
    assert src.host_source.splitlines()[2] == \
        "top = triton._triton_op; custom_op = triton._custom_op; wrap_triton = triton._wrap_triton"


def test_the_stand_ins_give_the_handle_back_and_call_the_function_as_it_is() -> None:
    spec = {"function": "k", "params": [["x", "*fp16"]], "axes": [], "dtype_args": {}, "spec_params": [],
            "key": [], "variants": {}}
    handle = rt.Kernel("k", spec, {}, backend=None)
    assert rt.host_triton._wrap_triton(handle) is handle
    with pytest.raises(RuntimeError, match="wrap_triton"):  # anything else is torch's business (and error)
        rt.host_triton._wrap_triton(lambda: None)

    def op(x):
        return x

    # the function, called as it is (with CustomOpDef's registrations: a call needing a registered autograd goes
    # through the op, tests/test_library_patterns.py)
    for wrapped in (rt.host_triton._triton_op("a::b", mutates_args={})(op), rt.host_triton._triton_op(
            "a::b", op, mutates_args=())):
        assert wrapped.__wrapped__ is op and wrapped._init_fn is op and wrapped(5) == 5 and wrapped.__name__ == "op"


def test_a_libraries_custom_op_is_defined_in_the_packages_namespace() -> None:
    """``@torch.library.custom_op("ns::name")`` in shipped host code defines ``<package>__ns::name``: the library's
    own definition of ``ns::name`` in the same process (a user importing both) stays as it is, and so does the
    package's. Under one name, the later definition would destroy the earlier one's registration (torch's
    get_library_allowing_overwrite), leaving its callers on a freed operator: the H100 suite crashed so in session
    35 (std::bad_alloc, an internal assert) where a wheel's module loaded before the library's file."""
    import torch

    def twice(x):
        return x * 2

    library = torch.library.custom_op("forge_test_lib::twice", twice, mutates_args=(), schema="(Tensor x) -> Tensor")
    packaged = rt.host_triton._custom_op("forge_test_lib::twice", twice, mutates_args=(),
                                         schema="(Tensor x) -> Tensor")

    assert packaged._qualname == "forge_aot__forge_test_lib::twice"  # the runtime as forge_aot ships it
    x = torch.randn(5)
    assert torch.equal(library(x), x * 2) and torch.equal(packaged(x), x * 2)
    assert torch.equal(torch.ops.forge_test_lib.twice(x), x * 2)
    assert torch.equal(torch.ops.forge_aot__forge_test_lib.twice(x), x * 2)


def test_plan_traces_both_styles(realworld_plan) -> None:
    plan = realworld_plan
    variants = {(e.assignment["T"], e.assignment["BLOCK_K"], e.assignment["BLOCK_M"]) for e in plan.entries
                if e.kernel == "rotary"}
    assert variants == {(t, k, 8) for t in ("fp16", "bf16") for k in (64, 128)}
    schema = "(Tensor x, Tensor cos, Tensor sin) -> Tensor"
    assert plan.modules["kernels_rotary"]["schemas"] == {"apply_rotary": schema, "rotary": schema,
                                                         "rotary_custom": schema}
    assert plan.modules["kernels_rotary"]["schema_notes"]["rotary_custom"] == "from its @torch.library.custom_op"


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(realworld):
    return realworld


@pytest.fixture(scope="module")
def jit():
    """The file under Triton's JIT, imported once per process (its triton_op registers forge_fixture::rotary)."""
    from forge_aot.introspect import load_kernel_module

    return load_kernel_module(str(SOURCE))


def _inputs(dtype: str, batch: int, seqlen: int, nheads: int, headdim: int, rotary_dim: int, layout: str):
    import torch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    if layout == "bhsd":  # (batch, nheads, seqlen, headdim) transposed: rows nheads * headdim apart are heads apart
        x = torch.randn(batch, nheads, seqlen, headdim, device="cuda", dtype=dt).transpose(1, 2)
    else:
        x = torch.randn(batch, seqlen, nheads, headdim, device="cuda", dtype=dt)
        if layout == "misaligned":
            x = offset_view(x)
    angle = torch.randn(seqlen, rotary_dim // 2, device="cuda") * 3
    return x, angle.cos().to(dt), angle.sin().to(dt)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(2, 1000, 8, 128, 128), (1, 77, 4, 64, 64), (2, 256, 8, 128, 64),
                                   (3, 513, 2, 128, 128), (1, 1, 1, 64, 64)])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned", "bhsd"])
def test_rotary_both_styles_against_torch_and_the_jit(wheel, jit, dtype, shape, layout) -> None:
    import torch

    x, cos, sin = _inputs(dtype, *shape, layout)
    ref = jit.rotary_reference(x, cos, sin)
    for name in ("apply_rotary", "rotary", "rotary_custom"):
        poison_allocator(x.numel() * x.element_size())
        y = getattr(wheel, name)(x, cos, sin)
        torch.cuda.synchronize()
        assert y.shape == x.shape and y.dtype == x.dtype
        assert relative_error(y, ref) < HALF_TOL[dtype], name
        # rotary_custom is a @torch.library.custom_op: its name is global, and in this process the file, the
        # development-mode plan and the wheel each registered it (the last registration serves every caller, so
        # the file's own object would not run the file's code); its body is apply_rotary (the wheel's own
        # custom op runs alone in test_the_custom_op_runs_from_the_wheel_alone)
        jy = (jit.apply_rotary if name == "rotary_custom" else getattr(jit, name))(x, cos, sin)
        if layout == "contiguous" and shape[:2] in ((2, 1000), (1, 77), (2, 256)):
            assert torch.equal(y, jy), name  # a traced shape: the JIT's own binary
        else:
            assert relative_error(y, jy.double()) < HALF_TOL[dtype], name


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rotary", "rotary_custom"])
def test_the_triton_op_is_a_package_custom_op_torch_compile_keeps_whole(wheel, op) -> None:
    import torch

    x, cos, sin = _inputs("fp16", 2, 300, 8, 128, 128, "contiguous")
    assert hasattr(torch.ops.forge_realworld, op)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fn = getattr(wheel, op)
    compiled = torch.compile(lambda a, c, s: fn(a, c, s) + 1, fullgraph=True, backend=backend)
    assert torch.equal(compiled(x, cos, sin), fn(x, cos, sin) + 1)
    (gm,) = graphs
    assert f"forge_realworld.{op}" in [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.gpu
def test_the_custom_op_runs_from_the_wheel_alone(realworld) -> None:  # (skips without the wheel)
    """A fresh process with the wheel only (Triton unimportable): its @torch.library.custom_op, defined in the
    package's namespace (forge_realworld__forge_fixture::rotary_custom), runs the packaged host code and kernel."""
    import json
    import subprocess
    import sys
    import textwrap

    from tests.test_cold_process_gpu import NO_TRITON

    child = NO_TRITON + textwrap.dedent("""
        import torch
        import forge_realworld
        x = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.float16)
        angle = torch.randn(1000, 64, device="cuda")
        cos, sin = angle.cos().half(), angle.sin().half()
        y = forge_realworld.rotary_custom(x, cos, sin)
        z = torch.ops.forge_realworld__forge_fixture.rotary_custom(x, cos, sin)
        x0, x1 = x.double()[..., :64], x.double()[..., 64:]
        c, s = cos.double()[:, None, :], sin.double()[:, None, :]
        ref = torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)
        print(json.dumps({"err": ((y.double() - ref).norm() / ref.norm()).item(), "same": torch.equal(y, z),
                          "triton": sorted(m for m in sys.modules if m.split(".")[0] == "triton")}))
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["err"] < HALF_TOL["fp16"] and result["same"] and result["triton"] == []


def test_a_triton_op_that_writes_what_it_declares_is_a_mutating_custom_op(tmp_path: Path) -> None:
    """``@triton_op(..., mutates_args={'x'})`` whose kernel stores into ``x``: the traced launches show the write,
    so the op is a mutating custom op (``Tensor(a!) x -> ()``); one declaring an argument its kernels never write
    stays plain calls, with the reason."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(
        "import torch\nimport triton\nimport triton.language as tl\nfrom torch.library import triton_op, "
        "wrap_triton\n\n\n@triton.jit\ndef k(x, y, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(x + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)\n\n\n"
        "@triton_op('t::double_', mutates_args={'x'})\ndef double_(x: torch.Tensor, y: torch.Tensor) -> None:\n"
        "    wrap_triton(k)[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)\n\n\n"
        "@triton_op('t::claims_', mutates_args={'y'})\ndef claims_(x: torch.Tensor, y: torch.Tensor) -> None:\n"
        "    wrap_triton(k)[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)\n\n\n"
        "def examples(device='cpu'):\n    x, y = torch.randn(1000, device=device), torch.randn(1000, device=device)\n"
        "    double_(x, y)\n    claims_(x, y)\n")
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "t_mut"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\nsource = "k.py:k"\n'
        'ops = ["double_", "claims_"]\nsignature = { x = "*fp32", y = "*fp32", n = "i32" }\nexamples = "examples"\n')
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    schemas, notes = plan.modules["k"]["schemas"], plan.modules["k"]["schema_notes"]
    assert schemas["double_"] == "(Tensor(a!) x, Tensor y) -> ()", (schemas, notes)
    assert schemas["claims_"] is None and "do not show its kernels writing" in notes["claims_"]


@pytest.mark.gpu
def test_the_wheel_and_the_library_keep_their_custom_ops_apart_in_one_process(wheel, jit) -> None:
    """The library's file (here under Triton's JIT) and the wheel's copy both define their @torch.library.custom_op
    in one process, in either order: apart (``forge_fixture::rotary_custom`` and the package's
    ``forge_realworld__forge_fixture::rotary_custom``), each calls its own, with the same results."""
    import importlib

    import torch

    wheel.preload()  # every host module of the wheel: its custom ops defined
    host = importlib.import_module("forge_realworld._ops.kernels_rotary")
    packaged = getattr(host.rotary_custom, "__forge_host__", host.rotary_custom)  # routed where the package is
    assert packaged._qualname == "forge_realworld__forge_fixture::rotary_custom"
    assert jit.rotary_custom._qualname == "forge_fixture::rotary_custom"
    x, cos, sin = _inputs("fp16", 2, 256, 8, 128, 64, "contiguous")
    for _ in range(3):
        assert torch.equal(wheel.rotary_custom(x, cos, sin), jit.rotary_custom(x, cos, sin))


def test_the_files_references_to_its_custom_ops_by_name_follow_them(tmp_path: Path) -> None:
    """Shipped host code names the ops its file defines with ``custom_op`` elsewhere too: the string in
    ``register_fake("ns::name")``, ``torch.ops.ns.name``. The split rewrites those to the package's names
    (``triton._op_name``, ``triton._ops_namespace``), so the file runs as written in the package's namespace; other
    strings and namespaces stay as they are."""
    import torch

    f = tmp_path / "k.py"
    f.write_text(textwrap.dedent('''\
        import torch
        import triton
        from torch.library import custom_op


        @triton.jit
        def k(x):
            pass


        @custom_op("forge_test_ref::double", mutates_args=())
        def double(x: torch.Tensor) -> torch.Tensor:
            return x * 2


        torch.library.register_fake("forge_test_ref::double")(lambda x: torch.empty_like(x))
        OTHER = "forge_test_ref::other"


        def quadruple(x):
            return torch.ops.forge_test_ref.double(x) + torch.ops.forge_test_ref.double.default(x) + x * 0
    '''))
    src = parse_source(f, {"quadruple"})
    lines = src.host_source.splitlines()
    assert lines[2] == "custom_op = triton._custom_op"
    assert lines[15] == ("torch.library.register_fake(triton._op_name('forge_test_ref::double'))"
                         "(lambda x: torch.empty_like(x))")
    assert lines[16] == 'OTHER = "forge_test_ref::other"'
    assert lines[20] == ("    return triton._ops_namespace('forge_test_ref').double(x) + "
                         "triton._ops_namespace('forge_test_ref').double.default(x) + x * 0")
    namespace = {"triton": rt.host_triton, "__name__": "k", "__forge_kernel_side__": lambda name, module: None}
    exec(compile(src.host_source, str(f), "exec"), namespace)
    x = torch.randn(3)
    assert torch.equal(namespace["quadruple"](x), x * 4)
    assert namespace["double"]._qualname == "forge_aot__forge_test_ref::double"
    fake = torch.ops.forge_aot__forge_test_ref.double(torch.empty(3, device="meta"))
    assert fake.device.type == "meta" and fake.shape == (3,)
