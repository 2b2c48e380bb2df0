"""How a call's config and binary are chosen, read alike by every binding (full, cold, lean): variant ids, the
binary of a call's heuristic values and specializations, what heuristics see, ``Config``. Apart from ``rules`` so the
lean first calls read them without loading ``rules`` and ``packing``. Imports: ``basics``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .basics import spec_fits, spec_rank


def variant_id(assignment: dict[str, Any], axes: Sequence[str]) -> str:
    """Text id of a build variant in the kernel's canonical axis order, e.g. ``T=fp16,BLOCK_SIZE=1024``:
    ``axes`` is the one order used everywhere (build, index, runtime, dev mode): type variables, then
    call-site constexprs in parameter order, then call-site launch options; ``base`` when there are none."""
    return ",".join(f"{name}={assignment[name]}" for name in axes) or "base"


def best_binary(binaries: dict[str, dict[str, Any]], names: Sequence[str], heur: tuple[Any, ...], spec: str,
                keep: Any = None) -> dict[str, Any] | None:
    """The binary of a config serving a call (every binding chooses so: full, cold, lean): the heuristic values
    ``heur`` (of the parameters ``names``), every specialization assumption true for the call (``spec``),
    ``keep(binary)`` where given, the most specialized such (the generic one assumes nothing, so it always fits);
    None where none is."""
    best: dict[str, Any] | None = None
    for b in binaries.values():
        if tuple(b.get("heur", {}).get(n) for n in names) != heur or not spec_fits(b["spec"], spec):
            continue
        if keep is not None and not keep(b):
            continue
        if best is None or spec_rank(b["spec"]) > spec_rank(best["spec"]):
            best = b
    return best


def named_args(runtime_names: Sequence[str], runtime: Sequence[Any], call: dict[str, Any],
               config: Config) -> dict[str, Any]:
    """What Triton's heuristics, pre-hooks and grid functions see: every argument by name, the call-site values and
    the config's keyword arguments."""
    return {**dict(zip(runtime_names, runtime)), **call, **config.all_kwargs()}


def run_heuristics(heuristics: Sequence[tuple[str, Any]], names: Sequence[str], nargs: dict[str, Any],
                   ) -> tuple[Any, ...]:
    """``@triton.heuristics`` values in registration order, each added to ``nargs`` (the arguments by name) as it is
    computed; their values in ``names`` order."""
    for name, fn in heuristics:
        nargs[name] = fn(nargs)
    return tuple(nargs[n] for n in names)


class Config:
    """One compiled config: tuned meta-parameter values plus the launch options it was compiled with."""

    __slots__ = ("id", "launch_meta", "maxnreg", "meta", "num_stages", "num_warps", "pre_hook")

    def __init__(self, cid: str, meta: dict[str, Any], num_warps: int, num_stages: int,
                 call_constexprs: dict[str, Any], maxnreg: int | None = None, pre_hook: str | None = None) -> None:
        self.id = cid
        self.meta = dict(meta)
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.maxnreg = maxnreg
        self.pre_hook = pre_hook
        # What a grid function sees, as with Triton: meta-parameters, call-site constexprs, warps, stages.
        self.launch_meta = {**meta, **call_constexprs, "num_warps": num_warps, "num_stages": num_stages}

    @classmethod
    def from_entry(cls, cid: str, entry: dict[str, Any], call_values: dict[str, Any]) -> Config:
        """The config of an index entry (its meta-parameters, warps, stages, maxnreg, pre-hook) for a call's build
        values (``call_values``: its call-site constexprs and launch options), as every binding makes it."""
        return cls(cid, entry["meta"], entry["num_warps"], entry["num_stages"], call_values, entry.get("maxnreg"),
                   entry.get("pre_hook"))

    def all_kwargs(self) -> dict[str, Any]:
        """As ``triton.Config.all_kwargs()``: what heuristics and pre-hooks see of the config."""
        out = {**self.meta, "num_warps": self.num_warps, "num_ctas": 1, "num_stages": self.num_stages}
        if self.maxnreg is not None:
            out["maxnreg"] = self.maxnreg
        return out

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v}" for k, v in self.meta.items())
        return f"Config({items}, num_warps={self.num_warps}, num_stages={self.num_stages})"


def grid_dims(grid: Any, meta: dict[str, Any], names: Sequence[str], heur: tuple[Any, ...], nargs: Any) -> Any:
    """A launch's grid as ``Kernel.run`` computes it: a grid function called with the config's launch meta and the
    heuristic values, or, where it raises KeyError (it reads an argument by name, as Triton allows), with the
    arguments by name (``nargs()``)."""
    if not callable(grid):
        return grid
    try:
        return grid({**meta, **dict(zip(names, heur))} if heur else meta)
    except KeyError:
        return grid(nargs())
