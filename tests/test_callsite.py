"""Kernels as libraries write them: call-site constexprs and launch options, derived values, examples traced
on the CPU, one canonical variant order, autotune and heuristics decorators, per-argument specialization."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from forge_aot import runtime as rt
from forge_aot.errors import ManifestError, SourceError
from forge_aot.manifest import load_manifest
from forge_aot.plan import BinarySpec, make_plan, plan_summary
from tests.conftest import FIXTURES

CALLSITE = FIXTURES / "projects" / "callsite" / "kernel_manifest.toml"
KERNELS = FIXTURES / "kernels"


def _project(tmp_path: Path, body: str, name: str = "callsite") -> Path:
    text = body.replace("KERNELS", str(KERNELS))
    path = tmp_path / name / "kernel_manifest.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


HEADER = '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n'
ROW_SCALE = ('[kernels.row_scale]\nsource = "KERNELS/callsite.py:row_scale_kernel"\nops = ["row_scale"]\n'
             'signature = { out_ptr = "*T", x_ptr = "*T", x_row_stride = "i32", out_row_stride = "i32", '
             'n_cols = "i32", scale = "fp32" }\ndtypes = { T = ["fp32"] }\nkey = ["n_cols"]\n')


def test_axes_follow_parameter_order_whatever_the_manifest_order() -> None:
    plan = make_plan(load_manifest(CALLSITE))
    kp = plan.kernels["row_scale"]
    # type variables, call-site constexprs in parameter order (ACT before BLOCK_SIZE), then launch options
    assert kp.axes == ["T", "ACT", "BLOCK_SIZE", "num_warps"]
    ids = sorted(e.variant for e in plan.entries)
    assert "T=fp32,ACT=relu,BLOCK_SIZE=4096,num_warps=8" in ids
    assert all(v.split(",")[1].startswith("ACT=") for v in ids)


def test_permuted_manifest_gives_the_same_variants(tmp_path: Path) -> None:
    text = CALLSITE.read_text().replace("../../kernels/", "KERNELS/")
    permuted = text.replace('derive = { num_warps = "4 if next_power_of_2(n_cols) < 2048 else 8", '
                            'BLOCK_SIZE = "next_power_of_2(n_cols)" }',
                            'derive = { BLOCK_SIZE = "next_power_of_2(n_cols)", '
                            'num_warps = "4 if BLOCK_SIZE < 2048 else 8" }')
    assert permuted != text
    a = make_plan(load_manifest(_project(tmp_path, text, "a")))
    b = make_plan(load_manifest(_project(tmp_path, permuted, "b")))
    assert sorted(e.variant for e in a.entries) == sorted(e.variant for e in b.entries)
    # the runtime finds the built variant from a call's values, in the same canonical order
    from forge_aot.index import build_index

    index = build_index(b, None, "jit", {m: "x.py" for m in b.modules})
    kernel = rt.Kernel("row_scale", index["kernels"]["row_scale"], index["targets"], backend=None)
    vid, assignment = kernel.find_variant(("fp32", "relu", 4096, 8))
    assert vid == "T=fp32,ACT=relu,BLOCK_SIZE=4096,num_warps=8" and list(assignment) == kernel.axes
    with pytest.raises(rt.NotBuiltError, match=r"launch option num_warps=16 was not built; built values: \[4, 8\]"):
        kernel.find_variant(("fp32", "relu", 4096, 16))
    with pytest.raises(rt.NotBuiltError, match=r"constexpr BLOCK_SIZE=65536 was not built"):
        kernel.find_variant(("fp32", "", 65536, 8))


def test_derive_builds_only_the_values_rows_reach(tmp_path: Path) -> None:
    plan = make_plan(load_manifest(CALLSITE))
    variants = {e.variant: [r.key for r in e.tables["default"]] for e in plan.entries}
    # 2 ACT values × one (BLOCK_SIZE, num_warps) per row; each variant's table holds only its own row
    assert len(variants) == 8 and all(len(rows) == 1 for rows in variants.values())
    assert variants["T=fp32,ACT=,BLOCK_SIZE=128,num_warps=4"] == [(100,)]
    product = _project(tmp_path, HEADER + ROW_SCALE + 'shapes = [{ n_cols = 100 }, { n_cols = 3000 }]\n'
                       'constexprs = { ACT = ["", "relu"], BLOCK_SIZE = [1, 128, 1024, 4096], num_warps = [4, 8] }\n')
    full = make_plan(load_manifest(product))
    assert len({e.variant for e in full.entries}) == 16
    assert plan_summary(full)["row_scale"]["binaries"] > plan_summary(plan)["row_scale"]["binaries"]


def test_examples_are_traced_with_triton_specialization(tmp_path: Path) -> None:
    manifest = _project(tmp_path, HEADER + ROW_SCALE + 'examples = "examples"\n')
    plan = make_plan(load_manifest(manifest))
    kp = plan.kernels["row_scale"]
    assert kp.spec_params == ["out_ptr", "x_ptr", "x_row_stride", "out_row_stride", "n_cols"]
    specs = {(e.variant, key): {c.spec for c in calls} for e in plan.entries for key, calls in e.calls.items()}
    # one row of one column: strides and n_cols equal 1 (Triton compiles them as constants)
    assert specs[("T=fp32,ACT=,BLOCK_SIZE=1,num_warps=4", (1,))] == {"DD111"}
    assert specs[("T=fp32,ACT=relu,BLOCK_SIZE=1024,num_warps=4", (1024,))] == {"DDDDD"}
    assert specs[("T=fp32,ACT=,BLOCK_SIZE=4096,num_warps=8", (3000,))] == {"DDxxx"}
    # traced keys became the rows; the examples function stays out of the wheel
    assert len(plan.entries) == 8
    host = next(iter(plan.modules.values()))["host_source"]
    assert "def examples" not in host and "def row_scale" in host
    e = next(e for e in plan.entries if e.variant == "T=fp32,ACT=,BLOCK_SIZE=1024,num_warps=4")
    row = e.tables["default"][0]
    # exact; key unassumed; every integer's divisibility unassumed (unit strides kept); generic
    assert [b.spec for b in plan.binaries_for(e, row.key, row.preferences[0])] == ["DDDDD", "DDDDx", "DDxxx",
                                                                                  "xxxxx"]


def test_call_site_launch_option_without_values_is_refused_with_its_line(tmp_path: Path) -> None:
    manifest = _project(tmp_path, HEADER + ROW_SCALE + 'shapes = [{ n_cols = 100 }]\n'
                        'constexprs = { ACT = [""], BLOCK_SIZE = [128] }\n')
    with pytest.raises(ManifestError, match=r"launch option 'num_warps'.*row_scale\(\) line 34.*derive"):
        make_plan(load_manifest(manifest))


def test_passing_a_tuned_meta_parameter_is_refused_by_check(tmp_path: Path) -> None:
    manifest = _project(tmp_path, HEADER + ROW_SCALE + 'shapes = [{ n_cols = 100 }]\n'
                        'constexprs = { ACT = [""], num_warps = [4, 8] }\n'
                        '[kernels.row_scale.tune]\nmeta = { BLOCK_SIZE = [128, 256] }\n')
    with pytest.raises(SourceError, match=r"callsite.py:34: row_scale\(\) passes BLOCK_SIZE .* is tuned"):
        make_plan(load_manifest(manifest))


AUTOTUNED = ('[kernels.sum]\nsource = "KERNELS/autotuned.py:sum_kernel"\nops = ["total"]\n'
             'signature = { x_ptr = "*T", out_ptr = "*fp32", n = "i32" }\ndtypes = { T = ["fp32"] }\n'
             'shapes = [{ n = 4096 }, { n = 1000 }]\n')


def test_autotune_and_heuristics_decorators_become_space_key_and_binaries(tmp_path: Path) -> None:
    plan = make_plan(load_manifest(_project(tmp_path, HEADER + AUTOTUNED)))
    kp = plan.kernels["sum"]
    assert [c.id for c in kp.space] == ["BLOCK64-w4-s1", "BLOCK64-w8-s1", "BLOCK256-w4-s1", "BLOCK256-w8-s1"]
    assert kp.key == ["n"] and kp.reset_to_zero == ["out_ptr"] and kp.heuristic_names == ["EVEN"]
    assert dict(kp.params)["EVEN"] == "heuristic" and dict(kp.params)["BLOCK"] == "meta"
    (e,) = plan.entries
    rows = {r.key: r for r in e.tables["default"]}
    # untuned: the first config of the decorator's list; EVEN follows from the key and the config for the
    # row's own binary and its aligned twin (for aligned calls near the row); the loose and generic binaries
    # exist for both values (shapes between rows)
    for key, even in (((4096,), True), ((1000,), False)):
        binaries = plan.binaries_for(e, key, rows[key].preferences[0])
        assert BinarySpec(kp.default_spec(key), (("EVEN", even),)) in binaries
        exact = max(binaries, key=lambda b: rt.spec_rank(b.spec))
        assert exact == BinarySpec("DDD", (("EVEN", even),))  # 1000 is not divisible by 16: its aligned twin
        assert {b.heur for b in binaries if b.generic} == {(("EVEN", False),), (("EVEN", True),)}
    host = next(iter(plan.modules.values()))["host_source"]
    assert "__forge_heuristics__('sum_kernel'," in host and "def get_configs" not in host
    assert kp.heuristics and kp.heuristics[0][0] == "EVEN"


def test_heuristic_reading_an_argument_outside_the_key_needs_examples(tmp_path: Path) -> None:
    src = (KERNELS / "autotuned.py").read_text().replace('args["n"] % args["BLOCK"]',
                                                        'args["x_ptr"].numel() % args["BLOCK"]')
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "autotuned.py").write_text(src)
    manifest = _project(tmp_path, HEADER + AUTOTUNED.replace("KERNELS", str(tmp_path / "k")))
    with pytest.raises(ManifestError, match=r"reads argument 'x_ptr'.*examples"):
        make_plan(load_manifest(manifest))


def test_choose_binary_takes_the_most_specialized_that_holds() -> None:
    spec = {"function": "k", "params": [["a", "*fp32"], ["s", "i32"], ["n", "i32"], ["E", "heuristic"]],
            "axes": [], "dtype_args": {}, "spec_params": ["a", "s", "n"], "key": ["n"], "variants": {}}
    kernel = rt.Kernel("k", spec, {}, backend=None)
    built = {b: {"spec": b, "heur": {"E": e}} for b, e in (("D1D", True), ("D1x", True), ("xxx", True),
                                                          ("xxx", True))}
    built["xxx.E=False"] = {"spec": "xxx", "heur": {"E": False}}
    assert rt.choose_binary(kernel, built, (True,), "D1D")["spec"] == "D1D"
    assert rt.choose_binary(kernel, built, (True,), "D1x")["spec"] == "D1x"
    assert rt.choose_binary(kernel, built, (True,), "DDD")["spec"] == "xxx"  # 16 is not 1: no '1' binary fits
    assert rt.choose_binary(kernel, built, (False,), "D1D")["heur"] == {"E": False}
    with pytest.raises(rt.NotBuiltError, match="heuristics gave"):
        rt.choose_binary(kernel, {"D1D": built["D1D"]}, (False,), "D1D")


@pytest.mark.slow
def test_build_falls_back_when_a_specialization_fails_to_compile(tmp_path: Path) -> None:
    from forge_aot.pipeline import build

    result = build(CALLSITE, out_dir=tmp_path / "dist", build_dir=tmp_path / "work")
    failures = result.report.failures
    # n_cols = 1 compiled as a constant trips the kernel's static_assert: reported, never shipped
    assert failures and all(("BLOCK_SIZE=1," in f and "static_assert" in f.lower()) or "dtype" in f for f in failures)
    index = json.loads((result.build_dir / "package" / "callsite_pkg" / "_forge" / "index.json").read_text())
    variant = index["kernels"]["row_scale"]["variants"]["T=fp32,ACT=,BLOCK_SIZE=1,num_warps=4"]
    (config,) = variant["targets"]["sm_90"]["configs"].values()
    specs = sorted(b["spec"] for b in config["binaries"].values())
    # the row's default specialization (n_cols = 1) failed; its calls take one without that assumption
    assert all(s[-1] != "1" for s in specs) and "xxxxx" in specs and any(s.startswith("DD") for s in specs)


def test_combinations_list_what_occurs(tmp_path: Path) -> None:
    manifest = _project(tmp_path, HEADER + ROW_SCALE + 'shapes = [{ n_cols = 100 }, { n_cols = 3000 }]\n'
                        'constexprs = { ACT = [""] }\n'
                        'combinations = [{ BLOCK_SIZE = 128, num_warps = 4 }, { BLOCK_SIZE = 4096, num_warps = 8 }]\n')
    plan = make_plan(load_manifest(manifest))
    assert sorted(e.variant for e in plan.entries) == ["T=fp32,ACT=,BLOCK_SIZE=128,num_warps=4",
                                                       "T=fp32,ACT=,BLOCK_SIZE=4096,num_warps=8"]
    # a call-site num_warps fixes the configs' warps: the config ids say what the binaries are compiled with
    assert {e.tables["default"][0].preferences[0].num_warps for e in plan.entries} == {4, 8}


def test_config_pre_hook_is_bound_from_the_host_module(tmp_path: Path) -> None:
    from forge_aot.index import build_index
    from forge_aot.trace import TraceKernel

    plan = make_plan(load_manifest(_project(tmp_path, HEADER + AUTOTUNED)))
    assert {c.pre_hook for c in plan.kernels["sum"].space} == {"zero_output"}
    index = build_index(plan, None, "jit", {m: "x.py" for m in plan.modules})
    assert index["kernels"]["sum"]["pre_hooks"] == ["zero_output"]
    (mod_name, mod), = plan.modules.items()
    handles = {}

    def factory(name, spec, targets, backend):
        handles[name] = TraceKernel(name, spec, targets, backend)
        return handles[name]

    module = rt.bind_module("_t_pre_hook", index, mod_name, None, factory, ("autotuned.py", mod["host_source"]))
    assert handles["sum"].pre_hooks == {"zero_output": module.zero_output}
    assert [n for n, _ in handles["sum"].heuristics] == ["EVEN"]


def test_check_lists_launches_values_and_binary_count() -> None:
    from click.testing import CliRunner

    from forge_aot.cli import main

    result = CliRunner().invoke(main, ["check", "--manifest", str(FIXTURES / "realworld" / "kernel_manifest.toml")])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "binaries to compile for sm_80, sm_90" in out
    assert "launched in rms_norm_forward() line" in out and "passes BLOCK_SIZE, num_warps" in out
    assert "matmul_kernel [@triton.autotune, @triton.heuristics]" in out
    assert "call-site values from: examples" in out
    # the pointers each kernel writes through: Liger's GeGLU backward writes its gradients into its inputs
    geglu_bwd = out[out.index("  geglu_bwd:"):]
    assert geglu_bwd.splitlines()[2:4].count("    writes through: a, b") == 1, geglu_bwd[:400]
    # which ops torch.compile can trace whole, and why another cannot
    assert ("    _chunk_cumsum_fwd: torch.ops.forge_realworld._chunk_cumsum_fwd(Tensor dt, Tensor A, int chunk_size, "
            "Tensor? dt_bias=None, bool dt_softplus=False, float[]? dt_limit=None) -> (Tensor, Tensor) (from the "
            "traced examples)") in out
    assert ("    mean_dim: torch.ops.forge_realworld.mean_dim(Tensor x, int dim, bool keepdim=False, *, ScalarType? "
            "dtype=None) -> Tensor (from the traced examples; dtype as the op's code fills it in)") in out
    # every op of the library-style fixtures is a custom op but Unsloth's RoPE, which returns a view of its input Q
    # in a decode step (seq 1); mamba's layer_norm_fn returns y or (y, residual) as prenorm says: the union, padded
    # Liger's GeGLU passes the row width as a tl.constexpr: one binary per model width, named
    assert "note: _geglu_tanh_forward_kernel: constexpr n_cols takes 5 values in the traced calls (1000, 4096" in out
    # Liger's fused add-RMSNorm sizes its rows per program from the SM count only for a CUDA tensor: the trace's
    # tensors answer as CUDA ones, so the values are the GPUs' (the CPU branch's one program gave 333, 74, 4096)
    assert ("note: _fused_add_rms_norm_backward_kernel: constexpr rows_per_program takes 6 values in the traced "
            "calls (1, 3, 4, 32, 36, 38)") in out
    plain = [line.split(":")[0].strip() for line in out.splitlines() if "Python calls only" in line]
    assert plain == ["fast_rope_embedding"], plain
    assert ("bool is_rms_norm=False) -> (Tensor, Tensor?) (from the traced examples; returns 2 results padded with "
            "None, the exported function giving each call the structure prenorm selects)") in out


def test_rows_and_tuned_rows_agree_with_variant_axes_in_the_key() -> None:
    # attention's key (N_CTX, HEAD_DIM) names a call-site constexpr: a variant holds only its own HEAD_DIM rows,
    # from the examples and from the committed tuning data alike
    from forge_aot.pipeline import triton_version
    from forge_aot.tune.apply import apply_tuning, load_database

    loaded = load_manifest(FIXTURES / "realworld" / "kernel_manifest.toml")
    plan = make_plan(loaded, ["sm_90"])
    summary = apply_tuning(plan, load_database(loaded), triton_version())
    assert not summary.stale, summary.stale
    entries = [e for e in plan.entries if e.kernel == "attention"]
    assert entries and all(len(e.tables) == 2 for e in entries)
    for e in entries:
        for rows in e.tables.values():
            assert {r.key[1] for r in rows} == {e.assignment["HEAD_DIM"]}


def test_a_constexpr_that_takes_per_call_values_is_named_at_check_and_build(tmp_path) -> None:
    """The constexpr trap (../shared/seeds): SGLang's mask fill passes the batch's longest length as a
    ``tl.constexpr``, a new value nearly every decode step. Built from its examples, each value is a binary and any
    other fails at run time; ``forge-aot check`` says so and names the fix. Powers of two (block sizes), launch
    options and values the manifest lists are not named."""
    from click.testing import CliRunner

    from forge_aot.cli import main

    manifest = _project(tmp_path, HEADER + (
        '[kernels.fill_mask]\nsource = "KERNELS/mask_fill.py:fill_mask_kernel"\nops = ["fill_mask"]\n'
        'signature = { mask_ptr = "*u8", tree_ptr = "*u8", offsets_ptr = "*i64", n_draft = "i32" }\n'
        'examples = "examples"\n'))
    plan = make_plan(load_manifest(manifest))
    summary = plan_summary(plan)["fill_mask"]
    assert summary["variants"] == 6 and summary["data_like_constexprs"] == {
        "max_kv_len_per_req": [37, 38, 39, 41, 64, 100]}
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert ("note: fill_mask_kernel: constexpr max_kv_len_per_req takes 6 values in the traced calls (37, 38, 39, 41, "
            "64, 100): each is a binary of its own, and a value no example passes fails at run time") in result.output
    assert "make it a runtime argument" in result.output
    result = CliRunner().invoke(main, ["build", "--manifest", str(manifest), "--out", str(tmp_path / "dist"), "-q",
                                       "-j", "2"])
    assert result.exit_code == 0, result.output
    assert "warning: fill_mask_kernel: constexpr max_kv_len_per_req takes 6 values" in result.output
    assert "built " in result.output and "6 untuned" in result.output  # one table row per value
    # the same values listed in the manifest: the author's choice, nothing said
    listed = _project(tmp_path, HEADER + (
        '[kernels.fill_mask]\nsource = "KERNELS/mask_fill.py:fill_mask_kernel"\nops = ["fill_mask"]\n'
        'signature = { mask_ptr = "*u8", tree_ptr = "*u8", offsets_ptr = "*i64", n_draft = "i32" }\n'
        'constexprs = { max_kv_len_per_req = [37, 38, 39, 41, 64, 100], BLOCK = [128] }\n'), name="listed")
    assert plan_summary(make_plan(load_manifest(listed)))["fill_mask"]["data_like_constexprs"] == {}
    # the callsite fixture's block sizes and num_warps: powers of two and launch options
    assert all(not k["data_like_constexprs"] for k in plan_summary(make_plan(load_manifest(CALLSITE))).values())


@pytest.mark.gpu
def test_the_mask_fill_wheel_runs_the_lengths_it_was_built_for_and_names_any_other(tmp_path) -> None:
    """The trap's consequence in a wheel: the lengths the examples passed run (results exact), another raises
    before any launch, naming the constexpr, the value and the values built."""
    import sys
    import zipfile

    import torch

    from forge_aot.pipeline import build

    manifest = _project(tmp_path, HEADER.replace('name = "p"', 'name = "forge_mask_fill"') + (
        '[kernels.fill_mask]\nsource = "KERNELS/mask_fill.py:fill_mask_kernel"\nops = ["fill_mask"]\n'
        'signature = { mask_ptr = "*u8", tree_ptr = "*u8", offsets_ptr = "*i64", n_draft = "i32" }\n'
        'examples = "examples"\n'))
    result = build(manifest, out_dir=tmp_path / "dist", build_dir=tmp_path / "build")
    site = tmp_path / "site"
    with zipfile.ZipFile(result.wheel) as zf:
        zf.extractall(site)
    sys.path.insert(0, str(site))
    try:
        import forge_mask_fill
    finally:
        sys.path.remove(str(site))
    for max_kv in (37, 64, 100):
        tree = torch.randint(0, 2, (3, 4, max_kv), device="cuda", dtype=torch.uint8)
        offsets = torch.arange(3, device="cuda", dtype=torch.int64) * 4 * max_kv
        assert torch.equal(forge_mask_fill.fill_mask(tree, offsets), tree.reshape(-1))
    tree = torch.randint(0, 2, (3, 4, 40), device="cuda", dtype=torch.uint8)
    with pytest.raises(Exception, match=r"max_kv_len_per_req=40 was not built; built values: "
                       r"\[37, 38, 39, 41, 64, 100\]"):
        forge_mask_fill.fill_mask(tree, torch.arange(3, device="cuda", dtype=torch.int64) * 160)


@pytest.mark.parametrize("layers", ["", "torch/"])
def test_a_launch_from_a_layer_file_the_package_exports_is_packaged(tmp_path, layers: str) -> None:
    """attorch launches its kernels in its layer files (an autograd Function and an nn.Module importing the kernel
    file). Listed under [exports], such a file is a host module of the wheel, whose import of the kernel file gets
    the bound handles; since session 43 the build binds it so too (its examples' import of the layer is the bound
    module: the launch is traced through the kernel's handle, where it had gone through Triton itself and been
    refused); also where the layer file lies in a folder named ``torch`` (mlstm_kernels' ``mlstm_kernels/torch/``),
    which was taken for torch's own. A launch through Triton itself is still named at its host line."""
    import torch

    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "attorchlike").mkdir()
    (tmp_path / "attorchlike" / "__init__.py").write_text("")
    (tmp_path / "attorchlike" / "scale_kernels.py").write_text(
        "import triton\nimport triton.language as tl\n\n\n"
        "@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (2, 4)], key=['n'])\n@triton.jit\n"
        "def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)\n\n\n"
        f"def examples(device='cpu'):\n    import torch\n    from attorchlike.{layers.replace('/', '.')}scale_layer "
        "import Scale\n\n    Scale()(torch.randn(4096, device=device, dtype=torch.float16))\n")
    (tmp_path / "attorchlike" / layers).mkdir(exist_ok=True)
    (tmp_path / "attorchlike" / layers / "__init__.py").write_text("")
    (tmp_path / "attorchlike" / layers / "scale_layer.py").write_text(
        f"import torch\nimport triton\n\nfrom {'..' if layers else '.'}scale_kernels import scale_kernel\n\n\n"
        "class ScaleFn(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
        "        y = torch.empty_like(x)\n        try:\n"
        "            scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)\n"
        "        except Exception:  # a torch fallback, as libraries write: it cannot hide the launch\n"
        "            y = x * 2\n        return y\n\n\n"
        "class Scale(torch.nn.Module):\n    def forward(self, x):\n        return ScaleFn.apply(x)\n")
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.scale]\n'
        'source = "attorchlike/scale_kernels.py:scale_kernel"\nsignature = { x_ptr = "*T", y_ptr = "*T", n = "i32" }\n'
        f'dtypes = {{ T = ["fp16"] }}\nexamples = "examples"\n\n[exports]\n'
        f'Scale = "attorchlike/{layers}scale_layer.py"\n')
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    runs = JITFunction.run, Autotuner.run
    try:
        plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
        assert plan.modules["scale_layer"]["exports"] == ["Scale"]
        assert [e.variant for e in plan.entries] == ["T=fp16,BLOCK=1024"]  # the layer's launch, traced
        assert (JITFunction.run, Autotuner.run) == runs  # Triton's own again
        # kernel.warmup(...) of an autotuned kernel (Triton's Autotuner.warmup calls its fn's): the host line is named
        from forge_aot.trace import TritonLaunch, no_triton_launches
        from tests.conftest import import_fixture_file

        kernels = import_fixture_file(tmp_path / "attorchlike" / "scale_kernels.py", "_attorchlike_kernels")
        with pytest.raises(TritonLaunch, match=r"test_callsite.py:\d+, which launches scale_kernel"), \
                no_triton_launches():
            kernels.scale_kernel.warmup(torch.empty(8), torch.empty(8), 8, BLOCK=128, grid=(1,))
        assert (JITFunction.run, Autotuner.run) == runs
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "attorchlike" or n == "_attorchlike_kernels"]:
            del sys.modules[name]


def test_the_launch_guard_refuses_only_the_threads_inside_it(tmp_path) -> None:
    """Development mode plans in its caller's process: while one thread traces, another thread's own Triton
    launches go to Triton as usual (here, on a machine without a GPU, to Triton's own error), and Triton's classes
    are as they were once no thread is inside."""
    import threading

    import torch
    from triton.runtime.jit import JITFunction

    from forge_aot.trace import TritonLaunch, no_triton_launches
    from tests.conftest import import_fixture_file

    (tmp_path / "k.py").write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                                   "def k(x, BLOCK: tl.constexpr):\n    pass\n")
    k = import_fixture_file(tmp_path / "k.py", "_guard_threads_kernel").k
    run = JITFunction.run
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def guarded():
        with no_triton_launches():
            inside.set()
            try:
                k[(1,)](torch.empty(4), BLOCK=4)
            except TritonLaunch:
                seen["guarded"] = "refused"
            done.wait()

    thread = threading.Thread(target=guarded)
    thread.start()
    inside.wait()
    try:
        k[(1,)](torch.empty(4), BLOCK=4)
    except TritonLaunch:
        seen["other"] = "refused"
    except Exception as exc:  # Triton's own answer (no GPU here, or a real launch on one)
        seen["other"] = type(exc).__name__
    else:
        seen["other"] = "launched"
    done.set()
    thread.join()
    sys.modules.pop("_guard_threads_kernel", None)
    assert seen["guarded"] == "refused" and seen["other"] != "refused", seen
    assert JITFunction.run is run


OPTION_AT_ONE_SHAPE = '''\
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 1024}, num_warps=8)],
                 key=["n"])
@triton.heuristics({"HAS_BIAS": lambda args: args["bias_ptr"] is not None})
@triton.jit
def biased_kernel(x_ptr, bias_ptr, out_ptr, n, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if HAS_BIAS:
        x += tl.load(bias_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, x, mask=offs < n)


def biased(x, bias=None):
    out = torch.empty_like(x)
    biased_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, bias, out, x.numel())
    return out


def examples(device="cpu"):
    biased(torch.randn(1000, device=device), torch.randn(1000, device=device))  # the option at a small shape only
    biased(torch.randn(100000, device=device))
'''
"""Cut Cross-Entropy's softcap: an example passed it at a small shape only, and the wheel refused it at a large one."""


def test_an_optional_argument_traced_at_one_shape_is_built_at_every_row(tmp_path: Path) -> None:
    """The binaries of a row cross the optional arguments (None or passed) that any traced call of its variant
    passes both ways, not only its own calls: the large row, whose calls left ``bias`` None, also has binaries with
    ``HAS_BIAS`` True for its config (a call at that size with a bias would have raised NotBuiltError); the small
    row has the None side of its config's binaries too."""
    from tests.test_localmods import one_file_project

    plan = make_plan(load_manifest(one_file_project(tmp_path / "p", "forge_test_option_rows", OPTION_AT_ONE_SHAPE,
                                                    "biased_kernel", ["biased"])))
    (e,) = plan.entries
    rows = {r.key: r for r in e.tables["default"]}
    assert set(rows) == {(1000,), (100000,)}
    for key, traced_bias in (((1000,), True), ((100000,), False)):
        binaries = plan.binaries_for(e, key, rows[key].preferences[0])
        # per side, the bias pointer aligned (D) or None (N): its exact, key-unassumed and generic binaries
        assert {(b.spec, dict(b.heur)["HAS_BIAS"]) for b in binaries} == {
            ("DDDD", True), ("DDDx", True), ("xxxx", True), ("DNDD", False), ("DNDx", False), ("xNxx", False)}
        assert {dict(b.heur)["HAS_BIAS"] for b in binaries if not b.speculative} == {traced_bias}


@pytest.mark.gpu
def test_an_optional_argument_traced_at_one_shape_runs_at_another_on_the_gpu(tmp_path: Path) -> None:
    """That wheel, Triton blocked: a bias at the large size (and none at the small one) launches, exact."""
    from tests.test_localmods import _installed, _run_fresh, one_file_project

    site = _installed(one_file_project(tmp_path / "p", "forge_test_option_rows_gpu", OPTION_AT_ONE_SHAPE,
                                       "biased_kernel", ["biased"]), tmp_path)
    probe = textwrap.dedent("""\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_test_option_rows_gpu as pkg
        out = {}
        for n, with_bias in ((100000, True), (100003, True), (1000, False), (999, True)):
            x, b = (torch.randn(n + 1, device="cuda")[1:] for _ in range(2))  # misaligned
            got = pkg.biased(x, b if with_bias else None)
            want = x.double() + (b.double() if with_bias else 0)
            out[f"{n}:{with_bias}"] = (got.double() - want).abs().max().item()
        print(json.dumps(out))
        """)
    res = _run_fresh(probe, site)
    assert len(res) == 4 and max(res.values()) < 1e-6, res


SHAPE_CONSTEXPRS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def decay_kernel(X, Y, b: tl.constexpr, h: tl.constexpr, n: tl.constexpr, d: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + row * d + offs, mask=offs < d)
    tl.store(Y + row * d + offs, x * (n * h * b), mask=offs < d)


def decay(q):
    b, h, n, d = q.shape
    y = torch.empty_like(q)
    decay_kernel[(b * h * n,)](q, y, b, h, n, d, BLOCK=triton.next_power_of_2(d))
    return y


def examples(device="cpu"):
    decay(torch.randn(2, 4, 100, 64, device=device))
    decay(torch.randn(1, 4, 256, 48, device=device))
'''
"""lightning-attention's ``_fwd_kernel``: ``b, h, n, d = q.shape`` passed as constexprs."""


def test_a_constexpr_that_is_a_tensors_size_is_named_at_check(tmp_path: Path) -> None:
    """The lightning-attention hunt: batch and sequence length compiled in, two of each traced, and ``check`` said
    nothing (the data-like rule wants five values); a wheel then refuses every other batch size or length. A
    call-site constexpr that is one leading size of one tensor in every traced call, with two values or one not a
    power of two, is named with that size; the innermost size (a head dimension), a constant size and block sizes
    are not."""
    from click.testing import CliRunner

    from forge_aot.cli import main
    from tests.test_localmods import one_file_project

    manifest = one_file_project(tmp_path / "p", "forge_test_sizes", SHAPE_CONSTEXPRS, "decay_kernel", ["decay"])
    summary = plan_summary(make_plan(load_manifest(manifest)))["k"]
    assert summary["size_constexprs"] == {"b": ("X", 0, [1, 2]), "n": ("X", 2, [100, 256])}
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    assert "note: decay_kernel: constexpr n equals X.shape[2] in every traced call (100, 256): each value is a " \
        "binary of its own, and a value no example passes raises NotBuiltError at run time" in result.output, \
        result.output
    assert "constexpr b equals X.shape[0] in every traced call (1, 2)" in result.output
    assert "constexpr h " not in result.output and "constexpr d " not in result.output
