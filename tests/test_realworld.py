"""Library-style kernels (tests/fixtures/realworld) packaged unchanged: the wheel against torch (forward and
backward), against the same file under Triton's JIT, and against forge-aot's development mode (the JIT with
the wheel's own config). Needs the fixture wheel installed (scripts/gpu_round.sh does it)."""

from __future__ import annotations

import pytest

from tests.conftest import (
    HALF_TOL,
    REALWORLD,
    import_fixture_file,
    launched_specs,
    offset_view,
    poison_allocator,
    relative_error,
    reset_handle,
    torch_dtype,
)

FWD_TOL = HALF_TOL
GRAD_TOL = {"fp16": 1e-2, "bf16": 3e-2}



@pytest.fixture(scope="module")
def wheel(realworld):
    return realworld


@pytest.fixture(scope="module")
def jit():
    """The fixture files imported as they are, running under Triton's JIT (and autotuner), the fixture project's
    root importable as it is for its authors (rms_norm imports the ``ligerlike`` helpers)."""
    return {name: import_fixture_file(REALWORLD / "kernels" / f"{name}.py", f"_rw_jit_{name}")
            for name in ("rms_norm", "layer_norm", "matmul_autotune", "flash_attention")}


@pytest.fixture(scope="module")
def dev():
    from forge_aot.dev import load_dev_ops

    return load_dev_ops(REALWORLD / "kernel_manifest.toml")


def _grads(fn, *inputs, grad):
    import torch

    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out.backward(grad)
    torch.cuda.synchronize()
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "mode", "offset"), [("fp16", "llama", 0.0), ("bf16", "gemma", 1.0)])
@pytest.mark.parametrize("shape", [(3, 1000), (8, 2048), (5, 3000), (16, 5120), (2, 8192), (2, 3, 4096)])
def test_rms_norm_forward_backward(wheel, jit, dtype, mode, offset, shape) -> None:
    import torch

    ref_mod = jit["rms_norm"]
    x = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype))
    w = torch.randn(shape[-1], device="cuda", dtype=torch_dtype(dtype))
    dy = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype))
    poison_allocator(x.numel() * 4)
    reset_handle("forge_realworld._ops.rms_norm", "_rms_norm_forward_kernel")
    y, (dx, dw) = _grads(lambda a, b: wheel.rms_norm(a, b, 1e-6, offset, mode), x, w, grad=dy)
    ry, (rdx, rdw) = _grads(lambda a, b: ref_mod.rms_norm_reference(a, b, 1e-6, offset, mode), x.float(),
                            w.float(), grad=dy.float())
    assert relative_error(y, ry) < FWD_TOL[dtype]
    assert relative_error(dx, rdx) < GRAD_TOL[dtype] and relative_error(dw, rdw) < GRAD_TOL[dtype]
    jy, (jdx, _) = _grads(lambda a, b: ref_mod.rms_norm(a, b, 1e-6, offset, mode), x, w, grad=dy)
    traced = shape[-1] in (1000, 2048, 4096, 5120, 8192)
    (spec,) = launched_specs("forge_realworld._ops.rms_norm", "_rms_norm_forward_kernel")
    # W's and RSTD's strides are 1, specialized as Triton's JIT does; an untraced row length takes the binary
    # that assumes nothing of the integers' divisibility but keeps the unit strides
    assert spec[5] == "1" and spec[7] == "1", spec
    if traced:
        # the exact binary the JIT compiles: the same bits as the file under Triton's JIT
        assert torch.equal(y, jy), spec
    else:
        assert spec == "DxDxD1D1x" and relative_error(y, jy.double()) < 1e-3
    assert relative_error(dx, jdx.double()) < 1e-3


@pytest.mark.gpu
def test_rms_norm_unbuilt_call_site_value_is_named(wheel) -> None:
    import torch

    x = torch.randn(4, 2048, device="cuda", dtype=torch.float16)
    w = torch.randn(2048, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"casting_mode=1 .*not built|combination .*casting_mode=1"):
        wheel.rms_norm(x, w, casting_mode="gemma")  # fp16 with gemma casting: not among the examples
    with pytest.raises(ValueError, match=r"BLOCK_SIZE=16384 was not built; built values"):
        wheel.rms_norm(torch.randn(2, 10000, device="cuda", dtype=torch.float16),
                       torch.randn(10000, device="cuda", dtype=torch.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(3, 1151), (4, 1024), (64, 4096), (7, 8192), (2, 5, 3000)])
def test_layer_norm_forward_backward(wheel, jit, dtype, shape) -> None:
    import torch

    n = shape[-1]
    x = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype))
    w = torch.randn(n, device="cuda", dtype=torch_dtype(dtype))
    b = torch.randn(n, device="cuda", dtype=torch_dtype(dtype))
    dy = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype))
    poison_allocator(x.numel() * 4)
    y, (dx, dw, db) = _grads(lambda a, c, d: wheel.layer_norm(a, (n,), c, d, 1e-5), x, w, b, grad=dy)
    ry, (rdx, rdw, rdb) = _grads(lambda a, c, d: jit["layer_norm"].layer_norm_reference(a, (n,), c, d, 1e-5),
                                 x.float(), w.float(), b.float(), grad=dy.float())
    assert relative_error(y, ry) < FWD_TOL[dtype]
    for got, want in ((dx, rdx), (dw, rdw), (db, rdb)):
        assert relative_error(got, want) < GRAD_TOL[dtype]
    jy, _ = _grads(lambda a, c, d: jit["layer_norm"].layer_norm(a, (n,), c, d, 1e-5), x, w, b, grad=dy)
    if n in (1024, 1151, 4096, 8192):  # traced row lengths: the JIT's own binary, the same bits
        assert torch.equal(y, jy)
    else:
        assert relative_error(y, jy.double()) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mnk", [(512, 512, 512), (1000, 1000, 1000), (777, 333, 129), (16, 4096, 4096),
                                 (1, 300, 64), (2048, 1536, 1024)])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned", "transposed-b"])
def test_autotuned_matmul(wheel, dev, dtype, mnk, layout) -> None:
    import torch

    M, N, K = mnk
    a = torch.randn(M, K, device="cuda", dtype=torch_dtype(dtype))
    b = torch.randn(K, N, device="cuda", dtype=torch_dtype(dtype))
    if layout == "misaligned":
        a, b = offset_view(a), offset_view(b, 3)
    elif layout == "transposed-b":
        b = torch.randn(N, K, device="cuda", dtype=torch_dtype(dtype)).t()
    poison_allocator(M * N * 2)
    reset_handle("forge_realworld._ops.matmul_autotune", "matmul_kernel")
    for act in ("", "leaky_relu"):
        c = wheel.matmul(a, b, act)
        ref = a.double() @ b.double()
        if act:
            ref = torch.nn.functional.leaky_relu(ref, 0.01)
        assert relative_error(c, ref) < FWD_TOL[dtype] * 2
        # the JIT with the wheel's own config and heuristics: the same bits where it is the same binary
        same = dev["matmul"](a, b, act)
        assert torch.equal(c, same) if layout == "contiguous" and not act else relative_error(c, same.double()) < 1e-3
    if layout == "contiguous" and (M, N, K) in ((512, 512, 512), (4096, 4096, 4096)):
        # a traced shape: stride_ak, stride_bn and stride_cn are 1 and compiled as constants, like the JIT
        (spec,) = launched_specs("forge_realworld._ops.matmul_autotune", "matmul_kernel")
        assert spec == "DDDDDDD1D1D1", spec


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 128, 64), (2, 3, 1000, 64), (1, 2, 1024, 64), (1, 4, 4096, 128)])
def test_block_pointer_attention(wheel, dev, dtype, causal, shape) -> None:
    import torch

    q, k, v = (torch.randn(shape, device="cuda", dtype=torch_dtype(dtype)) for _ in range(3))
    poison_allocator(q.numel() * 2)
    o = wheel.attention(q, k, v, causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert relative_error(o, ref) < FWD_TOL[dtype] * 2
    assert torch.equal(o, dev["attention"](q, k, v, causal))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "bshd"])
@pytest.mark.parametrize("shape", [(1, 2, 128, 64), (2, 3, 1000, 64), (1, 2, 1024, 64), (1, 4, 4096, 128),
                                   (2, 2, 77, 64)])
def test_tensor_descriptor_attention(wheel, dev, dtype, causal, layout, shape) -> None:
    """Descriptors built in the kernel (TMA, global scratch) from the wheel: against torch in fp64 and bit for bit
    against development mode (the file's host code under Triton's JIT with the wheel's config; the file as is
    would autotune 36 configs per row); ``bshd`` is the (batch, seq, heads, dim) layout transposed, so the rows
    are strided."""
    import torch

    z, h, n, d = shape
    make = ((lambda: torch.randn((z, h, n, d), device="cuda", dtype=torch_dtype(dtype))) if layout == "contiguous"
            else (lambda: torch.randn((z, n, h, d), device="cuda", dtype=torch_dtype(dtype)).transpose(1, 2)))
    q, k, v = make(), make(), make()
    poison_allocator(q.numel() * 2)
    o = wheel.attention_tma(q, k, v, causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert relative_error(o, ref) < FWD_TOL[dtype] * 2
    assert torch.equal(o, dev["attention_tma"](q, k, v, causal))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("n", [1, 1000, 3000, 4096, 65536])
def test_autotuned_sum_runs_its_config_pre_hook(wheel, dtype, n) -> None:
    import torch

    x = torch.randn(n, device="cuda", dtype={"fp32": torch.float32, "fp16": torch.float16}[dtype])
    poison_allocator(4)  # the op's accumulator starts as NaN unless the Config pre_hook zeroes it
    got = wheel.total(x)
    torch.cuda.synchronize()
    want = x.double().sum()
    scale = max(1.0, float(x.double().abs().sum()))
    assert abs(float(got) - float(want)) <= (1e-4 if dtype == "fp32" else 2e-2) * scale
