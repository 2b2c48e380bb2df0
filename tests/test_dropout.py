"""Triton's tutorial 04, seeded dropout (tests/fixtures/realworld/kernels/dropout.py), packaged unchanged: a
Philox stream from ``tl.rand(seed, offsets)`` with a new integer seed every call, whose specialization (divisible
by 16, equal to 1, neither) changes from call to call, and a Python float ``p``.

CPU: the plan builds each seed specialization the examples traced plus the binary that assumes nothing. GPU: bit
for bit against the file under Triton's JIT for seeds of every specialization, negative seeds and seeds beyond 32
bits (declared i64: the JIT types small seeds i32, the stream is the same); kept elements scaled by 1 / (1 - p)
and their share near 1 - p; the same seed gives the same mask in every dtype and on a recompute."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, poison_allocator, torch_dtype

SEEDS = [0, 1, 16, 123, 2**31 - 1, 2**31 + 5, 2**40 + 3, -7]
SCALE_TOL = {"fp32": 1e-6, "fp16": 1e-3, "bf16": 8e-3}


def test_every_traced_seed_specialization_is_built(realworld_plan) -> None:
    kp = realworld_plan.kernels["dropout"]
    assert kp.spec_json()["spec_params"][-1] == "seed"
    specs = {b.spec for e in realworld_plan.entries if e.kernel == "dropout" and e.target == "sm_90"
             for rows in e.tables.values() for row in rows
             for b in realworld_plan.binaries_for(e, row.key, row.preferences[0])}
    # the examples' seeds 123, 512 and 1: neither, divisible by 16, equal to 1; and the binary assuming nothing
    assert {s[-1] for s in specs} == {"x", "D", "1"} and "xxxx" in specs, specs


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "dropout.py", "_dropout_jit")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("n", [1, 1000, 10_000, 1_000_003])
@pytest.mark.parametrize("seed", SEEDS)
def test_dropout_bit_for_bit_with_the_jit(realworld, jit, dtype, n, seed) -> None:
    import torch

    x = torch.randn(n, device="cuda", dtype=torch_dtype(dtype))
    p = 0.3
    poison_allocator(n * 4)
    out = realworld.seeded_dropout(x, p, seed)
    ref = jit.seeded_dropout(x, p, seed)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    kept = out != 0
    scaled = (x.double() / (1 - p)).to(x.dtype)
    assert torch.allclose(out[kept].double(), scaled[kept].double(), rtol=SCALE_TOL[dtype], atol=0)
    if n >= 10_000:
        share = kept.double().mean().item()
        assert abs(share - (1 - p)) < 5 * ((p * (1 - p) / n) ** 0.5), share


@pytest.mark.gpu
def test_the_same_seed_gives_the_same_mask_in_every_dtype_and_on_a_recompute(realworld) -> None:
    import torch

    x = torch.randn(100_003, device="cuda")
    masks = [realworld.seeded_dropout(x.to(torch_dtype(d)), 0.5, 2024) != 0 for d in ("fp32", "fp16", "bf16")]
    assert all(torch.equal(masks[0], m) for m in masks[1:])
    assert torch.equal(realworld.seeded_dropout(x, 0.5, 2024), realworld.seeded_dropout(x, 0.5, 2024))
    assert not torch.equal(masks[0], realworld.seeded_dropout(x, 0.5, 2025) != 0)


@pytest.mark.gpu
def test_unaligned_input_and_a_seed_beyond_64_bits(realworld, jit) -> None:
    import torch

    from tests.conftest import offset_view

    x = offset_view(torch.randn(4097, device="cuda"), 1)
    assert torch.equal(realworld.seeded_dropout(x, 0.25, 77), jit.seeded_dropout(x, 0.25, 77))
    with pytest.raises(OverflowError, match=r"seed=18446744073709551616 does not fit i64"):
        realworld.seeded_dropout(torch.randn(16, device="cuda"), 0.5, 2**64)
