"""Search strategies: small classes over one base, each a function from candidates and a benchmark to results.

- ``ExhaustiveSearch`` benchmarks every candidate (in preference order, so early exit has a good bar soon).
- ``GuidedSearch`` is the profiling-driven search of the TritonForge idea, for large spaces: it benchmarks a
  diverse seed set, classifies the row as memory-, compute- or latency-bound from the best seed's achieved
  throughput against the device's measured ceilings (and, for latency, its absolute time), prunes the
  candidates that the compiled metadata says cannot suit that bound, then repeatedly fits a ridge regression
  of log-time on the configs (one-hot parameter values plus the binary's occupancy, waves and registers) and
  benchmarks the best predicted, until ``budget`` × the space has been benchmarked.

Neither strategy keeps state between rows: everything a search learns is in its result.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..plan import ConfigChoice
from .timing import TimingStats

BOUNDS = ("memory", "compute", "latency")


@dataclass
class Candidate:
    """A config with what its compiled binary and its first run said (``features``)."""

    cid: str
    config: ConfigChoice
    features: dict[str, Any] = field(default_factory=dict)
    """``programs``, ``occupancy`` (blocks per multiprocessor), ``regs``, ``local_bytes``, ``shared``…"""


@dataclass(frozen=True)
class Ceilings:
    """The device's measured ceilings."""

    bytes_per_s: float
    flops: float
    sms: int


Measure = Callable[[list[Candidate], float | None], dict[str, TimingStats | None]]
"""Benchmark a batch (with the best time so far, for early exit): config id → statistics, None if it failed."""


@dataclass
class SearchContext:
    space: int
    """Size of the row's space (what the budget is a fraction of)."""
    ceilings: Ceilings
    measure: Measure
    bytes: float | None = None
    """Bytes one call moves (for memory throughput)."""
    flops: float | None = None
    """Floating-point operations of one call."""


@dataclass
class SearchOutcome:
    times: dict[str, TimingStats]
    """Benchmarked candidates that ran."""
    failed: list[str]
    """Benchmarked candidates that failed."""
    pruned: dict[str, str] = field(default_factory=dict)
    """Candidates left out by the search, and why."""
    bound: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def benchmarked(self) -> int:
        return len(self.times) + len(self.failed)

    def best(self) -> str | None:
        ok = {c: s for c, s in self.times.items() if not s.early_exit}
        return min(ok, key=lambda c: ok[c].median_ms) if ok else None


def classify(best_ms: float, ctx: SearchContext) -> tuple[str, dict[str, float]]:
    """Memory-, compute- or latency-bound, from the achieved fraction of each ceiling at the best time."""
    seconds = best_ms / 1e3
    bw = (ctx.bytes / seconds / ctx.ceilings.bytes_per_s) if ctx.bytes else 0.0
    fl = (ctx.flops / seconds / ctx.ceilings.flops) if ctx.flops else 0.0
    evidence = {"bandwidth_fraction": round(bw, 4), "flops_fraction": round(fl, 4), "best_ms": best_ms}
    if max(bw, fl) < 0.25 and best_ms < 0.02:
        return "latency", evidence
    return ("compute" if fl > bw else "memory"), evidence


class SearchStrategy(ABC):
    name: ClassVar[str]

    @abstractmethod
    def search(self, candidates: list[Candidate], ctx: SearchContext) -> SearchOutcome:
        """Benchmark some of ``candidates`` (preference order, the untuned default first) through ``ctx``."""


def _collect(outcome: SearchOutcome, results: dict[str, TimingStats | None]) -> float | None:
    for cid, stats in results.items():
        if stats is None:
            outcome.failed.append(cid)
        else:
            outcome.times[cid] = stats
    best = outcome.best()
    return outcome.times[best].median_ms if best else None


class ExhaustiveSearch(SearchStrategy):
    name = "exhaustive"

    def __init__(self, batch: int = 16) -> None:
        self.batch = batch

    def search(self, candidates: list[Candidate], ctx: SearchContext) -> SearchOutcome:
        outcome = SearchOutcome({}, [])
        best: float | None = None
        for i in range(0, len(candidates), self.batch):
            best = _collect(outcome, ctx.measure(candidates[i:i + self.batch], best))
        if best is not None:
            outcome.bound, evidence = classify(best, ctx)
            outcome.notes.append(f"bound: {outcome.bound} {evidence}")
        return outcome


def _log2(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return 0.0
    return math.log2(x) if x > 0 else 0.0


def _parameters(c: Candidate) -> dict[str, Any]:
    return {**c.config.meta, "num_warps": c.config.num_warps, "num_stages": c.config.num_stages}


def _numeric(c: Candidate, sms: int) -> dict[str, float]:
    f = c.features
    programs = float(f.get("programs", 0) or 0)
    occupancy = float(f.get("occupancy", 1) or 1)
    slots = max(sms * occupancy, 1.0)
    waves = programs / slots
    tail = waves / math.ceil(waves) if waves > 0 else 0.0
    return {"log_programs": _log2(programs), "occupancy": occupancy,
            "active_warps": occupancy * c.config.num_warps, "log_regs": _log2(f.get("regs", 0)),
            "tail": tail, "under_filled": 1.0 if programs < sms else 0.0}


class _Ridge:
    """Ridge regression (closed form, pure Python): small dense problems only."""

    def __init__(self, rows: list[list[float]], y: list[float], lam: float = 0.3) -> None:
        d = len(rows[0]) if rows else 0
        self.mean = [sum(r[j] for r in rows) / len(rows) for j in range(d)]
        self.scale = [max(1e-9, math.sqrt(sum((r[j] - self.mean[j]) ** 2 for r in rows) / len(rows)))
                      for j in range(d)]
        z = [[(r[j] - self.mean[j]) / self.scale[j] for j in range(d)] for r in rows]
        self.y0 = sum(y) / len(y)
        a = [[sum(z[i][p] * z[i][q] for i in range(len(z))) + (lam if p == q else 0.0) for q in range(d)]
             for p in range(d)]
        b = [sum(z[i][p] * (y[i] - self.y0) for i in range(len(z))) for p in range(d)]
        self.w = _solve(a, b)

    def predict(self, row: list[float]) -> float:
        return self.y0 + sum(w * (x - m) / s for w, x, m, s in zip(self.w, row, self.mean, self.scale))


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(b)
    m = [[*row[:], b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            continue
        for r in range(n):
            if r != col:
                factor = m[r][col] / m[col][col]
                if factor:
                    m[r] = [x - factor * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] if abs(m[i][i]) > 1e-12 else 0.0 for i in range(n)]


class GuidedSearch(SearchStrategy):
    """Seeds, bound classification and pruning, then a surrogate-ordered search within a budget."""

    name = "guided"

    def __init__(self, budget: float = 0.25, batch: int = 4, seed_share: float = 0.4, min_budget: int = 12) -> None:
        self.budget = budget
        self.batch = batch
        self.seed_share = seed_share
        self.min_budget = min_budget

    def limit(self, n_candidates: int, space: int) -> int:
        return max(min(n_candidates, self.min_budget), math.floor(self.budget * space))

    def _vector(self, c: Candidate, names: list[str]) -> list[float]:
        p = _parameters(c)
        return [_log2(p.get(n, 0)) for n in names]

    def _seeds(self, candidates: list[Candidate], k: int) -> list[Candidate]:
        """The default, then greedy max-min distance over normalised log2 parameter values (deterministic)."""
        names = sorted({n for c in candidates for n in _parameters(c)})
        vecs = {c.cid: self._vector(c, names) for c in candidates}
        spans = [max(v[j] for v in vecs.values()) - min(v[j] for v in vecs.values()) or 1.0
                 for j in range(len(names))]
        chosen = [candidates[0]]
        dist = {c.cid: math.inf for c in candidates}
        while len(chosen) < min(k, len(candidates)):
            last = vecs[chosen[-1].cid]
            for c in candidates:
                d = sum(((a - b) / s) ** 2 for a, b, s in zip(vecs[c.cid], last, spans))
                dist[c.cid] = min(dist[c.cid], d)
            nxt = max((c for c in candidates if c not in chosen), key=lambda c: dist[c.cid])
            chosen.append(nxt)
        return chosen

    def _prune(self, pool: list[Candidate], everyone: list[Candidate], bound: str,
               sms: int) -> dict[str, str]:
        """Candidates the bound rules out, by what the compiled binary says (never all of them)."""
        out: dict[str, str] = {}
        filled = any(float(c.features.get("programs", 0) or 0) >= sms for c in everyone)
        if bound == "memory":
            # (Not by warps in flight: a GEMV-like row is fastest with few, deep tiles.)
            for c in pool:
                if filled and float(c.features.get("programs", 0) or 0) < sms / 2:
                    out[c.cid] = "memory-bound: fills under half the multiprocessors where others fill them all"
        elif bound == "compute":
            for c in pool:
                if filled and float(c.features.get("programs", 0) or 0) < sms / 4:
                    out[c.cid] = "compute-bound: fills under a quarter of the multiprocessors"
        elif bound == "latency":
            top = max(float(c.features.get("programs", 0) or 0) for c in everyone)
            for c in pool:
                if float(c.features.get("programs", 0) or 0) < top / 16:
                    out[c.cid] = "latency-bound: far fewer programs than the most parallel candidate"
        if len(out) == len(pool):
            return {}
        return out

    def _features(self, c: Candidate, names: list[tuple[str, Any]], sms: int, bound: str | None) -> list[float]:
        p = _parameters(c)
        row = [1.0 if p.get(n) == v else 0.0 for n, v in names]
        num = _numeric(c, sms)
        keys = {"memory": ("active_warps", "log_programs", "under_filled", "log_regs"),
                "compute": ("tail", "log_programs", "under_filled", "log_regs", "occupancy"),
                "latency": ("log_programs", "under_filled", "occupancy")}.get(bound or "", ("log_programs",))
        return row + [num[k] for k in keys]

    def search(self, candidates: list[Candidate], ctx: SearchContext) -> SearchOutcome:
        limit = self.limit(len(candidates), ctx.space)
        if len(candidates) <= limit:
            outcome = ExhaustiveSearch().search(candidates, ctx)
            outcome.notes.insert(0, f"{len(candidates)} candidates within the budget of {limit}: all benchmarked")
            return outcome
        outcome = SearchOutcome({}, [])
        seeds = self._seeds(candidates, max(8, int(limit * self.seed_share)))
        best = _collect(outcome, ctx.measure(seeds, None))
        measured = {c.cid for c in seeds}
        if best is None:
            outcome.notes.append("every seed failed: benchmarking the rest in order")
            rest = [c for c in candidates if c.cid not in measured]
            more = ExhaustiveSearch().search(rest[:limit - len(seeds)], ctx)
            outcome.times.update(more.times)
            outcome.failed += more.failed
            return outcome
        bound, evidence = classify(best, ctx)
        outcome.bound = bound
        outcome.notes.append(f"bound: {bound} {evidence} after {len(seeds)} seeds")
        pool = [c for c in candidates if c.cid not in measured]
        outcome.pruned = self._prune(pool, candidates, bound, ctx.ceilings.sms)
        pool = [c for c in pool if c.cid not in outcome.pruned]
        names = sorted({(n, v) for c in candidates for n, v in _parameters(c).items()}, key=repr)
        by_id = {c.cid: c for c in candidates}
        while pool and outcome.benchmarked < limit:
            timed = [(cid, s) for cid, s in outcome.times.items() if not s.early_exit]
            # early exits are lower bounds: they enter the fit at their measured (slow) time
            timed += [(cid, s) for cid, s in outcome.times.items() if s.early_exit]
            rows = [self._features(by_id[cid], names, ctx.ceilings.sms, bound) for cid, _ in timed]
            model = _Ridge(rows, [math.log(max(s.median_ms, 1e-6)) for _, s in timed])
            predicted = {c.cid: model.predict(self._features(c, names, ctx.ceilings.sms, bound)) for c in pool}
            pool.sort(key=lambda c: predicted[c.cid])
            take = min(self.batch, limit - outcome.benchmarked)
            # Half the batch from the model's best guesses, half from the neighbours of the two best so far
            # (one parameter changed), the model ordering them: a pattern search around the incumbents.
            ranked = sorted((cid for cid, s in outcome.times.items() if not s.early_exit),
                            key=lambda cid: outcome.times[cid].median_ms)[:2]
            near = [c for c in pool if any(_one_step(by_id[r], c) for r in ranked)]
            batch = []
            for c in near[:take // 2] + pool:
                if len(batch) == take:
                    break
                if c not in batch:
                    batch.append(c)
            pool = [c for c in pool if c not in batch]
            best = _collect(outcome, ctx.measure(batch, best))
        outcome.notes.append(f"benchmarked {outcome.benchmarked} of {ctx.space} ({len(outcome.pruned)} pruned by the "
                             f"{bound} bound, {len(pool)} left unbenchmarked)")
        return outcome


def _one_step(a: Candidate, b: Candidate) -> bool:
    """Whether two configs differ in exactly one parameter."""
    pa, pb = _parameters(a), _parameters(b)
    return sum(pa.get(k) != pb.get(k) for k in set(pa) | set(pb)) == 1


STRATEGIES: dict[str, type[SearchStrategy]] = {"exhaustive": ExhaustiveSearch, "guided": GuidedSearch}


def make_strategy(name: str, n_candidates: int, budget: float) -> SearchStrategy:
    """``auto``: guided above 64 candidates, exhaustive otherwise."""
    if name == "auto":
        name = "guided" if n_candidates > 64 else "exhaustive"
    if name == "guided":
        return GuidedSearch(budget=budget)
    return ExhaustiveSearch()
