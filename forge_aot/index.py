"""The package index (``_forge/index.json``): what the runtime reads to bind kernels, tables and binaries.

Built from the plan and the compile report for a wheel, or from the plan alone for development mode (where
each row takes its first preference and Triton's JIT compiles it on demand).
"""

from __future__ import annotations

from typing import Any

from . import __version__
from .compiler import CompileReport
from .plan import BuildPlan, path_component
from .runtime import INDEX_FORMAT
from .targets import TARGETS

BINARY_FIELDS = ("function", "shared", "warp_size", "num_warps", "global_scratch_size", "global_scratch_align",
                 "profile_scratch_size", "profile_scratch_align", "sha256", "size", "arch", "spec", "heur")
DESCRIPTOR_FIELDS = ("descs", "tensordesc_meta")
"""Binaries of kernels that take host-side tensor descriptors: their block shapes and TMA metadata."""


def binary_path(sidecar: dict[str, Any], config_id: str, binary_id: str) -> str:
    variant, config = path_component(sidecar["variant"]), path_component(config_id)
    binary = path_component(binary_id)
    return f"_forge/bin/{sidecar['kernel']}/{sidecar['target']}/{variant}/{config}/{binary}.{sidecar['format']}"


def compile_reason(failures: list[str]) -> str:
    """The compiler's own words for why a variant did not compile (ptxas's first error line where there is one), in
    one short line for the index and the runtime's message."""
    for failure in failures:
        for line in failure.splitlines()[1:]:
            if "error" in line and ":" in line:
                return " ".join(line.split(":", 1)[1].split())[:240]
    first = failures[0].splitlines()[0] if failures else "no config compiled"
    return " ".join(first.split("): ", 1)[-1].split())[:240]


def build_index(plan: BuildPlan, report: CompileReport | None, triton_version: str,
                module_paths: dict[str, str]) -> dict[str, Any]:
    m = plan.loaded.manifest
    kernels = {name: kp.spec_json() for name, kp in plan.kernels.items()}
    used_targets: set[str] = set()
    if report is not None:
        for ce in report.entries:
            e = ce.entry
            variant = kernels[e.kernel]["variants"].setdefault(e.variant, {"assign": e.assignment, "targets": {}})
            configs = {}
            for cid, choice in sorted(ce.configs.items()):
                binaries = {bid: {"path": binary_path(sc, cid, bid), **{f: sc[f] for f in BINARY_FIELDS},
                                  **{f: sc[f] for f in DESCRIPTOR_FIELDS if f in sc}}
                            for bid, sc in sorted(ce.binaries[cid].items())}
                configs[cid] = {**choice.to_json(), "binaries": binaries}
            tables = {d: [[*key, cid] for key, cid in rows] for d, rows in sorted(ce.tables.items())}
            variant["targets"][e.target] = {"configs": configs, "tables": tables, "rows": e.origin_counts()}
            used_targets.add(e.target)
        for err in report.left_out:  # a kernel's optional target where this variant did not compile
            variant = kernels[err.kernel]["variants"][err.variant]
            variant.setdefault("not_built", {})[err.target] = compile_reason(err.failures)
    else:
        for e in plan.entries:
            variant = kernels[e.kernel]["variants"].setdefault(e.variant, {"assign": e.assignment, "targets": {}})
            configs: dict[str, Any] = {}
            tables: dict[str, list[list[Any]]] = {}
            for d, rows in e.tables.items():
                tables[d] = []
                for row in rows:
                    c = row.preferences[0]
                    configs[c.id] = c.to_json()
                    tables[d].append([*row.key, c.id])
            variant["targets"][e.target] = {"configs": configs, "tables": tables, "rows": e.origin_counts()}
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
        "modules": {mod: {"path": module_paths[mod], "kernels": spec["kernels"], "ops": spec["ops"],
                          "schemas": {op: s for op, s in spec.get("schemas", {}).items() if s},
                          **({"autograd": spec["autograd"]} if spec.get("autograd") else {}),
                          **({"exports": spec["exports"]} if spec.get("exports") else {}),
                          **({"export_as": spec["export_as"]} if spec.get("export_as") else {}),
                          **({"results": spec["results"]} if spec.get("results") else {}),
                          **({"buffers": spec["buffers"]} if spec.get("buffers") else {}),
                          **({"takes": spec["takes"]} if spec.get("takes") else {}),
                          **({"local_modules": sorted(spec["local_sources"])} if spec.get("local_sources") else {}),
                          **({"package": spec["package"]} if spec.get("package") else {}),
                          **{k: spec[k] for k in ("imported_as", "imports_host") if spec.get(k)},
                          **({"torch_compile": True} if _compiles(spec.get("host_source")) else {})}
                    for mod, spec in sorted(plan.modules.items())},
        "kernels": kernels,
        **({"local_torch_compile": compiling} if (compiling := sorted(
            {name for spec in plan.modules.values() for name, (text, *_) in spec.get("local_sources", {}).items()
             if _compiles(text)})) else {}),
    }


def _compiles(source: str | None) -> bool:
    """Whether shipped code names ``torch.compile`` (Cut Cross-Entropy's ``@torch.compile`` helpers, in a host module
    or a project module): the runtime then runs that module's code so that a process without Triton runs those
    helpers eagerly (``host_exec.run_module_code``). Decided here, from the source, so that no other module's
    first load pays for it."""
    return "torch.compile" in (source or "")
