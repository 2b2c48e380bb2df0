"""Build cost of the library-style fixtures: call-site values as a product of constexpr lists (what a manifest
had to say before `derive`/`examples`) against the values the examples really reach.

For each norm fixture (tests/fixtures/realworld: RMSNorm forward+backward, LayerNorm forward+two backward
kernels) it writes two manifests into a temporary project — "product": the natural lists of block sizes,
warps and group sizes crossed; "examples": the file's examples function traced — builds both for one target
from a cold Triton cache, and reports binaries, wheel size and build time. Runs on a CPU machine.

    python benchmarks/bench_build.py --target sm_90 -j 2 --json build.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "tests" / "fixtures" / "realworld" / "kernels"

RMS_SIG = {
    "fwd": 'signature = { Y_ptr = "*T", Y_row_stride = "i32", X_ptr = "*T", X_row_stride = "i32", W_ptr = "*T", '
           'W_row_stride = "i32", RSTD_ptr = "*fp32", RSTD_row_stride = "i32", n_cols = "i32", eps = "fp32", '
           'offset = "fp32" }',
    "bwd": 'signature = { dY_ptr = "*T", dY_row_stride = "i32", dX_ptr = "*T", dX_row_stride = "i32", X_ptr = "*T", '
           'X_row_stride = "i32", W_ptr = "*T", W_row_stride = "i32", RSTD_ptr = "*fp32", RSTD_row_stride = "i32", '
           'dW_ptr = "*fp32", dW_row_stride = "i32", n_rows = "i32", n_cols = "i32", offset = "fp32", '
           'rows_per_program = "i32" }',
}
LN_SIG = {
    "fwd": 'signature = { X = "*T", Y = "*T", W = "*T", B = "*T", Mean = "*fp32", Rstd = "*fp32", stride = "i32", '
           'N = "i32", eps = "fp32" }',
    "dx": 'signature = { DX = "*T", DY = "*T", DW = "*fp32", DB = "*fp32", X = "*T", W = "*T", Mean = "*fp32", '
          'Rstd = "*fp32", Lock = "*i32", stride = "i32", N = "i32" }',
    "dwdb": 'signature = { DW = "*fp32", DB = "*fp32", FINAL_DW = "*T", FINAL_DB = "*T", M = "i32", N = "i32" }',
}
BLOCKS = "[1024, 2048, 4096, 8192, 16384, 32768, 65536]"
LN_BLOCKS = "[256, 512, 1024, 2048, 4096, 8192, 16384, 32768]"


def _entry(name: str, source: str, signature: str, key: str, values: str | None, ops: str = "") -> str:
    lines = [f"[kernels.{name}]", f'source = "kernels/{source}"', signature, 'dtypes = { T = ["fp16", "bf16"] }',
             f'key = ["{key}"]']
    if ops:
        lines.append(f'ops = ["{ops}"]')
    if values is None:
        lines.append('examples = "examples"')
    else:
        lines += [f"buckets = {{ {key} = [1000, 2048, 4096, 5120, 8192] }}", f"constexprs = {values}"]
    return "\n".join(lines) + "\n\n"


def manifests() -> dict[str, dict[str, str]]:
    head = '[project]\nname = "bench_NAME"\nversion = "0.1.0"\ntargets = ["TARGET"]\nline-info = false\n\n'
    rms_product = f"{{ casting_mode = [0, 1], BLOCK_SIZE = {BLOCKS}, num_warps = [4, 8, 16, 32] }}"
    ln_product = f"{{ BLOCK_SIZE = {LN_BLOCKS}, num_warps = [1, 2, 4, 8] }}"
    dx_product = f"{{ GROUP_SIZE_M = [64, 96, 128, 256], BLOCK_SIZE_N = {LN_BLOCKS}, num_warps = [1, 2, 4, 8] }}"
    out: dict[str, dict[str, str]] = {"rms_norm": {}, "layer_norm": {}}
    for mode in ("product", "examples"):
        p = mode == "product"
        out["rms_norm"][mode] = head + (
            _entry("fwd", "rms_norm.py:_rms_norm_forward_kernel", RMS_SIG["fwd"], "n_cols", rms_product if p else None,
                   "rms_norm")
            + _entry("bwd", "rms_norm.py:_rms_norm_backward_kernel", RMS_SIG["bwd"], "n_cols",
                     rms_product if p else None))
        out["layer_norm"][mode] = head + (
            _entry("fwd", "layer_norm.py:_layer_norm_fwd_fused", LN_SIG["fwd"], "N", ln_product if p else None,
                   "layer_norm")
            + _entry("dx", "layer_norm.py:_layer_norm_bwd_dx_fused", LN_SIG["dx"], "N", dx_product if p else None)
            + _entry("dwdb", "layer_norm.py:_layer_norm_bwd_dwdb", LN_SIG["dwdb"], "N",
                     "{ BLOCK_SIZE_M = [32], BLOCK_SIZE_N = [128] }" if p else None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", default="", help="build only this fixture (rms_norm or layer_norm)")
    ap.add_argument("--modes", default="product,examples", help="which manifests to build")
    args = ap.parse_args()
    from forge_aot.pipeline import build

    results = {}
    print(f"{'fixture':12s} {'manifest':9s} {'binaries':>9s} {'wheel MB':>9s} {'build s':>8s}")
    with tempfile.TemporaryDirectory() as tmp:
        for fixture, modes in manifests().items():
            if args.only and fixture != args.only:
                continue
            for mode, text in modes.items():
                if mode not in args.modes.split(","):
                    continue
                project = Path(tmp) / f"{fixture}_{mode}"
                shutil.copytree(KERNELS, project / "kernels")
                (project / "kernel_manifest.toml").write_text(text.replace("NAME", fixture).replace("TARGET",
                                                                                                    args.target))
                start = time.perf_counter()
                result = build(project / "kernel_manifest.toml", out_dir=project / "dist",
                               build_dir=project / "work", jobs=args.jobs)
                seconds = time.perf_counter() - start
                binaries = sum(1 for r in result.report.results if r.ok)
                size = result.wheel.stat().st_size / 1e6
                results[f"{fixture}/{mode}"] = {"binaries": binaries, "wheel_mb": round(size, 2),
                                                "build_s": round(seconds, 1), "target": args.target,
                                                "variants": len({(e.kernel, e.variant) for e in result.plan.entries})}
                print(f"{fixture:12s} {mode:9s} {binaries:9d} {size:9.2f} {seconds:8.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
