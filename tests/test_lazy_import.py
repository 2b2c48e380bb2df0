"""`import <package>` registers the ops and loads nothing else; the first use loads the op's host module.

Runs the repository's wheel (unpacked, as pip lays it out) in fresh processes on the CPU: which modules an
import loads, that torch.ops.<package>.<op> exists right after import (its custom ops defined on the first look-up,
or at import where the namespace was looked up before), that torch.compile(fullgraph=True) traces
an exported op as one custom op before anything was loaded, that the first call binds only its own host module,
and that importing a host module by name binds it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(repo_site: Path) -> Path:
    return repo_site


def _run(site: Path, code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd="/")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _loaded() -> str:
    return "sorted(m for m in sys.modules if m.startswith('forge_kernels'))"


def test_import_loads_only_the_entry_point_and_defines_the_custom_ops(site: Path) -> None:
    res = _run(site, f"""
        import json, sys, torch
        import forge_kernels
        after_import = {_loaded()}
        ops = [hasattr(torch.ops.forge_kernels, op) for op in ("softmax", "matmul", "vector_add")]
        try:
            forge_kernels.softmax(torch.randn(2, 8))
        except Exception as exc:
            error = type(exc).__name__
        after_call = {_loaded()}
        import inspect
        print(json.dumps({{"import": after_import, "ops": ops, "call": after_call, "error": error,
                          "doc": forge_kernels.softmax.__doc__, "sig": str(inspect.signature(forge_kernels.softmax))}}))
    """)
    # the package entry only (lean.py; the first call's modules load on the first call)
    assert res["import"] == ["forge_kernels", "forge_kernels._runtime", "forge_kernels._runtime.lean"]
    assert res["ops"] == [True, True, True]
    # the first call bound the op's own host module only (and the runtime it needs)
    host = [m for m in res["call"] if m.startswith("forge_kernels._ops.")]
    assert host == ["forge_kernels._ops.softmax"] and res["error"] == "UnsupportedDeviceError"
    assert "softmax" in res["doc"] and res["sig"] == "(x: torch.Tensor) -> torch.Tensor"


COUNT_DEFINES = textwrap.dedent("""
    import json, sys, threading, torch
    defined = []
    define = torch.library.Library.define
    torch.library.Library.define = lambda self, schema, *a, **k: (defined.append(schema.split("(")[0]),
                                                                  define(self, schema, *a, **k))[1]
""")


def test_custom_ops_are_defined_on_first_need_not_at_import(site: Path) -> None:
    """``import <package>`` defines no custom op: the first look-up in ``torch.ops.<package>`` defines them all,
    once, also when eight threads look up at once."""
    res = _run(site, COUNT_DEFINES + textwrap.dedent("""
        import forge_kernels
        at_import = list(defined)
        packets = []
        barrier = threading.Barrier(8)
        def look_up():
            barrier.wait()
            packets.append(torch.ops.forge_kernels.softmax)
        threads = [threading.Thread(target=look_up) for _ in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(json.dumps({"at_import": at_import, "defined": sorted(defined), "same": len(set(map(id, packets))),
                          "schema": str(torch.ops.forge_kernels.matmul.default._schema),
                          "loaded": "forge_kernels._runtime.custom_ops" in sys.modules}))
    """))
    assert res["at_import"] == [] and res["defined"] == ["matmul", "softmax", "vector_add"]
    assert res["same"] == 1 and res["loaded"] is True
    assert res["schema"].startswith("forge_kernels::matmul(Tensor a, Tensor b")


def test_a_namespace_looked_up_before_the_import_gets_the_ops_at_import(site: Path) -> None:
    """Where ``torch.ops.<package>`` exists before the import (a failed torch.export.load, code that looked), it is
    left as it is and the ops are defined at import, as before."""
    res = _run(site, COUNT_DEFINES + textwrap.dedent("""
        before = hasattr(torch.ops.forge_kernels, "softmax")
        import forge_kernels
        print(json.dumps({"before": before, "at_import": sorted(defined),
                          "op": str(torch.ops.forge_kernels.softmax.default._schema)}))
    """))
    assert res["before"] is False and res["at_import"] == ["matmul", "softmax", "vector_add"]
    assert res["op"] == "forge_kernels::softmax(Tensor x) -> Tensor"


def test_preload_defines_the_custom_ops(site: Path) -> None:
    """For look-ups that do not pass through Python (an AOTInductor package's proxy executor): ``preload()``."""
    res = _run(site, COUNT_DEFINES + textwrap.dedent("""
        import forge_kernels
        try:
            forge_kernels.preload()
        except Exception as exc:  # no GPU here: the binaries do not load
            error = type(exc).__name__
        else:
            error = None
        print(json.dumps({"defined": sorted(defined), "error": error,
                          "dispatcher": torch._C._dispatch_has_kernel_for_dispatch_key("forge_kernels::softmax",
                                                                                       "Meta")}))
    """))
    assert res["defined"] == ["matmul", "softmax", "vector_add"] and res["dispatcher"] is True


def test_importing_a_host_module_binds_its_kernel_handles(site: Path) -> None:
    res = _run(site, """
        import importlib, json, sys
        import forge_kernels
        from forge_kernels._ops import vector_add as va
        m = importlib.import_module("forge_kernels._ops.matmul")
        print(json.dumps({"add": repr(va.add_kernel), "matmul": repr(m.matmul_kernel), "origin": m.__spec__.origin,
                          "same": sys.modules["forge_kernels._ops.matmul"] is m}))
    """)
    assert res["add"].startswith("<forge-aot kernel add") and res["matmul"].startswith("<forge-aot kernel matmul")
    assert res["origin"].endswith("forge_kernels/_ops/matmul.py") and res["same"]


def test_a_host_module_bound_by_a_first_call_imports_by_its_dotted_name(site: Path) -> None:
    res = _run(site, """
        import json, sys, torch
        import forge_kernels
        try:
            forge_kernels.vector_add(torch.randn(4), torch.randn(4))  # binds the host module, then fails (CPU)
        except Exception as exc:
            error = type(exc).__name__
        import forge_kernels._ops.vector_add as host  # the import system takes it from sys.modules
        from forge_kernels._ops import vector_add
        print(json.dumps({"error": error, "same": host is vector_add is sys.modules["forge_kernels._ops.vector_add"],
                          "handle": repr(host.add_kernel)}))
    """)
    assert res["error"] == "UnsupportedDeviceError" and res["same"]
    assert res["handle"].startswith("<forge-aot kernel add")


def test_torch_compile_fullgraph_sees_one_custom_op_before_anything_loaded(site: Path) -> None:
    res = _run(site, f"""
        import json, sys, torch
        import forge_kernels
        graphs = []

        class Captured(Exception):
            pass

        def backend(gm, example_inputs):
            graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
            def run(*args):
                raise Captured
            return run

        f = torch.compile(lambda x: forge_kernels.softmax(x) * 2, fullgraph=True, backend=backend)
        try:
            f(torch.randn(4, 1000))
        except Captured:
            pass
        print(json.dumps({{"graphs": graphs, "loaded": {_loaded()}}}))
    """)
    (targets,) = res["graphs"]
    assert "forge_kernels.softmax" in targets, targets
    # tracing ran the Meta implementation (the host code with launches skipped): softmax's module only
    assert [m for m in res["loaded"] if m.startswith("forge_kernels._ops.")] == ["forge_kernels._ops.softmax"]


def test_an_exported_program_saved_on_a_cpu_machine_loads_where_the_package_is_imported(site: Path,
                                                                                         tmp_path: Path) -> None:
    """torch.export with a dynamic row count, saved (a CPU machine: only the fake implementation runs), then loaded
    in a fresh process: the graph keeps the package's custom op and the dynamic size; loading needs the package
    imported (its look-up defines the op), and loading it loads no host code."""
    path = tmp_path / "softmax.pt2"
    res = _run(site, f"""
        import json, torch
        import forge_kernels
        from torch.export import Dim

        class M(torch.nn.Module):
            def forward(self, x):
                return forge_kernels.softmax(x) * 2

        ep = torch.export.export(M(), (torch.randn(37, 1000, dtype=torch.float16),),
                                 dynamic_shapes=({{0: Dim("rows", min=2, max=4096)}},))
        torch.export.save(ep, {str(path)!r})
        print(json.dumps({{"saved": True}}))
    """)
    assert res == {"saved": True}
    res = _run(site, f"""
        import json, sys, torch
        try:
            torch.export.load({str(path)!r})
            without = "loaded"
        except Exception as exc:
            without = type(exc).__name__
        import forge_kernels
        ep = torch.export.load({str(path)!r})
        print(json.dumps({{"without_import": without,
                          "targets": [str(n.target) for n in ep.graph.nodes if n.op == "call_function"],
                          "dynamic": [str(r) for r in ep.range_constraints.values()], "loaded": {_loaded()}}}))
    """)
    assert res["without_import"] != "loaded"
    assert res["targets"] == ["forge_kernels.softmax.default", "aten.mul.Tensor"]
    assert res["dynamic"] == ["VR[2, 4096]"]
    assert not [m for m in res["loaded"] if m.startswith("forge_kernels._ops.")]


def test_first_call_reads_one_target_and_compiles_no_constraint_for_a_row_key(site: Path) -> None:
    """A host module's index part holds no target's data: the configs and tables of each (kernel, variant,
    target) are a file of their own, read when a call first resolves to it (not the other variant's), and each
    config's binaries another, read when the config first launches.
    A key equal to a table row takes the row's config without compiling the kernel's constraints (the build
    checked them at that key); another key compiles them."""
    res = _run(site, """
        import json, os, sys
        import forge_kernels
        from forge_kernels._runtime import host_modules as hm, tables, launch, kernel as kmod
        root = forge_kernels.__path__[0]
        part = json.load(open(os.path.join(root, "_forge", "modules", "matmul.json")))
        full = json.load(open(os.path.join(root, "_forge", "index.json")))
        index = hm.load_index(root, "matmul")
        spec = index["kernels"]["matmul"]
        variant = spec["variants"]["T=fp16"]
        names = list(variant["targets"])
        def loaded(v):
            return [t for t, e in v["targets"].items() if e.loaded]

        before = loaded(variant)
        k = kmod.Kernel("matmul", spec, index["targets"], launch.BinaryBackend(root))
        info = {"name": "NVIDIA H100 80GB HBM3", "capability": (9, 0), "arch": "sm_90", "max_shared": 232448}
        target, table = tables.resolve_table(k, variant, {"T": "fp16"}, "cuda", info)
        after = loaded(variant)
        others = loaded(spec["variants"]["T=bf16"])
        configs = variant["targets"]["sm_90"]["configs"]
        binaries_read = sorted(c for c, v in configs.items() if v["binaries"].loaded)
        row_binaries = sorted(configs[table.lookup((4096, 4096, 4096)).id]["binaries"])
        binaries_read_after = sorted(c for c, v in configs.items() if v["binaries"].loaded)
        want = full["kernels"]["matmul"]["variants"]["T=fp16"]["targets"]["sm_90"]
        got = variant["targets"]["sm_90"]
        same = (got["tables"] == want["tables"] and sorted(got["configs"]) == sorted(want["configs"])
                and all(dict(got["configs"][c]["binaries"]) == want["configs"][c]["binaries"]
                        for c in want["configs"]))
        row = table.lookup((4096, 4096, 4096))
        after_row = "forge_kernels._runtime.expressions" in sys.modules
        other = table.lookup((3000, 100, 77))
        env = {**other.launch_meta, "M": 3000, "N": 100, "K": 77}
        print(json.dumps({
            "part_has_configs": "configs" in json.dumps(part),
            "files": sorted(f for f in os.listdir(os.path.join(root, "_forge", "modules", "matmul", "matmul", "T=fp16"))
                            if f.endswith(".json")),
            "others": others,
            "names": names, "before": before, "loaded": after, "binaries_read": binaries_read,
            "row_binaries": row_binaries, "binaries_read_after": binaries_read_after, "target": target, "same": same,
            "row": row.id, "row_config": [r[-1] for r in got["tables"][info["name"]]
                                          if tuple(r[:-1]) == (4096, 4096, 4096)],
            "expressions_after_row": after_row,
            "expressions_after_other": "forge_kernels._runtime.expressions" in sys.modules,
            "other_fits": all(c(env) for c in k.constraints)}))
    """)
    assert not res["part_has_configs"]
    assert res["files"] == ["gfx942.json", "sm_80.json", "sm_90.json"]
    assert res["names"] == ["gfx942", "sm_80", "sm_90"] and res["before"] == []
    assert res["target"] == "sm_90" and res["loaded"] == ["sm_90"] and res["others"] == [] and res["same"]
    assert res["row_config"] == [res["row"]]
    # resolving read no config's binaries; the row config's first launch reads its own only
    assert res["binaries_read"] == [] and res["binaries_read_after"] == [res["row"]] and res["row_binaries"]
    assert res["expressions_after_row"] is False
    assert res["expressions_after_other"] is True and res["other_fits"] is True


def test_a_missing_index_part_is_a_clear_error(site: Path, tmp_path: Path) -> None:
    res = _run(site, f"""
        import json
        from forge_kernels._runtime.errors import ForgeRuntimeError
        from forge_kernels._runtime.host_modules import LazyJson
        bad = {str(tmp_path / "bad.json")!r}
        open(bad, "w").write("{{not json")
        out = []
        for path in ({str(tmp_path / "missing.json")!r}, bad):
            part = LazyJson(path)
            try:
                part["configs"]
            except ForgeRuntimeError as exc:
                out.append([str(exc), part.loaded])
        print(json.dumps(out))
    """)
    assert len(res) == 2 and all("reinstall the package" in msg and not loaded for msg, loaded in res)
    assert "missing.json" in res[0][0] and "bad.json" in res[1][0]


def test_a_custom_ops_exported_function_leaves_out_dynamos_marks_of_its_host_function() -> None:
    """flash-linear-attention decorates its ops ``@torch.compiler.disable``: the exported op, dressed as its host
    function after the first eager call, took that mark and torch.compile(fullgraph=True) stopped there instead of
    tracing the custom op; an op that is no custom op keeps it (its host code must not be traced)."""
    import torch

    from forge_aot.runtime.exports import dress_exported

    @torch.compiler.disable
    def chunk_op(x):
        """FLA's op."""
        return x

    marks = [k for k in vars(chunk_op) if k.startswith("_torchdynamo")]
    assert marks
    for custom in (True, False):
        def exported(*args, **kwargs):
            return None

        dress_exported(exported, chunk_op, "chunk_op", custom)
        assert exported.__doc__ == "FLA's op." and exported.__wrapped__ is chunk_op
        assert [k for k in vars(exported) if k.startswith("_torchdynamo")] == ([] if custom else marks)
