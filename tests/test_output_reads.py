"""Host code reading what a recorded launch wrote (native-sparse-attention's topk backward, found by session 49's
hunt): the build records launches without running them, so such values are the buffer's old contents and a block
size derived from them was built for 0; ``check`` says where (``forge_aot.output_reads``)."""

from __future__ import annotations

from pathlib import Path

from forge_aot.manifest import load_manifest
from forge_aot.plan import make_plan
from tests.test_localmods import one_file_project

COUNT_THEN_COPY = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def count_kernel(x_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(c_ptr, tl.sum((x > 0).to(tl.int32), axis=0))


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def positive_prefix(x, cu_seqlens):
    n = x.numel()
    longest = (cu_seqlens[1:] - cu_seqlens[:-1]).max().item()  # an input's values: known on the CPU too
    count = torch.zeros(2, dtype=torch.int32, device=x.device)
    count_kernel[(1,)](x, count, n, BLOCK=triton.next_power_of_2(n))
    m = count[0:1].max().item()  # written by count_kernel
    BLOCK_N = triton.next_power_of_2(m)
    y = torch.empty(m + longest - longest, dtype=x.dtype, device=x.device)
    copy_kernel[(triton.cdiv(m, BLOCK_N),)](x, y, m, BLOCK_N=BLOCK_N)
    return y


class Positives(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 1

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        count = torch.zeros(1, dtype=torch.int32, device=x.device)
        count_kernel[(1,)](x, count, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
        if bool(count[0] > 0):  # read in a backward, which the autograd engine runs
            return g
        return g * 0


def trainable(x):
    return Positives.apply(x)


def examples(device="cpu"):
    cu = torch.tensor([0, 300, 1000], dtype=torch.int32, device=device)
    for _ in range(3):  # (freed temporaries' addresses come back: they must not count as written)
        positive_prefix(torch.ones(1000, device=device), cu)
    trainable(torch.ones(100, device=device, requires_grad=True)).sum().backward()
'''


def test_reading_a_recorded_launchs_output_is_a_warning_naming_the_line(tmp_path: Path) -> None:
    """Where host code reads values a recorded launch wrote (``.item()`` of a reduction over a view of the buffer;
    ``bool()`` in an autograd Function's backward), ``check`` warns at that line, naming the kernel: the build saw 0
    there and planned ``BLOCK_N=1`` only, which every GPU call would refuse. Reading an input's values (the
    sequence lengths) is no such read, nor is a later allocation at an address a freed one had."""
    manifest = one_file_project(tmp_path / "p", "forge_reads", COUNT_THEN_COPY, "count_kernel",
                                ["positive_prefix", "trainable"],
                                extra='\n[kernels.copy]\nsource = "k.py:copy_kernel"\nexamples = "examples"\n',
                                entry="count")
    plan = make_plan(load_manifest(manifest))
    reads = [w for w in plan.warnings if "host code reads values" in w]
    assert [w.split(" that ")[0] for w in reads] == ["k.py:24: host code reads values (.item())",
                                                     "k.py:42: host code reads values (.__bool__())"], plan.warnings
    assert all("count_kernel writes; the build records launches without running them" in w for w in reads)
    assert "kernels.NAME.constexprs" in reads[0]
    # what the warning is about: the plan built what the CPU's zeros gave
    assert {e.assignment["BLOCK_N"] for e in plan.entries if e.kernel == "copy"} == {1}


def test_values_the_examples_compute_on_the_host_are_no_such_reads(tmp_path: Path) -> None:
    """Host code that reads only its inputs' values (and a buffer no launch wrote) gets no warning."""
    source = COUNT_THEN_COPY.replace("    m = count[0:1].max().item()  # written by count_kernel\n",
                                     "    m = int(torch.full((1,), 7)[0])\n")
    manifest = one_file_project(tmp_path / "p", "forge_reads2", source, "count_kernel", ["positive_prefix"],
                                extra='\n[kernels.copy]\nsource = "k.py:copy_kernel"\nexamples = "examples"\n',
                                entry="count")
    plan = make_plan(load_manifest(manifest.parent.joinpath("kernel_manifest.toml")))
    assert [w for w in plan.warnings if "host code reads values" in w and "k.py:24" in w] == []
