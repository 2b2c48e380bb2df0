"""FlagGems-style row mean (tests/fixtures/realworld/kernels/gems_mean.py): ``@libentry()`` (a launch cache, listed in
``project.launch-wrappers``) outside ``@triton.autotune`` whose configs a helper package's ``runtime`` returns, a
module logger, the launch under ``with torch_device_fn.device(x.device)``.

CPU: the decorator is looked through for the space and left out of the wheel with the imports only kernels use; a
decorator not listed, or listed but inside the Triton ones, is refused with the file and line. GPU: means against
torch in fp64 on traced and untraced shapes, fp16 and fp32, reductions over inner and outer dims."""

from __future__ import annotations

import pytest

from tests.conftest import poison_allocator, torch_dtype


def test_the_launch_wrapper_is_looked_through_and_left_out(realworld_plan) -> None:
    kp = realworld_plan.kernels["gems_mean"]
    assert [c.meta for c in kp.space] == [{"BLOCK_M": 4, "BLOCK_N": 512}, {"BLOCK_M": 8, "BLOCK_N": 256},
                                          {"BLOCK_M": 1, "BLOCK_N": 1024}]
    host = realworld_plan.modules["gems_mean"]["host_source"]
    code = host.split('"""', 2)[2]  # past the docstring
    assert "libentry" not in code and "import runtime" not in code
    assert "from gemslike.runtime import torch_device_fn" in host and "with torch_device_fn.device" in host


@pytest.mark.parametrize("where", ["unlisted", "inside"])
def test_other_decorators_are_refused_where_they_stand(tmp_path, where) -> None:
    from forge_aot.sourcesplit import SourceError, parse_source

    decorators = "@libentry()\n@triton.jit\n" if where == "unlisted" else "@triton.autotune(configs=[], key=[])\n" \
        "@libentry()\n@triton.jit\n"
    (tmp_path / "k.py").write_text("import triton\nfrom lib import libentry\n\n\n" + decorators +
                                   "def k(x):\n    pass\n\n\ndef op(x):\n    k[(1,)](x)\n")
    wrappers = frozenset() if where == "unlisted" else frozenset({"libentry"})
    with pytest.raises(SourceError, match=r"k\.py:line \d+: k has decorators forge-aot cannot package: @libentry\(\).*"
                                          r"project\.launch-wrappers"):
        parse_source(tmp_path / "k.py", {"op"}, wrappers=wrappers)
    if where == "unlisted":  # listed, outside: a kernel like any other
        src = parse_source(tmp_path / "k.py", {"op"}, wrappers=frozenset({"libentry", "other"}))
        assert "k" in src.kernels and "libentry" not in src.host_source


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize(("shape", "dim"), [((1024, 1000), -1), ((4096, 4096), 1), ((8, 33, 512), 1),
                                            ((3, 1000, 7), 1), ((1, 77), 0), ((517, 3001), -1)])
def test_gems_mean_against_torch(realworld, dtype, shape, dim) -> None:
    import torch

    x = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype))
    poison_allocator(x.numel() * x.element_size())
    out = realworld.mean_dim(x, dim)
    keep = realworld.mean_dim(x, dim, keepdim=True)
    torch.cuda.synchronize()
    ref = x.double().mean(dim)
    tol = 2e-3 if dtype == "fp16" else 1e-5
    assert out.shape == ref.shape and out.dtype == x.dtype
    assert torch.allclose(out.double(), ref, atol=tol, rtol=tol)
    assert torch.equal(keep, out.unsqueeze(dim))


def test_device_switches_of_traced_calls_on_a_machine_with_a_gpu(monkeypatch) -> None:
    """The examples run on CPU tensors even where the build machine has a GPU (dev mode, ``build --tune``): FlagGems'
    ``with torch_device_fn.device(x.device)`` then switches nothing, while a real CUDA device still switches."""
    import torch

    from forge_aot.targets import torch_answers_as

    switched = []

    class Recorder:
        def __init__(self, device):
            switched.append(device)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", Recorder)
    monkeypatch.setattr(torch.cuda, "device_of", Recorder)
    cpu = torch.zeros(1)
    with torch_answers_as("sm_90"):
        for device in (cpu.device, cpu.device.index, None, "cpu"):
            with torch.cuda.device(device):
                pass
        with torch.cuda.device_of(cpu):
            pass
        with torch.cuda.device("cuda:1"), torch.cuda.device(torch.device("cuda", 0)), torch.cuda.device(0):
            pass
    assert switched == ["cuda:1", torch.device("cuda", 0), 0]
    assert torch.cuda.device is Recorder  # restored
