"""flash-linear-attention's optional tensors (tests/fixtures/realworld/kernels/fused_recurrent.py): ``g``, ``h0`` and
``ht`` passed as ``None`` when absent, ``@triton.heuristics`` flags from their presence, every argument by keyword.

Triton compiles an argument passed as None as the constant None; so does the build: each combination of None
arguments the examples pass is its own binary (specialization code ``N``), the flags that follow from it are never
flipped, and a call takes only a binary built for its Nones. CPU: the plan and the compile jobs. GPU: the wheel
against an fp64 recurrence and bit for bit against the same file under Triton's JIT."""

from __future__ import annotations

import itertools
import json
import re
import zipfile

import pytest

from tests.conftest import HALF_TOL, REALWORLD, import_fixture_file, relative_error, torch_dtype

FLAGS = ("USE_G", "USE_INITIAL_STATE", "STORE_FINAL_STATE")


def _entries(plan, target="sm_90"):
    return [e for e in plan.entries if e.kernel == "fused_recurrent" and e.target == target]


def test_each_combination_of_nones_is_a_binary_with_its_own_flags(realworld_plan) -> None:
    plan = realworld_plan
    kp = plan.kernels["fused_recurrent"]
    assert kp.spec_params == ["q", "k", "v", "g", "o", "h0", "ht"]  # T: do_not_specialize
    for e in _entries(plan):
        row = e.tables["default"][0]
        binaries = plan.binaries_for(e, row.key, row.preferences[0])
        patterns = set()
        for b in binaries:
            nones = {name for name, c in zip(kp.spec_params, b.spec) if c == "N"}
            flags = dict(b.heur)
            # the presence flags follow the Nones in every binary (never flipped)
            assert flags == {"USE_G": "g" not in nones, "USE_INITIAL_STATE": "h0" not in nones,
                             "STORE_FINAL_STATE": "ht" not in nones}, b.id
            patterns.add(frozenset(nones))
        # g, h0 and ht are passed as None by some examples and as tensors by others: every combination is built
        # (the examples tried four of the eight), each aligned and generic; q, k, v and o are never None
        assert patterns == {frozenset(c) for n in range(4) for c in itertools.combinations(("g", "h0", "ht"), n)}
        assert len(binaries) == 16


def test_check_names_the_optional_arguments(realworld_plan) -> None:
    from forge_aot.plan import plan_summary

    summary = plan_summary(realworld_plan)
    assert summary["fused_recurrent"]["optional"] == ["g", "h0", "ht"]
    assert summary["fused_recurrent"]["binaries"] == 4 * 2 * 16  # variants x targets x (8 combinations x 2)
    assert summary["rms_norm_fwd"]["optional"] == []


def test_a_none_is_compiled_as_a_constant(realworld_plan) -> None:
    from forge_aot.plan import job_for

    plan = realworld_plan
    e = _entries(plan)[0]
    row = e.tables["default"][0]
    b = next(b for b in plan.binaries_for(e, row.key, row.preferences[0]) if b.spec == "DDDNDNN")
    job = job_for(plan, e, row.preferences[0], b)
    assert [job.signature[n] for n in ("g", "h0", "ht")] == ["constexpr"] * 3
    assert job.constexprs["g"] is job.constexprs["h0"] is job.constexprs["ht"] is None
    assert job.signature["q"] == f"*{e.assignment['DT']}" and job.constexprs["USE_G"] is False
    assert job.divisible == (0, 1, 2, 4)  # q, k, v, o aligned


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "fused_recurrent.py", "_fr_jit_fused_recurrent")


def _reference(q, k, v, g, scale, h0):
    import torch

    B, T, H, K = k.shape
    h = h0.double().clone() if h0 is not None else torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64,
                                                                 device=q.device)
    o = torch.empty(B, T, H, v.shape[-1], dtype=torch.float64, device=q.device)
    for t in range(T):
        if g is not None:
            h = h * g[:, t].double().exp()[..., None, None]
        h = h + k[:, t].double()[..., :, None] * v[:, t].double()[..., None, :]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t].double() * scale, h)
    return o, h


COMBOS = [(False, False, False), (True, False, True), (True, True, True), (False, True, False)]  # as the examples


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize(("B", "T", "H", "D"), [(2, 64, 4, 64), (1, 100, 2, 128), (3, 37, 4, 64), (1, 1, 2, 128)])
@pytest.mark.parametrize(("use_g", "use_h0", "final"), COMBOS)
def test_fused_recurrent_against_fp64_and_the_jit(realworld, jit, dtype, B, T, H, D, use_g, use_h0, final) -> None:
    import torch

    dt = torch_dtype(dtype)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=dt) for _ in range(3))
    g = torch.randn(B, T, H, device="cuda").sigmoid().log() if use_g else None
    h0 = torch.randn(B, H, D, D, device="cuda") if use_h0 else None
    o, ht = realworld.fused_recurrent_gla(q, k, v, g=g, initial_state=h0, output_final_state=final)
    torch.cuda.synchronize()
    ref_o, ref_h = _reference(q, k, v, g, D**-0.5, h0)
    assert o.shape == (B, T, H, D) and o.dtype == dt
    assert relative_error(o, ref_o) < 2 * HALF_TOL[dtype]
    if final:
        assert ht.dtype == torch.float32 and relative_error(ht, ref_h) < 1e-5
    else:
        assert ht is None
    j_o, j_ht = jit.fused_recurrent_gla(q, k, v, g=g, initial_state=h0, output_final_state=final)
    assert torch.equal(o, j_o) and (ht is None or torch.equal(ht, j_ht))
    # again: the C path serves a call with Nones once the Python path has resolved it
    o2, _ = realworld.fused_recurrent_gla(q, k, v, g=g, initial_state=h0, output_final_state=final)
    assert torch.equal(o2, o)


@pytest.mark.gpu
@pytest.mark.parametrize(("use_g", "use_h0", "final"), sorted(set(itertools.product((False, True), repeat=3))
                                                             - set(COMBOS)))
def test_combinations_of_nones_no_example_passed(realworld, jit, use_g, use_h0, final) -> None:
    import torch

    q, k, v = (torch.randn(2, 33, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    g = torch.randn(2, 33, 4, device="cuda").sigmoid().log() if use_g else None
    h0 = torch.randn(2, 4, 64, 64, device="cuda") if use_h0 else None
    o, ht = realworld.fused_recurrent_gla(q, k, v, g=g, initial_state=h0, output_final_state=final)
    ref_o, ref_h = _reference(q, k, v, g, 64**-0.5, h0)
    assert relative_error(o, ref_o) < 2 * HALF_TOL["fp16"]
    assert relative_error(ht, ref_h) < 1e-5 if final else ht is None
    j_o, _ = jit.fused_recurrent_gla(q, k, v, g=g, initial_state=h0, output_final_state=final)
    assert torch.equal(o, j_o)


PAIRED = '''\
import torch
import triton
import triton.language as tl


@triton.heuristics({"SCALED": lambda args: args["a_scale"] is not None})
@triton.jit
def scaled_copy_kernel(x, a_scale, b_scale, out, n, BLOCK: tl.constexpr, SCALED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask)
    if SCALED:  # both scales come together: a_scale alone cannot compile (b_scale is the constant None)
        v = v * tl.load(a_scale) * tl.load(b_scale)
    tl.store(out + offs, v, mask=mask)


def scaled_copy(x, a_scale=None, b_scale=None):
    out = torch.empty_like(x)
    n = x.numel()
    scaled_copy_kernel[(triton.cdiv(n, 1024),)](x, a_scale, b_scale, out, n, BLOCK=1024)
    return out


def examples(device="cpu"):
    x = torch.randn(4096, device=device)
    scaled_copy(x)
    scaled_copy(x, torch.ones(1, device=device), torch.ones(1, device=device))
'''


@pytest.mark.slow
def test_an_untraced_combination_that_cannot_compile_costs_only_itself(tmp_path) -> None:
    from forge_aot.pipeline import build

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "paired.py").write_text(PAIRED)
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_paired"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n'
        '[kernels.scaled_copy]\nsource = "kernels/paired.py:scaled_copy_kernel"\nops = ["scaled_copy"]\n'
        'signature = { x = "*fp32", a_scale = "*fp32", b_scale = "*fp32", out = "*fp32", n = "i32" }\n'
        'examples = "examples"\n')
    result = build(tmp_path / "kernel_manifest.toml", out_dir=tmp_path / "dist", build_dir=tmp_path / "work")
    failed = result.report.failures
    # (a_scale, None): SCALED is true and the kernel loads b_scale, the constant None: it cannot compile, and it
    # was no example's; the build goes on without it. (None, b_scale) compiles (SCALED false, b_scale unused).
    specs = {re.search(r"\((\w+)\.SCALED=True\) \(a combination of None arguments no example passed\)", f)[1]
             for f in failed}
    assert specs == {"DDNDD", "DDNDx", "xxNxx"}, failed  # aligned, any size, generic
    index = json.loads(zipfile.ZipFile(result.wheel).read("forge_paired/_forge/index.json"))
    (variant,) = index["kernels"]["scaled_copy"]["variants"].values()
    (config,) = variant["targets"]["sm_90"]["configs"].values()
    shipped = {b["spec"] for b in config["binaries"].values()}
    # the traced combinations and the untraced one that compiles, each aligned, on any size and generic
    assert shipped == {"DNNDD", "DNNDx", "xNNxx", "DDDDD", "DDDDx", "xxxxx", "DNDDD", "DNDDx", "xNxxx"}, shipped


VARLEN_KEY = """\
import torch
import triton
import triton.language as tl


@triton.heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in [2, 4]], key=["H", "BT", "IS_VARLEN"])
@triton.jit
def copy_kernel(x, y, cu_seqlens, T, H: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    o = tl.program_id(0) * BT + tl.arange(0, BT)
    bos = 0
    if IS_VARLEN:
        bos = tl.load(cu_seqlens).to(tl.int32)
    tl.store(y + bos + o, tl.load(x + bos + o, mask=o < T * H, other=0.0), mask=o < T * H)


def copy(x, cu_seqlens=None):
    T, H = x.shape
    y = torch.empty_like(x)
    copy_kernel[(triton.cdiv(T * H, 64),)](x, y, cu_seqlens, T, H=H, BT=64)
    return y


def examples(device="cpu"):
    x = torch.randn(4096, 16, device=device)
    copy(x)
    copy(x, torch.tensor([0, 4096], dtype=torch.int32, device=device))
"""


def test_an_autotune_key_naming_a_heuristic_keys_rows_by_the_rest(tmp_path) -> None:
    """flash-linear-attention keys its autotuners on ``IS_VARLEN``, which ``@triton.heuristics`` computes from
    ``cu_seqlens`` (valid Triton: the heuristics run outside the autotuner). It had been refused as "not an integer
    parameter"; the rows are keyed by the rest, each with both values' binaries, and check says so."""
    from click.testing import CliRunner

    from forge_aot.cli import main
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(VARLEN_KEY)
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.copy]\n'
        'source = "k.py:copy_kernel"\nops = ["copy"]\nsignature = { x = "*fp32", y = "*fp32", cu_seqlens = "*i32", '
        'T = "i32" }\nexamples = "examples"\n')
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    assert plan.kernels["copy"].key == ["H", "BT"]
    (entry,) = plan.entries
    (row,) = entry.tables["default"]
    assert row.key == (16, 64)
    at = plan.kernels["copy"].spec_params.index("cu_seqlens")
    built = {(b.spec[at] == "N", dict(b.heur)["IS_VARLEN"]) for c in row.preferences
             for b in plan.binaries_for(entry, row.key, c)}
    assert built == {(True, False), (False, True)}
    out = CliRunner().invoke(main, ["check", "--manifest", str(tmp_path / "kernel_manifest.toml")]).output
    assert "note: kernels.copy: @triton.autotune's key names IS_VARLEN, which @triton.heuristics computes" in out


def test_a_manifest_key_may_name_call_site_constexprs_the_examples_show(tmp_path) -> None:
    """``key = ["H", "BT"]`` in the manifest, names FLA's host code passes by keyword: with examples they are known
    once traced (it had been refused before tracing, as not listed in the manifest); a typo is refused then, with
    what is accepted; without examples the manifest's own check stays."""
    from forge_aot.errors import ManifestError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(VARLEN_KEY.replace('key=["H", "BT", "IS_VARLEN"]', 'key=["T"]'))
    manifest = tmp_path / "kernel_manifest.toml"
    head = ('[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.copy]\n'
            'source = "k.py:copy_kernel"\nops = ["copy"]\nsignature = { x = "*fp32", y = "*fp32", cu_seqlens = "*i32", '
            'T = "i32" }\n')
    manifest.write_text(head + 'examples = "examples"\nkey = ["H", "BT"]\n')
    (entry,) = make_plan(load_manifest(manifest)).entries
    assert [row.key for row in entry.tables["default"]] == [(16, 64)]
    manifest.write_text(head + 'examples = "examples"\nkey = ["H", "BTT"]\n')
    with pytest.raises(ManifestError, match=r"kernels.copy.key\[1\]: key argument 'BTT' is not an integer parameter "
                                            r"or call-site constexpr of copy_kernel \(accepted: BT, H, T\)"):
        make_plan(load_manifest(manifest))
    manifest.write_text(head + 'key = ["H"]\nshapes = [{ H = 16 }]\n')
    with pytest.raises(ManifestError, match=r"kernels.copy.key\[0\]: 'H' is not an integer parameter"):
        load_manifest(manifest)
