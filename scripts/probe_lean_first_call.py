"""How fast could import + first call be with a lean first-call path: a measured bound for the design, not product.

Session 50's plan for the <= 2 ms cold start puts the first call's resolution in C (a ``PlannedKernel`` reading a plan
the build writes). Before that much C, this probe measures what the same first call costs with the resolution left in
*Python* but everything else lean: no runtime module at all, only the C extension (``Driver``, ``FastKernel``,
``Launcher``) and a plan precomputed from the wheel's index (what ``fastpath.plan``, ``rules.binary_params`` and
``packing.block_layout`` give, the variants, target tables and binaries). The lean child does, timed from before the
package's first byte is read to the first launch's end: import an empty package placed beside the wheel's (what
any Python package entry costs to find and run, since session 60), load the extension from its file, read the plan
(marshal), open the driver (dlsym of its functions), make a kernel handle (``KernelBase`` subclass + ``FastKernel``),
run the shipped host module ``_ops/vector_add.py`` with it, and call ``vector_add``; the call's miss resolves as
``ColdKernel._resolve`` does (dtype -> variant, capability -> target, device name -> table, ``rank_rows``, the most
specialized fitting binary), reads the cubin, checks its SHA-256, loads it, makes the ``Launcher``, launches and
registers the call with the C path. The lean child's own code is compiled before its clock starts, so its bound
leaves out the cost of loading code. Since session 60 a third contender, ``compact package``, is the same work
written as a package for size (``scripts/compact_entry.py``, installed as ``forge_compact`` beside the wheel and
imported from its .pyc): it adds what a product's lean import and first call must keep (exported-op wrappers, a lazy
``torch.ops`` namespace, a lock, an ``_ops`` finder, per-device and per-binary caches), with the rare paths raising
where a product would load its full runtime, so it measures what a lean path written for size would cost. Interleaved
with them, the wheel as it is (``import forge_kernels`` + the call). Each child checks its result against torch and
that its second call took the C path.

    python scripts/probe_lean_first_call.py dist/forge_kernels-*.whl [--runs 11] [--fake] [--json out.json]

``--fake``: the test suite's fake driver (first on LD_LIBRARY_PATH as libcuda.so.1; CPU tensors answer as GPU 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from probe_children import DEVICE

PRELUDE = DEVICE + textwrap.dedent("""
    root = sys.argv[2]
    n = 4099  # not a table row: the nearest row is ranked
    x = torch.randn(n + 1, device=dev, dtype=torch.float16)[1:]  # misaligned by one element
    y = torch.randn(n, device=dev, dtype=torch.float16)
""")

PLAN = PRELUDE + textwrap.dedent("""
    import marshal
    sys.path.insert(0, root)
    import forge_kernels
    from forge_kernels._runtime import fastpath
    from forge_kernels._runtime.rules import pick_cuda_target
    from forge_kernels._runtime.cold_launch import block_of, device_info
    from forge_kernels._runtime.basics import CUDA_FUNCTIONS
    import json, os, shutil
    forge_kernels.vector_add(x, y)
    k = sys.modules["forge_kernels._ops.vector_add"].add_kernel
    assert type(k).__name__ == "ColdKernel", type(k)
    reading = fastpath.reading(k)
    assert not reading["names"] and not reading["heuristic_names"]  # (so FastKernel's defaults and heuristics are ())
    info = device_info(0)
    variants = {}
    for vid, v in k.variants.items():
        variants[v["assign"]["T"]] = vid
        target = pick_cuda_target(info["capability"], {t: k.targets[t] for t in v["targets"]})
        d = os.path.join(root, "forge_kernels", "_forge", "modules", "vector_add", v["target_files"])
        entry = json.load(open(os.path.join(d, target + ".json")))
        configs = {}
        for cid, c in entry["configs"].items():
            bins = json.load(open(os.path.join(d, c["binaries_file"])))
            out = []
            for b in bins.values():
                kept, kinds, offsets, size = block_of(k, b)
                out.append((b["spec"], b["path"], b["sha256"], b["function"], b["shared"],
                            b["warp_size"] * b["num_warps"], kept, kinds, offsets, size))
            configs[cid] = (c["meta"], c["num_warps"], c["num_stages"], int(c.get("max_shared", 0)), tuple(out))
        with open(os.path.join(root, f"plan-{vid}-{target}.marshal"), "wb") as f:
            marshal.dump(({name: tuple((tuple(r[:-1]), str(r[-1])) for r in rows)
                           for name, rows in entry["tables"].items()}, configs), f)
    capability = {info["capability"]: pick_cuda_target(info["capability"], k.targets)}
    plan = {"fast": reading, "variants": variants, "capability": capability,
            # the compact package's variant by every device argument's dtype (vector_add's are all of type T); the
            # driver functions the runtime's C Driver takes
            "by_args": {",".join([t] * len(reading["device_pos"])): vid for t, vid in variants.items()},
            "device_pos": reading["device_pos"], "key_pos": reading["key_pos"], "functions": CUDA_FUNCTIONS}
    with open(os.path.join(root, "plan.marshal"), "wb") as f:
        marshal.dump(plan, f)
    os.makedirs(os.path.join(root, "forge_probe_entry"), exist_ok=True)
    with open(os.path.join(root, "forge_probe_entry", "__init__.py"), "w") as f:
        f.write("# an empty package: the probe times finding and running a package entry")
    os.makedirs(os.path.join(root, "forge_compact"), exist_ok=True)
    shutil.copyfile(sys.argv[3], os.path.join(root, "forge_compact", "__init__.py"))  # scripts/compact_entry.py
    print("plan written")
""")

LEAN = PRELUDE + textwrap.dedent("""
    t0 = clk()
    import forge_probe_entry  # an empty package beside the wheel's: what any package entry costs to find and run
    stages = [("package", clk())]
    import marshal, math, os, types, threading, hashlib, _ctypes, ctypes
    from importlib.machinery import ExtensionFileLoader, SourceFileLoader
    from importlib.util import spec_from_file_location, module_from_spec
    pkg = os.path.join(root, "forge_kernels")
    path = os.path.join(pkg, "_runtime", "_fastlaunch.abi3.so")
    loader = ExtensionFileLoader("_fastlaunch", path)
    c = module_from_spec(spec_from_file_location("_fastlaunch", path, loader=loader))
    loader.exec_module(c)
    stages.append(("extension", clk()))
    with open(os.path.join(root, "plan.marshal"), "rb") as f:
        plan = marshal.load(f)
    stages.append(("plan", clk()))
    handle = _ctypes.dlopen("libcuda.so.1", ctypes.DEFAULT_MODE)
    drv = c.Driver({fn: _ctypes.dlsym(handle, fn) for fn in plan["functions"]})
    assert drv.init() == 0
    stages.append(("driver", clk()))

    def check(code, what):
        if code:
            raise RuntimeError(f"{what}: {code}")

    class Launches(threading.local):
        skip = False

    DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
    MISSING = object()

    def log2(v):
        return math.log2(v) if v > 1 else 0.0

    def rank_rows(rows, key):
        lk = [log2(v) for v in key]
        def order(i):
            row = rows[i][0]
            if row == key:
                return (-1.0, 0.0, i)
            lr = [log2(v) for v in row]
            return (sum(abs(a - b) for a, b in zip(lk, lr)), -sum(lr), i)
        return sorted(range(len(rows)), key=order)

    def rank(spec):
        return sum(ch != "x" for ch in spec)

    def fits(b, a):
        return all(x in ("x", y) for x, y in zip(b, a))

    class LeanKernel(c.KernelBase):
        def run(self, grid, args, kwargs):
            fast = self._fast
            spec = fast.spec(args, {})
            device = args[0].get_device()
            dev = drv.device(device)[1]
            cap = (drv.attribute(75, dev)[1], drv.attribute(76, dev)[1])
            target = plan["capability"][cap]
            vid = plan["variants"][DTYPES[args[0].dtype]]
            with open(os.path.join(root, f"plan-{vid}-{target}.marshal"), "rb") as f:
                by_name, configs = marshal.load(f)
            name = drv.name(dev)[1]
            max_shared = drv.attribute(97, dev)[1]
            rows = by_name.get(name, by_name["default"])
            key = (args[3],)
            cid = next(rows[i][1] for i in rank_rows(rows, key) if configs[rows[i][1]][3] <= max_shared)
            meta, num_warps, num_stages, _, binaries = configs[cid]
            best = None
            for b in binaries:
                if fits(b[0], spec) and (best is None or rank(b[0]) > rank(best[0])):
                    best = b
            bspec, bpath, sha, fname, shared, block, kept, kinds, offsets, size = best
            with open(os.path.join(root, "forge_kernels", bpath), "rb") as f:
                image = f.read()
            if hashlib.sha256(image).hexdigest() != sha:
                raise RuntimeError("sha256")
            ctx = drv.primary_context(dev)[1]
            code, failed, fn = drv.load(ctx, image, fname, shared, max_shared)
            check(code, failed)
            ep = drv.entry_points()
            launcher = c.Launcher(fn, ctx, block, shared, kept, kinds, offsets, size, 0, 0, None,
                                  torch._C._cuda_getCurrentRawStream, device, check, fname, ep["launch"],
                                  ep["ctx_get"], ep["ctx_push"], ep["ctx_pop"], 0, ep.get("launch_ex", 0), None,
                                  ep.get("tensor_map", 0))
            dims = grid(meta) if callable(grid) else grid
            launcher(dims, [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args])
            fast.register(tuple(args), {}, launcher, meta, (cid, num_warps, num_stages), spec)

    r = plan["fast"]
    kernel = LeanKernel()
    kernel._set_fast(c.FastKernel(r["kinds"], r["device_pos"], r["spec_pos"], r["spec_ptr"], r["axis_pos"],
                                  r["key_pos"], r["names"], (), MISSING, (torch.Tensor, torch.nn.Parameter),
                                  torch.Tensor.get_device, torch.Tensor.data_ptr, Launches(), r["runtime_names"], (),
                                  r["heuristic_names"], r["type_next"], r["param_slots"], r["pointer_ints"],
                                  r["pointer_int_kinds"], r["written_pos"]))
    stages.append(("handle", clk()))

    class SmallTriton(types.ModuleType):
        @staticmethod
        def cdiv(a, b):
            return -(a // -b)

    mod_path = os.path.join(pkg, "_ops", "vector_add.py")
    host = types.ModuleType("forge_kernels._ops.vector_add")
    host.__file__ = mod_path
    host.__dict__.update(triton=SmallTriton("triton"), __forge_kernel_side__=lambda name, of: kernel)
    exec(SourceFileLoader(host.__name__, mod_path).get_code(host.__name__), host.__dict__)
    t1 = clk()
    stages.append(("host module", t1))
    out = host.vector_add(x, y)
    if dev == "cuda":
        torch.cuda.synchronize()
    t2 = clk()
    ok = dev == "cpu" or bool((out.double() - (x.double() + y.double())).abs().max() < 1e-2)
    before = kernel._fast.size()
    host.vector_add(x, y)
    starts = [t0] + [t for _, t in stages]
    print("STAGES", *(f"{n.replace(' ', '_')}={1e3 * (t - p):.3f}" for (n, t), p in zip(stages, starts)))
    print(t1 - t0, t2 - t1, int(ok), int(kernel._fast.size() == before == 1))
""")

def package_child(package: str) -> str:
    """A child timing ``import <package>`` and its first ``vector_add`` (the wheel, or the compact package)."""
    return PRELUDE + textwrap.dedent(f"""
        t0 = clk()
        import {package}
        t1 = clk()
        out = {package}.vector_add(x, y)
        if dev == "cuda":
            torch.cuda.synchronize()
        t2 = clk()
        ok = dev == "cpu" or bool((out.double() - (x.double() + y.double())).abs().max() < 1e-2)
        k = sys.modules["{package}._ops.vector_add"].add_kernel
        before = k._fast.size()
        {package}.vector_add(x, y)
        print("KIND", type(k).__name__)
        print(t1 - t0, t2 - t1, int(ok), int(k._fast.size() == before == 1))
    """)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel")
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="forge_lean_"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(root),
                    a.wheel], check=True)
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    mode = "fake" if a.fake else "cuda"
    subprocess.run([sys.executable, "-c", "import torch, forge_kernels._runtime as r, forge_kernels; r.write_bundle()"],
                   env=env, check=True, cwd="/")
    subprocess.run([sys.executable, "-c", PLAN, mode, str(root), str(Path(__file__).with_name("compact_entry.py"))],
                   env=env | {"FORGE_NO_LEAN": "1"}, check=True, cwd="/")
    # (name: code, extra environment): the probe's bound, the same work written as a package for size, the wheel as
    # it is (lean.py since session 58) and the wheel with the lean path off (the cold handles' first call)
    wheel = package_child("forge_kernels")
    children = {"lean (probe)": (LEAN, {}), "compact package": (package_child("forge_compact"), {}),
                "wheel": (wheel, {}), "wheel, no lean": (wheel, {"FORGE_NO_LEAN": "1"})}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in children}
    stages: dict[str, list[float]] = {}
    kinds: dict[str, set[str]] = {}
    for i in range(a.runs + 1):
        for name in (list(children) if i % 2 else list(children)[::-1]):
            code, extra = children[name]
            out = subprocess.run([sys.executable, "-c", code, mode, str(root)], env=env | extra, cwd="/",
                                 capture_output=True, text=True)
            if out.returncode:
                sys.exit(out.stderr)
            setup, first, ok, c_path = out.stdout.split()[-4:]
            if not (int(ok) and int(c_path)):
                sys.exit(f"{name}: wrong result or second call off the C path: {out.stdout}")
            kinds.setdefault(name, set()).update(line.split()[1] for line in out.stdout.splitlines()
                                                 if line.startswith("KIND"))
            if i:  # the first round wrote bytecode caches
                runs[name].append((float(setup), float(first)))
                for line in out.stdout.splitlines():
                    if line.startswith("STAGES"):
                        for item in line.split()[1:]:
                            stage, ms = item.split("=")
                            stages.setdefault(stage, []).append(float(ms))
    table = {}
    print(f"import + first call of vector_add ({mode}, {a.runs} interleaved fresh processes; ms, median (min - max))")
    for name, rs in runs.items():
        tot = [s + f for s, f in rs]
        table[name] = {"setup_ms": 1e3 * statistics.median(s for s, _ in rs),
                       "first_call_ms": 1e3 * statistics.median(f for _, f in rs),
                       "total_ms": 1e3 * statistics.median(tot), "min_ms": 1e3 * min(tot), "max_ms": 1e3 * max(tot)}
        t = table[name]
        print(f"  {name:16s} setup/import {t['setup_ms']:.2f}  first call {t['first_call_ms']:.2f}  "
              f"total {t['total_ms']:.2f} ({t['min_ms']:.2f} - {t['max_ms']:.2f})")
    print("  handles: " + ", ".join(f"{n}: {'/'.join(sorted(k))}" for n, k in kinds.items() if k))
    print("  lean setup by stage (ms, median): "
          + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in stages.items()))
    if a.json:
        Path(a.json).write_text(json.dumps({"mode": mode, "runs": runs, "medians": table, "lean_stages": stages,
                                            "handles": {n: sorted(k) for n, k in kinds.items()}}, indent=1))


if __name__ == "__main__":
    main()
