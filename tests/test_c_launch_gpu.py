"""The C launch path on a GPU, through the installed wheel: the same results as the pure-Python path, inside
CUDA-graph capture, on a second device, and from a fresh thread (no CUDA context current) — and the C path
really serving the calls (Kernel.run, which every call the C path does not take goes through, is not called)."""

from __future__ import annotations

import contextlib
import importlib

import pytest

from tests.conftest import in_fresh_thread

HANDLES = [("forge_kernels._ops.vector_add", "add_kernel"), ("forge_kernels._ops.softmax", "softmax_kernel"),
           ("forge_kernels._ops.matmul", "matmul_kernel")]


@pytest.fixture
def c_path(packaged):
    fastpath = importlib.import_module("forge_kernels._runtime.fastpath")
    if fastpath.c is None:
        pytest.skip("the installed wheel has no C launch path (built without a C compiler?)")
    handles = [getattr(importlib.import_module(m), f) for m, f in HANDLES]
    yield fastpath, handles
    for h in handles:
        fastpath.use_c_launch(h, True)


@contextlib.contextmanager
def python_runs(handles):
    """Count the calls that reach Kernel.run (the Python path)."""
    count = [0]
    for h in handles:
        def run(grid, args, kwargs, h=h):
            count[0] += 1
            return type(h).run(h, grid, args, kwargs)
        h.run = run
    try:
        yield count
    finally:
        for h in handles:
            del h.run


def python_then_c(fastpath, handles, run):
    """``run()``'s results on the pure-Python path, then on the C path once it has learnt the calls (no call may
    reach Kernel.run): (python's, C's)."""
    import torch

    for h in handles:
        fastpath.use_c_launch(h, False)
    want = run()
    for h in handles:
        assert fastpath.use_c_launch(h, True)
    run()  # the Python path resolves each call once and hands it to the C path
    with python_runs(handles) as count:
        got = run()
    torch.cuda.synchronize()
    assert count[0] == 0, "the C path did not serve every call"
    return want, got


def _ops(packaged, device="cuda"):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(12345, device=device, generator=g)
    h = torch.randn(3000, device=device, generator=g, dtype=torch.float16)
    s = torch.randn(37, 1000, device=device, generator=g)
    a = torch.randn(300, 200, device=device, generator=g, dtype=torch.float16)
    b = torch.randn(200, 120, device=device, generator=g, dtype=torch.float16)
    return lambda: [packaged.vector_add(x, x), packaged.vector_add(h, h), packaged.vector_add(x[1:], x[:-1]),
                    packaged.softmax(s), packaged.softmax(s[:, :999]), packaged.matmul(a, b)]


@pytest.mark.gpu
def test_c_path_gives_the_python_paths_results(packaged, c_path) -> None:
    import torch

    fastpath, handles = c_path
    want, got = python_then_c(fastpath, handles, _ops(packaged))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.gpu
def test_a_launch_returns_its_binarys_compiled_kernel_on_both_paths(packaged, c_path) -> None:
    """Triton's ``kernel[grid](...)`` returns the CompiledKernel it ran, and Unsloth's MoE GEMMs log its ``name``,
    ``n_regs``, ``n_spills`` and ``metadata`` after every launch (the wheel's launch returned None). The Python
    path's launch and the C path's return the same object, one per binary, with the driver's figures."""
    import torch

    fastpath, handles = c_path
    add = handles[0]
    x = torch.randn(3001, device="cuda")
    y, out = torch.randn_like(x), torch.full_like(x, float("nan"))

    def grid(meta):
        return ((x.numel() + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)

    fastpath.use_c_launch(add, False)
    first = add[grid](x, y, out, x.numel())
    assert fastpath.use_c_launch(add, True)
    assert add[grid](x, y, out, x.numel()) is first  # the Python path, handing the call to the C path
    out.fill_(float("nan"))
    with python_runs([add]) as count:
        again = add[grid](x, y, out, x.numel())
    torch.cuda.synchronize()
    assert count[0] == 0 and again is first
    torch.testing.assert_close(out, x + y)
    assert again.name == again.metadata.name == "add_kernel"
    assert again.n_regs > 0 and again.n_spills >= 0 and again.n_max_threads >= 32 * again.metadata.num_warps
    assert again.metadata.num_warps in (1, 2, 4, 8, 16) and again.metadata.target.arch > 0
    assert "add_kernel" in repr(again)


@pytest.mark.gpu
def test_c_path_inside_cuda_graph_capture(packaged, c_path) -> None:
    import torch

    _, handles = c_path
    packaged.preload()
    run = _ops(packaged)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = run()  # warm-up on the side stream; the C path learns the calls
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with python_runs(handles) as count, torch.cuda.graph(graph):
        captured = run()
    assert count[0] == 0, "calls during capture fell back to the Python path"
    graph.replay()
    torch.cuda.synchronize()
    for c, e in zip(captured, eager):
        assert torch.equal(c, e)


@pytest.mark.gpu
def test_c_path_on_the_second_device(packaged, c_path) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    fastpath, handles = c_path
    torch.cuda.set_device(0)
    try:
        run = _ops(packaged, "cuda:1")
        for h in handles:
            fastpath.use_c_launch(h, False)
        want = run()
        for h in handles:
            fastpath.use_c_launch(h, True)
        side = torch.cuda.Stream(device="cuda:1")
        with torch.cuda.stream(side):  # device 1's current stream is a side stream: launches go there
            run()
            with python_runs(handles) as count:
                got = run()
        side.synchronize()
        assert count[0] == 0 and torch.cuda.current_device() == 0
        for g, w in zip(got, want):
            assert g.device.index == 1 and torch.equal(g, w)
    finally:
        torch.cuda.set_device(0)


@pytest.mark.gpu
def test_c_path_from_a_fresh_thread(packaged, c_path) -> None:
    """A new thread has no current CUDA context: the C path launches under the device's primary context."""
    import torch

    _, handles = c_path
    run = _ops(packaged)
    want = run()
    run()
    torch.cuda.synchronize()
    def work():
        with python_runs(handles) as count:
            out = run()
        torch.cuda.synchronize()
        return out, count[0]

    out, runs_in_python = in_fresh_thread(work)
    assert runs_in_python == 0
    for g, w in zip(out, want):
        assert torch.equal(g, w)


@pytest.mark.gpu
def test_descriptor_and_pre_hook_kernels_take_the_c_path() -> None:
    """The Triton tutorials' Hopper kernels as the realworld fixtures ship them: the TMA matmul (``tensordesc<T>``
    parameters, a pre-hook setting the block shapes per config) and the attention forward (host descriptors passed
    to pointer parameters, a pre-hook, runtime arguments by keyword). From session 33 the C path serves their calls
    after the first, encoding the tensor maps itself: bit for bit the pure-Python path's results, in CUDA-graph
    capture too; a misaligned view and other shapes take their own maps."""
    import torch

    realworld = pytest.importorskip("forge_realworld")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("host tensor descriptors with TMA: Hopper")
    fastpath = importlib.import_module("forge_realworld._runtime.fastpath")  # that package's own extension
    handles = [importlib.import_module("forge_realworld._ops.matmul_tma_host").matmul_kernel_tma,
               importlib.import_module("forge_realworld._ops.attention_tutorial")._attn_fwd]
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(r, 512, device="cuda", generator=g, dtype=torch.float16) for r in (777, 264))
    wide = torch.randn(1000, 520, device="cuda", generator=g, dtype=torch.float16)
    q, k, v = (torch.randn(2, 4, 384, 64, device="cuda", generator=g, dtype=torch.float16) for _ in range(3))

    def run():
        return [realworld.matmul_tma(a, b), realworld.matmul_tma(wide[:, 8:], b), realworld.matmul_tma(b, a[:128]),
                realworld.tutorial_attention(q, k, v, False, 0.5, False),
                realworld.tutorial_attention(q, k, v, True, 0.5, False)]

    try:
        want, got = python_then_c(fastpath, handles, run)
        for x, w in zip(got, want):
            assert torch.equal(x, w)
        realworld.preload()
        graph = torch.cuda.CUDAGraph()
        with python_runs(handles) as count, torch.cuda.graph(graph):
            captured = run()
        assert count[0] == 0
        graph.replay()
        torch.cuda.synchronize()
        for x, w in zip(captured, want):
            assert torch.equal(x, w)
    finally:
        for h in handles:
            fastpath.use_c_launch(h, True)
