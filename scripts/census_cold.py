"""Which kernels and host modules of a manifest the first call's cold handles serve (``runtime/cold_binding``),
and which host modules get a lean plan (``cold_binding.lean_plan``: served by ``import <package>``'s lean path
where the package routes no op by name).

Reads the build's plan (compiles nothing: ``make_plan`` and the index as a build without binaries writes it) and
asks the runtime's own ``plain_kernel`` / ``plain_module`` / ``lean_plan`` of each kernel and host module, then says
why each other one needs the full binding. Usage::

    python scripts/census_cold.py kernel_manifest.toml tests/fixtures/realworld/kernel_manifest.toml [--json F]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from typing import Any

from forge_aot import __version__
from forge_aot.index import build_index
from forge_aot.manifest import load_manifest
from forge_aot.package import reads_handle_attributes
from forge_aot.plan import make_plan
from forge_aot.runtime import cold_binding


def census(manifest: str) -> dict[str, Any]:
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    index = build_index(plan, None, "census", {mod: f"{mod}.py" for mod in plan.modules})
    kernels = {name: [why] if (why := cold_binding.not_plain(spec)) else [] for name, spec in index["kernels"].items()}
    modules: dict[str, list[str]] = {}
    for mod, spec in index["modules"].items():
        why = [f"kernel {s['function']}" for s in index["kernels"].values()
                if s.get("module", mod) == mod and s["function"] in spec["kernels"] and not
                cold_binding.plain_kernel(s)]
        if not why and cold_binding.plain_module(index, mod) is None:
            why.append("other")
        modules[mod] = why
    reading = {mod for mod, spec in index["modules"].items()  # (as package.stage_package decides)
               if reads_handle_attributes(plan.modules[mod]["host_source"], spec["kernels"])}
    plans = cold_binding.lean_plans(index, reading)
    no_lean = {mod: "reads a kernel handle's attribute" if mod in reading else plans[mod][1]
               for mod in index["modules"]}
    lean = sorted(mod for mod, why in no_lean.items() if why is None)
    routed = any(spec.get("autograd") or spec.get("exports") for spec in index["modules"].values())
    return {"manifest": manifest, "forge_aot": __version__, "routed": routed, "kernels": kernels, "modules": modules,
            "lean": lean, "no_lean": {mod: why for mod, why in sorted(no_lean.items()) if why}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifests", nargs="+")
    parser.add_argument("--json", help="write the census here")
    args = parser.parse_args()
    out = [census(m) for m in args.manifests]
    for c in out:
        plain = [k for k, why in c["kernels"].items() if not why]
        cold = [m for m, why in c["modules"].items() if not why]
        routed = " (ops routed by name: autograd or exports)" if c["routed"] else ""
        print(f"{c['manifest']}: {len(plain)}/{len(c['kernels'])} kernels plain, {len(cold)}/{len(c['modules'])} "
              f"host modules bind cold handles{routed}")
        print(f"  {len(c['lean'])}/{len(c['modules'])} host modules with a lean plan: {' '.join(c['lean'])}")
        for reason, count in collections.Counter(c["no_lean"].values()).most_common():
            print(f"  {count:4d} host modules without a lean plan: {reason}")
        counts = collections.Counter(r for why in c["kernels"].values() for r in why)
        for reason, count in counts.most_common():
            print(f"  {count:4d} kernels: {reason}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
