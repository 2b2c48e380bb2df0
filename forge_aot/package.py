"""Stage 4: package. Lay out the generated package from dist_templates/ and build its wheel with `build`.

The generated project carries its own deterministic PEP 517 backend (dist_templates/_forge_build_backend.py),
so the wheel is built through the standard `build` front end, offline, and two builds of the same inputs
give the same bytes.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import string
import tempfile
import types
import zipfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from . import __version__
from .compiler import CompileReport
from .errors import PackageError
from .extension import FILENAME as EXTENSION_FILENAME
from .extension import Extension, build_extension, native_arch
from .index import build_index, path_component
from .plan import BuildPlan
from .runtime import rules
from .runtime.cold_binding import lean_plans
from .runtime.cold_launch import block_of
from .runtime.host_modules import op_table


def _block(kernel: Any, binary: dict[str, Any]) -> list[Any] | None:
    """A binary's parameter block as the lean path's C ``Launcher`` takes it (``cold_launch.block_of``), as JSON; None
    for a binary taking descriptors (host code passing one to a pointer parameter, the tutorial attention's on Hopper:
    the lean path hands such a call over)."""
    block = block_of(kernel, binary)
    return None if block is None else [list(block[0]), list(block[1]), list(block[2]), block[3]]


def reads_handle_attributes(host_source: str, kernels: Sequence[str]) -> bool:
    """Whether host code reads an attribute of one of its kernel handles (the Triton tutorials' fused softmax:
    ``softmax_kernel.warmup(...)``). A lean handle hands the package over to the full runtime there, in the middle of
    its module's binding, so the lean binding was work for nothing (about 2 ms on an H200, session 62): such a module
    gets no lean plan, and its first call binds it with the full runtime."""
    names = set(kernels)
    try:
        tree = ast.parse(host_source)
    except SyntaxError:  # (the index build parsed it already; kept conservative)
        return True
    return any(isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names
               for node in ast.walk(tree))


def _template(name: str) -> str:
    return resources.files("forge_aot.templates").joinpath(name).read_text(encoding="utf-8")


def _compact_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def _toml_str(value: str) -> str:
    return json.dumps(value)[1:-1]


def stage_package(plan: BuildPlan, report: CompileReport, binaries_dir: Path, stage_dir: Path,
                  triton_version: str) -> Path:
    """Write the generated project (pyproject, backend, package with binaries and index) into stage_dir, pure
    Python (``stage_platform`` then makes it a platform's)."""
    m = plan.loaded.manifest
    name = m.project.name
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    pkg = stage_dir / name
    (pkg / "_forge").mkdir(parents=True)
    (pkg / "_ops").mkdir()
    module_paths = {mod: f"_ops/{mod}.py" for mod in plan.modules}
    for mod, spec in plan.modules.items():
        # The kernel file with its Triton lines blanked, line numbers kept (see sourcesplit).
        (pkg / "_ops" / f"{mod}.py").write_text(spec["host_source"], encoding="utf-8")
    # Empty: the runtime makes the package without running it (lean.ops_package), which a first call pays for.
    (pkg / "_ops" / "__init__.py").write_text("", encoding="utf-8")
    local = {name: src for spec in plan.modules.values() for name, src in spec.get("local_sources", {}).items()}
    if local:
        # The project's own modules the host code imports (localmods.py): the runtime sends those imports here.
        base = pkg / "_ops" / "_local"
        base.mkdir()
        (base / "__init__.py").write_text('"""The project modules the host code imports."""\n', encoding="utf-8")
        for dotted, (text, package) in sorted(local.items()):
            if text is None:  # a host module of this package, imported by this name (index: "imported_as")
                continue
            parts = dotted.split(".")
            target = base.joinpath(*parts, "__init__.py") if package else base.joinpath(*parts[:-1],
                                                                                        f"{parts[-1]}.py")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    for shipped, source in sorted(plan.data_files.items()):
        # Data host code reads at run time (tuned-config JSON beside a kernel file), where its __file__ finds it.
        target = pkg / shipped
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(Path(source).read_bytes())
    index = build_index(plan, report, triton_version, module_paths)
    binaries: dict[str, str] = {}
    for spec in index["kernels"].values():
        for variant in spec["variants"].values():
            for tentry in variant["targets"].values():
                for cfg in tentry["configs"].values():
                    for b in cfg["binaries"].values():
                        rel = b["path"]
                        src = binaries_dir / rel.removeprefix("_forge/bin/")
                        data = src.read_bytes()
                        if hashlib.sha256(data).hexdigest() != b["sha256"]:
                            raise PackageError(f"{src}: contents do not match the sha256 its compile recorded")
                        dst = pkg / rel
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        dst.write_bytes(data)
                        sidecar = src.with_suffix(".json")
                        dst.with_suffix(".json").write_bytes(sidecar.read_bytes())
                        binaries[rel] = b["sha256"]
    # What lets `import <package>` serve a host module's first calls without the rest of the runtime (lean.py):
    # a plan per module, written from the runtime's own readings of a kernel, and each binary's parameter block.
    reading = {mod for mod, spec in index["modules"].items()
               if reads_handle_attributes(plan.modules[mod]["host_source"], spec["kernels"])}
    module_plans = {mod: lean for mod, (lean, _) in lean_plans(index, reading).items()
                    if mod not in reading and lean is not None}
    for kernel in sorted({kernel for lean in module_plans.values() for kernel, _ in lean.values()}):
        params = types.SimpleNamespace()
        rules.read_params(params, index["kernels"][kernel])
        for variant in index["kernels"][kernel]["variants"].values():
            for tentry in variant["targets"].values():
                for cfg in tentry["configs"].values():
                    for b in cfg["binaries"].values():
                        block = _block(params, b)
                        if block is not None:  # (none: Lean._launch's ``"block" not in best``)
                            b["block"] = block
    (pkg / "_forge" / "index.json").write_bytes(_json_bytes(index))
    # Per host module, the part of the index its kernels need, compact: an op's first call parses only these.
    # The configs and tables of each (kernel, variant, target) go to a file of their own
    # (modules/<module>/<kernel>/<variant dir>/<target>.json), read when a call first resolves to it, and each
    # config's binaries to another (<target>/<config>.json), so a first call parses only what it launches.
    (pkg / "_forge" / "modules").mkdir()
    for mod, spec in sorted(index["modules"].items()):
        shell: dict[str, Any] = {}
        lean = module_plans.get(mod)
        for k, kspec in sorted(index["kernels"].items()):
            if kspec["function"] not in spec["kernels"]:
                continue
            variants = {}
            for vid, variant in sorted(kspec["variants"].items()):
                files = f"{k}/{path_component(vid)}"
                base = pkg / "_forge" / "modules" / mod / files
                for target, tentry in sorted(variant["targets"].items()):
                    # the target's configs and tables; each config's binaries a file of their own, read when
                    # the config first launches (with their largest shared memory here, for the usable check)
                    (base / target).mkdir(parents=True, exist_ok=True)
                    configs = {}
                    for cid, cfg in sorted(tentry["configs"].items()):
                        bins = cfg.get("binaries", {})
                        (base / target / f"{path_component(cid)}.json").write_bytes(_compact_json(bins))
                        configs[cid] = {**{f: v for f, v in cfg.items() if f != "binaries"},
                                        "binaries_file": f"{target}/{path_component(cid)}.json",
                                        "max_shared": max((b["shared"] for b in bins.values()), default=0)}
                    (base / f"{target}.json").write_bytes(_compact_json({**tentry, "configs": configs}))
                variants[vid] = {**variant, "targets": sorted(variant["targets"]), "target_files": files}
            shell[k] = {**kspec, "variants": variants}
        part = {**{k: v for k, v in index.items() if k not in ("modules", "kernels")}, "modules": {mod: spec},
                "kernels": shell, "split_targets": True, **({"lean": lean} if lean is not None else {})}
        (pkg / "_forge" / "modules" / f"{mod}.json").write_bytes(_compact_json(part))
    # The index without its kernels: what binding a project module reads (which host module a name imports, the
    # import rules, torch.compile), which the whole index made a first call parse (9 ms for 62 kernels on an H200).
    (pkg / "_forge" / "modules.json").write_bytes(
        _compact_json({k: v for k, v in index.items() if k != "kernels"}))
    # The runtime package, copied verbatim (every import inside it is relative), and its optional C launch path.
    (pkg / "_runtime").mkdir()
    runtime_digest = hashlib.sha256()
    for module in sorted(resources.files("forge_aot.runtime").iterdir(), key=lambda m: m.name):
        if module.name.endswith(".py"):
            text = module.read_bytes()
            (pkg / "_runtime" / module.name).write_bytes(text)
            runtime_digest.update(module.name.encode() + b"\0" + hashlib.sha256(text).digest())
    build_info = {"name": name, "version": m.project.version, "forge_aot_version": __version__,
                  "triton_version": triton_version, "manifest_sha256": plan.loaded.sha256,
                  "targets": plan.targets, "binaries": dict(sorted(binaries.items())), "c_launch": None}
    (pkg / "_forge" / "build_info.json").write_bytes(_json_bytes(build_info))
    shutil.copyfile(resources.files("forge_aot.templates").joinpath("_forge_build_backend.py"),
                    stage_dir / "_forge_build_backend.py")
    ops = [spec.get("export_as", {}).get(op, op) for spec in plan.modules.values() for op in spec["ops"]]
    exports = {name: mod for mod, spec in sorted(plan.modules.items()) for name in spec.get("exports", ())}
    description = m.project.description or f"Triton kernels packaged ahead of time by forge-aot: {name}"
    values = {
        "runtime_sha256": runtime_digest.hexdigest(),
        "name": name, "version": m.project.version, "description": _toml_str(description),
        "requires_python": m.project.requires_python, "forge_version": __version__,
        "manifest_name": plan.loaded.path.name, "manifest_sha256": plan.loaded.sha256,
        "dependencies": ", ".join(json.dumps(d) for d in m.project.dependencies),
        "triton_version": triton_version, "targets": ", ".join(plan.targets),
        "exports": "".join(f'{op} = _exported["{op}"]\n' for op in ops),
        "exports_table": ", ".join(f"{n!r}: {mod!r}" for n, mod in exports.items()),
        "lazy_exports": _lazy_exports(exports),
        "all": ", ".join(json.dumps(op) for op in [*ops, *exports, "preload"]),
        "ops": ", ".join(f"`{op}`" for op in ops) or "none", "wheel_tag": "py3-none-any",
        "ops_table": ", ".join(f"{op!r}: {entry!r}" for op, entry in op_table(index["modules"]).items()),
        "lean_modules": "".join(f"{mod!r}, " for mod in sorted(module_plans)).rstrip(" "),
    }
    (stage_dir / "pyproject.toml").write_text(string.Template(_template("pyproject.toml.in")).substitute(values),
                                              encoding="utf-8")
    (stage_dir / "README.md").write_text(string.Template(_template("README.md.in")).substitute(
        {**values, "description": description}), encoding="utf-8")
    (pkg / "__init__.py").write_text(string.Template(_template("package_init.py.in")).substitute(
        {**values, "description": description}), encoding="utf-8")
    return stage_dir


def wheel_platforms(requested: Sequence[str]) -> list[tuple[str, bool]]:
    """``project.wheel-platforms`` resolved on this machine: (``any`` or an architecture, whether its C launch path
    must be built), in order, each once (``native``, best effort, is this machine's architecture)."""
    out: dict[str, bool] = {}
    for platform in requested:
        arch = native_arch() if platform == "native" else platform
        out[arch] = out.get(arch, False) or platform not in ("native", "any")
    return list(out.items())


def platform_extensions(platforms: list[tuple[str, bool]], work_dir: Path) -> dict[str, Extension]:
    """The runtime's C launch path compiled for each wheel platform (``any``: none), into ``work_dir``, before any
    kernel compiles: a required one that cannot be built fails the build at once (PackageError), not after
    minutes of kernel compiles."""
    out: dict[str, Extension] = {}
    for platform, required in platforms:
        if platform == "any":
            out[platform] = Extension(None, "py3-none-any",
                                      "pure Python wheel (wheel-platforms: any): launches through ctypes")
            continue
        target = work_dir / platform
        shutil.rmtree(target, ignore_errors=True)
        ext = build_extension(target, platform)
        if ext.path is None and required:
            raise PackageError(f"project.wheel-platforms lists {platform}, but its C launch path cannot be built: "
                               f"{ext.note}")
        out[platform] = ext
    return out


def stage_platform(stage_dir: Path, ext: Extension) -> None:
    """Make the staged project one platform's wheel: the runtime's C launch path ``ext`` (or none), the build
    info's record of it, the wheel tag."""
    pyproject = stage_dir / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    package = re.search(r'^package = "([^"]+)"$', text, re.M)
    assert package is not None, "a staged project names its package"
    runtime = stage_dir / package.group(1) / "_runtime"
    (runtime / EXTENSION_FILENAME).unlink(missing_ok=True)
    if ext.path is not None:
        shutil.copyfile(ext.path, runtime / EXTENSION_FILENAME)
    info_path = stage_dir / package.group(1) / "_forge" / "build_info.json"
    info = json.loads(info_path.read_bytes())
    info["c_launch"] = None if ext.path is None else {
        "file": f"_runtime/{EXTENSION_FILENAME}", "sha256": hashlib.sha256(ext.path.read_bytes()).hexdigest(),
        "wheel_tag": ext.tag}
    info_path.write_bytes(_json_bytes(info))
    pyproject.write_text(re.sub(r'^wheel-tag = "[^"]*"$', f'wheel-tag = "{ext.tag}"', text, count=1, flags=re.M),
                         encoding="utf-8")


def _lazy_exports(exports: dict[str, str]) -> str:
    """The generated ``__init__``'s exported classes and functions (manifest ``[exports]``): a module
    ``__getattr__`` (PEP 562) binds each one's host module on first access, so import stays lazy."""
    if not exports:
        return ""
    return """
# Classes and functions of the host files, exported as they are: each binds its host module on first access.
def __getattr__(name):
    if name in _EXPORTS:
        from ._runtime.exports import exported

        value = globals()[name] = exported(__name__, _EXPORTS[name], name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_EXPORTS})
"""


def build_wheel(stage_dir: Path, out_dir: Path) -> Path:
    """Build the staged project's wheel through the `build` front end (PEP 517), without network access."""
    import build
    import pyproject_hooks

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            builder = build.ProjectBuilder(str(stage_dir), runner=pyproject_hooks.quiet_subprocess_runner)
            produced = Path(builder.build("wheel", tmp))
        except build.BuildException as exc:
            raise PackageError(f"building the wheel failed: {exc}") from None
        except build.BuildBackendException as exc:
            raise PackageError(f"the build backend failed: {exc.exception}") from None
        target = out_dir / produced.name
        tmp_target = out_dir / f".{produced.name}.tmp"
        shutil.copyfile(produced, tmp_target)
        os.replace(tmp_target, target)
    return target


def read_wheel(path: Path) -> dict[str, Any]:
    """The index, build info and binary sizes of a forge-aot wheel (for ``forge-aot inspect``)."""
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise PackageError(f"{path}: not a wheel: {exc}") from None
    with zf:
        names = zf.namelist()
        index_name = next((n for n in names if n.endswith("/_forge/index.json") and n.count("/") == 2), None)
        if index_name is None:
            raise PackageError(f"{path}: not a forge-aot wheel (no <package>/_forge/index.json)")
        package = index_name.split("/")[0]
        index = json.loads(zf.read(index_name))
        build_info = json.loads(zf.read(f"{package}/_forge/build_info.json"))
        sizes = {n[len(package) + 1:]: zf.getinfo(n).file_size for n in names if n.startswith(package + "/")}
        compressed = {n[len(package) + 1:]: zf.getinfo(n).compress_size for n in names
                      if n.startswith(package + "/")}
    rows = []
    for kname, spec in index["kernels"].items():
        for vid, variant in spec["variants"].items():
            for target, tentry in variant["targets"].items():
                for cid, cfg in tentry["configs"].items():
                    rows.append({
                        "kernel": kname, "variant": vid, "target": target, "config": cid,
                        "rows": sum(1 for rows in tentry["tables"].values() for r in rows if r[-1] == cid),
                        "tables": sorted(tentry["tables"]),
                        "specializations": sorted(cfg["binaries"]),
                        "launch_heuristics": spec.get("launch_heuristics", []),
                        "bytes": sum(sizes[b["path"]] for b in cfg["binaries"].values()),
                        "shared": max(b["shared"] for b in cfg["binaries"].values()),
                    })
    tuning: dict[str, dict[str, Any]] = {}
    for spec in index["kernels"].values():
        for variant in spec["variants"].values():
            for target, tentry in variant["targets"].items():
                t = tuning.setdefault(target, {"tuned": 0, "aliased": 0, "untuned": 0, "devices": []})
                for origin, n in tentry.get("rows", {}).items():
                    t[origin] += n
                t["devices"] += [d for d in sorted(tentry["tables"]) if d != "default" and d not in t["devices"]]
    return {"wheel": str(path), "package": package, "size": path.stat().st_size, "tuning": tuning,
            "binary_bytes": sum(v for k, v in sizes.items() if k.startswith("_forge/bin/")),
            "binary_bytes_compressed": sum(v for k, v in compressed.items() if k.startswith("_forge/bin/")),
            "build_info": build_info, "ops": [m.get("export_as", {}).get(op, op) for m in index["modules"].values()
                                              for op in m["ops"]],
            "exports": [n for m in index["modules"].values() for n in m.get("exports", ())],
            "rows": rows}
