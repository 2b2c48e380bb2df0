"""Stage 2: manifest → plan. Which binaries to compile and which config each table row starts with.

Per (kernel, variant, target) an entry holds its table rows; each row carries its preference list of
configs: the tuned config (tuning data), then the manifest's explicit default, then every candidate of the
tuning space in listed order that satisfies the constraints for that row. The compile stage starts with each
row's first choice and walks down a row's list only when that config fails to compile.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import manifest as mf
from .errors import ManifestError, SourceError, close_match
from .sourcesplit import SourceFile, parse_source
from .targets import TARGETS
from .templates._forge_runtime import Expression, variant_id

SPECIALIZATIONS = ("aligned", "generic")
"""aligned: every pointer 16-byte aligned and every integer argument divisible by 16 (what Triton's JIT
assumes when the values allow it); generic: no assumption, correct for any valid input. Integer arguments
equal to 1 are never specialized."""

TUNING_FORMAT = 1
_DIVISIBLE_INTS = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")


@dataclass(frozen=True)
class ConfigChoice:
    """One point of a tuning space."""

    meta: dict[str, Any]
    num_warps: int
    num_stages: int

    @property
    def id(self) -> str:
        parts = [f"{k}{v}" for k, v in self.meta.items()]
        return "-".join([*parts, f"w{self.num_warps}", f"s{self.num_stages}"])

    @property
    def env(self) -> dict[str, Any]:
        return {**self.meta, "num_warps": self.num_warps, "num_stages": self.num_stages}

    @classmethod
    def from_flat(cls, flat: dict[str, Any], space: mf.TuneSpace) -> ConfigChoice:
        meta = {k: flat[k] for k in space.meta}
        return cls(meta, int(flat.get("num_warps", space.num_warps[0])),
                   int(flat.get("num_stages", space.num_stages[0])))

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "num_warps": self.num_warps, "num_stages": self.num_stages}


@dataclass(frozen=True)
class CompileJob:
    """One binary: kernel × variant × config × target × specialization."""

    kernel: str
    function: str
    source: str
    variant: str
    target: str
    config: ConfigChoice
    specialization: str
    signature: dict[str, str]
    """Every parameter of the function in order: a concrete type, or ``constexpr``."""
    constexprs: dict[str, Any]
    divisible: tuple[int, ...]
    """Parameter indices given ``tt.divisibility = 16``."""
    timeout: float

    @property
    def binary_stem(self) -> str:
        return f"{self.kernel}/{self.target}/{self.variant.replace(',', '_')}/{self.config.id}.{self.specialization}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["config"] = self.config.to_json()
        return d


@dataclass
class TableRow:
    key: tuple[int, ...]
    preferences: list[ConfigChoice]
    """Configs in order of preference; the first that compiles is the row's config."""


@dataclass
class EntryPlan:
    """One kernel variant on one target: its tables (``default`` and per GPU model) and call constraints."""

    kernel: str
    variant: str
    assignment: dict[str, Any]
    target: str
    tables: dict[str, list[TableRow]] = field(default_factory=dict)
    table_sources: dict[str, str] = field(default_factory=dict)


@dataclass
class KernelPlan:
    name: str
    entry: mf.KernelEntry
    function: str
    source: Path
    params: list[tuple[str, str]]
    """(name, type) in function order; type ``meta`` for tuned constexprs, ``constexpr`` for call-site ones."""
    constexpr_defaults: dict[str, Any]
    module: str


@dataclass
class BuildPlan:
    """Everything the compile and package stages need."""

    loaded: mf.LoadedManifest
    targets: list[str]
    kernels: dict[str, KernelPlan]
    entries: list[EntryPlan]
    modules: dict[str, dict[str, Any]]
    """Host modules by name: kernel file path, kernels bound, ops exported, blanked host source."""

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": str(self.loaded.path), "manifest_sha256": self.loaded.sha256, "targets": self.targets,
            "kernels": {n: {"function": k.function, "source": str(k.source), "params": k.params}
                        for n, k in self.kernels.items()},
            "entries": [{"kernel": e.kernel, "variant": e.variant, "target": e.target,
                         "tables": {dev: [{"key": list(r.key), "preferences": [c.id for c in r.preferences]}
                                          for r in rows] for dev, rows in e.tables.items()},
                         "table_sources": e.table_sources} for e in self.entries],
        }


def _kernel_params(name: str, k: mf.KernelEntry, src: SourceFile,
                   func: str) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    at = f"kernels.{name}"
    if func not in src.kernels:
        raise ManifestError(f"no @triton.jit function '{func}' in {src.path.name} (found: "
                            f"{', '.join(src.kernels)})", key_path=f"{at}.source",
                            suggestion=close_match(func, src.kernels))
    params: list[tuple[str, str]] = []
    defaults: dict[str, Any] = {}
    names = [p.name for p in src.kernels[func]]
    for p in src.kernels[func]:
        if p.constexpr:
            if p.name in k.tune.meta:
                params.append((p.name, "meta"))
            elif p.name in k.constexprs:
                params.append((p.name, "constexpr"))
                if p.has_default:
                    defaults[p.name] = p.default
            else:
                raise ManifestError(f"constexpr parameter '{p.name}' of {func} is neither tuned (tune.meta) nor "
                                    "listed in constexprs", key_path=f"{at}.tune.meta")
        elif p.name in k.signature:
            params.append((p.name, k.signature[p.name]))
        elif p.name in k.tune.meta or p.name in k.constexprs:
            raise ManifestError(f"parameter '{p.name}' of {func} is not annotated tl.constexpr",
                                key_path=f"{at}.tune.meta" if p.name in k.tune.meta else f"{at}.constexprs")
        else:
            raise ManifestError(f"runtime parameter '{p.name}' of {func} has no type",
                                key_path=f"{at}.signature")
    for listed, path in ((k.signature, "signature"), (k.tune.meta, "tune.meta"), (k.constexprs, "constexprs")):
        for n in listed:
            if n not in names:
                raise ManifestError(f"{func} has no parameter '{n}'", key_path=f"{at}.{path}.{n}",
                                    suggestion=close_match(n, names))
    return params, defaults


def _concrete(ty: str, assignment: dict[str, Any]) -> str:
    if ty.startswith("*"):
        return "*" + str(assignment.get(ty[1:], ty[1:]))
    return ty


def _preferences(k: mf.KernelEntry, key: tuple[int, ...], assignment: dict[str, Any],
                 tuned: ConfigChoice | None, candidates: list[ConfigChoice],
                 constraints: list[Expression]) -> list[ConfigChoice]:
    env_key = {**dict(zip(k.key, key)), **{c: assignment[c] for c in k.constexprs}}

    def ok(c: ConfigChoice) -> bool:
        env = {**c.env, **env_key}
        return all(x(env) for x in constraints)

    prefs: list[ConfigChoice] = []
    if tuned is not None:
        prefs.append(tuned)
    if k.tune.default is not None:
        d = ConfigChoice.from_flat(k.tune.default, k.tune)
        if ok(d):
            prefs.append(d)
    prefs += [c for c in candidates if ok(c)]
    seen: set[str] = set()
    return [c for c in prefs if not (c.id in seen or seen.add(c.id))]  # type: ignore[func-returns-value]


def load_tuning_data(directory: Path) -> list[dict[str, Any]]:
    """Every tuning-data file of a directory (``*.json``), each checked for format and fields."""
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ManifestError(f"unreadable tuning data: {exc}", file=str(path)) from None
        if data.get("format") != TUNING_FORMAT:
            raise ManifestError(f"format must be {TUNING_FORMAT}", file=str(path), key_path="format")
        for key in ("kernel", "target", "entries"):
            if key not in data:
                raise ManifestError("required key is missing", file=str(path), key_path=key)
        data["_path"] = str(path)
        out.append(data)
    return out


def make_plan(loaded: mf.LoadedManifest, targets: list[str] | None = None) -> BuildPlan:
    """Resolve sources, variants, tables and config preferences. Imports nothing, compiles nothing."""
    m = loaded.manifest
    root = loaded.root
    chosen = list(targets) if targets else list(m.project.targets)
    for t in chosen:
        if t not in TARGETS:
            raise ManifestError(f"unknown target '{t}' (accepted: {', '.join(TARGETS)})", key_path="--target",
                                suggestion=close_match(t, TARGETS))
    sources: dict[Path, SourceFile] = {}
    kernels: dict[str, KernelPlan] = {}
    modules: dict[str, dict[str, Any]] = {}
    for name, k in m.kernels.items():
        file, _, func = k.source.rpartition(":")
        path = (root / file).resolve()
        if path not in sources:
            sources[path] = parse_source(path)
        src = sources[path]
        try:
            params, defaults = _kernel_params(name, k, src, func)
        except ManifestError as exc:
            exc.file = str(loaded.path)
            raise
        module = path.stem
        kernels[name] = KernelPlan(name, k, func, path, params, defaults, module)
        mod = modules.setdefault(module, {"path": str(path), "kernels": [], "ops": [],
                                          "host_source": src.host_source})
        if mod["path"] != str(path):
            raise ManifestError(f"two kernel files are named {path.name}; host modules are named after "
                                "their file", file=str(loaded.path), key_path=f"kernels.{name}.source")
        mod["kernels"].append(func)
        for i, op in enumerate(k.ops):
            if op not in src.host_functions:
                raise ManifestError(f"no host function '{op}' in {file}", file=str(loaded.path),
                                    key_path=f"kernels.{name}.ops[{i}]",
                                    suggestion=close_match(op, src.host_functions))
            if op not in mod["ops"]:
                mod["ops"].append(op)
    for path, src in sources.items():
        declared = {kp.function for kp in kernels.values() if kp.source == path}
        exported = {op for kp in kernels.values() if kp.source == path for op in kp.entry.ops}
        for fn, refs in sorted(src.kernel_refs.items()):
            if fn not in exported:
                continue  # an unexported helper; it is not reachable from the package's ops
            for kern in sorted(refs - declared):
                raise SourceError(f"{path}: host function '{fn}' launches '{kern}', which has no entry in "
                                  f"{loaded.path.name}")
    tuning = load_tuning_data(root / m.project.tuning_data) if m.project.tuning_data else []
    entries: list[EntryPlan] = []
    for name, kp in kernels.items():
        k = kp.entry
        constraints = [Expression(c) for c in k.tune.constraints]
        candidates = [ConfigChoice.from_flat(c, k.tune) for c in mf.candidates(k)]
        rows = mf.shape_rows(k)
        for assignment in mf.variants(k):
            vid = variant_id(assignment)
            for target in chosen:
                entry = EntryPlan(name, vid, assignment, target)
                per_device: dict[str, dict[tuple[int, ...], ConfigChoice]] = {}
                for data in tuning:
                    if data["kernel"] != name or data["target"] != target:
                        continue
                    device = data.get("device") or "default"
                    for i, e in enumerate(data["entries"]):
                        if variant_id(e.get("variant", {})) != vid:
                            continue
                        try:
                            key = tuple(int(e["key"][n]) for n in k.key)
                            choice = ConfigChoice.from_flat(e["config"], k.tune)
                        except (KeyError, TypeError, ValueError) as exc:
                            raise ManifestError(f"bad tuning entry: {exc!r}", file=data["_path"],
                                                key_path=f"entries[{i}]") from None
                        per_device.setdefault(device, {})[key] = choice
                        entry.table_sources[device] = data["_path"]
                devices = {"default": None, **{d: d for d in per_device if d != "default"}}
                for device in devices:
                    tuned = per_device.get(device, {})
                    # A GPU-model table holds that model's tuned rows; the default table every manifest row.
                    keys = list(tuned) if device != "default" else list(dict.fromkeys([*rows, *tuned]))
                    table = []
                    for key in keys:
                        prefs = _preferences(k, key, assignment, tuned.get(key), candidates, constraints)
                        if not prefs:
                            raise ManifestError(f"no config of the tuning space satisfies the constraints for "
                                                f"{dict(zip(k.key, key))} [{vid}]", file=str(loaded.path),
                                                key_path=f"kernels.{name}.tune.constraints")
                        table.append(TableRow(key, prefs))
                    entry.tables[device] = table
                    entry.table_sources.setdefault(device, "manifest default")
                entries.append(entry)
    return BuildPlan(loaded, chosen, kernels, entries, modules)


def job_for(plan: BuildPlan, entry: EntryPlan, config: ConfigChoice, specialization: str) -> CompileJob:
    kp = plan.kernels[entry.kernel]
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    divisible = []
    for i, (pname, ty) in enumerate(kp.params):
        if ty == "meta":
            signature[pname] = "constexpr"
            constexprs[pname] = config.meta[pname]
        elif ty == "constexpr":
            signature[pname] = "constexpr"
            constexprs[pname] = entry.assignment[pname]
        else:
            concrete = _concrete(ty, entry.assignment)
            signature[pname] = concrete
            if specialization == "aligned" and (concrete.startswith("*") or (
                    concrete in _DIVISIBLE_INTS and (kp.entry.divisible is None or pname in kp.entry.divisible))):
                divisible.append(i)
    # Relative to the manifest: Triton records the source path in the binary's line info, and a path that
    # does not depend on the checkout keeps builds of the same inputs byte-identical on any machine.
    try:
        source = kp.source.relative_to(plan.loaded.root).as_posix()
    except ValueError:
        source = str(kp.source)
    return CompileJob(kernel=entry.kernel, function=kp.function, source=source, variant=entry.variant,
                      target=entry.target, config=config, specialization=specialization, signature=signature,
                      constexprs=constexprs, divisible=tuple(divisible),
                      timeout=plan.loaded.manifest.project.compile_timeout)
