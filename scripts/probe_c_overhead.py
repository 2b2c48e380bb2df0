"""The C launch path's own host cost, on the CPU machine, against a no-op driver.

    python scripts/probe_c_overhead.py [--calls 200000] [--rounds 7]

The runtime is built as the C launch tests build it (tests/c_launch_support.py: the runtime copied with its
extension compiled, the fake libcuda as its driver). CPU tensors stand in for GPU tensors through C callables
only, so nothing Python-level is timed that a GPU call would not run: ``Tensor.get_device`` is
``Tensor.storage_offset`` (0 for these tensors: device 0) and torch's current raw stream is ``abs`` (stream 0).
What is left is the C path's own work plus the fake's cuLaunchKernel (a few stores and a 48-byte memcpy).
The figures are this machine's, not the H100 host's; they compare variants of the C path with each other.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", help="time this contender alone (for a profiler)")
    ap.add_argument("--symbols", action="store_true", help="keep the extension's symbols (for perf)")
    args = ap.parse_args()

    import pytest
    import torch

    from tests import c_launch_support as cs

    if args.symbols:
        from forge_aot import extension

        extension.FLAGS[:] = [f for f in extension.FLAGS if f not in ("-s", "-fvisibility=hidden", "-g0")]
    tmp = Path(tempfile.mkdtemp(prefix="forge_probe_c_"))
    rt = cs.build_c_runtime(tmp / "rt", "forge_probe_rt")
    lib = cs.build_fake_cuda(tmp)
    mp = pytest.MonkeyPatch()
    mp.setattr(torch.Tensor, "get_device", torch.Tensor.storage_offset)
    mp.setattr(torch._C, "_cuda_getCurrentRawStream", abs, raising=False)
    fake = cs.install_fake_driver(rt, lib, mp)
    spec = cs.kernel_spec(tmp, "add", [["x_ptr", "*T"], ["y_ptr", "*T"], ["out_ptr", "*T"], ["n", "i32"],
                                       ["BLOCK", "meta"]], dtypes={"T": ["fp16"]}, key=["n"], specs=["DDDD"])
    add = rt.Kernel("add", spec, cs.TARGETS, rt.BinaryBackend(str(tmp)))
    fake.block_size, fake.nparams = 48, 6
    x, y, o = (torch.empty(4096, dtype=torch.float16) for _ in range(3))
    n = 4096
    grid = (4,)
    assert rt.fastpath.use_c_launch(add, True)
    add[grid](x, y, o, n)  # registers
    calls = fake.calls
    add[grid](x, y, o, n)
    assert fake.calls == calls + 1 and add._fast.size() == 1, "the C path did not launch"
    fn = add._fast
    contenders = {
        "kernel[grid](x, y, o, n)": lambda: add[grid](x, y, o, n),
        "kernel[(0,)](x, y, o, n)": lambda: add[(0,)](x, y, o, n),
        "kernel[grid] (subscript only)": lambda: add[grid],
        "x.data_ptr()": lambda: x.data_ptr(),
        "x.dtype": lambda: x.dtype,
        "lambda: None": lambda: None,
    }
    del fn
    if args.only:
        contenders = {args.only: contenders[args.only]}
    results: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for name, f in contenders.items():
            t0 = time.perf_counter()
            for _ in range(args.calls):
                f()
            results[name].append((time.perf_counter() - t0) / args.calls * 1e9)
    mp.undo()
    print(f"ns per call on this machine ({args.rounds} rounds x {args.calls} calls, median (min - max))")
    for name, ns in results.items():
        print(f"  {name:34s} {statistics.median(ns):8.1f}  ({min(ns):.1f} - {max(ns):.1f})")


if __name__ == "__main__":
    main()
