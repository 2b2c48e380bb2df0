"""bitsandbytes-style row-wise int8 quantization (tests/fixtures/realworld/bnblike/triton/quantize_rowwise.py): the
kernel, Triton's imports and the op are defined under ``if not is_triton_available(): <stub op returning None>
else:``, in a library subpackage itself named ``triton``; packaged as written.

CPU: the file read with the branch the build's import takes in the block's place (same line numbers), the stub
left out; a kernel in a branch the import does not take is refused; ``try: <Triton, kernels> except ImportError:``
likewise. GPU: the wheel, which has no Triton (the stub's branch would be taken), against fp64 and bit for bit against
the file under Triton's JIT, aligned and misaligned rows."""

from __future__ import annotations

import textwrap

import pytest

from forge_aot.errors import SourceError
from forge_aot.manifest import load_manifest
from forge_aot.plan import make_plan
from forge_aot.sourcesplit import parse_source
from tests.conftest import REALWORLD, import_fixture_file, poison_allocator

SOURCE = REALWORLD / "bnblike" / "triton" / "quantize_rowwise.py"


def test_the_branch_that_defines_the_kernel_is_read_in_the_blocks_place() -> None:
    src = parse_source(SOURCE, {"quantize_rowwise"})
    original = SOURCE.read_text().splitlines()
    block = original.index("if not is_triton_available():") + 1
    assert src.branch_kernels == {"_quantize_rowwise": (block, block + 4, len(original) - original[::-1].index(
        "        return output, output_maxs"))}
    assert src.kernels["_quantize_rowwise"].autotuned
    host = src.host_source.splitlines()
    assert len(host) == len(original)
    assert "is_triton_available():" not in src.host_source and "return None" not in src.host_source
    op = original.index("    def quantize_rowwise(x: torch.Tensor):")
    assert host[op] == "def quantize_rowwise(x: torch.Tensor):"  # at module level, on its own line
    assert host[op + 1] == "    output = torch.empty(*x.shape, device=x.device, dtype=torch.int8)"
    assert "_quantize_rowwise[grid](x, output" in host[original.index(next(
        line for line in original if "_quantize_rowwise[grid]" in line))]
    compile(src.host_source, str(SOURCE), "exec")


def test_the_plan_types_the_kernel_from_the_examples(realworld_plan) -> None:
    entries = [e for e in realworld_plan.entries if e.kernel == "bnb_quantize_rowwise"]
    assert {(e.target, e.assignment["BLOCK_SIZE"], e.assignment["P2"]) for e in entries} == {
        (t, n, p2) for t in ("sm_80", "sm_90") for n, p2 in ((1000, 1024), (1024, 1024), (4096, 4096), (4099, 8192))}
    module = realworld_plan.modules["quantize_rowwise"]
    assert module["schemas"]["quantize_rowwise"] == "(Tensor x) -> (Tensor, Tensor)"


_KERNEL = '''\
    import triton
    import triton.language as tl

    @triton.jit
    def double_kernel(a, c, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(c + offs, tl.load(a + offs, mask=offs < n) * 2, mask=offs < n)

    def double(a):
        c = torch.empty_like(a)
        double_kernel[(triton.cdiv(a.numel(), 256),)](a, c, a.numel(), BLOCK=256)
        return c
'''


def _project(tmp_path, body: str):
    (tmp_path / "k.py").write_text("import torch\n\n" + body + textwrap.dedent('''

        def examples(device="cpu"):
            double(torch.randn(1000, device=device))
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_test_branch"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.double]\n'
        'source = "k.py:double_kernel"\nsignature = { a = "*fp32" }\nexamples = "examples"\nops = ["double"]\n')
    return tmp_path / "kernel_manifest.toml"


def test_try_import_triton_except_import_error_is_read_as_its_try(tmp_path) -> None:
    fallback = "except ImportError:\n    def double(a):\n        return a * 2\n"
    manifest = _project(tmp_path, "try:\n" + _KERNEL + fallback)
    plan = make_plan(load_manifest(manifest))
    assert plan.modules["k"]["schemas"]["double"] == "(Tensor a) -> Tensor"
    assert "return a * 2" not in plan.modules["k"]["host_source"]


@pytest.mark.parametrize("stub", ["", "    def double_kernel(*args):\n        pass\n"])
def test_a_kernel_in_a_branch_the_import_does_not_take_is_refused(tmp_path, stub) -> None:
    """Also where the branch taken defines a stub of the kernel's name: it must be a Triton kernel, defined in the
    branch the wheel runs."""
    manifest = _project(tmp_path, "if torch.__version__:\n    def double(a):\n        return a * 2\n" + stub
                        + "else:\n" + _KERNEL)
    with pytest.raises(SourceError, match=r"k.py:\d+: double_kernel is defined in a branch of the block at line 3 "
                                          r"that importing the file with Triton does not take"):
        make_plan(load_manifest(manifest))


_TOP_KERNEL = textwrap.dedent('''\
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def k(a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(a + offs, tl.load(a + offs, mask=offs < n) * 2, mask=offs < n)
''')


@pytest.mark.parametrize("block", [
    # the script tail: never runs where the file is a module
    'if __name__ == "__main__":\n    @triton.jit\n    def copy_kernel(a):\n        pass\n    print(torch.randn(3))\n',
    # helper kernels behind a flag, the block importing no Triton of its own: left as it was
    "if torch.__version__ == 'debug':\n    @triton.jit\n    def debug_kernel(a):\n        pass\n",
    # a @triton.jit fallback in the ImportError handler (the path without Triton): kernel side as before
    "try:\n    from triton.language.extra.cuda.libdevice import fast_dividef\nexcept ImportError:\n"
    "    @triton.jit\n    def fast_dividef(x, y):\n        return x / y\n",
])
def test_blocks_that_do_not_guard_triton_are_not_read_as_one_branch(tmp_path, block) -> None:
    (tmp_path / "k.py").write_text(_TOP_KERNEL + "\n\n" + block)
    src = parse_source(tmp_path / "k.py", set())
    assert src.branch_kernels == {} and set(src.kernels) == {"k"}
    assert "print(" not in src.host_source


def test_the_branch_keeps_its_strings_as_written(tmp_path) -> None:
    """Dedenting the branch leaves a string that spans lines as written: the value the build's import saw."""
    text = ("import torch\n\ntry:\n    import triton\n    import triton.language as tl\n\n"
            "    HELP = \"\"\"first\n        indented eight\n    four\"\"\"\n\n"
            "    @triton.jit  # a comment\n    def k(a, BLOCK: tl.constexpr):\n        pass\n\n"
            "    def op(a):\n        return HELP\n"
            "except ImportError:\n    HELP = None\n")
    (tmp_path / "k.py").write_text(text)
    src = parse_source(tmp_path / "k.py", {"op"})
    assert set(src.branch_kernels) == {"k"}
    scope: dict = {}
    exec(compile(src.host_source.replace("__forge_kernel_side__('k', __name__)", "None"), "k.py", "exec"), scope)
    assert scope["op"](None) == "first\n        indented eight\n    four"
    assert len(src.host_source.splitlines()) == len(text.splitlines())


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(SOURCE, "bnblike.triton.quantize_rowwise")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("cols", [1000, 1024, 4096, 4099])
@pytest.mark.parametrize("aligned", [True, False])
def test_against_fp64_and_the_jit(realworld, jit, rows, cols, aligned) -> None:
    import torch

    if not aligned and cols not in (1000, 4099):
        pytest.skip("the examples build misaligned rows of 1000 and 4099 only")
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16) if aligned else jit.misaligned(rows, cols, "cuda")
    x.mul_(3)
    assert (x.data_ptr() % 16 == 0) == aligned
    ref_q, ref_max = jit.quantize_rowwise_reference(x)
    poison_allocator(x.numel() * 4)
    q, maxs = realworld.quantize_rowwise(x)
    torch.cuda.synchronize()
    assert q.dtype == torch.int8 and q.shape == x.shape and maxs.dtype == torch.float16
    assert torch.equal(maxs, ref_max)
    # the kernel scales in fp16 (x / max_val), so a value near a half-way point may round the other way
    assert (q.int() - ref_q.int()).abs().max().item() <= 1
    assert (q != ref_q).float().mean().item() < 0.02
    jq, jmax = jit.quantize_rowwise(x)
    assert torch.equal(q, jq) and torch.equal(maxs, jmax)  # the JIT compiles the same kernel: the same bits


@pytest.mark.slow
def test_the_wheel_runs_the_kernel_branch_without_triton(tmp_path) -> None:
    """Installed where Triton cannot be imported (``is_triton_available()``, a ``find_spec("triton")``, answers as the
    build did: True, since session 44), the wheel's op is the branch that launches the kernel, not bitsandbytes' stub
    returning None. Its custom op on the fake CUDA
    tensors torch.compile and torch.export trace with gives the int8 rows and the fp16 maxima on that device: the
    host code's ``assert x.is_cuda`` holds there (torch's FakeTensorMode hands a Meta implementation tensors that say
    ``meta``; the runtime runs it as a fake implementation)."""
    import shutil

    from tests.test_localmods import _installed, _run_fresh

    project = tmp_path / "project"
    shutil.copytree(REALWORLD / "bnblike", project / "bnblike")
    (project / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_test_bnb"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.quantize]\n'
        'source = "bnblike/triton/quantize_rowwise.py:_quantize_rowwise"\nops = ["quantize_rowwise"]\n'
        'signature = { x_ptr = "*fp16" }\nexamples = "examples"\n')
    target = _installed(project / "kernel_manifest.toml", tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = sys.modules["bnblike"] = None  # importing either would raise
        import torch, forge_test_bnb
        from torch._subclasses.fake_tensor import FakeTensorMode
        from forge_test_bnb._ops._local.bnblike.triton import triton_utils
        with FakeTensorMode():
            x = torch.empty(7, 4099, device="cuda", dtype=torch.float16)
            q, maxs = torch.ops.forge_test_bnb.quantize_rowwise(x)
            again = torch.ops.forge_test_bnb.quantize_rowwise(x)[0]
        print(json.dumps({"q": [list(q.shape), str(q.dtype), str(q.device)], "again": str(again.device),
                          "maxs": [list(maxs.shape), str(maxs.dtype), str(maxs.device)],
                          "available": triton_utils.is_triton_available()}))
        ''')
    res = _run_fresh(code, target)
    assert res == {"q": [[7, 4099], "torch.int8", "cuda:0"], "again": "cuda:0",
                   "maxs": [[7], "torch.float16", "cuda:0"], "available": True}


@pytest.mark.gpu
def test_the_op_compiles_fullgraph_with_its_assert_is_cuda(realworld) -> None:
    """torch.compile(fullgraph=True) over the op: its host code asserts ``x.is_cuda`` (before, the Meta
    implementation saw meta tensors and the assert failed while Dynamo traced)."""
    import torch

    x = torch.randn(300, 4099, device="cuda", dtype=torch.float16)
    compiled = torch.compile(lambda t: realworld.quantize_rowwise(t), fullgraph=True)
    q, maxs = compiled(x)
    eq, emaxs = realworld.quantize_rowwise(x)
    assert torch.equal(q, eq) and torch.equal(maxs, emaxs)
