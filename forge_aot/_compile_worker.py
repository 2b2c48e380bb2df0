"""Compile worker: a long-lived process that compiles one binary per request with triton.compile.

Protocol: one JSON job per line on stdin; one result line per job, prefixed with RESULT_MARK, on the file
descriptor the parent reads. Anything Triton, LLVM or ptxas print goes to stderr. The parent enforces the
per-binary timeout by killing this process; a crash loses only the job in flight.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
import traceback
from typing import Any

from forge_aot.introspect import base_jit_function, host_dtype, load_kernel_module

RESULT_MARK = "@@forge-aot-result@@"


def _atomic_write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def compile_one(job: dict[str, Any]) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # The bare @triton.jit function: autotune and heuristics are the build's business (config, constexprs).
    fn = base_jit_function(getattr(load_kernel_module(job["source"]), job["function"]))
    t = job["target_info"]
    target = GPUTarget(t["backend"], t["arch"], t["warp_size"])
    attrs = {(i,): [["tt.divisibility", 16]] for i in job["divisible"]}
    # A constexpr host code passed as a Triton element type arrives as its text (``tl.bfloat16``), a @triton.jit
    # function as its text too, with its file and name (SGLang's SCORE_MOD=score_mod).
    functions = {text: base_jit_function(getattr(load_kernel_module(file), name))
                 for text, (file, name) in job.get("functions", {}).items()}
    constexprs = {name: functions[value] if isinstance(value, str) and value in functions else host_dtype(value)
                  for name, value in job["constexprs"].items()}
    src = ASTSource(fn=fn, signature=job["signature"], constexprs=constexprs, attrs=attrs)
    cfg = job["config"]
    start = time.perf_counter()
    options = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    if cfg.get("maxnreg"):
        options["maxnreg"] = cfg["maxnreg"]
    options.update(job.get("options", {}))  # launch options the kernel's heuristics computed (see CompileJob)
    compiled = triton.compile(src, target=target, options=options)
    seconds = time.perf_counter() - start
    ext = "cubin" if t["backend"] == "cuda" else "hsaco"
    image = compiled.asm[ext]
    md = compiled.metadata
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False) \
            or getattr(md, "launch_pdl", False):
        raise RuntimeError("clusters, cooperative grids and PDL launches are not supported by the forge-aot loader")
    arch = f"sm_{t['arch']}{'a' if int(t['arch']) >= 90 else ''}" if t["backend"] == "cuda" else t["arch"]
    sidecar = {
        "kernel": job["kernel"], "function": md.name, "variant": job["variant"], "target": job["target"],
        "arch": arch, "config": cfg, "spec": job["specialization"], "heur": job["heuristics"],
        "signature": job["signature"],
        "divisible": job["divisible"], "num_warps": md.num_warps, "num_stages": md.num_stages,
        "warp_size": md.warp_size, "shared": md.shared,
        "global_scratch_size": getattr(md, "global_scratch_size", 0),
        "global_scratch_align": getattr(md, "global_scratch_align", 1),
        "profile_scratch_size": getattr(md, "profile_scratch_size", 0),
        "profile_scratch_align": getattr(md, "profile_scratch_align", 1),
        "triton_version": triton.__version__, "format": ext, "size": len(image),
        "sha256": hashlib.sha256(image).hexdigest(),
    }
    if job.get("descriptors"):
        # Per tensor descriptor argument, how the binary takes it: TMA metadata (swizzle, element type, box) for a
        # tensor map the loader encodes at launch, or None where it was lowered without TMA (pointer, shape and
        # strides); an empty list from Triton means none uses TMA.
        meta = list(getattr(md, "tensordesc_meta", None) or [])
        if meta and t["backend"] != "cuda":
            raise RuntimeError("tensor descriptors lowered to AMD TDM descriptors are not supported by the forge-aot "
                               "loader (only decomposed ones: pointer, shape and strides)")
        names = list(job["descriptors"])
        sidecar["descs"] = job["descriptors"]
        sidecar["tensordesc_meta"] = {n: (dict(meta[i]) if meta else None) for i, n in enumerate(names)}
    stem = os.path.join(job["out_dir"], job["binary_stem"])
    _atomic_write(f"{stem}.{ext}", image)
    _atomic_write(f"{stem}.json", (json.dumps(sidecar, indent=2, sort_keys=True) + "\n").encode())
    return {"ok": True, "sidecar": sidecar, "seconds": seconds}


def main() -> None:
    nice = int(os.environ.get("FORGE_AOT_COMPILE_NICE", "0") or 0)
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)  # before the imports: they are most of a starting worker's CPU time
    # The project root (the working directory the pool gives its workers) for the kernel files' imports of the
    # project's modules, also where PYTHONSAFEPATH keeps ``python -m`` from adding it.
    from forge_aot.introspect import make_importable

    make_importable(os.getcwd())
    # Import the compiler (and torch, which kernel files import) before the first job arrives: a pool started
    # ahead of time does this while its parent plans.
    import triton.compiler  # noqa: F401

    with contextlib.suppress(ImportError):
        import torch  # noqa: F401
    result_fd = os.dup(1)
    os.dup2(2, 1)  # compiler chatter goes to stderr; results go to the saved descriptor only
    out = os.fdopen(result_fd, "w", buffering=1)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            result = compile_one(job)
        except BaseException as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            result = {"ok": False, "error": detail[-4000:]}
        out.write(RESULT_MARK + json.dumps(result) + "\n")
    # Job pipe closed: every answer is written. Skip the interpreter's teardown of torch and Triton (a large
    # part of a second), which the pool would wait for.
    out.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
