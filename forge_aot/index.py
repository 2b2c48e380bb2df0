"""The package index (``_forge/index.json``): what the runtime reads to bind kernels, tables and binaries.

Built from the plan and the compile report for a wheel, or from the plan alone for development mode (where
each row takes its first preference and Triton's JIT compiles it on demand).
"""

from __future__ import annotations

from typing import Any

from . import __version__
from .compiler import CompileReport
from .plan import BuildPlan, ConfigChoice, KernelPlan
from .targets import TARGETS
from .templates._forge_runtime import INDEX_FORMAT

BINARY_FIELDS = ("function", "shared", "warp_size", "num_warps", "global_scratch_size", "global_scratch_align",
                 "profile_scratch_size", "profile_scratch_align", "sha256", "size", "arch")


def _kernel_spec(kp: KernelPlan) -> dict[str, Any]:
    k = kp.entry
    dtype_args = {}
    for tv in k.dtypes:
        dtype_args[tv] = next(n for n, t in kp.params if t == f"*{tv}")
    ints = [n for n, t in kp.params if t in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")]
    return {"function": kp.function, "params": [list(p) for p in kp.params],
            "divisible": list(k.divisible) if k.divisible is not None else ints,
            "constexpr_defaults": kp.constexpr_defaults, "dtype_args": dtype_args, "key": list(k.key),
            "constraints": list(k.tune.constraints), "variants": {}}


def _config_json(c: ConfigChoice) -> dict[str, Any]:
    return {"meta": c.meta, "num_warps": c.num_warps, "num_stages": c.num_stages}


def build_index(plan: BuildPlan, report: CompileReport | None, triton_version: str,
                module_paths: dict[str, str]) -> dict[str, Any]:
    m = plan.loaded.manifest
    kernels = {name: _kernel_spec(kp) for name, kp in plan.kernels.items()}
    used_targets: set[str] = set()
    if report is not None:
        for ce in report.entries:
            e = ce.entry
            variant = kernels[e.kernel]["variants"].setdefault(e.variant, {"assign": e.assignment, "targets": {}})
            configs = {}
            for cid, choice in sorted(ce.configs.items()):
                binaries = {}
                for spec, sc in sorted(ce.binaries[cid].items()):
                    stem = f"_forge/bin/{sc['kernel']}/{sc['target']}/{sc['variant'].replace(',', '_')}/{cid}"
                    binaries[spec] = {"path": f"{stem}.{spec}.{sc['format']}",
                                      **{f: sc[f] for f in BINARY_FIELDS}}
                configs[cid] = {**_config_json(choice), "binaries": binaries}
            tables = {d: [[*key, cid] for key, cid in rows] for d, rows in sorted(ce.tables.items())}
            variant["targets"][e.target] = {"configs": configs, "tables": tables}
            used_targets.add(e.target)
    else:
        for e in plan.entries:
            variant = kernels[e.kernel]["variants"].setdefault(e.variant, {"assign": e.assignment, "targets": {}})
            configs: dict[str, Any] = {}
            tables: dict[str, list[list[Any]]] = {}
            for d, rows in e.tables.items():
                tables[d] = []
                for row in rows:
                    c = row.preferences[0]
                    configs[c.id] = _config_json(c)
                    tables[d].append([*row.key, c.id])
            variant["targets"][e.target] = {"configs": configs, "tables": tables}
            used_targets.add(e.target)
    targets = {}
    for t in sorted(used_targets):
        info = TARGETS[t]
        targets[t] = {"backend": info.backend, "arch": info.arch, "arch_specific": info.arch_specific,
                      "warp_size": info.warp_size}
    return {
        "format": INDEX_FORMAT, "name": m.project.name, "version": m.project.version,
        "forge_aot_version": __version__, "triton_version": triton_version,
        "manifest_sha256": plan.loaded.sha256, "targets": targets,
        "modules": {mod: {"path": module_paths[mod], "kernels": spec["kernels"], "ops": spec["ops"]}
                    for mod, spec in sorted(plan.modules.items())},
        "kernels": kernels,
    }
