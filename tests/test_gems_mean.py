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
    """The examples run on CPU tensors even where the build machine has a GPU (dev mode, ``build --tune``), and the
    tensors answer as ``cuda:0`` (``tensors_on_gpu``): FlagGems' ``with torch_device_fn.device(x.device)`` switches
    nothing, on a machine with a GPU too, and the stand-in is a class, as torch's own ``__init__`` asks
    ``isinstance(device, torch.cuda.device)`` (a function there had failed the dev-mode plan on the H100)."""
    import torch

    from forge_aot.ongpu import tensors_on_gpu
    from forge_aot.targets import torch_answers_as

    real = torch.cuda.device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cpu = torch.zeros(1)
    with torch_answers_as("sm_90"), tensors_on_gpu("cpu"):
        assert cpu.device == torch.device("cuda", 0)
        # its idx is the index asked for, as torch's (Unsloth keys its streams by torch.cuda.device(i).idx)
        for device, idx in ((cpu.device, 0), (cpu.device.index, 0), (None, -1), ("cpu", -1), ("cuda:1", 1),
                            (torch.device("cuda", 0), 0), (0, 0), ("cuda", 0)):
            with torch.cuda.device(device) as switched:
                assert isinstance(switched, torch.cuda.device) and switched.idx == idx, (device, switched.idx)
        with torch.cuda.device_of(cpu):
            pass
    assert torch.cuda.device is real  # restored


def test_flaggems_philox_seed_and_offset_trace_without_a_gpu() -> None:
    """FlagGems' random ops take the Philox seed and offset from ``torch.cuda.default_generators[device]`` (its
    state viewed as two int64) and advance the offset: while the build traces on a machine without a GPU that is a
    stand-in generator with CUDA's default seed (torch without CUDA has none: the examples had failed)."""
    import torch

    from forge_aot.targets import torch_answers_as

    def philox_backend_seed_offset(increment):  # as flag_gems/utils/random_utils.py writes it
        gen = torch.cuda.default_generators[torch.cuda.current_device()]
        state_copy = gen.get_state()
        c0, c1 = state_copy.view(torch.int64)
        seed, offset = int(c0), int(c1)
        c1 += (increment + 3) // 4 * 4
        gen.set_state(state_copy)
        return seed, offset

    real = torch.cuda.default_generators
    if torch.cuda.is_available():
        pytest.skip("the machine's own generators serve the trace")
    with torch_answers_as("sm_90"):
        assert philox_backend_seed_offset(10) == (67280421310721, 0)
        assert philox_backend_seed_offset(10) == (67280421310721, 12)
        assert torch.cuda.default_generators[0].manual_seed(5).initial_seed() == 5
    assert torch.cuda.default_generators is real
