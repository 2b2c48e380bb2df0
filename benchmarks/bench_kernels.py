"""The installed forge_kernels wheel (built on a CPU machine from the committed tuning database) against Triton's
JIT autotuner over the same space and against torch, at the tuned rows, at the issue's shapes and between rows.

Contenders, timed interleaved (each round times every contender once, in rotating order; --rounds rounds), each
figure a triton.testing.do_bench median (fresh random inputs, as many buffers rotated as make twice the L2, so
small sizes are not timed from cache); reported: the median over rounds, the spread, and the ratios.
  forge-aot     the wheel's op: its table picks the config (tuned for this GPU model)
  jit-autotune  the same kernel under @triton.autotune over the same space (key = the wheel's key), its choice
                made on a first call that is not timed. For add and softmax: the manifest's whole space, filtered
                by the constraints for the shape. For matmul, the kernel the op takes for the shape (on Hopper,
                large problems with TMA-addressable rows take the persistent TMA kernel: its whole space; else the
                tiled kernel, whose 288 configs would take the whole GPU lease to compile serially: the 16 fastest
                configs the tuning database measured at the nearest tuned row, plus the untuned default).
  torch         torch.add / torch.softmax / torch.mm
Goals: tuned rows >= 0.98x jit-autotune; shapes between rows >= 0.9x; matmul >= 0.9x torch at 4096^3, 8192^3.

--mode events (default): each figure a do_bench median (CUDA events around each call, L2 flushed between calls).
--mode graph: one CUDA graph per contender holds one call per rotated input set (the sets together twice the
L2, so each call reads from memory as under events), replayed; a figure is the median over replays of the graph's
time divided by its calls. Device time only: no launch gap, no host overhead, so short kernels (vector_add 1M,
softmax 8192x128: under 10 us) compare without the events' per-call noise.

    python benchmarks/bench_kernels.py --json kernels.json
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# (op, shape, kind): kind "row" = a tuned row, "issue" = a shape of issue 6's table, "between" = between rows
CASES = [
    ("matmul", (1000, 1000, 1000), "row"), ("matmul", (777, 333, 129), "row"), ("matmul", (16, 4096, 4096), "row"),
    ("matmul", (4096, 4096, 4096), "row"), ("matmul", (8192, 8192, 8192), "row"), ("matmul", (1, 4096, 4096), "row"),
    ("matmul", (256, 4096, 4096), "row"), ("matmul", (512, 4096, 4096), "between"),
    ("matmul", (3000, 4096, 4096), "between"), ("matmul", (48, 4096, 4096), "between"),
    ("matmul", (1536, 1536, 1536), "row"), ("matmul", (1024, 1024, 1024), "row"),
    ("matmul", (768, 4096, 4096), "between"), ("matmul", (1200, 1200, 1200), "between"),
    ("matmul", (512, 512, 512), "between"), ("matmul", (768, 768, 768), "between"),
    ("matmul", (520, 536, 552), "between"), ("matmul", (600, 616, 632), "between"),
    ("matmul", (700, 712, 728), "between"),
    ("softmax", (8192, 128), "row"), ("softmax", (32, 50257), "row"), ("softmax", (4096, 4096), "row"),
    ("softmax", (4096, 1024), "row"), ("softmax", (1024, 32768), "row"), ("softmax", (8192, 3000), "between"),
    ("softmax", (2048, 6000), "between"), ("softmax", (8192, 700), "between"),
    ("vector_add", (16777216,), "row"), ("vector_add", (1048576,), "row"), ("vector_add", (300000,), "between"),
    ("vector_add", (4000000,), "between"),
]


def host_us_per_call(fn, calls: int = 5000, rounds: int = 5) -> float:
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def graph_ms(fn, inputs: list[tuple[Any, ...]], replays: int = 20) -> float:
    """Median time per call of ``fn`` over ``inputs``, every set called once per replay of one CUDA graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the capture, as torch's docs ask
        for args in inputs[:2]:
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in inputs:
            fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(inputs))
    del graph
    return statistics.median(times)


def _rate(template: str, ms: float) -> str:
    """``"<work / 1e9> UNIT"`` and a time in ms → the achieved rate (work per second, in tera-units)."""
    value, unit = template.split(" ", 1)
    return f"{float(value) / ms:.{0 if unit.startswith('TFLOP') else 2}f} {unit}"


def _configs(triton, flat: list[dict[str, Any]]) -> list[Any]:
    return [triton.Config({k: v for k, v in c.items() if k not in ("num_warps", "num_stages")},
                          num_warps=c["num_warps"], num_stages=c["num_stages"]) for c in flat]


def matmul_space(db, device: str, key: tuple[int, int, int]) -> list[dict[str, Any]]:
    """The 16 fastest configs the database measured at the nearest tuned row (log distance), plus the default."""
    import math

    rows = {}
    for r in db.select(kind="measurement", kernel="matmul", variant="T=fp16"):
        if r.provenance.gpu == device and r.status == "ok" and r.time and not r.time.get("early_exit"):
            rows.setdefault((r.key["M"], r.key["N"], r.key["K"]), {})[r.config_id] = (r.median_ms, r.config)
    near = min(rows, key=lambda k: sum(abs(math.log2(max(a, 1)) - math.log2(max(b, 1))) for a, b in zip(k, key)))
    best = sorted(rows[near].values(), key=lambda v: v[0])[:16]
    default = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    out = [c for _, c in best]
    return out + ([default] if default not in out else [])


def manifest_space(kernel: str, key: tuple[int, ...]) -> list[dict[str, Any]]:
    """The repository manifest's tuning space of a kernel for one key (fp16), filtered by its constraints: the
    candidates forge-aot tune measured for that row, as flat config dicts."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan, preferences

    plan = make_plan(load_manifest(REPO / "kernel_manifest.toml"), ["sm_90"])
    choices = preferences(plan.kernels[kernel], key, {"T": "fp16"}, None)
    return [{**c.meta, "num_warps": c.num_warps, "num_stages": c.num_stages} for c in choices]


def _config_id(config) -> str:
    """A triton.Config (or a forge-aot Config) as the tuning database names it: meta, w, s."""
    meta = "-".join(f"{k}{v}" for k, v in config.kwargs.items()) if hasattr(config, "kwargs") else \
        "-".join(f"{k}{v}" for k, v in config.meta.items())
    return f"{meta}-w{config.num_warps}-s{config.num_stages}"


def forge_pick(op: str, shape: tuple[int, ...], args: tuple) -> str:
    """The config the wheel's table gives this call (after a call has resolved the kernel's table)."""
    import torch

    module = importlib.import_module(f"forge_kernels._ops.{op}")
    if op == "matmul":  # the wheel's own host code decides, as in the call
        name = "matmul_tma_kernel" if module._takes_tma(*args) else "matmul_kernel"
    else:
        name = {"softmax": "softmax_kernel", "vector_add": "add_kernel"}[op]
    key = tuple(shape) if op == "matmul" else (shape[-1],)
    states = [s for s in getattr(module, name)._states.values()
              if s.assignment.get("T") == "fp16" and s.device == torch.cuda.current_device()]
    return states[0].table.lookup(key).id if states else "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", help="comma-separated ops, or op:shape cases (matmul:4096x4096x4096)")
    ap.add_argument("--mode", choices=["events", "graph"], default="events",
                    help="events: do_bench per call; graph: rotated calls replayed in one CUDA graph")
    args = ap.parse_args()
    import forge_kernels
    import torch
    import triton
    from triton.testing import do_bench

    sys.path.insert(0, str(REPO))
    from forge_aot.tune.database import TuningDatabase
    from kernels import matmul as matmul_file
    from kernels.matmul import matmul_kernel, matmul_tma_kernel
    from kernels.softmax import softmax_kernel
    from kernels.vector_add import add_kernel

    device = torch.cuda.get_device_name()
    db = TuningDatabase(REPO / "tuning")
    def quick(fn, quantiles):
        return do_bench(fn, warmup=5, rep=25, quantiles=quantiles)

    def autotuned(kernel, configs, key):
        return triton.autotune(configs=configs, key=key, do_bench=quick)(kernel)

    dt = torch.float16
    results = []
    only = set(args.only.split(",")) if args.only else None
    print(f"{device}: forge-aot wheel vs Triton JIT autotune (same space) vs torch, fp16, medians of "
          f"{args.rounds} interleaved rounds, timed by {'CUDA-graph replay' if args.mode == 'graph' else 'events'}")
    print(f"{'case':28s} {'kind':8s} {'forge-aot':>11s} {'jit-autotune':>13s} {'torch':>10s} {'vs jit':>7s} "
          f"{'vs torch':>8s} {'rate':>14s}")
    for op, shape, kind in CASES:
        if only and op not in only and f"{op}:{'x'.join(map(str, shape))}" not in only:
            continue
        if op == "matmul":
            m, n, k = shape
            inputs = [(torch.randn(m, k, device="cuda", dtype=dt), torch.randn(k, n, device="cuda", dtype=dt))
                      for _ in range(3)]
            if matmul_file._takes_tma(*inputs[0]):  # the op's own choice: the persistent TMA kernel
                sms = torch.cuda.get_device_properties(0).multi_processor_count
                space = manifest_space("matmul_tma", shape)
                tuned = autotuned(matmul_tma_kernel, _configs(triton, space), ["M", "N", "K"])
                triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda", dtype=torch.int8))

                def jit(a, b, tuned=tuned, sms=sms):
                    c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=a.dtype)
                    M, K = a.shape
                    N = b.shape[1]
                    tuned[lambda meta: (min(sms, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)](
                        a, b, c, M, N, K, sms)
                    return c
            else:
                space = matmul_space(db, device, shape)
                tuned = autotuned(matmul_kernel, _configs(triton, space), ["M", "N", "K"])

                def jit(a, b, tuned=tuned):
                    c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=a.dtype)
                    M, K = a.shape
                    N = b.shape[1]
                    tuned[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)](
                        a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
                    return c

            contenders = {"forge-aot": forge_kernels.matmul, "jit-autotune": jit, "torch": torch.mm}
            rate = f"{2 * m * n * k / 1e9:.6g} TFLOP/s"
        elif op == "softmax":
            rows_, cols = shape
            inputs = [(torch.randn(rows_, cols, device="cuda", dtype=dt) * 4,) for _ in range(3)]
            space = [{"BLOCK_SIZE": b, "num_warps": w, "num_stages": 1}
                     for b, w in itertools.product([4096, 2048, 1024, 512, 256, 128, 8192, 16384], [8, 4, 16, 2, 32])
                     if b < 2 * max(cols, 128)]
            tuned = autotuned(softmax_kernel, _configs(triton, space), ["n_cols"])

            def jit(x, tuned=tuned):
                out = torch.empty_like(x)
                tuned[(x.shape[0],)](out, x, x.shape[1], x.stride(0), out.stride(0))
                return out

            contenders = {"forge-aot": forge_kernels.softmax, "jit-autotune": jit,
                          "torch": lambda x: torch.softmax(x, -1)}
            rate = f"{2 * rows_ * cols * 2 / 1e9:.6g} TB/s"
        else:
            (size,) = shape
            inputs = [(torch.randn(size, device="cuda", dtype=dt), torch.randn(size, device="cuda", dtype=dt))
                      for _ in range(3)]
            space = [{"BLOCK_SIZE": b, "num_warps": w, "num_stages": 1}
                     for b, w in itertools.product([1024, 2048, 4096, 512, 8192], [4, 8, 2, 16])]
            tuned = autotuned(add_kernel, _configs(triton, space), ["n_elements"])

            def jit(x, y, tuned=tuned):
                out = torch.empty_like(x)
                n_el = x.numel()
                tuned[lambda meta: (triton.cdiv(n_el, meta["BLOCK_SIZE"]),)](x, y, out, n_el)
                return out

            contenders = {"forge-aot": forge_kernels.vector_add, "jit-autotune": jit, "torch": torch.add}
            rate = f"{3 * size * 2 / 1e9:.6g} TB/s"
        # As many input sets as make twice the L2 (50 MB on an H100), rotated: small sizes are timed from memory,
        # as the tuner times them, not from a warm cache.
        set_bytes = sum(t.numel() * t.element_size() for t in inputs[0])
        while len(inputs) < min(64, -(-2 * (50 << 20) // set_bytes)):
            inputs.append(tuple(t.clone().normal_() for t in inputs[0]))
        for fn in contenders.values():  # the autotuner chooses here, untimed; everything is compiled and loaded
            fn(*inputs[0])
        torch.cuda.synchronize()
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        names = list(contenders)
        for r in range(args.rounds):
            for name in names[r % 3:] + names[:r % 3]:
                it = itertools.cycle(inputs)
                fn = contenders[name]
                if args.mode == "graph":
                    samples[name].append(graph_ms(fn, inputs))
                else:
                    samples[name].append(do_bench(lambda fn=fn, it=it: fn(*next(it)), warmup=10, rep=50,
                                                  return_mode="median"))
        med = {name: statistics.median(v) for name, v in samples.items()}
        picks = {"forge-aot": forge_pick(op, shape, inputs[0]), "jit-autotune": _config_id(tuned.best_config)}
        row = {"op": op, "shape": list(shape), "kind": kind, "median_ms": med, "configs": picks,
               "spread_ms": {name: [min(v), max(v)] for name, v in samples.items()},
               "vs_jit": med["jit-autotune"] / med["forge-aot"], "vs_torch": med["torch"] / med["forge-aot"],
               "jit_space": len(space), "rate": _rate(rate, med["forge-aot"])}
        results.append(row)
        label = f"{op} {'x'.join(map(str, shape))}"
        print(f"{label:28s} {kind:8s} {med['forge-aot'] * 1e3:9.1f}us {med['jit-autotune'] * 1e3:11.1f}us "
              f"{med['torch'] * 1e3:8.1f}us {row['vs_jit']:7.3f} {row['vs_torch']:8.2f} {row['rate']:>14s}")
        if sorted(picks["forge-aot"].split("-")) != sorted(picks["jit-autotune"].split("-")):
            print(f"{'':28s} configs differ: forge-aot {picks['forge-aot']}, jit-autotune {picks['jit-autotune']}")
    n = 4096
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    o = torch.empty_like(x)
    handle = importlib.import_module("forge_kernels._ops.vector_add").add_kernel  # loaded lazily by the package
    grid = (triton.cdiv(n, 1024),)
    overhead = {
        "forge-aot kernel[grid](...)": host_us_per_call(lambda: handle[grid](x, y, o, n)),
        "forge-aot op (allocates out)": host_us_per_call(lambda: forge_kernels.vector_add(x, y)),
        "triton-jit kernel[grid](...)": host_us_per_call(lambda: add_kernel[grid](x, y, o, n, BLOCK_SIZE=1024)),
        "torch.add(out=)": host_us_per_call(lambda: torch.add(x, y, out=o)),
    }
    print("\nhost time per launch, 4096-element fp32 add (median of 5 x 5000 calls)")
    for k, v in overhead.items():
        print(f"  {k:32s} {v:7.2f} us")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "mode": args.mode, "cases": results,
                                         "host_overhead_us": overhead}, indent=1))


if __name__ == "__main__":
    main()
