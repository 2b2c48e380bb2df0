"""Kernels behind Triton-availability guards (tests/fixtures/realworld/kernels/guarded_gather.py), the commonest way
model repositories and libraries write optional Triton kernels: ``try: import triton ... _HAS_TRITON = True`` /
``except ImportError: triton = None; _HAS_TRITON = False``, kernels under ``if _HAS_TRITON:`` or ``if triton is not
None:``, host functions that test the flag at every call and fall back to torch.

The build reads the file as importing it with Triton runs it (``sourcesplit._triton_guard``): the ``try`` is its
body, and a top-level ``if`` whose test it can evaluate from Triton's names, flags and feature probes
(``TRITON_HAS_REDUCE = hasattr(tl, "reduce")``) is the branch it takes; before, the kernels were refused ("inside the
if block"), and the wheel's copy of the ``try`` would have run its handler (flag false: the torch fallback).

CPU: the shipped host code (flag true, no ``triton = None``, kernels bound, lines kept), a probe choosing between two
branches that define the same kernel, and a test the build cannot evaluate still refused. GPU: both ops against
torch in fp64 on odd and misaligned shapes, the kernels launched (not the fallbacks, which give the same values),
and torch.compile(fullgraph=True)."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import REALWORLD, launched_specs, offset_view, reset_handle


def test_the_wheel_reads_the_guards_as_the_build_does(realworld_plan) -> None:
    shipped = realworld_plan.modules["guarded_gather"]["host_source"]
    original = (REALWORLD / "kernels" / "guarded_gather.py").read_text()
    assert "_HAS_TRITON = True" in shipped and "_HAS_TRITON = False" not in shipped
    assert "\n    triton = None\n" not in shipped and "\nimport triton" not in shipped  # (the docstring says it)
    assert "_scaled_gather_kernel = __forge_kernel_side__(" in shipped
    assert "_row_absmax_kernel = __forge_kernel_side__(" in shipped
    # line for line: tracebacks from the wheel point at the lines of the file as written
    assert len(shipped.splitlines()) == len(original.splitlines())
    for name in ("def scaled_gather(", "def row_absmax(", "    if not _HAS_TRITON or not src.is_cuda:"):
        assert original.splitlines().index(next(li for li in original.splitlines() if li.startswith(name))) == \
            shipped.splitlines().index(next(li for li in shipped.splitlines() if li.startswith(name)))
    assert realworld_plan.modules["guarded_gather"]["schemas"]["scaled_gather"] == \
        "(Tensor src, Tensor idx, float scale=1.0) -> Tensor"


def _parse(tmp_path, body: str):
    from forge_aot.sourcesplit import parse_source

    path = tmp_path / "k.py"
    path.write_text(textwrap.dedent(body))
    return parse_source(path)


def test_a_feature_probe_chooses_between_two_branches_defining_the_kernel(tmp_path) -> None:
    """``TRITON_HAS_REDUCE = hasattr(tl, "reduce")`` then ``if TRITON_HAS_REDUCE:`` / ``else:``, each defining
    ``absmax_kernel`` (a kernel per Triton feature): the branch this Triton takes is the kernel; the other is left
    out of the host code."""
    src = _parse(tmp_path, '''\
        import torch
        import triton
        import triton.language as tl

        TRITON_HAS_REDUCE = hasattr(tl, "reduce")
        TRITON_HAS_NOTHING = hasattr(tl, "no_such_feature")


        @triton.jit
        def _max_abs(a, b):
            return tl.maximum(tl.abs(a), tl.abs(b))


        if TRITON_HAS_REDUCE:

            @triton.jit
            def absmax_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
                x = tl.load(x_ptr + tl.arange(0, BLOCK))
                tl.store(out_ptr, tl.reduce(x, 0, _max_abs))

        else:

            @triton.jit
            def absmax_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
                tl.store(out_ptr, tl.max(tl.abs(tl.load(x_ptr + tl.arange(0, BLOCK))), 0))

        if TRITON_HAS_NOTHING:
            absmax_fallback = None


        def absmax(x):
            out = torch.empty(1, device=x.device, dtype=torch.float32)
            absmax_kernel[(1,)](x, out, BLOCK=x.numel())
            return out
    ''')
    assert src.kernels["absmax_kernel"].line == 17  # the if-branch's definition
    assert src.branch_kernels["absmax_kernel"] == (14, 16, 19)  # the block, the branch's first and last lines
    assert "tl.max(" not in src.host_source and "absmax_fallback = None" in src.host_source


def test_a_guard_the_build_cannot_evaluate_is_still_refused(tmp_path) -> None:
    """``if os.environ.get(...)``: not Triton's availability, so not the build's to choose; kernels there are
    refused as before, with where they are."""
    from forge_aot.errors import SourceError

    with pytest.raises(SourceError, match=r"k.py:9: scale_kernel is a @triton.jit function inside the if block at "
                                          r"line 7"):
        _parse(tmp_path, '''\
            import os

            import triton
            import triton.language as tl


            if os.environ.get("USE_TRITON", "1") == "1":
                @triton.jit
                def scale_kernel(x_ptr, BLOCK: tl.constexpr):
                    pass
        ''')


def test_a_try_that_does_more_than_import_triton_and_set_flags_keeps_its_handler(tmp_path) -> None:
    """A ``try`` whose body does anything else (flash-linear-attention patches ``tl.extra`` there) or imports what
    this machine lacks is left as written: its Triton imports raise ImportError in the wheel, so the handler runs."""
    src = _parse(tmp_path, '''\
        import torch
        import triton
        import triton.language as tl

        try:
            from triton.backends.no_such_backend import Options
            HAS_OPTIONS = True
        except ImportError:
            HAS_OPTIONS = False


        @triton.jit
        def k(x_ptr):
            pass


        def op(x):
            k[(1,)](x)
            return HAS_OPTIONS
    ''')
    assert "HAS_OPTIONS = False" in src.host_source and "raise ImportError" in src.host_source


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize(("rows", "cols", "picks", "misaligned"), [(100, 1000, 37, False), (333, 4099, 1000, True),
                                                                   (5, 1, 3, False)])
def test_scaled_gather_runs_the_kernel_and_matches_torch(realworld, dtype, rows, cols, picks, misaligned) -> None:
    import torch

    from tests.conftest import torch_dtype

    dt = torch_dtype(dtype)
    g = torch.Generator(device="cuda").manual_seed(rows + cols)
    src = torch.randn(rows, cols, device="cuda", dtype=dt, generator=g)
    src = offset_view(src) if misaligned else src
    idx = torch.randint(0, rows, (picks,), device="cuda", generator=g)
    reset_handle("forge_realworld._ops.guarded_gather", "_scaled_gather_kernel")
    got = realworld.scaled_gather(src, idx, 0.75)
    want = (src.double()[idx] * 0.75).to(dt)
    assert launched_specs("forge_realworld._ops.guarded_gather", "_scaled_gather_kernel"), "the torch fallback ran"
    assert got.dtype == dt and torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_row_absmax_runs_the_kernel_and_compiles_fullgraph(realworld, dtype) -> None:
    import torch

    from tests.conftest import torch_dtype

    x = offset_view(torch.randn(7, 4099, device="cuda", dtype=torch_dtype(dtype)) * 3)
    reset_handle("forge_realworld._ops.guarded_gather", "_row_absmax_kernel")
    got = realworld.row_absmax(x)
    assert launched_specs("forge_realworld._ops.guarded_gather", "_row_absmax_kernel"), "the torch fallback ran"
    assert torch.equal(got, x.double().abs().amax(dim=-1).float())
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: realworld.row_absmax(t) * 2, fullgraph=True)(x)
    assert torch.equal(compiled, got * 2)
