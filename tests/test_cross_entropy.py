"""Unsloth-style cross-entropy forward (tests/fixtures/realworld/kernels/cross_entropy.py): ``@triton.heuristics``
that coerce flags the call also passes (``bool(args["DO_SOFTCAPPING"])``), softcapping and logit scaling.

CPU: the heuristics see the call's own values while the build traces, so each traced (softcap, scale) builds the
binary of its flags; the index names the parameters host code passes (``call_heuristics``; the C path reads them
as call-site values, tests/test_c_launch.py). GPU: losses against torch in fp64 and bit for bit against the file
under Triton's JIT, plain, softcapped (Gemma 2) and scaled (Cohere), with ignored labels."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, torch_dtype


def test_the_heuristics_see_the_values_the_call_passes(realworld_plan) -> None:
    kp = realworld_plan.kernels["cross_entropy"]
    assert kp.call_heuristics == ["DO_SOFTCAPPING", "DO_LOGIT_SCALING"]
    assert kp.spec_json()["call_heuristics"] == ["DO_SOFTCAPPING", "DO_LOGIT_SCALING"]
    traced = set()
    for e in realworld_plan.entries:
        if e.kernel == "cross_entropy":
            for rows in e.tables.values():
                for row in rows:
                    # the traced call's binary comes first (boolean heuristics are then also built flipped)
                    h = dict(realworld_plan.binaries_for(e, row.key, row.preferences[0])[0].heur)
                    traced.add((e.assignment["SOFTCAP"], e.assignment["LOGIT_SCALE"], h["DO_SOFTCAPPING"],
                                h["DO_LOGIT_SCALING"]))
    assert traced == {(0, 0, False, False), (30.0, 0, True, False), (0, 0.0625, False, True)}


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "cross_entropy.py", "_cross_entropy_jit")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize(("cap", "scale"), [(0, 0), (30.0, 0), (0, 0.0625)])
@pytest.mark.parametrize("rows", [1, 8, 333])
def test_cross_entropy_against_torch_and_the_jit(realworld, jit, dtype, cap, scale, rows) -> None:
    import torch

    logits = torch.randn(rows, 32000, device="cuda", dtype=torch_dtype(dtype)) * 4
    labels = torch.randint(0, 32000, (rows,), device="cuda")
    labels[::3] = -100
    if rows == 1:
        labels[0] = 7
    loss = realworld.cross_entropy_loss(logits, labels, cap, scale)
    ref_jit = jit.cross_entropy_loss(logits, labels, cap, scale)
    x = logits.double()
    if scale:
        x = scale * x
    if cap:
        x = cap * torch.tanh(x / cap)
    ref = torch.nn.functional.cross_entropy(x, labels, ignore_index=-100)
    torch.cuda.synchronize()
    assert abs(loss.item() - ref.item()) <= 1e-4 * max(1.0, abs(ref.item()))
    assert torch.equal(loss, ref_jit)


@pytest.mark.gpu
def test_a_softcap_that_was_not_built_is_named(realworld) -> None:
    import torch

    logits = torch.randn(4, 32000, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"SOFTCAP=50.0 was not built"):
        realworld.cross_entropy_loss(logits, torch.zeros(4, dtype=torch.long, device="cuda"), 50.0)
