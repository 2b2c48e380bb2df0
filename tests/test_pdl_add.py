"""Triton 3.6 tutorial 11 (tests/fixtures/realworld/kernels/pdl_add.py): ``launch_pdl=`` at the call, a launch
attribute read per call (never part of the binary), and a ``USE_GDC`` constexpr whose ``gdc_wait`` needs sm_90.

CPU: the plan records the flag the host code passes and builds one binary per USE_GDC value, for sm_90 only.
(The attribute's path to ``cuLaunchKernelEx``, both launch paths, is tests/test_c_launch.py's, on a fake driver.)
GPU: results against torch and bit for bit against the tutorial under Triton's JIT, with and without PDL, on odd
sizes and offset tensors; a chain of dependent PDL launches reads each previous launch's writes."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, offset_view, poison_allocator


def test_the_flag_is_read_per_call_and_never_built(realworld_plan) -> None:
    kp = realworld_plan.kernels["pdl_add"]
    assert kp.launch_flags == ["launch_pdl"] and kp.spec_json()["launch_flags"] == ["launch_pdl"]
    assert "launch_pdl" not in kp.axes  # one binary serves both: the attribute is the launch's
    built = {(e.target, e.assignment["USE_GDC"]) for e in realworld_plan.entries if e.kernel == "pdl_add"}
    assert built == {("sm_90", True), ("sm_90", False)}


def test_a_launch_attribute_the_loader_does_not_know_is_refused(tmp_path) -> None:
    from forge_aot.errors import SourceError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(
        "import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(x, B: tl.constexpr):\n"
        "    tl.store(x + tl.arange(0, B), tl.zeros([B], tl.float32))\n\n\ndef op(x):\n"
        "    k[(1,)](x, B=16, launch_pdl=True, launch_sideways=True)\n    return x\n\n\n"
        "def examples(device='cpu'):\n    op(torch.empty(16, device=device))\n")
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "pdl_refused"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\n'
        'source = "k.py:k"\nops = ["op"]\nsignature = { x = "*fp32" }\nexamples = "examples"\n')
    with pytest.raises(SourceError, match=r"passes launch_sideways= to k, which has no such parameter or launch "
                                          r"option \(accepted: x, B, num_warps, num_stages, num_ctas, maxnreg, "
                                          r"enable_fp_fusion, launch_pdl, launch_cooperative_grid\)"):
        make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "pdl_add.py", "_pdl_add_jit")


@pytest.mark.gpu
@pytest.mark.parametrize("launch_pdl", [True, False])
@pytest.mark.parametrize("n", [1, 1000, 98432, 1_000_003])
@pytest.mark.parametrize("offset", [0, 1])
def test_pdl_add_against_torch_and_the_jit(realworld, jit, launch_pdl, n, offset) -> None:
    import torch

    x = offset_view(torch.rand(n, device="cuda"), offset)
    y = offset_view(torch.rand(n, device="cuda"), offset)
    poison_allocator(4 * n)
    out = realworld.add(x, y, launch_pdl=launch_pdl)
    ref = jit.add(x, y, launch_pdl=launch_pdl)
    torch.cuda.synchronize()
    assert torch.equal(out, (x.double() + y.double()).float()) and torch.equal(out, ref)


@pytest.mark.gpu
def test_a_chain_of_pdl_launches_reads_each_previous_write(realworld) -> None:
    # each launch may start before the previous one ends: its gdc_wait makes it read that launch's output
    import torch

    n = 3 * 2**20 + 7
    x = torch.randint(0, 8, (n,), device="cuda").float()
    one = torch.ones(n, device="cuda")
    for _ in range(3):
        out = x
        for _ in range(50):
            out = realworld.add(out, one, launch_pdl=True)
        torch.cuda.synchronize()
        assert torch.equal(out, x + 50)
    # and under a CUDA graph capture (the attribute becomes the graph's programmatic edge)
    g = torch.cuda.CUDAGraph()
    realworld.add(x, one)  # loaded before capture
    with torch.cuda.graph(g):
        out = x
        for _ in range(20):
            out = realworld.add(out, one, launch_pdl=True)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x + 20)


def _pdl_project(tmp_path, optional: str) -> object:
    import shutil

    from forge_aot.manifest import load_manifest

    (tmp_path / "kernels").mkdir(parents=True)
    shutil.copy(REALWORLD / "kernels" / "pdl_add.py", tmp_path / "kernels" / "pdl_add.py")
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "pdl_optional"\nversion = "0.1.0"\ntargets = ["sm_80", "sm_90"]\n\n[kernels.pdl_add]\n'
        'source = "kernels/pdl_add.py:add_kernel"\nops = ["add"]\n'
        'signature = { x_ptr = "*fp32", y_ptr = "*fp32", output_ptr = "*fp32", n_elements = "i32" }\n'
        f'examples = "examples"\n{optional}')
    return load_manifest(tmp_path / "kernel_manifest.toml")


def test_an_optional_target_leaves_out_the_variants_that_cannot_compile_there(tmp_path) -> None:
    """The tutorial as is on sm_80 and sm_90: USE_GDC=True cannot compile below sm_90 (griddepcontrol). With
    ``optional-targets = ["sm_80"]`` the build leaves that variant out of sm_80 (real compiles, real ptxas error),
    keeps the other for both, and a call of it on an A100 names the compiler's reason; without it the build fails."""
    import json

    from forge_aot import runtime as rt
    from forge_aot.index import build_index
    from forge_aot.pipeline import BuildFailed, build

    with pytest.raises(BuildFailed, match=r"USE_GDC=True\] for sm_80: no config compiled"):
        build(_pdl_project(tmp_path / "strict", "").path, out_dir=tmp_path / "strict" / "dist", jobs=2)
    loaded = _pdl_project(tmp_path / "optional", 'optional-targets = ["sm_80"]\n')
    result = build(loaded.path, out_dir=tmp_path / "optional" / "dist", jobs=2)
    [left_out] = result.report.left_out
    assert (left_out.variant, left_out.target) == ("BLOCK_SIZE=1024,USE_GDC=True", "sm_80")
    # the build's per-target row counts are the wheel's: the left-out variant's sm_80 rows are not among them
    rows = {t: sum(e.origin_counts()["untuned"] for e in result.plan.entries if e.target == t)
            for t in ("sm_80", "sm_90")}
    assert result.plan.tuning.rows["sm_90"]["untuned"] == rows["sm_90"]
    assert result.plan.tuning.rows["sm_80"]["untuned"] == rows["sm_80"] - 1 == rows["sm_90"] - 1
    index = build_index(result.plan, result.report, "3.6.0", {m: m for m in result.plan.modules})
    variants = index["kernels"]["pdl_add"]["variants"]
    assert set(variants["BLOCK_SIZE=1024,USE_GDC=False"]["targets"]) == {"sm_80", "sm_90"}
    pdl = variants["BLOCK_SIZE=1024,USE_GDC=True"]
    assert set(pdl["targets"]) == {"sm_90"} and "requires .target sm_90" in pdl["not_built"]["sm_80"]
    json.dumps(index)  # the reason is plain text in the index
    spec = index["kernels"]["pdl_add"]
    kernel = rt.Kernel("pdl_add", spec, index["targets"], backend=None)
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "capability": (8, 0), "arch": "sm_80", "max_shared": 163 * 1024}
    with pytest.raises(rt.UnsupportedDeviceError, match=r"no binaries for NVIDIA A100-SXM4-80GB \(sm_80\); this build "
                       r"of it was built for sm_90\. It did not compile for sm_80: .*requires \.target sm_90"):
        rt.resolve_table(kernel, pdl, pdl["assign"], "cuda", a100)
    assert rt.resolve_table(kernel, variants["BLOCK_SIZE=1024,USE_GDC=False"],
                            variants["BLOCK_SIZE=1024,USE_GDC=False"]["assign"], "cuda", a100)[0] == "sm_80"


def test_an_optional_target_must_be_one_the_kernel_is_built_for(tmp_path) -> None:
    from forge_aot.errors import ManifestError

    with pytest.raises(ManifestError, match=r"kernels\.pdl_add\.optional-targets\[0\]: 'sm_89' is not a target"):
        _pdl_project(tmp_path, 'optional-targets = ["sm_89"]\n')
