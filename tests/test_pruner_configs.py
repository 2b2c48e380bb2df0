"""A pruning hook that makes configs of its own, as gemlite's gemv kernels write it: ``early_config_prune`` clamps
each decorator config's blocks to the shape (``BLOCK_SIZE_K`` to the quantization group, which the kernel needs:
one scale per block) and adds constexprs no decorator config and no launch gives (``NUM_STAGES``, ``EVEN_K``,
``EVEN_N``). The build used to know only the decorator's configs ("missing the constexpr argument 'NUM_STAGES'"),
and untuned rows took the space's first config without running the hook, where Triton's autotuner prunes first.

Now the plan runs the hook per row on the row's first traced call: the row's configs are the hook's.

CPU: the plan's rows and spaces, the errors. GPU: the wheel against a float64 reference."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

KERNEL = '''\
import torch
import triton
import triton.language as tl


def next_power_of_2(v):
    return 1 << (int(v) - 1).bit_length()


def kernel_config_pruner(configs, nargs, **kwargs):
    n, k, g = nargs["N"], nargs["K"], nargs["group_size"]
    used = set()
    for config in configs:
        block_size_n = next_power_of_2(min(n, config.kwargs["BLOCK_SIZE_N"]))
        # one scale per block: a block of K may not cross a group
        block_size_k = next_power_of_2(min(g, k, config.kwargs["BLOCK_SIZE_K"]))
        key = (block_size_n, block_size_k, config.num_stages, config.num_warps)
        if key in used:
            continue
        used.add(key)
        new_config = {
            "BLOCK_SIZE_N": block_size_n,
            "BLOCK_SIZE_K": block_size_k,
            "NUM_STAGES": config.num_stages,
            "EVEN_K": k % block_size_k == 0,
            "EVEN_N": n % block_size_n == 0,
        }
        yield triton.Config(new_config, num_stages=config.num_stages, num_warps=config.num_warps)


def get_autotune_config():
    return [triton.Config({"BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k}, num_warps=w, num_stages=s)
            for n in (256, 64) for k in (128, 32) for w in (4, 2) for s in (2, 1)]


@triton.autotune(
    configs=get_autotune_config(),
    key=["M", "N", "K"],
    prune_configs_by={"early_config_prune": lambda _c, _n, **_kw: list(kernel_config_pruner(_c, _n, **_kw))},
)
@triton.jit
def gemv_kernel(
    a_ptr, b_ptr, scales_ptr, c_ptr,
    M, N: tl.constexpr, K: tl.constexpr,
    group_size: tl.constexpr,
    stride_am, stride_bk, stride_bn,
    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, EVEN_K: tl.constexpr = False, EVEN_N: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    acc = tl.zeros((BLOCK_SIZE_N,), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_SIZE_K, num_stages=NUM_STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_SIZE_K)
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        if EVEN_K:
            a = tl.load(a_ptr + pid_m * stride_am + offs_k)
        else:
            a = tl.load(a_ptr + pid_m * stride_am + offs_k, mask=offs_k < K, other=0.0)
        if EVEN_K and EVEN_N:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        if EVEN_N:
            scale = tl.load(scales_ptr + (k0 // group_size) * N + offs_n)
        else:
            scale = tl.load(scales_ptr + (k0 // group_size) * N + offs_n, mask=offs_n < N, other=0.0)
        acc += tl.sum(a[:, None].to(tl.float32) * b.to(tl.float32), axis=0) * scale
    if EVEN_N:
        tl.store(c_ptr + pid_m * N + offs_n, acc)
    else:
        tl.store(c_ptr + pid_m * N + offs_n, acc, mask=offs_n < N)


def gemv_forward(x, w, scales, group_size):
    M, K = x.shape
    N = w.shape[1]
    out = torch.empty((M, N), device=x.device, dtype=torch.float32)
    grid = lambda META: (M, triton.cdiv(N, META["BLOCK_SIZE_N"]))
    gemv_kernel[grid](
        x, w, scales, out,
        M, N, K,
        group_size,
        x.stride(0), w.stride(0), w.stride(1),
    )
    return out


SHAPES = ((1, 1000, 512, 32), (3, 4096, 256, 64), (2, 48, 200, 128))  # M, N, K, group_size


def examples(device="cuda"):
    for M, N, K, g in SHAPES:
        x = torch.randn(M, K, device=device, dtype=torch.float16)
        w = torch.randn(K, N, device=device, dtype=torch.float16)
        gemv_forward(x, w, torch.rand(triton.cdiv(K, g), N, device=device), g)
'''

NAME = "forge_test_pruner_configs"


def _project(root: Path, source: str = KERNEL) -> Path:
    from tests.test_localmods import one_file_project

    return one_file_project(root, NAME, source, "gemv_kernel", ["gemv_forward"], entry="gemv")


def test_the_rows_take_the_configs_the_pruning_hook_makes(tmp_path: Path) -> None:
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    plan = make_plan(load_manifest(_project(tmp_path / "p")), ["sm_90"])
    kp = plan.kernels["gemv"]
    assert kp.pruner_meta == ["NUM_STAGES", "EVEN_K", "EVEN_N"]
    assert kp.meta_defaults == {"EVEN_K": False, "EVEN_N": False}  # gemlite's: what a config that does not set them
    assert dict(kp.params)["NUM_STAGES"] == "meta" and dict(kp.params)["EVEN_N"] == "meta"
    rows = {(e.assignment["N"], e.assignment["K"]): row for e in plan.entries for row in e.tables["default"]}
    assert sorted(rows) == [(48, 200), (1000, 512), (4096, 256)]
    groups = {(1000, 512): 32, (4096, 256): 64, (48, 200): 128}
    for (n, k), row in rows.items():
        g = groups[(n, k)]
        for c in row.preferences:  # what the hook returned for the row's call, in its order
            assert c.meta["BLOCK_SIZE_K"] <= g and c.meta["BLOCK_SIZE_N"] <= max(64, 1 << (n - 1).bit_length())
            assert c.meta["NUM_STAGES"] == c.num_stages
            assert c.meta["EVEN_K"] == (k % c.meta["BLOCK_SIZE_K"] == 0)
            assert c.meta["EVEN_N"] == (n % c.meta["BLOCK_SIZE_N"] == 0)
        # the decorator's first config clamped: what Triton's autotuner would run were it the one left
        first = row.preferences[0]
        assert (first.meta["BLOCK_SIZE_K"], first.num_warps, first.num_stages) == (min(g, 128), 4, 2)
    assert len(rows[(48, 200)].preferences) == 8  # N=48 clamps both block widths to 64: half the configs alike
    assert {c.id for row in rows.values() for c in row.preferences} == {c.id for c in kp.space}
    for e in plan.entries:  # binaries carry the hook's constexprs
        for row in e.tables["default"]:
            assert plan.binaries_for(e, row.key, row.preferences[0])


def test_a_row_no_call_reaches_cannot_have_the_hooks_configs(tmp_path: Path) -> None:
    from forge_aot.errors import ManifestError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    # the manifest gives the rows and the constexprs, no examples: no call shows the hook a row's arguments
    root = tmp_path / "p"
    root.mkdir()
    (root / "k.py").write_text(KERNEL.replace('key=["M", "N", "K"]', 'key=["M"]'))
    manifest = root / "kernel_manifest.toml"
    manifest.write_text(textwrap.dedent(f"""\
        [project]
        name = "{NAME}"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.gemv]
        source = "k.py:gemv_kernel"
        ops = ["gemv_forward"]
        shapes = [{{M = 1}}, {{M = 7}}]
        constexprs = {{N = [1000], K = [512], group_size = [32]}}

        [kernels.gemv.signature]
        a_ptr = "*fp16"
        b_ptr = "*fp16"
        scales_ptr = "*fp32"
        c_ptr = "*fp32"
        M = "i32"
        stride_am = "i32"
        stride_bk = "i32"
        stride_bn = "i32"
        """))
    with pytest.raises(ManifestError, match=r"no traced call reaches the row \{'M': 1\} \[N=1000.*\] of gemv_kernel, "
                                            r"so its pruning hook cannot make the configs that set NUM_STAGES: "):
        make_plan(load_manifest(manifest), ["sm_90"])


def test_a_hook_config_that_misses_a_meta_parameter_is_refused(tmp_path: Path) -> None:
    from forge_aot.errors import SourceError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    source = KERNEL.replace('            "NUM_STAGES": config.num_stages,\n', "")
    with pytest.raises(SourceError, match=r"returned a config that sets \['BLOCK_SIZE_K', 'BLOCK_SIZE_N', 'EVEN_K', "
                                          r"'EVEN_N'\]; a config of gemv_kernel sets \['BLOCK_SIZE_K', 'BLOCK_SIZE_N', "
                                          r"'NUM_STAGES'\], and may set \['EVEN_K', 'EVEN_N'\]"):
        make_plan(load_manifest(_project(tmp_path / "p", source)), ["sm_90"])


def test_a_config_without_the_defaulted_constexprs_compiles_with_their_defaults(tmp_path: Path) -> None:
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    source = KERNEL.replace('            "EVEN_N": n % block_size_n == 0,\n', "")
    plan = make_plan(load_manifest(_project(tmp_path / "p", source)), ["sm_90"])
    assert {c.meta["EVEN_N"] for e in plan.entries for row in e.tables["default"] for c in row.preferences} == {False}


def test_a_config_whose_pre_hook_is_a_closure_is_refused_not_left_out(tmp_path: Path) -> None:
    """gemlite's ``pre_hook=init_to_zero("c_ptr")`` (a closure: no name the packaged host code could call it by) for
    kernels that accumulate with atomics: rows without the hook's configs would never zero their output, so the build
    stops instead of taking the space unpruned."""
    from forge_aot.errors import SourceError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    factory = "def init_to_zero(name):\n    return lambda nargs: nargs[name].zero_()\n\n\n"
    source = KERNEL.replace("def next_power_of_2(v):", factory + "def next_power_of_2(v):")
    source = source.replace("num_stages=config.num_stages, num_warps=config.num_warps)",
                            'num_stages=config.num_stages, num_warps=config.num_warps, pre_hook=init_to_zero("c_ptr"))')
    with pytest.raises(SourceError, match=r"gemv_kernel: the pruning hook <its @triton.autotune's own>\(\): the "
                                          r"pre_hook of a config it returned must be a function defined at the top "
                                          r"level of the kernel file"):
        make_plan(load_manifest(_project(tmp_path / "p", source)), ["sm_90"])


def test_a_tuned_config_that_leaves_a_defaulted_constexpr_out_keeps_its_default(tmp_path: Path) -> None:
    """A winner recorded before its kernel's pruning hook made ``EVEN_K = False`` a meta-parameter (or one the hook
    made without it) measured the default: it stands, completed with it, rather than going stale."""
    from forge_aot.manifest import load_manifest
    from forge_aot.pipeline import triton_version
    from forge_aot.plan import make_plan
    from forge_aot.tune.apply import apply_tuning, current_code, load_database
    from forge_aot.tune.database import Provenance, Record, TuningDatabase

    manifest = _project(tmp_path / "p")
    manifest.write_text(manifest.read_text().replace('version = "0.1.0"', 'version = "0.1.0"\ntuning-data = "tuning"'))
    (manifest.parent / "tuning").mkdir()
    loaded = load_manifest(manifest)
    plan = make_plan(loaded, ["sm_90"])
    code = current_code(plan)["gemv"]
    prov = Provenance(gpu="NVIDIA H100 80GB HBM3", capability="9.0", target="sm_90", triton=triton_version(),
                      source_sha256=code.source_sha256, code_sha256=code.code_sha256)
    config = {"BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "NUM_STAGES": 1, "num_warps": 2, "num_stages": 1}
    variant = next(e.variant for e in plan.entries if e.assignment["N"] == 1000)
    TuningDatabase(manifest.parent / "tuning").append(Record(
        "winner", "gemv", variant, {"M": 1, "N": 1000, "K": 512}, "c", config, prov, "ok", {"median_ms": 0.01}))
    summary = apply_tuning(plan, load_database(loaded), triton_version())
    assert not summary.stale
    entry = next(e for e in plan.entries if e.variant == variant)
    tuned = entry.tables["NVIDIA H100 80GB HBM3"][0].preferences[0]
    assert tuned.meta == {"BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "NUM_STAGES": 1, "EVEN_K": False, "EVEN_N": False}


IN_PLACE = """\
import torch
import triton
import triton.language as tl


def prune(configs, nargs, **kwargs):
    for c in configs:
        if nargs["n"] > 2000:
            c.num_warps = 8  # changed in place, as some pruners do: Triton runs the config as changed
    return configs + configs[:1]  # a config twice: the first stands


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=4) for b in (128, 256)], key=["n"],
                 prune_configs_by={"early_config_prune": prune})
@triton.jit
def add_one_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def add_one(x):
    y = torch.empty_like(x)
    n = x.numel()
    add_one_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n)
    return y


def examples(device="cuda"):
    for n in (300, 5000):
        add_one(torch.randn(n, device=device))
"""


def test_a_config_the_hook_changed_in_place_is_taken_as_changed(tmp_path: Path) -> None:
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan
    from tests.test_localmods import one_file_project

    manifest = one_file_project(tmp_path / "p", "forge_test_in_place", IN_PLACE, "add_one_kernel", ["add_one"])
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    rows = {row.key[0]: [c.id for c in row.preferences] for e in plan.entries for row in e.tables["default"]}
    assert rows == {300: ["BLOCK128-w4-s3", "BLOCK256-w4-s3"], 5000: ["BLOCK128-w8-s3", "BLOCK256-w8-s3"]}


KEYWORD_PRUNE = """\
import torch
import triton
import triton.language as tl


def prune(configs, nargs, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK"] <= max(kwargs["n"], 128)]


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=4) for b in (128, 256)], key=["n"],
                 prune_configs_by={"early_config_prune": prune})
@triton.jit
def add_one_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def add_one(x):
    y = torch.empty_like(x)
    n = x.numel()
    add_one_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n=n)
    return y


def examples(device="cuda"):
    for n in (200, 5000):
        add_one(torch.randn(n, device=device))
"""


def test_a_hook_finds_a_runtime_argument_passed_by_keyword_in_its_kwargs(tmp_path: Path) -> None:
    """Triton's tutorial attention prunes with ``kwargs["N_CTX"]``, a runtime argument its launch passes by keyword
    (Triton hands the hook the call's keyword arguments): the hook failed on the build's arguments and the rows
    stayed unpruned, with a note."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan
    from tests.test_localmods import one_file_project

    manifest = one_file_project(tmp_path / "p", "forge_test_kw_prune", KEYWORD_PRUNE, "add_one_kernel", ["add_one"])
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    assert not plan.kernels["k"].notes
    rows = {row.key[0]: [c.meta["BLOCK"] for c in row.preferences] for e in plan.entries for row in e.tables["default"]}
    assert rows == {200: [128], 5000: [128, 256]}


@pytest.mark.gpu
def test_the_wheel_runs_the_hooks_configs_against_float64(tmp_path: Path) -> None:
    from tests.test_localmods import _installed, _run_fresh

    target = _installed(_project(tmp_path / "p"), tmp_path)
    code = textwrap.dedent(f'''\
        import json, sys
        sys.modules["triton"] = None
        import torch, {NAME}
        errs = []
        for M, N, K, g in ((1, 1000, 512, 32), (3, 4096, 256, 64), (2, 48, 200, 128), (5, 1000, 512, 32)):
            x = torch.randn(M * K + 1, device="cuda", dtype=torch.float16)[1:].view(M, K)  # misaligned
            w = torch.randn(K, N, device="cuda", dtype=torch.float16)
            scales = torch.rand((K + g - 1) // g, N, device="cuda")
            ref = torch.einsum("mk,kn->mn", x.double(), w.double() * scales.double().repeat_interleave(g, 0)[:K])
            out = {NAME}.gemv_forward(x, w, scales, g)
            errs.append(((out.double() - ref).abs().max() / ref.abs().max()).item())
        print(json.dumps({{"max_rel_err": max(errs)}}))
        ''')
    assert _run_fresh(code, target)["max_rel_err"] < 1e-5
