"""Liger-Kernel's GeGLU (tests/fixtures/realworld/kernels/geglu.py): libdevice's ``tanh`` imported inside an
``if compare_version("triton", ...)`` / ``try`` / ``except`` block (a Triton version check and an NGC fallback),
``calculate_settings`` from a helper package, ``n_cols`` a shape-derived constexpr, a backward kernel that writes
its gradients over the saved inputs.

CPU: the import block is the kernels' (left out of the host code, the version check never runs in the wheel).
GPU: forward and backward against torch in fp64 and against the same file under Triton's JIT."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import HALF_TOL, REALWORLD, import_fixture_file, poison_allocator, relative_error, torch_dtype


def test_a_version_checked_import_block_belongs_to_the_kernels(realworld_plan) -> None:
    host = realworld_plan.modules["geglu"]["host_source"]
    tree = ast.parse(host)
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.If, ast.Try))]  # the whole block left out
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert imported == {"torch", "calculate_settings", "ensure_contiguous"}  # tanh, operator, compare_version: gone
    assert "from ligerlike.ops.utils import calculate_settings, ensure_contiguous" in host
    widths = {e.assignment["n_cols"]: (e.assignment["BLOCK_SIZE"], e.assignment["num_warps"])
              for e in realworld_plan.entries if e.kernel == "geglu_fwd"}
    assert widths == {1000: (1024, 4), 4096: (4096, 8), 11008: (16384, 16), 16384: (16384, 16),
                      24576: (32768, 32)}


def test_an_import_block_that_host_code_needs_is_still_host_code(tmp_path) -> None:
    from forge_aot.sourcesplit import SourceError, parse_source

    kernels = tmp_path / "k.py"
    base = ("import triton\nimport triton.language as tl\n{block}\n\n@triton.jit\ndef k(x):\n"
            "    tl.store(x, fast_tanh(tl.load(x)))\n\n\ndef op(x):\n    {use}\n    k[(1,)](x)\n    return x\n")
    # an optional non-Triton dependency in a try block stays host code
    kernels.write_text(base.format(block="try:\n    import numpy as np\nexcept ImportError:\n    np = None\n"
                                         "from triton.language.extra.libdevice import tanh as fast_tanh",
                                   use="np"))
    assert "import numpy as np" in parse_source(kernels, {"op"}).host_source
    # host code that uses a name the Triton import block binds is told so
    kernels.write_text(base.format(block="try:\n    from triton.language.extra.libdevice import tanh as fast_tanh\n"
                                         "except ImportError:\n    from triton.language.math import tanh as fast_tanh",
                                   use="fast_tanh"))
    with pytest.raises(SourceError, match=r"host code uses 'fast_tanh', which is Triton"):
        parse_source(kernels, {"op"})


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "geglu.py", "_geglu_jit_geglu")



@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(4, 1000), (8, 4096), (2, 11008), (2, 16384), (2, 24576), (3, 5, 4096),
                                   (1, 1000), (129, 11008)])
def test_geglu_forward_and_backward_against_torch_and_the_jit(realworld, jit, dtype, shape) -> None:
    import torch

    a0 = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype))
    b0 = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype))
    dc = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype))
    ref_a, ref_b = a0.double().requires_grad_(), b0.double().requires_grad_()
    ref = torch.nn.functional.gelu(ref_a, approximate="tanh") * ref_b
    ref.backward(dc.double())

    results = {}
    for name, impl in (("wheel", realworld), ("jit", jit)):
        # Liger's backward writes the gradients over its saved inputs: each run gets its own copies
        a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        poison_allocator(a.numel() * a.element_size())
        c = impl.geglu(a, b)
        c.backward(dc)
        torch.cuda.synchronize()
        results[name] = (c, a.grad, b.grad)
    c, da, db = results["wheel"]
    assert c.shape == a0.shape and c.dtype == a0.dtype
    assert relative_error(c, ref.detach()) < HALF_TOL[dtype]
    assert relative_error(da, ref_a.grad) < 2 * HALF_TOL[dtype]
    assert relative_error(db, ref_b.grad) < HALF_TOL[dtype]
    for mine, theirs in zip(results["wheel"], results["jit"]):
        assert torch.equal(mine, theirs)  # the JIT's own binaries: a traced width (any row count)


@pytest.mark.gpu
def test_a_width_that_was_not_built_is_named(realworld) -> None:
    # n_cols is a constexpr in Liger's kernels: one binary per width, and the examples built five
    import torch

    a = torch.randn(2, 3000, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"n_cols=3000 was not built; built values: \[1000, 4096, 11008, 16384, "
                                         r"24576\]"):
        realworld.geglu(a, a.clone())
