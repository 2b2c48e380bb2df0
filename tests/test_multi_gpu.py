"""Several GPUs: tensors on a device other than the current one launch on their own device, with that device's
binaries, context and current stream (run on a machine with two GPUs)."""

from __future__ import annotations

import pytest

from tests.conftest import relative_error


@pytest.mark.gpu
@pytest.mark.parametrize("current", [0, 1])
def test_ops_run_on_the_tensors_device(packaged, current: int) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    other = 1 - current
    torch.cuda.set_device(current)
    dev = torch.device("cuda", other)
    x = torch.randn(300, 1000, device=dev)
    a = torch.randn(512, 300, device=dev, dtype=torch.float16)
    b = torch.randn(300, 200, device=dev, dtype=torch.float16)
    big = torch.randn(1024, 1024, device=dev, dtype=torch.float16)  # Hopper: the persistent TMA kernel
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):  # the other device's current stream is a side stream: launches go there
        s, m, v = packaged.softmax(x), packaged.matmul(a, b), packaged.vector_add(x, x)
        mb = packaged.matmul(big, big)
    side.synchronize()
    assert s.device == m.device == v.device == mb.device == dev and torch.cuda.current_device() == current
    assert relative_error(mb, big.double() @ big.double()) < 2e-3
    assert relative_error(s, torch.softmax(x.double(), -1)) < 1e-5
    assert relative_error(m, a.double() @ b.double()) < 2e-3
    assert torch.equal(v, x + x)
    assert packaged.preload(other) > 0
    with pytest.raises(RuntimeError, match=rf"tensors on cuda:{other} and cuda:{current}"):
        packaged.vector_add(x, torch.randn(300, 1000, device=torch.device("cuda", current)))
    torch.cuda.set_device(0)


@pytest.mark.gpu
def test_library_style_op_on_the_second_device() -> None:
    import torch

    forge_realworld = pytest.importorskip("forge_realworld")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torch.cuda.set_device(0)
    x = torch.randn(64, 4096, device="cuda:1", dtype=torch.float16, requires_grad=True)
    w = torch.randn(4096, device="cuda:1", dtype=torch.float16, requires_grad=True)
    y = forge_realworld.rms_norm(x, w)
    y.backward(torch.ones_like(y))
    ref_x = x.detach().float().requires_grad_(True)
    ref = (ref_x * torch.rsqrt(ref_x.pow(2).mean(-1, keepdim=True) + 1e-6)).half().float() * w.detach().float()
    assert y.device.index == 1 and relative_error(y.detach(), ref.detach().double()) < 2e-3
    assert x.grad is not None and x.grad.device.index == 1 and torch.isfinite(x.grad).all()
