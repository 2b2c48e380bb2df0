"""Unsloth's RMS layer norm (tests/fixtures/realworld/unslothlike/kernels/rms_layernorm.py): host code picks one of
two forward kernels into a local name, ``fx = _gemma_rms_layernorm_forward if gemma else _rms_layernorm_forward``,
and launches through it, ``fx[(n_rows,)](..., BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)``.

The build had not seen that launch (a launch site was a kernel's own name): ``num_warps`` was no call-site option,
and the examples' calls were refused ("the call passes num_warps=8, but num_warps was not built"; session 38's hunt
over Unsloth's file). A local name bound only to kernels now launches each of them (``sourcesplit._kernel_aliases``).

CPU: both kernels' launch site and call-site options. GPU: both variants against fp64 on odd row counts and a
misaligned input, each kernel seen launching, torch.compile(fullgraph=True)."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import REALWORLD, import_fixture_file, launched_specs, offset_view, reset_handle


def test_a_kernel_picked_into_a_local_name_is_launched_there(realworld_plan) -> None:
    assert sorted(realworld_plan.modules["rms_layernorm"]["kernels"]) == ["_gemma_rms_layernorm_forward",
                                                                          "_rms_layernorm_forward"]
    for name in ("unsloth_rms_fwd", "unsloth_gemma_rms_fwd"):
        kp = realworld_plan.kernels[name]
        assert [(s.function, s.keywords) for s in kp.launches] == [("fast_rms_layernorm", ("BLOCK_SIZE", "num_warps"))]
        assert {e.assignment["num_warps"] for e in realworld_plan.entries if e.kernel == name} == {4, 8}


def test_kernel_aliases_are_names_bound_only_to_kernels(tmp_path) -> None:
    """``fx = A``, ``A if c else B``, ``(A, B)[i]``: each kernel; ``A if c else None`` (a handle picked at run time,
    Unsloth's MoE style): A; a name also bound to anything else (by unpacking too) is none."""
    import ast

    from forge_aot.sourcesplit import _kernel_aliases

    fn = ast.parse(textwrap.dedent('''\
        def op(x, c, i):
            fx = A if c else B
            gx = (A, B, C)[i]
            hx = A
            hx = B
            other = A if c else make()
            mixed = A
            mixed = x
            pair = A
            pair, other2 = B, x
            maybe = A if c else None
            fx[(1,)](x)
    ''')).body[0]
    assert _kernel_aliases(fn, {"A", "B", "C"}) == {"fx": ["A", "B"], "gx": ["A", "B", "C"], "hx": ["A", "B"],
                                                  "maybe": ["A"]}


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize(("rows", "dim", "dtype", "misaligned"), [(74, 4096, "fp16", False), (7, 2560, "bf16", True),
                                                                  (1, 1000, "fp16", True)])
def test_fast_rms_layernorm_against_fp64_through_the_picked_kernel(realworld, gemma, rows, dim, dtype,
                                                                   misaligned) -> None:
    import torch

    from tests.conftest import torch_dtype

    ref = import_fixture_file(REALWORLD / "unslothlike" / "kernels" / "rms_layernorm.py",
                              "unslothlike.kernels.rms_layernorm")
    dt = torch_dtype(dtype)
    g = torch.Generator(device="cuda").manual_seed(rows * dim)
    X = torch.randn(rows, dim, device="cuda", dtype=dt, generator=g)
    X = offset_view(X) if misaligned else X
    W = torch.randn(dim, device="cuda", dtype=dt, generator=g)
    function = "_gemma_rms_layernorm_forward" if gemma else "_rms_layernorm_forward"
    module = "forge_realworld._ops.rms_layernorm"
    reset_handle(module, function)
    got = realworld.fast_rms_layernorm(X, W, 1e-6, gemma=gemma)
    assert launched_specs(module, function)
    want = ref.reference(X, W, 1e-6, gemma)
    tol = 2e-2 if dtype == "bf16" else 4e-3
    assert got.dtype == dt and torch.allclose(got.double(), want, rtol=tol, atol=tol)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: realworld.fast_rms_layernorm(x, w, 1e-6, gemma=gemma), fullgraph=True)
    assert torch.equal(compiled(X, W), got)
