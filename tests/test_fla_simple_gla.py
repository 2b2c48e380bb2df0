"""flash-linear-attention 0.6.0's simple GLA chunk forward, its files as FLA ships them (tests/fixtures/fla060/:
``fla/ops/simple_gla/chunk.py``, ``fla/ops/common/chunk_h.py``, ``chunk_o.py``, ``fla/ops/utils/cumsum.py`` and the
``fla/utils/`` package they import). What session 32's hunt found and fixed, in one real library: Triton feature
probes and guarded Triton imports in ``fla/utils``, a computed ``do_not_specialize``, heuristics on backward kernels
the manifest leaves out, FLA's caching autotuner, the cumsum op taken through ``fla/ops/utils``' re-export.

CPU: what the build makes of those files. GPU: the wheel's ``chunk_simple_gla`` (the files' host code with the
packaged kernels, no Triton) against a float64 recurrence and against FLA itself under Triton's JIT, data-dependent
gates with and without initial and final state and a head-wise decay, lengths the examples did not use (FLA's cumsum
kernels take the batch size as a constexpr: the examples run each batch size the tests use)."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import (
    FAKE_GPU_PRELUDE,
    fake_driver_child,
    fixture_site,
    import_fixture_file,
    relative_error,
    torch_dtype,
)

FLA = __import__("pathlib").Path(__file__).parent / "fixtures" / "fla060"


@pytest.fixture(scope="module")
def fla_plan():
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    return make_plan(load_manifest(FLA / "kernel_manifest.toml"))


def test_what_the_build_makes_of_flas_files(fla_plan) -> None:
    mods = fla_plan.modules
    # the op file names cumsum's package, not the file: bound after it all the same
    assert "cumsum" in mods["chunk"]["imports_host"]
    hardware = mods["chunk_h"]["local_sources"]["fla.utils.hardware"][0]
    env = mods["chunk_h"]["local_sources"]["fla.utils.env"][0]
    assert "SUPPORTS_AUTOTUNE_CACHE = (True)" in env  # inspect.signature(triton.autotune): Triton 3.6's answer
    assert "IS_GATHER_SUPPORTED = (True)" in hardware
    assert hardware.count('raise ImportError("packaged host code runs without Triton")') == 2
    kp = fla_plan.kernels["local_cumsum_scalar"]
    assert kp.autotune is not None and "IS_VARLEN" in kp.heuristic_names
    assert {"T"} <= fla_plan.kernels["chunk_fwd_h"].do_not_specialize
    assert sorted(fla_plan.kernels) == ["chunk_fwd_h", "chunk_fwd_o", "local_cumsum_scalar", "local_cumsum_vector"]


@pytest.mark.slow
def test_the_wheel_runs_flas_files_without_triton_or_fla(tmp_path) -> None:
    """The wheel in a fresh process that can import neither Triton nor FLA: FLA's package ``__init__`` probes its
    optional parts with ``importlib.import_module("fla.layers")`` (the shipped copy's rules, the missing module named
    as FLA's own import names it), ``fla/ops/utils`` re-exports the ``@triton.jit`` helper ``softplus`` (a stand-in
    there) and imports ``csr.py``, whose kernel the manifest leaves out but decorates with heuristics; the custom
    ops' meta implementations run the files' host code on meta tensors."""

    from tests.test_localmods import _installed, _run_fresh

    target = _installed(FLA / "kernel_manifest.toml", tmp_path)
    code = textwrap.dedent('''\
        import json, sys, warnings
        sys.modules["triton"] = sys.modules["fla"] = sys.modules["forge_aot"] = None
        warnings.simplefilter("ignore")  # fla.utils.hardware warns that this machine has no GPU
        import torch, forge_fla
        from forge_fla._ops.chunk import chunk_simple_gla
        from forge_fla._ops._local.fla.ops import utils
        B, T, H, K, V = 2, 100, 4, 64, 64
        k = torch.empty(B, T, H, K, device="meta", dtype=torch.bfloat16)
        v = torch.empty(B, T, H, V, device="meta", dtype=torch.bfloat16)
        g = torch.empty(B, T, H, device="meta", dtype=torch.float32)
        h, ht = torch.ops.forge_fla.chunk_fwd_h(k, v, g, output_final_state=True)
        o = torch.ops.forge_fla.chunk_fwd_o(k, k, v, h, g, scale=0.125)
        # FLA's public op takes **kwargs (deprecated keywords, chunk_size): a custom op without them
        o2, ht2 = torch.ops.forge_fla.chunk_simple_gla(k, k, v, g, output_final_state=True)
        try:
            utils.softplus(k)
            refused = ""
        except Exception as exc:
            refused = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"h": list(h.shape), "ht": list(ht.shape), "o": list(o.shape),
                          "gla": [list(o2.shape), list(ht2.shape), str(o2.dtype), str(ht2.dtype)],
                          "softplus": repr(utils.softplus), "refused": refused,
                          "csr": "forge_fla._ops._local.fla.ops.utils.csr" in sys.modules,
                          "fla": sorted(m for m in sys.modules if m == "fla" or m.startswith("fla."))}))
        ''')
    res = _run_fresh(code, target)
    assert res["h"] == [2, 2, 4, 64, 64] and res["ht"] == [2, 4, 64, 64] and res["o"] == [2, 100, 4, 64]
    assert res["gla"] == [[2, 100, 4, 64], [2, 4, 64, 64], "torch.bfloat16", "torch.float32"]
    assert res["softplus"] == "<Triton code forge_fla._ops._local.fla.ops.utils.softplus.softplus, not packaged>"
    assert res["refused"].startswith("ForgeRuntimeError: forge_fla._ops._local.fla.ops.utils.softplus.softplus is "
                                     "Triton code")
    assert res["csr"] and res["fla"] == ["fla"]  # only the None this test put there: nothing under FLA's names


@pytest.fixture(scope="module")
def wheel():
    return pytest.importorskip("forge_fla")


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(FLA / "fla" / "ops" / "simple_gla" / "chunk.py", "_fla_simple_gla_jit")


def _reference(q, k, v, g, h0, scale):
    """float64: S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale q_t S_t, per batch and head."""
    import torch

    B, T, H, K = q.shape
    V = v.shape[-1]
    q64, k64, v64, g64 = q.double(), k.double(), v.double(), g.double()
    S = h0.double().clone() if h0 is not None else torch.zeros(B, H, K, V, dtype=torch.float64, device=q.device)
    o = torch.empty(B, T, H, V, dtype=torch.float64, device=q.device)
    for t in range(T):
        S = S * g64[:, t].exp()[..., None, None] + k64[:, t, :, :, None] * v64[:, t, :, None, :]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q64[:, t] * scale, S)
    return o, S


TOLERANCE = {"bf16": 2e-2, "fp32": 5e-3}  # fp32 inputs: FLA's tl.dot runs in tf32


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize(("B", "T"), [(2, 1000), (1, 77), (3, 300), (1, 1)])
@pytest.mark.parametrize("case", ["g", "g-states", "g_gamma"])
def test_against_float64_and_fla_itself(wheel, jit, dtype, B, T, case) -> None:
    import torch

    torch.manual_seed(B * 1000 + T)
    H, K, V = 4, 64, 64
    dt = torch_dtype(dtype)
    q, k = (torch.randn(B, T, H, K, device="cuda", dtype=dt) for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda", dtype=dt)
    kwargs = {}
    if case == "g_gamma":
        g_gamma = -torch.rand(H, device="cuda", dtype=torch.float32) * 0.5
        kwargs["g_gamma"] = g_gamma
        g_full = g_gamma.expand(B, T, H)
    else:
        g_full = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda", dtype=dt)).float()
        kwargs["g"] = g_full.to(dt)
    h0 = torch.randn(B, H, K, V, device="cuda", dtype=torch.float32) if case == "g-states" else None
    if case != "g":
        kwargs["output_final_state"] = True
    if h0 is not None:
        kwargs["initial_state"] = h0
    ref_o, ref_s = _reference(q, k, v, g_full if case == "g_gamma" else kwargs["g"], h0, K ** -0.5)
    outs = [fn(q, k, v, **kwargs) for fn in (wheel.chunk_simple_gla, jit.chunk_simple_gla)]
    for (o, s), name in zip(outs, ("wheel", "jit")):
        assert relative_error(o, ref_o) < TOLERANCE[dtype], name
        if case != "g":
            assert relative_error(s, ref_s) < TOLERANCE[dtype], name
    # FLA's autotuner picks its config at run time, the wheel takes its table's: equal up to rounding
    assert relative_error(outs[0][0], outs[1][0].double()) < TOLERANCE[dtype]


@pytest.mark.gpu
def test_a_batch_size_no_example_built_is_refused_before_any_launch(wheel) -> None:
    """FLA's cumsum kernels take the batch size as a constexpr (``B: tl.constexpr``): Triton's JIT compiles a
    binary per batch size, the wheel has those of the examples (1, 2 and 3) and refuses another, naming B."""
    import torch
    from forge_fla._runtime.errors import NotBuiltError

    q, k, v = (torch.randn(5, 64, 4, 64, device="cuda") for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(5, 64, 4, device="cuda"))
    with pytest.raises(NotBuiltError, match=r"constexpr B=5 was not built; built values: \[1, 2, 3\]"):
        wheel.chunk_simple_gla(q, k, v, g)


@pytest.mark.gpu
def test_flas_public_op_with_kwargs_compiles_fullgraph(wheel) -> None:
    """``chunk_simple_gla(..., **kwargs)`` (FLA's public ops take deprecated keywords and ``chunk_size`` through
    ``**kwargs``) is a custom op without them: torch.compile(fullgraph=True) gives the eager results exactly; a call
    passing ``chunk_size`` under torch.compile runs as Python (a graph break), with its eager results."""
    import torch

    torch.manual_seed(7)
    B, T, H, K = 2, 300, 4, 64
    q, k, v = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda")).to(torch.bfloat16)

    def block(q, k, v, g):
        o, s = wheel.chunk_simple_gla(q, k, v, g, output_final_state=True)
        return o * 2, s

    eager = block(q, k, v, g)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)(q, k, v, g)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))

    def with_chunk_size(q, k, v, g):
        return wheel.chunk_simple_gla(q, k, v, g, output_final_state=True, chunk_size=64)

    eager_chunked = with_chunk_size(q, k, v, g)  # (FLA's path for a given chunk_size: not bitwise the default's)
    torch._dynamo.reset()
    got = torch.compile(with_chunk_size)(q, k, v, g)
    assert all(torch.equal(a, b) for a, b in zip(eager_chunked, got))


LEAN_CHILD = FAKE_GPU_PRELUDE + textwrap.dedent("""
    import warnings
    warnings.simplefilter("ignore")  # fla.utils.hardware warns that this machine has no GPU
    import os
    import forge_fla as lib
    at_import = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("forge_fla._runtime."))
    if os.environ.get("SEED_RULES"):  # another project's module bound first (a package of several projects)
        import forge_fla._runtime.local_imports
        sys.modules["forge_fla._runtime.local_imports"].import_rules(
            sys.modules["forge_fla._runtime.lean"].PACKAGES["forge_fla"], ["otherproj.util"])
        lib.chunk_local_cumsum(torch.randn(1, 100, 4), 64, scale=0.5)  # (its file first: FLA's names under no rule)
    fake = FakeState.in_dll(ctypes.CDLL("libcuda.so.1"), "fake")
    fake.block_size = -1  # the whole parameter block of every launch
    torch.manual_seed(0)
    H, K = 4, 64
    cases = []
    for dtype in (torch.bfloat16, torch.float32):  # FLA's public op, its files importing each other by FLA's names
        for b, t in ((1, 100), (2, 1000)):
            q, k, v = (odd(b, t, H, K, dtype=dtype) for _ in range(3))
            g = torch.nn.functional.logsigmoid(torch.randn(b, t, H, dtype=dtype))
            cases.append(lambda q=q, k=k, v=v, g=g: lib.chunk_simple_gla(q, k, v, g))
        h0 = torch.randn(2, H, K, K)
        cases.append(lambda q=q, k=k, v=v, g=g, h0=h0: lib.chunk_simple_gla(q, k, v, g, initial_state=h0,
                                                                           output_final_state=True))
        cases.append(lambda q=q, k=k, v=v: lib.chunk_simple_gla(q, k, v, g_gamma=-torch.rand(H),
                                                               output_final_state=True))
    out = []
    for case in cases:
        before = fake.calls
        SEEN.clear()
        case()
        r = fake.launch_record()  # (the last launch of the op: chunk_fwd_o's)
        out.append([fake.calls - before, r[1], r[2], r[3], canonical_block(r[6], r[7])])
    loaded = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("forge_fla._runtime."))
    kinds = sorted({type(h).__name__ for m, mod in list(sys.modules.items()) if m.startswith("forge_fla._ops.")
                    for h in vars(mod).values() if type(h).__name__ in ("LeanKernel", "ColdKernel", "Kernel")})
    aliases = {m: sys.modules[m] is sys.modules.get("forge_fla._ops." + m.rsplit(".", 1)[1])  # (one module, two names)
               for m in ("forge_fla._ops._local.fla.ops.common.chunk_h", "forge_fla._ops._local.fla.ops.common.chunk_o",
                         "forge_fla._ops._local.fla.ops.utils.cumsum")}
    print(json.dumps({"at_import": at_import, "out": out, "loaded": loaded, "kinds": kinds, "aliases": aliases,
                      "dynamo": "torch._dynamo" in sys.modules}))
""")


@pytest.mark.slow
def test_flas_op_is_served_lean_and_launches_as_the_full_runtime(tmp_path, fake_libcuda) -> None:
    """FLA's op file imports the other kernel files by FLA's names (``from fla.ops.common.chunk_h import ...``, the
    cumsum through ``fla.ops.utils``' re-export): since session 64 the lean path binds each (every one has a lean
    plan), so the first call loads no full binding; against the fake libcuda its launches are the full runtime's
    (FORGE_NO_LEAN=1: cold handles; FORGE_NO_COLD=1: full ones), and each kernel file is one module under both names."""
    site = fixture_site(tmp_path, FLA / "kernel_manifest.toml", "forge_fla")
    init = (site / "forge_fla" / "__init__.py").read_text()
    assert "_LEAN = ('chunk', 'chunk_h', 'chunk_o', 'cumsum',)" in init
    lean = fake_driver_child(LEAN_CHILD, site, fake_libcuda)
    cold = fake_driver_child(LEAN_CHILD, site, fake_libcuda, FORGE_NO_LEAN="1")
    full = fake_driver_child(LEAN_CHILD, site, fake_libcuda, FORGE_NO_COLD="1")
    # the package's import rules made for another project first: FLA's names still come from the package's copies
    # (the lean binding makes the rules before it imports the parent packages of a file's project names)
    seeded = fake_driver_child(LEAN_CHILD, site, fake_libcuda, SEED_RULES="1")
    assert seeded["out"] == lean["out"] and seeded["kinds"] == ["LeanKernel"]
    assert lean["at_import"] == ["lean"] and lean["kinds"] == ["LeanKernel"], (lean["at_import"], lean["kinds"])
    assert not {"entry", "kernel", "cold", "launch", "tables"} & set(lean["loaded"]), lean["loaded"]
    assert cold["kinds"] == ["ColdKernel"] and full["kinds"] == ["Kernel"]
    assert [o[0] for o in lean["out"]] == [3, 3, 3, 2] * 2, lean["out"]  # (cumsum, h, o; g_gamma: no cumsum)
    assert lean["out"] == cold["out"] == full["out"]
    assert all(lean["aliases"].values()) and all(full["aliases"].values()), (lean["aliases"], full["aliases"])
    # FLA's ``@torch.compiler.disable`` (its ops, its backend dispatch) imports torch._dynamo, and Triton through it
    # where installed (4.4 s of the first call on an H200): bound lazily while the files run (host_exec.lazy_disable)
    assert not any(run["dynamo"] for run in (lean, cold, full, seeded))
