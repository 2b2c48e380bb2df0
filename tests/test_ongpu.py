"""The build's trace answers as on the GPU for its tensors (forge_aot/ongpu.py): what host code asks of a tensor
and of torch while the build runs it, and that nothing of it outlives the block (CPU only: the tensors are meta or
CPU ones)."""

from __future__ import annotations

import threading

import pytest


def _apply_entries():
    import torch

    cls = torch.autograd.function.BackwardCFunction
    return {name: cls.__dict__.get(name) for name in ("apply", "apply_boxed")}


def test_a_tensor_answers_as_a_cuda_tensor_and_torch_keeps_it_where_the_trace_does() -> None:
    import torch

    from forge_aot.ongpu import tensors_on_gpu

    x = torch.randn(4)
    m = torch.empty(4, device="meta")
    with tensors_on_gpu("cpu"):
        assert x.device == torch.device("cuda", 0) and x.is_cuda and not x.is_cpu and x.get_device() == 0
        made = [x.to(0), x.to("cuda", torch.float16), x.to(x.device), x.cuda(), torch.empty(2, device=x.device),
                torch.zeros(2, device=0), x.new_empty(3, device="cuda"), torch.tensor([1.0], device="cuda:0"),
                torch.empty(2, pin_memory=True), x.pin_memory()]
        assert all(y.is_cuda for y in made)
        # what host code makes a CPU tensor on purpose answers as one (vLLM checks its *_cpu metadata), as a view:
        # the tensor it came from is still a GPU one
        for c in (x.cpu(), x.to("cpu"), x.to(torch.device("cpu"), torch.float64)):
            assert c.device.type == "cpu" and c.is_cpu and not c.is_cuda and c.get_device() == -1
        assert x.is_cuda
        assert m.device.type == "meta" and not m.is_cuda  # another device than the trace's answers as itself
    with tensors_on_gpu("meta"):
        assert m.is_cuda and not x.is_cuda and torch.empty(2, device=m.device).is_meta and x.cuda().is_meta
    assert x.device.type == "cpu" and not x.is_cuda and x.get_device() == -1
    assert all(y.device.type == "cpu" for y in made)  # where the trace keeps its tensors


def _function(boxed: bool):
    import torch

    class Fn(torch.autograd.Function):
        boxed_grads_call = boxed

        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            grad = g[0] if boxed else g
            Fn.seen.append((grad.is_cuda, len(torch.overrides._get_current_function_mode_stack())))
            return grad * 2

    Fn.seen = []
    return Fn


@pytest.mark.parametrize("boxed", [False, True])
def test_backwards_run_under_one_mode_and_the_entries_come_back(boxed) -> None:
    """The autograd engine runs a Function's backward without the caller's modes: its entries (``apply``, and
    ``apply_boxed`` for ``boxed_grads_call``) enter the innermost block's mode, once however deep the nesting."""
    import torch

    from forge_aot.ongpu import tensors_on_gpu

    if boxed and _apply_entries()["apply_boxed"] is None:
        pytest.skip("this torch has no boxed backward entry")
    before = _apply_entries()
    fn = _function(boxed)
    x = torch.randn(3, requires_grad=True)
    with tensors_on_gpu("cpu"), tensors_on_gpu("cpu"):
        fn.apply(x).sum().backward()
    fn.apply(x).sum().backward()
    assert fn.seen == [(True, 1), (False, 0)]
    assert _apply_entries() == before


def test_the_block_is_undone_after_an_error_and_across_threads() -> None:
    import torch

    from forge_aot.ongpu import tensors_on_gpu

    before = _apply_entries()
    with pytest.raises(RuntimeError, match="host code failed"), tensors_on_gpu("cpu"):
        raise RuntimeError("host code failed")
    assert _apply_entries() == before and not torch.randn(1).is_cuda
    # two threads whose blocks overlap (A enters, B enters, A leaves, B leaves): one install, one removal
    entered, a_left = threading.Event(), threading.Event()
    answers = {}

    def a():
        with tensors_on_gpu("cpu"):
            entered.set()
            answers["a"] = torch.randn(1).is_cuda
        a_left.set()

    def b():
        entered.wait()
        with tensors_on_gpu("cpu"):
            a_left.wait()
            answers["b"] = torch.randn(1).is_cuda
            answers["b-backward"] = _apply_entries() != before  # still installed for B
    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == {"a": True, "b": True, "b-backward": True}
    assert _apply_entries() == before and not torch.randn(1).is_cuda  # modes are per thread: none here


def test_cuda_autocast_in_traced_host_code_casts_as_on_the_gpu() -> None:
    """attorch's linear backward multiplies an fp16 gradient by fp32 weights under ``torch.autocast('cuda',
    dtype=fp16)``: on the CPU tensors of the trace CUDA's autocast cast nothing and the matmul raised "expected m1
    and m2 to have the same dtype". Inside the block it is the CPU's autocast; outside, CUDA's as before."""
    import warnings

    import torch

    from forge_aot.ongpu import tensors_on_gpu

    y, w = torch.randn(4, 3, dtype=torch.float16), torch.randn(5, 3)
    with tensors_on_gpu("cpu"), torch.autocast("cuda", dtype=torch.float16):
        assert (y @ w.T).dtype == torch.float16
    with tensors_on_gpu("cpu"), torch.amp.autocast("cuda", dtype=torch.bfloat16):
        assert (y.float() @ w.T).dtype == torch.bfloat16
    if not torch.cuda.is_available():
        with warnings.catch_warnings(), torch.autocast("cuda", dtype=torch.float16):  # (torch warns: no CUDA)
            warnings.simplefilter("ignore")
            assert not torch.is_autocast_enabled("cuda")


def test_a_torch_op_the_cpu_lacks_for_a_dtype_runs_in_a_wider_one() -> None:
    """``torch.histc`` of int64 tensors exists on the GPU, not on the CPU (native-sparse-attention's
    ``transform_score``): the trace's call runs in float64 and gives int64, as the GPU's; a 0-dim tensor given as an
    integer argument (``bins=idx.max() + 1``) stays as it is; an op the CPU lacks for every dtype raises as
    before."""
    import torch

    from forge_aot.ongpu import tensors_on_gpu

    idx = torch.tensor([0, 1, 1, 3, 3, 3])
    with pytest.raises(NotImplementedError):
        torch.histc(idx, bins=4, min=0, max=3)
    with tensors_on_gpu("cpu"):
        counts = torch.histc(idx, bins=idx.max() + 1, min=0, max=idx.max())
        assert counts.dtype == torch.int64 and counts.tolist() == [1, 2, 0, 3]
        with pytest.raises(NotImplementedError):
            torch.histc(torch.tensor([1 + 1j]), bins=2)
