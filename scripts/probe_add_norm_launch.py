"""Host time per call of mamba's ``layer_norm_fn`` from the wheel (tests/fixtures/realworld/kernels/add_norm.py) with
the C launch path on and off, beside the same file under Triton's JIT: the LayerNorm call passes None for both
tensors of the type variable R (no residual), which the C path used to leave to the Python path on every call.

Decode-sized inputs (8 x 768), forward only under torch.no_grad (the autograd Function's own cost is the same for
all three), then the forward kernel's launch alone as the host code makes it (where the op's ~100 us of host code
no longer hides the launch path); 7 interleaved rounds of 2,000 calls, medians and spread in microseconds. Run on a
GPU machine with the forge_realworld wheel installed: ``python3 scripts/probe_add_norm_launch.py [--json out.json]``."""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    import forge_realworld as wheel
    import torch

    sys.path.insert(0, str(REPO))
    from tests.conftest import import_fixture_file

    jit = import_fixture_file(REPO / "tests" / "fixtures" / "realworld" / "kernels" / "add_norm.py", "_probe_add_norm")
    host = importlib.import_module("forge_realworld._ops.add_norm")
    fastpath = importlib.import_module("forge_realworld._runtime.fastpath")
    handle = host._add_norm_fwd_kernel
    x = torch.randn(8, 768, device="cuda", dtype=torch.float16)
    w, b = torch.randn(768, device="cuda", dtype=torch.float16), torch.randn(768, device="cuda", dtype=torch.float16)
    res = torch.randn(8, 768, device="cuda", dtype=torch.float32)
    cases = {
        "layer_norm_fn (R all None)": lambda f: f(x, w, b),
        "rms_norm_fn + fp32 residual": lambda f: f(x, w, None, res, prenorm=True, residual_in_fp32=True),
    }
    # The kernel launch alone, as _add_norm_fwd makes it: the LayerNorm with bias passes None for both tensors of
    # R (RESIDUAL, RESIDUAL_OUT); Mamba's first block gives RESIDUAL_OUT (fp32) with RESIDUAL None.
    y, mean, rstd, r_out = (torch.empty_like(x), torch.empty(8, device="cuda"), torch.empty(8, device="cuda"),
                            torch.empty(8, 768, device="cuda"))
    launches = {
        "kernel[grid], R all None": lambda k: k[(8,)](x, y, w, b, None, None, mean, rstd, 768, 768, 0, 0, 768, 1e-6,
                                                      False, 1024, False, False, True),
        "kernel[grid], R from RESIDUAL_OUT": lambda k: k[(8,)](x, y, w, None, None, r_out, None, rstd, 768, 768, 0,
                                                               768, 768, 1e-6, True, 1024, False, True, False),
    }

    def timed(call, fn, c_path):
        if c_path is not None:
            fastpath.use_c_launch(handle, c_path)
        for _ in range(50):
            call(fn)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            call(fn)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / args.calls * 1e6

    results = {}
    with torch.no_grad():
        for case, call in {**cases, **launches}.items():
            op = "layer_norm_fn" if "layer_norm_fn" in case else "rms_norm_fn"
            wheel_fn, jit_fn = ((handle, jit._add_norm_fwd_kernel) if case in launches
                                else (getattr(wheel, op), getattr(jit, op)))
            contenders = {"forge-aot C path": (wheel_fn, True), "forge-aot Python path": (wheel_fn, False),
                          "Triton JIT": (jit_fn, None)}
            samples = {n: [] for n in contenders}
            for r in range(args.rounds):
                names = list(contenders)
                for n in names[r % 3:] + names[:r % 3]:
                    fn, c_path = contenders[n]
                    samples[n].append(timed(call, fn, c_path))
            fastpath.use_c_launch(handle, True)
            results[case] = {n: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
                             for n, v in samples.items()}
            print(case)
            for n, st in results[case].items():
                print(f"  {n:24s} {st['median_us']:8.2f} us  ({st['min_us']:.2f} - {st['max_us']:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
