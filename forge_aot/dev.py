"""Development mode: the same host ops, run from the source tree through Triton's JIT.

The host code is taken from the kernel files exactly as the wheel packages it, the kernel names are bound to
handles with the wheel's selection rules (dtype build, table lookup, constraints), and the launch goes to
``jit_fn[grid](..., **config)`` so Triton compiles on demand. Needs triton and a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import ForgeError
from .index import build_index
from .manifest import load_manifest
from .plan import make_plan
from .templates import _forge_runtime as rt


class JitBackend:
    """Resolves tables like the packaged runtime; launches through Triton's JIT."""

    def __init__(self, functions: dict[str, Any]) -> None:
        self.functions = functions

    def resolve(self, kernel: rt.Kernel, variant: dict[str, Any], assignment: dict[str, Any],
                       device: int) -> tuple[str, rt.ConfigTable]:
        import torch

        props = torch.cuda.get_device_properties(device)
        if getattr(torch.version, "hip", None):
            target = rt.pick_hip_target(str(props.gcnArchName), kernel.targets)
        else:
            target = rt.pick_cuda_target((props.major, props.minor), kernel.targets)
        if target is None or target not in variant["targets"]:
            raise rt.UnsupportedDeviceError(f"{kernel.function}: the manifest lists no target for "
                                            f"{props.name}; built: {list(variant['targets'])}")
        entry = variant["targets"][target]
        constexprs = {k: v for k, v in assignment.items() if k in kernel.call_constexprs}
        configs = {cid: rt.Config(cid, c["meta"], c["num_warps"], c["num_stages"], constexprs)
                   for cid, c in entry["configs"].items()}
        rows = entry["tables"].get(props.name, entry["tables"]["default"])
        return target, rt.ConfigTable(kernel.function, kernel.spec["key"], rows, configs, kernel.constraints)

    def launch(self, kernel: rt.Kernel, state: Any, config: rt.Config, grid: Sequence[int],
               runtime: Sequence[Any], constexprs: dict[str, Any]) -> None:
        fn = self.functions[kernel.function]
        kwargs = dict(zip(kernel.runtime_names, runtime))
        fn[tuple(grid)](**kwargs, **config.meta, **constexprs, num_warps=config.num_warps,
                        num_stages=config.num_stages)


def load_dev_ops(manifest_path: str | Path, targets: list[str] | None = None) -> dict[str, Callable[..., Any]]:
    """The manifest's ops bound to Triton JIT kernels (for development and for benchmarks against JIT)."""
    import importlib.util
    import sys

    loaded = load_manifest(manifest_path)
    plan = make_plan(loaded, targets)
    index = build_index(plan, None, "jit", {m: str(spec["path"]) for m, spec in plan.modules.items()})
    functions: dict[str, Any] = {}
    for kp in plan.kernels.values():
        name = f"_forge_dev_kernels_{kp.module}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, kp.source)
            if spec is None or spec.loader is None:
                raise ForgeError(f"cannot import {kp.source}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        functions[kp.function] = getattr(module, kp.function)
    sources = {m: (spec["path"], spec["host_source"]) for m, spec in plan.modules.items()}
    return rt.bind_ops(f"_forge_dev_{loaded.manifest.project.name}", index, JitBackend(functions), sources)
