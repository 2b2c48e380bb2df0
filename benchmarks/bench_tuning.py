"""Tuning cost and quality on one GPU, side by side in one run.

Part ``autotune``: the repository's matmul kernel (kernels/matmul.py), the same 46-config space and the same
five fp16 shapes, tuned by
  - serial ``triton.autotune`` in a fresh process with an empty ``TRITON_CACHE_DIR`` (compile + benchmark), then
    again with that cache warm (benchmark only: the difference is its compile time);
  - ``forge-aot tune`` (exhaustive search; ``--no-report``) on a temporary project from an empty build
    directory, then again with ``--force`` and its binaries kept (benchmark only), then that warm run twice more
    with a ``forge-aot server`` running (the command and its workers forked from a process that imported torch
    and Triton once; the server's own start is reported apart);
  - and, as the judge, this script timing every config at every shape itself (``triton.testing.do_bench``
    medians, rounds interleaved in rotating order), then its near-ties and every tool's pick again (Triton's
    ``do_bench_cudagraph``, more rounds; once on one set of operands, warm in L2, and once over rotated copies,
    cold, the regime the tuner measures short kernels in): the exhaustive best, and each tool's winner against
    it.

Part ``guided``: the repository's 260-config matmul space at three shapes, ``forge-aot tune --strategy
exhaustive`` against ``--strategy guided`` (same binaries): how many configs each benchmarked, and the guided
winner against the exhaustive best (both re-timed here, interleaved).

    python benchmarks/bench_tuning.py --json tuning.json            # both parts, about 6 minutes on an H100
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHAPES = [(4096, 4096, 4096), (2048, 2048, 2048), (1024, 4096, 4096), (16, 4096, 4096), (1000, 1000, 1000)]
GUIDED_SHAPES = [(4096, 4096, 4096), (16, 4096, 4096), (1000, 1000, 1000)]
SIGNATURE = ('{ a_ptr = "*T", b_ptr = "*T", c_ptr = "*T", M = "i32", N = "i32", K = "i32", stride_am = "i32", '
             'stride_bk = "i32", stride_cm = "i32" }')


def small_space() -> list[dict[str, int]]:
    out = []
    for bm, bn, bk, w, s in itertools.product([128, 64], [256, 128, 64], [64, 32], [8, 4], [3, 4]):
        if (bm * bk + bk * bn) * 2 * s <= 160 * 1024:
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": w, "num_stages": s})
    return out


def space_260() -> list[dict[str, int]]:
    out = []
    for bm, bn, bk, w, s in itertools.product([128, 64, 32, 16], [256, 128, 64, 32], [64, 32, 128], [8, 4],
                                              [3, 4, 2]):
        if (bm * bk + bk * bn) * 2 * s <= 160 * 1024:
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": w, "num_stages": s})
    return out


def cid(c: dict[str, Any]) -> str:
    return (f"BLOCK_M{c['BLOCK_M']}-BLOCK_N{c['BLOCK_N']}-BLOCK_K{c['BLOCK_K']}-GROUP_M{c['GROUP_M']}-"
            f"w{c['num_warps']}-s{c['num_stages']}")


def project(root: Path, configs: list[dict[str, int]], shapes: list[tuple[int, int, int]], search: str) -> Path:
    root.mkdir(parents=True)
    shutil.copytree(REPO / "kernels", root / "kernels")
    (root / "tuning").mkdir()
    rows = ", ".join(f"{{ M = {m}, N = {n}, K = {k} }}" for m, n, k in shapes)
    configs_toml = ",\n    ".join("{ " + ", ".join(f"{k} = {v}" for k, v in c.items()) + " }" for c in configs)
    (root / "kernel_manifest.toml").write_text(f"""[project]
name = "bench_tuning"
version = "0.1.0"
targets = ["sm_90"]
tuning-data = "tuning"

[kernels.matmul]
source = "kernels/matmul.py:matmul_kernel"
ops = ["matmul"]
signature = {SIGNATURE}
dtypes = {{ T = ["fp16"] }}
key = ["M", "N", "K"]
shapes = [{rows}]

[kernels.matmul.tune]
configs = [
    {configs_toml}
]
inputs = "tune_inputs"
reference = "reference"
# the tiled kernel itself: on Hopper the matmul op takes matmul_tma for large problems
op = "_matmul_tiled"
flops = "2 * M * N * K"
search = "{search}"

# The matmul op's host code launches this kernel too (Hopper, large problems), so the project lists it with one
# config; it is not tuned here (forge_tune passes --kernel matmul).
[kernels.matmul_tma]
source = "kernels/matmul.py:matmul_tma_kernel"
ops = ["matmul"]
signature = {{ a_ptr = "*T", b_ptr = "*T", c_ptr = "*T", M = "i32", N = "i32", K = "i32", num_sms = "i32" }}
dtypes = {{ T = ["fp16"] }}
key = ["M", "N", "K"]
shapes = [{{ M = 4096, N = 4096, K = 4096 }}]

[kernels.matmul_tma.tune]
configs = [{{ BLOCK_M = 128, BLOCK_N = 256, BLOCK_K = 64, GROUP_M = 8, num_warps = 8, num_stages = 3 }}]
""")
    return root


def forge_tune(proj: Path, build: Path, *extra: str, socket: str | None = None) -> dict[str, Any]:
    # Without a server unless given one (a user's running server must not speed up the plain rows).
    env = dict(os.environ, PYTHONPATH=str(REPO), FORGE_AOT_SERVER="0")
    if socket is not None:
        env.pop("FORGE_AOT_SERVER")
        env["FORGE_AOT_SERVER_SOCKET"] = socket
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "forge_aot.cli", "tune", "-q", "--no-report", "--kernel", "matmul",
                           "--build-dir", str(build), *extra], cwd=proj, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"forge-aot tune failed:\n{done.stdout}\n{done.stderr}")
    run = json.loads((build / "tune" / "run.json").read_text())
    winners = {}
    for line in (proj / "tuning" / "matmul.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "winner":
            winners[(r["key"]["M"], r["key"]["N"], r["key"]["K"])] = r  # the latest
    return {"wall": wall, "run_wall": run["wall"], "compile_cpu_s": run["compile_seconds"],
            "compile_wall": run["compile_wall"], "benchmark_wall": run["benchmark_wall"], "binaries": run["binaries"],
            "boot_wall": run.get("boot_wall"), "first_row_at": run.get("first_row_at"),
            "gpu_idle_seconds": run.get("gpu_idle_seconds"), "benchmark_seconds": run.get("benchmark_seconds"),
            "close_seconds": run.get("close_seconds"), "compile_started_at": run.get("compile_started_at"),
            "boot_stages": run.get("boot_stages", {}),
            "process_to_tune_s": wall - run["wall"] - run.get("report_seconds", 0),
            "row_timeline": [(i["row"], i.get("ready_at"), i.get("started_at"), i.get("seconds"))
                             for i in run["items"]],
            "row_phases": {i["row"]: i.get("phases", {}) for i in run["items"]},
            "records": (proj / "tuning" / "matmul.jsonl").read_text().splitlines(),
            "winners": {f"{m}x{n}x{k}": w["config_id"] for (m, n, k), w in winners.items()},
            "benchmarked": {f"{m}x{n}x{k}": w["search"]["benchmarked"] for (m, n, k), w in winners.items()}}


def forge_tune_served(proj: Path, build: Path, *extra: str, runs: int = 2) -> tuple[list[dict[str, Any]], float]:
    """The warm run again, ``runs`` times, with a `forge-aot server` running (on a private socket): the command and
    its workers forked from a process that imported torch and Triton once. Returns the runs and the server's own
    start (once per machine and session, like Triton's cache warm-up: reported apart, not added)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from forge_aot import server

    directory = Path(tempfile.mkdtemp(prefix="fsb-", dir="/tmp"))  # mode 700
    path = str(directory / "s.sock")
    start = time.perf_counter()
    proc = server.start(600, path=path, env=dict(os.environ, PYTHONPATH=str(REPO)))["process"]
    started = time.perf_counter() - start
    try:
        done = [forge_tune(proj, build, "--force", *extra, socket=path) for _ in range(runs)]
        forked = server.server_info(path)["forked"]
        for d in done:
            d["forked_in_all"] = forked
    finally:
        server.stop(path)
        proc.wait(60)
        shutil.rmtree(directory, ignore_errors=True)
    return done, started


def grid_of(m: int, n: int) -> Any:
    import triton

    return lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)


def launcher(kernel: Any, args: tuple[Any, ...], meta: dict[str, int], grid: tuple[int, ...]) -> Any:
    return lambda: kernel[grid](*args, **meta)


def triton_child(args: argparse.Namespace) -> None:
    """In a fresh process: serial triton.autotune of the kernel over the space, each shape's first call timed."""
    import torch
    import triton

    sys.path.insert(0, str(Path(args.project) / "kernels"))
    import matmul as mm

    configs = [triton.Config({k: v for k, v in c.items() if k not in ("num_warps", "num_stages")},
                             num_warps=c["num_warps"], num_stages=c["num_stages"]) for c in small_space()]
    tuned = triton.autotune(configs=configs, key=["M", "N", "K"])(mm.matmul_kernel)
    out = {"shapes": {}}
    total = 0.0
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        torch.cuda.synchronize()
        start = time.perf_counter()
        tuned[grid_of(m, n)](a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0))
        torch.cuda.synchronize()
        spent = time.perf_counter() - start
        total += spent
        best = tuned.best_config
        out["shapes"][f"{m}x{n}x{k}"] = {"seconds": spent, "bench_time": tuned.bench_time,
                                         "winner": cid({**best.kwargs, "num_warps": best.num_warps,
                                                        "num_stages": best.num_stages})}
    out["total"] = total
    print(json.dumps(out))


def triton_autotune(proj: Path, cache: Path) -> dict[str, Any]:
    """The child's first calls ("total": what triton.autotune costs inside a running process) and its process
    wall clock ("process_wall": Python, torch, Triton and CUDA start-up included, as in forge-aot tune's wall)."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--triton-child", "--project", str(proj)], env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"triton.autotune child failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_wall": wall}


def judge(proj: Path, configs: list[dict[str, int]], shapes: list[tuple[int, int, int]], rounds: int,
          graph: str = "") -> dict:
    """This script's own timing of configs at shapes: medians over rounds interleaved in rotating order, each
    round Triton's own ``do_bench`` (events, L2 cleared before each launch) or its ``do_bench_cudagraph``
    (replays of a captured graph: no launch gaps, the steadier for kernels of a few microseconds), with
    ``graph="warm"`` on one set of operands (they stay in L2 between replays: a 32 MB weight fits the H100's
    50 MB), with ``graph="cold"`` over copies of the operands rotated through one graph, more bytes than twice
    the L2 (each launch reads its operands from memory, as a decode step's weights are; the tuner's own way of
    timing short kernels)."""
    import torch
    from triton.testing import do_bench, do_bench_cudagraph

    sys.path.insert(0, str(proj / "kernels"))
    import matmul as mm

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out: dict[str, dict[str, float]] = {}
    for m, n, k in shapes:
        copies = -(-2 * l2 // ((m * k + k * n + m * n) * 2)) if graph == "cold" else 1
        operands = [(torch.randn(m, k, device="cuda", dtype=torch.float16),
                     torch.randn(k, n, device="cuda", dtype=torch.float16),
                     torch.empty(m, n, device="cuda", dtype=torch.float16)) for _ in range(copies)]
        samples: dict[str, list[float]] = {cid(cfg): [] for cfg in configs}
        for r in range(rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for cfg in order:
                calls = [launcher(mm.matmul_kernel, (a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0)), cfg,
                                  grid_of(m, n)(cfg)) for a, b, c in operands]
                if graph:
                    t = do_bench_cudagraph(lambda cs=calls: [c() for c in cs], rep=20, return_mode="median")
                    samples[cid(cfg)].append(t / copies)
                else:
                    samples[cid(cfg)].append(do_bench(calls[0], warmup=5, rep=20, return_mode="median"))
        out[f"{m}x{n}x{k}"] = {name: statistics.median(v) for name, v in samples.items()}
    return out


FINALIST_MARGIN = 0.08
FINAL_ROUNDS = 9


def part_autotune(work: Path, jobs: int | None) -> dict[str, Any]:
    proj = project(work / "p48", small_space(), SHAPES, "exhaustive")
    cache = work / "triton-cache"
    t_cold = triton_autotune(proj, cache)
    t_warm = triton_autotune(proj, cache)
    build = work / "forge-build"
    jobs_args = ("-j", str(jobs)) if jobs else ()
    f_cold = forge_tune(proj, build, *jobs_args)
    f_warm = forge_tune(proj, build, "--force", *jobs_args)
    f_served, server_start_s = forge_tune_served(proj, build, *jobs_args)
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    judged = judge(proj, small_space(), SHAPES, rounds=3)
    by_id = {cid(c): c for c in small_space()}
    rows, refined, refined_cold = [], {}, {}
    for m, n, k in SHAPES:
        name = f"{m}x{n}x{k}"
        times = judged[name]
        best = min(times.values())
        tw, fw, fww = t_cold["shapes"][name]["winner"], f_cold["winners"][name], f_warm["winners"][name]
        # The sweep's near-ties (within FINALIST_MARGIN of its best) and every tool's pick, timed again: more
        # rounds, graph replay. The exhaustive best is the best of these.
        finalists = sorted({c for c, t in times.items() if t <= best * (1 + FINALIST_MARGIN)} | {tw, fw, fww})
        again = refined[name] = judge(proj, [by_id[c] for c in finalists], [(m, n, k)], rounds=FINAL_ROUNDS,
                                      graph="warm")[name]
        cold = refined_cold[name] = judge(proj, [by_id[c] for c in finalists], [(m, n, k)], rounds=FINAL_ROUNDS,
                                          graph="cold")[name]
        final_best, cold_best = min(again.values()), min(cold.values())
        rows.append({"shape": name, "exhaustive_best_ms": best, "exhaustive_best": min(times, key=times.get),
                     "triton_winner": tw, "triton_vs_best": best / times[tw],
                     "forge_winner": fw, "forge_vs_best": best / times[fw],
                     "forge_warm_winner": fww, "forge_warm_vs_best": best / times[fww],
                     "finalists": finalists, "final_best_ms": final_best, "final_best": min(again, key=again.get),
                     "triton_vs_final_best": final_best / again[tw], "forge_vs_final_best": final_best / again[fw],
                     "forge_warm_vs_final_best": final_best / again[fww],
                     "cold_best_ms": cold_best, "cold_best": min(cold, key=cold.get),
                     "triton_vs_cold_best": cold_best / cold[tw], "forge_vs_cold_best": cold_best / cold[fw],
                     "forge_warm_vs_cold_best": cold_best / cold[fww]})
    return {"configs": len(small_space()), "shapes": [f"{m}x{n}x{k}" for m, n, k in SHAPES], "judged_ms": judged,
            "finals_ms": refined, "finals_cold_l2_ms": refined_cold,
            "triton_cold_s": t_cold["total"], "triton_warm_s": t_warm["total"],
            "triton_compile_s": t_cold["total"] - t_warm["total"],
            "forge_cold_s": f_cold["wall"], "forge_warm_s": f_warm["wall"], "forge_cold": f_cold, "forge_warm": f_warm,
            "speedup_cold": t_cold["total"] / f_cold["wall"], "speedup_warm": t_warm["total"] / f_warm["wall"],
            "triton_cold_process_s": t_cold["process_wall"], "triton_warm_process_s": t_warm["process_wall"],
            "speedup_cold_process": t_cold["process_wall"] / f_cold["wall"],
            "speedup_warm_process": t_warm["process_wall"] / f_warm["wall"],
            "server_start_s": server_start_s, "forge_served": f_served,
            "forge_served_s": [f["wall"] for f in f_served],
            "speedup_served": [t_warm["total"] / f["wall"] for f in f_served],
            "speedup_served_process": [t_warm["process_wall"] / f["wall"] for f in f_served],
            "rows": rows}


def part_served(work: Path, jobs: int | None, runs: int = 2) -> dict[str, Any]:
    """forge-aot tune's start-up alone: the autotune part's project tuned cold, then warm (``--force``, binaries
    kept) ``runs`` times without a server and ``runs`` times with one, interleaved by block."""
    proj = project(work / "p48", small_space(), SHAPES, "exhaustive")
    build = work / "forge-build"
    jobs_args = ("-j", str(jobs)) if jobs else ()
    cold = forge_tune(proj, build, *jobs_args)
    warm = [forge_tune(proj, build, "--force", *jobs_args) for _ in range(runs)]
    served, server_start_s = forge_tune_served(proj, build, *jobs_args, runs=runs)
    return {"cold_s": cold["wall"], "warm_s": [w["wall"] for w in warm], "served_s": [w["wall"] for w in served],
            "server_start_s": server_start_s, "cold": cold, "warm": warm, "served": served}


def part_guided(work: Path, jobs: int | None) -> dict[str, Any]:
    build = work / "forge-build-260"
    jobs_args = ("-j", str(jobs)) if jobs else ()
    exh = forge_tune(project(work / "exhaustive", space_260(), GUIDED_SHAPES, "exhaustive"), build, *jobs_args)
    gui = forge_tune(project(work / "guided", space_260(), GUIDED_SHAPES, "guided"), build, *jobs_args)
    by_id = {cid(c): c for c in space_260()}
    rows = []
    for m, n, k in GUIDED_SHAPES:
        name = f"{m}x{n}x{k}"
        pair = [by_id[exh["winners"][name]], by_id[gui["winners"][name]]]
        pair = list({cid(c): c for c in pair}.values())
        judged = judge(work / "exhaustive", pair, [(m, n, k)], rounds=5)[name]
        rows.append({"shape": name, "exhaustive_winner": exh["winners"][name], "guided_winner": gui["winners"][name],
                     "exhaustive_benchmarked": exh["benchmarked"][name], "guided_benchmarked": gui["benchmarked"][name],
                     "guided_vs_exhaustive": judged[exh["winners"][name]] / judged[gui["winners"][name]],
                     "judged_ms": judged})
    return {"configs": len(space_260()), "exhaustive": exh, "guided": gui, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["autotune", "guided", "served", "all"], default="all",
                    help="served: only forge-aot tune's own start-up, warm, without and with a forge-aot server "
                         "(no Triton autotuning, no judge; a minute)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("-j", "--jobs", type=int)
    ap.add_argument("--triton-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--project", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.triton_child:
        triton_child(args)
        return
    import torch

    result: dict[str, Any] = {"device": torch.cuda.get_device_name()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.part == "served":
            v = result["served"] = part_served(work, args.jobs)
            print(f"\nforge-aot tune, same project as part autotune, {result['device']}: cold {v['cold_s']:.1f} s, "
                  f"warm (no server) " + ", ".join(f"{w:.1f} s" for w in v["warm_s"]) + "; with a running "
                  f"forge-aot server (started once in {v['server_start_s']:.1f} s): "
                  + ", ".join(f"{w:.1f} s" for w in v["served_s"]))
            for label, runs in (("warm", v["warm"]), ("served", v["served"])):
                for r in runs:
                    print(f"  {label}: workers up at {r['boot_wall']:.2f} s, first row at {r['first_row_at']:.2f} s, "
                          f"rows {r['benchmark_seconds']:.2f} s, outside tune() {r['process_to_tune_s']:.2f} s")
        if args.part in ("autotune", "all"):
            a = result["autotune"] = part_autotune(work, args.jobs)
            print(f"\nserial triton.autotune vs forge-aot tune: matmul fp16, {a['configs']} configs x "
                  f"{len(a['shapes'])} shapes, {result['device']}")
            print(f"  triton.autotune   cold {a['triton_cold_s']:7.1f} s  warm cache {a['triton_warm_s']:6.1f} s  "
                  f"(compile ~{a['triton_compile_s']:.1f} s, serial)")
            fc = a["forge_cold"]
            print(f"  forge-aot tune    cold {a['forge_cold_s']:7.1f} s  warm binaries {a['forge_warm_s']:6.1f} s  "
                  f"(compile {fc['compile_cpu_s']:.1f} CPU-s in {fc['compile_wall']:.1f} s wall, benchmark "
                  f"{fc['benchmark_wall']:.1f} s wall)")
            print(f"  forge-aot timeline (cold): compiling from {fc['compile_started_at']:.1f} s, workers up at "
                  f"{fc['boot_wall']:.1f} s, first row benchmarked at "
                  f"{fc['first_row_at']:.1f} s, GPU waiting on compiles {fc['gpu_idle_seconds']:.1f} s, rows "
                  f"{fc['benchmark_seconds']:.1f} s, workers ended in {fc['close_seconds']:.2f} s")
            stages = ", ".join(f"{k} {v:.2f}" for k, v in (fc.get("boot_stages") or {}).items())
            print(f"    before compiling (s from tune()'s start): {stages}; process start, imports and exit "
                  f"outside tune(): {fc['process_to_tune_s']:.1f} s")
            for row, ready, started, secs in fc["row_timeline"]:
                print(f"    {row}: compiled at {ready or 0:.1f} s, benchmarked {started or 0:.1f} – "
                      f"{(started or 0) + (secs or 0):.1f} s")
            fw = a["forge_warm"]
            print(f"  forge-aot timeline (warm): workers up at {fw['boot_wall']:.2f} s, first row at "
                  f"{fw['first_row_at']:.2f} s, rows {fw['benchmark_seconds']:.2f} s, workers ended in "
                  f"{fw['close_seconds']:.2f} s, outside tune() {fw['process_to_tune_s']:.2f} s; before the rows: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in (fw.get("boot_stages") or {}).items()))
            for row, phases in fw.get("row_phases", {}).items():
                print(f"    {row}: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
            served = ", ".join(f"{w:.1f} s ({x:.1f}x)" for w, x in zip(a["forge_served_s"], a["speedup_served"]))
            print(f"  forge-aot tune    warm, forked from a running `forge-aot server` (started once in "
                  f"{a['server_start_s']:.1f} s): {served}; as whole processes against triton's "
                  + ", ".join(f"{x:.1f}x" for x in a["speedup_served_process"]))
            for fs in a["forge_served"]:
                print(f"    served timeline: workers up at {fs['boot_wall']:.2f} s, first row at "
                      f"{fs['first_row_at']:.2f} s, outside tune() {fs['process_to_tune_s']:.2f} s; before the rows: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in fs["boot_stages"].items()))
            print(f"  forge-aot / triton wall clock: {a['speedup_cold']:.1f}x faster cold, {a['speedup_warm']:.1f}x "
                  "warm (triton: its first calls only; forge-aot: the whole command)")
            print(f"  both as whole processes (triton.autotune child {a['triton_cold_process_s']:.1f} s cold, "
                  f"{a['triton_warm_process_s']:.1f} s warm): {a['speedup_cold_process']:.1f}x cold, "
                  f"{a['speedup_warm_process']:.1f}x warm")
            print("  each winner's speed against the exhaustive best: the sweep (do_bench, 3 rounds), then its "
                  f"configs within {FINALIST_MARGIN:.0%} of its best and every pick timed again "
                  f"(do_bench_cudagraph, {FINAL_ROUNDS} rounds): operands warm in L2, then rotated copies (cold L2)")
            print(f"  {'shape':16} {'sweep best':>12} {'triton':>7} {'forge':>7} {'warm':>7} | {'L2 warm':>11} "
                  f"{'triton':>7} {'forge':>7} {'warm':>7} | {'L2 cold':>11} {'triton':>7} {'forge':>7} {'warm':>7}"
                  "  finalists")
            for r in a["rows"]:
                print(f"  {r['shape']:16} {r['exhaustive_best_ms'] * 1e3:9.1f} us {r['triton_vs_best']:7.3f} "
                      f"{r['forge_vs_best']:7.3f} {r['forge_warm_vs_best']:7.3f} | {r['final_best_ms'] * 1e3:8.1f} us "
                      f"{r['triton_vs_final_best']:7.3f} {r['forge_vs_final_best']:7.3f} "
                      f"{r['forge_warm_vs_final_best']:7.3f} | {r['cold_best_ms'] * 1e3:8.1f} us "
                      f"{r['triton_vs_cold_best']:7.3f} {r['forge_vs_cold_best']:7.3f} "
                      f"{r['forge_warm_vs_cold_best']:7.3f}  {len(r['finalists'])}")
        if args.part in ("guided", "all"):
            g = result["guided"] = part_guided(work, args.jobs)
            print(f"\nguided vs exhaustive search over {g['configs']} configs (forge-aot tune, same binaries)")
            e, gd = g["exhaustive"], g["guided"]
            print(f"  wall: exhaustive {e['wall']:.1f} s (benchmark {e['benchmark_wall']:.1f} s), guided "
                  f"{gd['wall']:.1f} s (benchmark {gd['benchmark_wall']:.1f} s)")
            for r in g["rows"]:
                print(f"  {r['shape']:16} benchmarked {r['guided_benchmarked']:3d} of {g['configs']} (exhaustive "
                      f"{r['exhaustive_benchmarked']}), guided winner = {r['guided_vs_exhaustive']:.3f}x the "
                      f"exhaustive winner's speed")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
