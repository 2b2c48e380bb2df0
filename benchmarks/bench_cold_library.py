"""Import + first call of library-style ops in fresh processes: cold handles against the full binding, and one wheel
against another, interleaved run by run.

The ops are those of the cold-handle fixture's wheel (``tests/fixtures/realworld/cold_manifest.toml``, package
``forge_coldlib``), written as the libraries write them: Liger's RMSNorm (an autograd Function, a custom op with a
backward, a project module), fused add + RMSNorm and cross entropy (every argument by keyword), FLA's
``chunk_local_cumsum`` (``@triton.heuristics`` on None arguments), torchao's ``wrap_triton`` in a ``@triton_op``,
Unsloth's cross entropy (heuristics coercing flags the call passes), the Triton tutorial's programmatic dependent
launch (``launch_pdl=``), a cooperative grid sum (``launch_cooperative_grid=``) and gsplat's heuristic ``num_warps``.

With ``--package forge_leanlib`` (``tests/fixtures/realworld/lean_manifest.toml``: a package that routes no op by
name, so ``import`` loads the lean entry alone) the ops are its library-style ones served by lean handles: the Triton
tutorials' LayerNorm (``num_warps``, ``num_ctas=1``), the seeded dropout, Liger's RoPE (constexprs by position), a
GIoU loss, a guarded row absmax (``BLOCK=`` by keyword), the tutorials' fused softmax (whose ``warmup`` keeps its
module off the lean path) and, since session 63, host modules importing project modules: Liger's fused add + RMSNorm
and GeGLU (whose ``compare_version("triton", ...)`` imports Triton where it is installed, as Liger does), FlagGems'
mean, bitsandbytes' row-wise quantization. ``forge_coldlib`` routes ops by name (a custom op with a backward): since
session 63 its modules with a lean plan are bound lean too (``NAME=PATH:cold`` is the cold-handle run).

Each contender is an install of a wheel (``pip install --target``, done here for a ``.whl``) with its runtime's
bytecode bundle written, as a deployed wheel has it after its first process; ``NAME=PATH:full`` runs the same install
with ``FORGE_NO_COLD=1`` (the full binding from the first call), ``NAME=PATH:cold`` with ``FORGE_NO_LEAN=1`` (cold
handles after the full runtime's import). Each child process has torch imported, the CUDA
context up and its inputs allocated before the clock starts; it reports import and first-call milliseconds, the
handle kinds that served the call and the runtime modules loaded. Printed: per op and contender the medians and the
range over ``--repeats`` rounds (contenders rotated within each round) and each contender's median total against the
first contender's, from the same run. Needs a CUDA GPU.

    forge-aot build --manifest tests/fixtures/realworld/cold_manifest.toml --target sm_90 --out dist
    python benchmarks/bench_cold_library.py cold=dist/forge_coldlib-*.whl full=dist/forge_coldlib-*.whl:full \\
        [old=OTHER.whl] [--repeats 9] [--ops rms_norm,cross_entropy_loss] [--json cold_library.json]
    python benchmarks/bench_cold_library.py --package forge_leanlib lean=dist/forge_leanlib-*.whl \\
        cold=dist/forge_leanlib-*.whl:cold full=dist/forge_leanlib-*.whl:full
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "forge_coldlib"

OPS = {
    # op: (inputs made before the clock starts, the first call)
    "rms_norm": ("x = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
                 "w = torch.randn(4096, device='cuda', dtype=torch.bfloat16)",
                 "lib.rms_norm(x, w, offset=1.0, casting_mode='gemma')"),
    "liger_fused_add_rms_norm": ("x = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
                                 "r = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
                                 "w = torch.randn(4096, device='cuda', dtype=torch.bfloat16)",
                                 "lib.liger_fused_add_rms_norm(x, r, w, 1e-6, 0.0, 'llama')"),
    "liger_cross_entropy": ("x = torch.randn(8, 32000, device='cuda', dtype=torch.bfloat16)\n"
                            "t = torch.randint(0, 32000, (8,), device='cuda')",
                            "lib.liger_cross_entropy(x, t)"),
    "chunk_local_cumsum": ("g = torch.randn(2, 1000, 4, device='cuda', dtype=torch.bfloat16)",
                           "lib.chunk_local_cumsum(g, 64, scale=0.5)"),
    "scale_rows": ("x = torch.randn(4, 4096, device='cuda', dtype=torch.float16)\n"
                   "s = torch.rand(4, device='cuda')",
                   "lib.scale_rows(x, s)"),
    "cross_entropy_loss": ("x = torch.randn(8, 32000, device='cuda', dtype=torch.bfloat16)\n"
                           "t = torch.randint(0, 32000, (8,), device='cuda')",
                           "lib.cross_entropy_loss(x, t, 30.0, 0)"),
    "add": ("x = torch.rand(98432, device='cuda')", "lib.add(x, x, launch_pdl=True)"),
    # flash-attn's rotary, an integer to its SEQLEN_OFFSETS pointer (lean since session 66)
    "apply_rotary_emb": ("x = torch.randn(2, 1000, 8, 128, device='cuda', dtype=torch.float16)\n"
                         "c = torch.randn(2048, 64, device='cuda', dtype=torch.float16)",
                         "lib.apply_rotary_emb(x, c, c, seqlen_offsets=7)"),
    "grid_sum": ("x = torch.randn(100_003, device='cuda')", "lib.grid_sum(x)"),
    "sh_to_color": ("sh = torch.randn(10_001, 4, 3, device='cuda')\n"
                    "d = torch.randn(10_001, 3, device='cuda')",
                    "lib.sh_to_color(sh, d, 1, 256)"),
}
LEAN_OPS = {
    "layer_norm": ("x = torch.randn(8, 4096, device='cuda', dtype=torch.float16)\n"
                   "w = torch.randn(4096, device='cuda', dtype=torch.float16)\n"
                   "b = torch.randn(4096, device='cuda', dtype=torch.float16)",
                   "lib.layer_norm(x, (4096,), w, b, 1e-5)"),
    "seeded_dropout": ("x = torch.randn(100_003, device='cuda', dtype=torch.float16)",
                       "lib.seeded_dropout(x, 0.5, 123)"),
    "liger_rotary_pos_emb": ("q = torch.randn(2, 32, 61, 128, device='cuda', dtype=torch.bfloat16)\n"
                             "k = torch.randn(2, 8, 61, 128, device='cuda', dtype=torch.bfloat16)\n"
                             "c = torch.randn(1, 61, 128, device='cuda', dtype=torch.bfloat16)",
                             "lib.liger_rotary_pos_emb(q, k, c, c)"),
    "loss_with_triton": ("p = torch.rand(32, 128, 4, device='cuda', dtype=torch.bfloat16)\n"
                         "p[..., 2:] += p[..., :2] + 0.1\n"
                         "t = torch.rand(32, 128, 4, device='cuda')\n"
                         "t[..., 2:] += t[..., :2] + 0.1",
                         "lib.loss_with_triton(p, t)"),
    "row_absmax": ("x = torch.randn(7, 4099, device='cuda', dtype=torch.float16)", "lib.row_absmax(x)"),
    "softmax": ("x = torch.randn(4, 4096, device='cuda', dtype=torch.float16)", "lib.softmax(x)"),
    # host modules importing project modules (lean since session 63)
    "liger_fused_add_rms_norm": OPS["liger_fused_add_rms_norm"],
    "geglu": ("a = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
              "b = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)", "lib.geglu(a, b)"),
    "mean_dim": ("x = torch.randn(1024, 1000, device='cuda', dtype=torch.float16)", "lib.mean_dim(x, -1)"),
    "quantize_rowwise": ("x = torch.randn(7, 4096, device='cuda', dtype=torch.float16)", "lib.quantize_rowwise(x)"),
    # @triton.heuristics and kernel files imported by their project names (lean since session 64)
    "even_scale": ("x = torch.randn(3, 1000, device='cuda', dtype=torch.float16)", "lib.even_scale(x, 0.5)"),
    "sh_to_color": OPS["sh_to_color"],
    "cross_entropy_loss": ("x = torch.randn(8, 32000, device='cuda', dtype=torch.bfloat16)\n"
                           "y = torch.randint(0, 32000, (8,), device='cuda')",
                           "lib.cross_entropy_loss(x, y, 30.0)"),
    "fused_recurrent_gla": ("bf = torch.bfloat16\n"
                            "q, k, v = (torch.randn(2, 64, 4, 64, device='cuda', dtype=bf) for _ in range(3))\n"
                            "g = torch.randn(2, 64, 4, device='cuda').sigmoid().log()",
                            "lib.fused_recurrent_gla(q, k, v, g=g, output_final_state=True)"),
}
# FLA 0.6.0's files as FLA ships them (tests/fixtures/fla060): each kernel file imports the others by FLA's names
FLA_OPS = {
    "chunk_simple_gla": ("bf = torch.bfloat16\n"
                         "q, k, v = (torch.randn(2, 1000, 4, 64, device='cuda', dtype=bf) for _ in range(3))\n"
                         "g = torch.nn.functional.logsigmoid(torch.randn(2, 1000, 4, device='cuda', dtype=bf))\n"
                         "h0 = torch.randn(2, 4, 64, 64, device='cuda')",
                         "lib.chunk_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True)"),
    "chunk_local_cumsum": ("g = torch.randn(2, 1000, 4, device='cuda', dtype=torch.bfloat16)",
                           "lib.chunk_local_cumsum(g, 64, scale=0.5)"),
}
KERNELS_OPS = {  # the repository's own wheel (kernel_manifest.toml): one wheel against another
    "vector_add": ("x = torch.randn(1 << 20, device='cuda', dtype=torch.float16)\n"
                   "y = torch.randn(1 << 20, device='cuda', dtype=torch.float16)", "lib.vector_add(x, y)"),
}
PACKAGE_OPS = {"forge_coldlib": OPS, "forge_leanlib": LEAN_OPS, "forge_fla": FLA_OPS, "forge_kernels": KERNELS_OPS}

CHILD = """
import json, sys, time
import torch
{setup}
torch.cuda.synchronize()
t0 = time.perf_counter()
import {package} as lib
t1 = time.perf_counter()
{call}
torch.cuda.synchronize()
t2 = time.perf_counter()
kinds = sorted({{type(h).__name__ for m, mod in list(sys.modules.items()) if m.startswith("{package}._ops.")
                for h in vars(mod).values() if type(h).__name__ in ("LeanKernel", "ColdKernel", "Kernel")}})
runtime = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("{package}._runtime."))
print(json.dumps({{"import": t1 - t0, "first": t2 - t1, "total": t2 - t0, "kinds": kinds, "runtime": runtime}}))
"""


def install(path: str, scratch: Path) -> str:
    """A directory to put on PYTHONPATH: ``path`` itself, or the wheel ``path`` (a glob) installed under ``scratch``
    (one directory per wheel file: two builds of one package share a file name, not a directory)."""
    if not path.endswith(".whl"):
        return path
    wheels = sorted(glob.glob(path))
    if len(wheels) != 1:
        sys.exit(f"{path}: {len(wheels)} wheels match (want one)")
    target = scratch / hashlib.sha256(str(Path(wheels[0]).resolve()).encode()).hexdigest()[:16]
    if not target.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                        str(target), wheels[0]], check=True)
    return str(target)


def run(op: str, env: dict[str, str], package: str, preimport: str = "") -> dict | None:
    setup, call = PACKAGE_OPS.get(package, OPS)[op]
    setup = "".join(f"import {m}\n" for m in preimport.split(",") if m) + setup
    proc = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, call=call, package=package)],
                          capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=300)
    if proc.returncode:
        if "has no attribute" in proc.stderr:  # an op an older wheel does not have
            return None
        raise RuntimeError(f"{op}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("contenders", nargs="+", help="NAME=WHEEL_OR_DIR[:full|:cold]; the first is the reference")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--ops", help="comma-separated (default: every op of the package): "
                    + "; ".join(f"{p}: {', '.join(o)}" for p, o in PACKAGE_OPS.items()))
    ap.add_argument("--package", default=PACKAGE)
    ap.add_argument("--preimport", default="", help="comma-separated modules imported before the clock starts, e.g. "
                    "torch._dynamo: FLA's host files decorate with torch.compiler.disable, which imports it (a "
                    "server using torch.compile has it already)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_cold_library.py needs a CUDA GPU")
    known = PACKAGE_OPS.get(args.package, OPS)
    ops = args.ops.split(",") if args.ops else list(known)
    unknown = [op for op in ops if op not in known]
    if unknown:
        ap.error(f"unknown ops {unknown}")
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FORGE_NO_COLD", "FORGE_NO_LEAN")}
    base["PYTHONDONTWRITEBYTECODE"] = "1"  # the bundle below is written once; the children write nothing
    scratch = Path(tempfile.mkdtemp(prefix="bench_cold_library_"))
    envs: dict[str, dict[str, str]] = {}
    for item in args.contenders:
        name, _, spec = item.partition("=")
        path, _, mode = spec.rpartition(":") if spec.endswith((":full", ":cold")) else (spec, "", "")
        off = {"full": {"FORGE_NO_COLD": "1"}, "cold": {"FORGE_NO_LEAN": "1"}}.get(mode, {})
        envs[name] = dict(base, PYTHONPATH=install(path, scratch), **off)
        subprocess.run([sys.executable, "-c", f"import {args.package}._runtime as r; r.write_bundle()"], check=True,
                       env=envs[name], cwd=tempfile.gettempdir())
    out: dict = {"device": torch.cuda.get_device_name(0), "python": platform.python_version(),
                 "torch": torch.__version__, "repeats": args.repeats, "contenders": args.contenders,
                 "preimport": args.preimport, "ops": {}}
    print(f"import + first call in fresh processes on {out['device']} ({args.repeats} rounds, ms, medians"
          + (f"; imported before the clock: {args.preimport}" if args.preimport else "") + ")")
    versus = "vs " + next(iter(envs))
    print(f"{'op':26s} {'contender':10s} {'import':>8s} {'first':>8s} {'total':>8s} {'range':>17s} {versus:>9s}"
          "  handles")
    for op in ops:
        runs: dict[str, list[dict]] = {name: [] for name in envs}
        names = list(envs)
        for i in range(args.repeats):
            for name in names[i % len(names):] + names[:i % len(names)]:  # rotated round by round
                r = run(op, envs[name], args.package, args.preimport)
                if r is not None:
                    runs[name].append(r)
        result = out["ops"][op] = {}
        for name, rs in runs.items():
            if rs:
                result[name] = {**{k: statistics.median(r[k] for r in rs) * 1e3 for k in ("import", "first", "total")},
                                "totals": [r["total"] * 1e3 for r in rs], "kinds": rs[-1]["kinds"],
                                "runtime": rs[-1]["runtime"]}
        ref = result.get(names[0], {}).get("total")
        for name, r in result.items():
            ratio = f"{r['total'] / ref:8.2f}x" if ref else f"{'':9s}"
            r["ratio"] = r["total"] / ref if ref else None
            print(f"{op:26s} {name:10s} {r['import']:8.3f} {r['first']:8.3f} {r['total']:8.3f} "
                  f"{min(r['totals']):7.3f} - {max(r['totals']):7.3f} {ratio}  {','.join(r['kinds'])}", flush=True)
        for name, r in result.items():
            print(f"{'':26s} {name} loaded: {' '.join(r['runtime'])}", flush=True)
        if args.json:  # after every op: a run cut short keeps what it measured
            args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
