"""Record what Triton's own @triton.autotune picks for a manifest's autotuned kernels, as forge-aot tuning data.

A stopgap until `forge-aot tune` exists (issue 6): on a GPU machine, imports each kernel file of the manifest
as it is (Triton's JIT and autotuner), runs the file's examples function on the GPU, reads every autotuned
kernel's choices (its Autotuner cache: key values and dtypes → best config) and writes one tuning-data file
per kernel for this GPU model (README, "Tuning data"). The build then fills that GPU model's tables with them.

    python benchmarks/record_triton_autotune.py tests/fixtures/realworld/kernel_manifest.toml --target sm_90 \\
        --out tests/fixtures/realworld/tuning
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("manifest", type=Path)
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    from forge_aot.manifest import load_manifest

    loaded = load_manifest(args.manifest)
    device = torch.cuda.get_device_name()
    modules: dict[Path, object] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, k in loaded.manifest.kernels.items():
        file, _, func = k.source.rpartition(":")
        path = (loaded.root / file).resolve()
        if path not in modules:
            spec = importlib.util.spec_from_file_location(f"_record_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            if k.examples:
                getattr(module, k.examples)("cuda")
                torch.cuda.synchronize()
            modules[path] = module
        tuner = getattr(modules[path], func)
        while type(tuner).__name__ == "Heuristics":
            tuner = tuner.fn
        if type(tuner).__name__ != "Autotuner":
            continue
        entries = []
        for key, config in sorted(tuner.cache.items(), key=repr):
            values, dtypes = key[:len(tuner.keys)], [d for d in key[len(tuner.keys):] if d in _DTYPES]
            type_var = next(iter(k.dtypes), None)
            variant = {type_var: _DTYPES[dtypes[0]]} if type_var and dtypes else {}
            entries.append({"variant": variant, "key": dict(zip(tuner.keys, values)),
                            "config": {**config.kwargs, "num_warps": config.num_warps,
                                       "num_stages": config.num_stages},
                            "source": "triton.autotune"})
        out = args.out / f"{name}_{args.target}_{device.replace(' ', '_')}.json"
        out.write_text(json.dumps({"format": 1, "kernel": name, "target": args.target, "device": device,
                                   "entries": entries}, indent=1) + "\n")
        print(f"{out}: {len(entries)} entries")


if __name__ == "__main__":
    main()
