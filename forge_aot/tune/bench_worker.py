"""GPU benchmark worker: one process per GPU (``CUDA_VISIBLE_DEVICES`` set by the parent).

Protocol: one JSON command per line on stdin; events on the file descriptor the parent reads, each line
prefixed with RESULT_MARK. Before each candidate the worker says ``start`` so that, if the candidate faults
(an illegal address poisons the CUDA context) or hangs, the parent knows which one cost the process: it records
that candidate as crashed or timed out, starts a fresh worker and goes on.

The op runs as the wheel runs it: the host code of the kernel file, the kernel being tuned launched from its
compiled binaries through the runtime's launcher with the candidate config forced, every other kernel of the
file through Triton's JIT with its table's config (as development mode). The kernel's launches are recorded,
so timing replays exactly those launches with the same arguments.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

from .. import runtime as rt
from ..runtime.drivers import driver
from ..runtime.launch import _BinaryLauncher
from .timing import CudaTimingBackend, Timer, TimingSettings

RESULT_MARK = "@@forge-aot-tune@@"


@dataclass
class LaunchRecord:
    """One launch of the kernel being tuned, as the op made it: what a replay needs."""

    launcher: Any
    grid: tuple[int, ...]
    values: list[Any]
    runtime: list[Any]
    nargs: dict[str, Any]
    spec: str
    binary_spec: str
    snapshots: dict[str, Any] = field(default_factory=dict)


class TuneBackend:
    """Launches the kernel being tuned with a forced config from given binaries; other kernels through JIT."""

    def __init__(self, functions: dict[str, Any]) -> None:
        from ..dev import JitBackend

        self.jit = JitBackend(functions)
        self.kernel_name: str | None = None
        self.target = ""
        self.config: rt.Config | None = None
        self.key: tuple[int, ...] = ()
        self.binaries: dict[str, dict[str, Any]] = {}
        self.restore: list[str] = []
        self.records: list[LaunchRecord] = []
        self._loaded: dict[str, _BinaryLauncher] = {}
        self.max_shared = 0

    def force(self, kernel: rt.Kernel, target: str, config: dict[str, Any], cid: str, key: tuple[int, ...],
              binaries: dict[str, dict[str, Any]], restore: list[str]) -> None:
        kernel._states.clear()
        self.kernel_name = kernel.name
        self.target = target
        self.key = key
        self.binaries = binaries
        self.restore = restore
        self.config = rt.Config(cid, config["meta"], config["num_warps"], config["num_stages"], {},
                                config.get("maxnreg"), config.get("pre_hook"))

    def resolve(self, kernel: rt.Kernel, variant: dict[str, Any], assignment: dict[str, Any],
                device: int) -> tuple[str, rt.ConfigTable]:
        if kernel.name != self.kernel_name:
            return self.jit.resolve(kernel, variant, assignment, device)
        assert self.config is not None
        c = self.config
        call_values = {k: v for k, v in assignment.items() if k in kernel.call_names}
        config = rt.Config(c.id, c.meta, c.num_warps, c.num_stages, call_values, c.maxnreg, c.pre_hook)
        # One row, no constraints: every key gets the forced config.
        table = rt.ConfigTable(kernel.function, kernel.spec["key"], [[*self.key, c.id]], {c.id: config}, [])
        return self.target, table

    def load(self, kernel: rt.Kernel, binary: dict[str, Any], device: int) -> _BinaryLauncher:
        launcher = self._loaded.get(binary["path"])
        if launcher is None:
            launcher = _BinaryLauncher(kernel, binary, binary["path"], device, self.max_shared)
            self._loaded[binary["path"]] = launcher
        return launcher

    def launch(self, kernel: rt.Kernel, state: Any, config: rt.Config, grid: Any, runtime: Any,
               call: dict[str, Any], heur: tuple[Any, ...]) -> Any:
        if kernel.name != self.kernel_name:
            return self.jit.launch(kernel, state, config, grid, runtime, call, heur)
        values = list(runtime)
        for i in kernel.ptr_pos:
            values[i] = rt.pointer_value(runtime[i])
        spec = rt.argument_spec(kernel.spec_slots, values)
        binary = rt.choose_binary(kernel, self.binaries, heur, spec, rt.block_shapes(kernel, runtime))
        launcher = self.load(kernel, binary, state.device)
        nargs = kernel.named_args(runtime, call, config)
        nargs.update(zip(kernel.heuristic_names, heur))
        snapshots = {n: nargs[n].clone() for n in self.restore}
        grid = tuple(int(g) for g in grid)
        self.records.append(LaunchRecord(launcher, grid, values, list(runtime), nargs, spec, binary["spec"],
                                         snapshots))
        launcher(grid, values)
        return rt.launched(kernel, launcher, config, call, state.target)  # what the wheel's launch returns


def _tensors(obj: Any) -> list[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in _tensors(obj[k])]
    return []


def relative_error(out: Any, ref: Any) -> float:
    """Largest ‖out − ref‖ / ‖ref‖ over the tensors of two results (same structure), in float64; inf for NaN
    or a missing tensor."""
    import torch

    outs, refs = _tensors(out), _tensors(ref)
    if len(outs) != len(refs) or not refs:
        return float("inf")
    worst = 0.0
    for o, r in zip(outs, refs):
        if o.shape != r.shape:
            return float("inf")
        o64, r64 = o.detach().double(), r.detach().double().to(o.device)
        if not torch.isfinite(o64).all() and not (torch.isfinite(o64) == torch.isfinite(r64)).all():
            return float("inf")
        diff = torch.nan_to_num(o64 - r64, nan=float("inf")).norm().item()
        worst = max(worst, diff / max(r64.norm().item(), 1e-30))
    return worst


def _clone(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


class Worker:
    """State of one worker process: bound host modules, the current item, timing."""

    def __init__(self, out: Any) -> None:
        import torch

        self.torch = torch
        self.out = out
        self.modules: dict[str, Any] = {}
        self.handles: dict[str, rt.Kernel] = {}
        self.backend: TuneBackend | None = None
        self.item: dict[str, Any] | None = None
        self.args: Any = None
        self.ref: Any = None
        self.variant: dict[str, Any] = {}
        self.settings = TimingSettings()
        torch.cuda.init()
        self.timer = Timer(CudaTimingBackend(0, self.settings.head_start_us), self.settings)
        self.info = driver().describe(0)

    def emit(self, event: dict[str, Any]) -> None:
        self.out.write(RESULT_MARK + json.dumps(event, default=str) + "\n")
        self.out.flush()

    # -- device ----------------------------------------------------------------------------------------
    def device(self) -> dict[str, Any]:
        torch = self.torch
        props = torch.cuda.get_device_properties(0)
        version = ""
        try:
            with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
                version = next((w for w in f.readline().split() if w[:1].isdigit() and "." in w), "")
        except OSError:
            pass
        # The two ceilings, measured: a large device-to-device copy and a large fp16 matrix product.
        n = 256 << 20
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        y = torch.empty_like(x)
        bw = self._best_of(lambda: y.copy_(x), 10)
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
        mm = self._best_of(lambda: a @ b, 5)
        torch.cuda.empty_cache()
        hip = bool(getattr(torch.version, "hip", None))
        return {"name": props.name, "capability": self.info["arch"] if hip else f"{props.major}.{props.minor}",
                "arch": self.info["arch"], "backend": "hip" if hip else "cuda",
                "sms": props.multi_processor_count, "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
                "max_shared": self.info["max_shared"], "driver": version, "cuda": torch.version.cuda or "",
                "torch": torch.__version__, "peak_bytes_per_s": 2 * n / (bw / 1e3),
                "peak_flops": 2 * 8192 ** 3 / (mm / 1e3)}

    def _best_of(self, fn: Any, reps: int) -> float:
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        return sorted(times)[len(times) // 2]

    # -- setup -----------------------------------------------------------------------------------------
    def setup(self, cmd: dict[str, Any]) -> None:
        from ..introspect import base_jit_function, load_kernel_module, make_importable

        os.chdir(cmd["root"])
        make_importable(cmd["root"])  # the kernel files' imports of the project's modules
        functions = {name: base_jit_function(getattr(load_kernel_module(path), fn))
                     for name, (path, fn) in cmd["kernel_files"].items()}
        self.backend = TuneBackend(functions)
        self.backend.max_shared = self.info["max_shared"]
        index = cmd["index"]

        def factory(name: str, spec: dict[str, Any], targets: dict[str, Any], backend: Any) -> rt.Kernel:
            self.handles[name] = rt.Kernel(name, spec, targets, backend)
            return self.handles[name]

        def bind(mod_name: str, names: tuple[str, ...]) -> Any:
            self.modules[mod_name] = rt.bind_module(f"_forge_tune_{mod_name}", index, mod_name, self.backend,
                                                    factory, tuple(cmd["modules"][mod_name]), aliases=names)
            return self.modules[mod_name]

        entries = {m: index["modules"][m] for m in cmd["modules"]}
        with rt.project_names_bound(entries, bind) as bound:
            for mod_name in rt.imports_first(entries):
                bound(mod_name)

    def start_item(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Make the row's inputs (seeded) and the reference result: the reference function's, else the untuned
        default config's."""
        from ..trace import TORCH_DTYPES, call_op

        torch = self.torch
        self.item = cmd
        self.timer.backend.flush_l2 = cmd.get("l2", "cold") == "cold"  # type: ignore[attr-defined]
        module = self.modules[cmd["module"]]
        self.variant = {a: getattr(torch, TORCH_DTYPES[v]) if a in cmd["type_vars"] else v
                        for a, v in cmd["assignment"].items()}
        self.args = self._inputs(cmd["seed"])
        if cmd.get("reference"):
            self.ref = call_op(getattr(module, cmd["reference"]), self.args)
        else:
            out, _ = self.run_op(cmd["default"], self.args)
            self.ref = _clone(out)
        torch.cuda.synchronize()
        return {"input_bytes": sum(t.numel() * t.element_size() for t in _tensors(self.args))}

    def _inputs(self, seed: int) -> Any:
        from ..trace import call_inputs

        assert self.item is not None
        self.torch.manual_seed(seed)
        module = self.modules[self.item["module"]]
        return call_inputs(getattr(module, self.item["inputs"]), dict(self.item["key"]), self.variant, "cuda")

    # -- one candidate ---------------------------------------------------------------------------------
    def run_op(self, cand: dict[str, Any], args: Any) -> tuple[Any, list[LaunchRecord]]:
        """Run the op once with a candidate forced; the kernel's launches are recorded."""
        from ..trace import call_op

        torch = self.torch
        item = self.item
        assert item is not None and self.backend is not None
        kernel = self.handles[item["kernel"]]
        binaries = {bid: dict(b) for bid, b in cand["binaries"].items()}
        self.backend.force(kernel, item["target"], cand["config"], cand["cid"], tuple(item["key"].values()),
                           binaries, item.get("restore", []))
        self.backend.records = []
        self._poison()
        out = call_op(getattr(self.modules[item["module"]], item["op"]), args)
        torch.cuda.synchronize()
        records = self.backend.records
        self.backend.records = []
        if not records:
            raise RuntimeError(f"{item['op']}() did not launch {kernel.function} on the tuning inputs")
        return out, records

    def _poison(self) -> None:
        """Fill a block of torch's caching allocator with NaN and free it, so an output element the kernel does not
        write shows up as NaN in the comparison."""
        torch = self.torch
        nbytes = min(max(sum(t.numel() * t.element_size() for t in _tensors(self.args)), 1 << 20), 1 << 30)
        block = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
        block.fill_(float("nan"))
        del block

    def attrs(self, records: list[LaunchRecord]) -> dict[str, Any]:
        """What the loaded binary says: registers, local memory (spills), blocks per multiprocessor."""
        lib = driver().lib
        rec = records[0]
        fn = ctypes.c_void_p(rec.launcher.function)
        out: dict[str, Any] = {"shared": rec.launcher.shared, "binary": rec.binary_spec, "spec": rec.spec,
                               "programs": sum(g[0] * (g[1] if len(g) > 1 else 1) * (g[2] if len(g) > 2 else 1)
                                               for g in (r.grid for r in records)),
                               "launches": len(records), "block": rec.launcher.block,
                               "tensor_bytes": self._tensor_bytes(rec.runtime)}
        if driver().backend != "cuda":
            return out
        value = ctypes.c_int()
        for name, attr in (("regs", 4), ("local_bytes", 3)):
            if lib.cuFuncGetAttribute(ctypes.byref(value), attr, fn) == 0:
                out[name] = value.value
        occ = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor
        occ.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        occ.restype = ctypes.c_int
        if occ(ctypes.byref(value), fn, rec.launcher.block, rec.launcher.shared) == 0:
            out["occupancy"] = value.value
        return out

    def _tensor_bytes(self, runtime: list[Any]) -> int:
        """Bytes of every tensor the kernel gets, each storage counted once (read or written once)."""
        seen: dict[int, int] = {}
        for arg in runtime:
            arg = getattr(arg, "base", arg) if hasattr(arg, "block_shape") else arg  # a tensor descriptor's tensor
            if isinstance(arg, self.torch.Tensor):
                seen[arg.data_ptr()] = max(seen.get(arg.data_ptr(), 0), arg.numel() * arg.element_size())
        return sum(seen.values())

    def replay(self, records: list[LaunchRecord]) -> tuple[Any, Any]:
        assert self.item is not None
        reset = self.item.get("reset", [])
        hooks = []
        for rec in records:
            pre_hook = self.backend.config.pre_hook if self.backend and self.backend.config else None
            if pre_hook:
                kernel = self.handles[self.item["kernel"]]
                hooks.append((kernel.pre_hooks[pre_hook], rec.nargs))

        def prepare() -> None:
            for rec in records:
                for name in reset:
                    rec.nargs[name].zero_()
                for name, snap in rec.snapshots.items():
                    rec.nargs[name].copy_(snap)
            for fn, nargs in hooks:
                fn(nargs)

        def run() -> None:
            for rec in records:
                rec.launcher(rec.grid, rec.values)

        needs_prepare = bool(reset or hooks or any(r.snapshots for r in records))
        if needs_prepare:
            return run, prepare, None
        if self.item and self.item.get("l2") == "warm":  # the same memory every launch: it stays in the L2
            return run, None, None
        return run, None, self._rotation(records)

    def _rotation(self, records: list[LaunchRecord]) -> Any:
        """``run`` rotating among copies of the memory its pointer arguments live in (each storage copied whole,
        so offsets, strides and alignment stay the same), as many copies as make twice the L2: graph replays of a
        short kernel then read cold data without a flush between launches."""
        torch = self.torch
        kernel = self.handles[self.item["kernel"]] if self.item else None
        if kernel is None or kernel.desc_pos or any(rt.SPEC_DESC in rec.spec for rec in records):
            return None  # tensor descriptors hold their addresses in tensor maps: not moved
        storages: dict[int, Any] = {}
        for rec in records:
            for i in kernel.ptr_pos:
                if rec.runtime[i] is None:  # an optional pointer passed as None (a null pointer): nothing to move
                    continue
                st = rec.runtime[i].untyped_storage()
                storages.setdefault(st.data_ptr(), st)
        working = sum(st.nbytes() for st in storages.values())
        copies = min(64, math.ceil(2 * self.timer.backend.l2_bytes / max(working, 1)))  # type: ignore[attr-defined]
        if copies <= 1:
            return None
        sets: list[list[tuple[LaunchRecord, list[Any]]]] = []
        keep: list[Any] = []
        for _ in range(copies):
            moved = {}
            for base, st in storages.items():
                src = torch.empty(0, dtype=torch.uint8, device=f"cuda:{torch.cuda.current_device()}").set_(st)
                dup = src.clone()
                keep.append(dup)
                moved[base] = dup.data_ptr()
            one = []
            for rec in records:
                values = list(rec.values)
                for i in kernel.ptr_pos:
                    if rec.runtime[i] is None:
                        continue
                    base = rec.runtime[i].untyped_storage().data_ptr()
                    values[i] = moved[base] + (rec.values[i] - base)
                one.append((rec, values))
            sets.append(one)
        turn = [0]

        def rotating() -> None:
            for rec, values in sets[turn[0] % copies]:
                rec.launcher(rec.grid, values)
            turn[0] += 1

        rotating.keep = keep  # type: ignore[attr-defined]  # the copies live as long as the function
        return rotating


    # -- commands --------------------------------------------------------------------------------------
    def probe(self, cands: list[dict[str, Any]]) -> None:
        assert self.item is not None
        tol = self.item["tolerance"]
        for cand in cands:
            self.emit({"event": "start", "cid": cand["cid"]})
            try:
                out, records = self.run_op(cand, self.args)
            except Exception as exc:
                self._candidate_error(cand, exc)
                continue
            err = relative_error(out, self.ref)
            status = "ok" if err <= tol else "wrong"
            self.emit({"event": "result", "cid": cand["cid"], "status": status, "rel_err": err,
                       "attrs": self.attrs(records)})
            del out, records

    def _candidate_error(self, cand: dict[str, Any], exc: BaseException) -> None:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
        fatal = "CUDA" in text or "cuda" in text or "illegal" in text.lower()
        self.emit({"event": "result", "cid": cand["cid"], "status": "crashed" if fatal else "failed",
                   "error": text})
        if fatal:
            # The context may be poisoned (illegal address): this process is done; the parent starts another.
            sys.exit(3)

    def time(self, cands: list[dict[str, Any]], best_ms: float | None) -> None:
        assert self.item is not None
        for cand in cands:
            self.emit({"event": "start", "cid": cand["cid"]})
            try:
                out, records = self.run_op(cand, self.args)
                run, prepare, rotating = self.replay(records)
                stats = self.timer.measure(run, prepare, best_ms=best_ms, graph_run=rotating)
                # After the timed repetitions, one more (reset as declared) must still give the right result:
                # a kernel that accumulates into or overwrites its arguments needs reset_to_zero/restore_value.
                if prepare is not None:
                    prepare()
                run()
                self.torch.cuda.synchronize()
                err = relative_error(out, self.ref)
            except Exception as exc:
                self._candidate_error(cand, exc)
                continue
            if err > self.item["tolerance"]:
                self.emit({"event": "result", "cid": cand["cid"], "status": "wrong", "rel_err": err,
                           "error": f"after {stats.n} timed runs the result is wrong (relative error {err:.3g}): "
                                    "the kernel accumulates into or overwrites its arguments; declare "
                                    "tune.reset-to-zero / restore-value (or the decorator's)"})
                continue
            if not stats.early_exit and (best_ms is None or stats.median_ms < best_ms):
                best_ms = stats.median_ms
            self.emit({"event": "result", "cid": cand["cid"], "status": "ok", "time": stats.to_json()})

    def interleave(self, cands: list[dict[str, Any]], rounds: int) -> None:
        runs = {}
        for cand in cands:
            _, records = self.run_op(cand, self.args)
            runs[cand["cid"]] = self.replay(records)
        medians, modes = self.timer.interleaved_rounds(runs, rounds)
        self.torch.cuda.synchronize()
        self.emit({"event": "interleaved", "rounds": medians, "modes": modes})

    def verify(self, cand: dict[str, Any], default: dict[str, Any], seed: int) -> None:
        """Re-run a candidate on fresh inputs and compare with the reference computed on them."""
        from ..trace import call_op

        assert self.item is not None
        args = self._inputs(seed)
        if self.item.get("reference"):
            ref = call_op(getattr(self.modules[self.item["module"]], self.item["reference"]), args)
        else:
            ref, _ = self.run_op(default, args)
            ref = _clone(ref)
        self.emit({"event": "start", "cid": cand["cid"]})
        out, _ = self.run_op(cand, args)
        err = relative_error(out, ref)
        self.emit({"event": "verified", "cid": cand["cid"], "rel_err": err,
                   "ok": err <= self.item["tolerance"]})


def main() -> None:
    result_fd = os.dup(1)
    os.dup2(2, 1)  # chatter goes to stderr; events go to the saved descriptor only
    out = os.fdopen(result_fd, "w", buffering=1)
    worker = None
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd["cmd"]
        try:
            if worker is None:
                worker = Worker(out)
            if op == "device":
                worker.emit({"event": "device", "device": worker.device(), "pid": os.getpid()})
                # Setup needs Triton (the kernel files' decorators): imported now, once the parent has what it
                # waits for, while it plans and sorts the rows, rather than at setup or before answering.
                import triton  # noqa: F401
            elif op == "setup":
                worker.setup(cmd)
                worker.emit({"event": "ready"})
            elif op == "item":
                worker.emit({"event": "item", **worker.start_item(cmd["item"])})
            elif op == "probe":
                worker.probe(cmd["candidates"])
                worker.emit({"event": "done"})
            elif op == "time":
                worker.time(cmd["candidates"], cmd.get("best_ms"))
                worker.emit({"event": "done"})
            elif op == "interleave":
                worker.interleave(cmd["candidates"], int(cmd["rounds"]))
            elif op == "verify":
                worker.verify(cmd["candidate"], cmd["default"], int(cmd["seed"]))
            else:
                raise ValueError(f"unknown command {op!r}")
        except SystemExit:
            raise
        except BaseException as exc:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
            payload = {"event": "error", "error": text}
            (worker.emit(payload) if worker is not None
             else out.write(RESULT_MARK + json.dumps(payload) + "\n"))
            if "CUDA" in text or "illegal" in text.lower():
                sys.exit(3)
    # The parent hung up: every event is written. Skip the interpreter's teardown of torch, Triton and the CUDA
    # context's Python objects (about a second), which the parent would wait for; the driver frees the rest.
    out.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
