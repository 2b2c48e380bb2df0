"""Manifest validation: one fixture project per failure case, reported by the CLI without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from forge_aot.cli import main
from forge_aot.manifest import load_manifest
from forge_aot.plan import make_plan
from tests.conftest import FIXTURES, REPO

EXPECTED = json.loads((FIXTURES / "manifests" / "expected_errors.json").read_text())

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_failure_case_is_reported_with_key_path(case: str) -> None:
    manifest = FIXTURES / "manifests" / case / "kernel_manifest.toml"
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.startswith("error: ")
    for needle in EXPECTED[case]:
        assert needle in result.output, (needle, result.output)


def test_every_failure_fixture_has_an_expectation() -> None:
    dirs = {p.name for p in (FIXTURES / "manifests").iterdir() if p.is_dir()}
    assert dirs == set(EXPECTED)


def test_missing_manifest_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["check", "--manifest", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2 and "file not found" in result.output and "Traceback" not in result.output


def test_repository_manifest_is_valid() -> None:
    result = CliRunner().invoke(main, ["check", "--manifest", str(REPO / "kernel_manifest.toml")])
    assert result.exit_code == 0, result.output
    assert "4 kernels" in result.output


def test_variants_rows_and_plan_of_repository_manifest() -> None:
    loaded = load_manifest(REPO / "kernel_manifest.toml")
    plan = make_plan(loaded, ["sm_90"])
    assert [e.assignment["T"] for e in plan.entries if e.kernel == "matmul"] == ["fp16", "bf16"]
    softmax_rows = [r.key for r in next(e for e in plan.entries if e.kernel == "softmax").tables["default"]]
    assert softmax_rows == [(n,) for n in (128, 256, 512, 1000, 1024, 2048, 4096, 8192, 16384, 32768, 50257)]
    softmax = next(e for e in plan.entries if e.kernel == "softmax" and e.variant == "T=fp32")
    # The documented default: the first candidate, in listed order, satisfying the constraints per row.
    firsts = {row.key[0]: row.preferences[0].meta["BLOCK_SIZE"] for row in softmax.tables["default"]}
    assert {n: firsts[n] for n in (128, 1000, 1024, 4096, 16384)} == {128: 128, 1000: 1024, 1024: 1024, 4096: 4096,
                                                                     16384: 4096}
    assert {e.target for e in plan.entries} == {"sm_90"}
    # The plan is a JSON document.
    json.dumps(plan.to_json())


def test_a_kernel_with_its_own_targets_is_planned_for_those_only() -> None:
    """matmul_tma is Hopper's path: the repository manifest builds it for sm_90 alone."""
    from forge_aot import runtime as rt
    from forge_aot.index import build_index

    plan = make_plan(load_manifest(REPO / "kernel_manifest.toml"))
    by_kernel: dict[str, set[str]] = {}
    for e in plan.entries:
        by_kernel.setdefault(e.kernel, set()).add(e.target)
    assert by_kernel["matmul_tma"] == {"sm_90"}
    assert by_kernel["matmul"] == {"sm_80", "sm_90", "gfx942"}
    # a build for the other targets only: the kernel stays bound (the host code names it) with no binaries,
    # and a call that reaches it says so instead of blaming the dtype
    sm80 = make_plan(load_manifest(REPO / "kernel_manifest.toml"), ["sm_80"])
    assert not [e for e in sm80.entries if e.kernel == "matmul_tma"]
    index = build_index(sm80, None, "jit", {m: "x.py" for m in sm80.modules})
    kernel = rt.Kernel("matmul_tma", index["kernels"]["matmul_tma"], index["targets"], backend=None)
    with pytest.raises(rt.UnsupportedDeviceError, match=r"no binaries of this kernel: it was built for sm_80 and "
                       r"kernels\.matmul_tma\.targets lists sm_90"):
        kernel.find_variant(("fp16",))


def test_refine_adds_rows_between_the_listed_shapes() -> None:
    from forge_aot.plan import refine_rows

    # 1-D: each row's two nearest, geometric midpoints keeping the alignment both ends share (1000 and 256 are
    # multiples of 8: 504, not 506), each once
    assert refine_rows([(128,), (256,), (1000,), (4096,)], 2) == [(128,), (256,), (1000,), (4096,), (176,), (360,),
                                                                  (504,), (2024,), (1024,)]
    assert refine_rows([(128,), (256,)], 0) == [(128,), (256,)]
    # matmul's gap between 1024^3 and 1536^3 gets a row, where the best tile changes with the wave count
    cubes = [(1000, 1000, 1000), (1024, 1024, 1024), (1536, 1536, 1536), (2048, 2048, 2048)]
    refined = refine_rows(cubes, 2)
    assert refined[:4] == cubes and (1248, 1248, 1248) in refined and len(refined) == len(set(refined))
    assert all(v % 8 == 0 for row in refined for v in row)  # TMA needs rows of K and N halfs 16-byte aligned
    # in a plan: the repository's matmul_tma refines its shapes; the added rows are traced and tabled
    plan = make_plan(load_manifest(REPO / "kernel_manifest.toml"), ["sm_90"])
    entry = next(e for e in plan.entries if e.kernel == "matmul_tma" and e.variant == "T=fp16")
    keys = {r.key for r in entry.tables["default"]}
    assert (1248, 1248, 1248) in keys and (1024, 1024, 1024) in keys
    assert entry.calls[(1248, 1248, 1248)]  # the tuning inputs were traced at the added row too


def test_refine_rows_do_not_depend_on_the_manifest_order_and_zero_counts_as_one() -> None:
    from forge_aot.plan import _midpoint, refine_rows

    shapes = [(2048, 1024), (2048, 2048), (256, 256), (1024, 2048)]
    added = set(refine_rows(shapes, 1)) - set(shapes)
    assert added == set(refine_rows(shapes[::-1], 1)) - set(shapes)  # distance ties broken the same way
    assert _midpoint(0, 4096) == _midpoint(1, 4096) == 64 and _midpoint(7, 7) == 7


def test_a_refined_row_no_config_serves_is_left_out(tmp_path: Path) -> None:
    from tests.test_callsite import HEADER, ROW_SCALE, _project

    # a constraint the listed rows meet and their midpoint (1440) does not
    manifest = _project(tmp_path, HEADER + ROW_SCALE + 'shapes = [{ n_cols = 1024 }, { n_cols = 2048 }]\n'
                        'refine = 1\nconstexprs = { ACT = [""], BLOCK_SIZE = [4096], num_warps = [4] }\n'
                        '\n[kernels.row_scale.tune]\nconstraints = ["n_cols % 1024 == 0"]\n')
    plan = make_plan(load_manifest(manifest))
    keys = {r.key for e in plan.entries for r in e.tables["default"]}
    assert keys == {(1024,), (2048,)}  # (1440,) was added, then left out: no config satisfies the constraints
    assert "refine" in " ".join(plan.kernels["row_scale"].notes)  # no tune.inputs: the added rows stay untuned


def test_refine_is_refused_where_the_decorators_key_is_chosen_at_the_call_site(tmp_path: Path) -> None:
    from tests.test_callsite import HEADER, ROW_SCALE, _project

    src = (FIXTURES / "kernels" / "callsite.py").read_text().replace(
        "@triton.jit\ndef row_scale_kernel", '@triton.autotune(configs=[triton.Config({}, num_warps=4)], '
        'key=["n_cols", "BLOCK_SIZE"])\n@triton.jit\ndef row_scale_kernel')
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "callsite.py").write_text(src)
    body = HEADER + ROW_SCALE.replace("KERNELS/callsite.py", str(tmp_path / "k" / "callsite.py"))
    body = body.replace('key = ["n_cols"]\n', "") + ('shapes = [{ n_cols = 100, BLOCK_SIZE = 128 }, '
                                                     '{ n_cols = 3000, BLOCK_SIZE = 4096 }]\nrefine = 1\n'
                                                     'constexprs = { ACT = [""], BLOCK_SIZE = [128, 4096] }\n')
    result = CliRunner().invoke(main, ["check", "--manifest", str(_project(tmp_path, body, "auto"))])
    assert result.exit_code == 2, result.output
    assert "kernels.row_scale.refine" in result.output and "call site" in result.output


def test_refine_is_refused_where_a_key_is_chosen_at_the_call_site(tmp_path: Path) -> None:
    from tests.test_callsite import HEADER, ROW_SCALE, _project

    bad = _project(tmp_path, HEADER + ROW_SCALE.replace('key = ["n_cols"]', 'key = ["n_cols", "BLOCK_SIZE"]')
                   + 'shapes = [{ n_cols = 100, BLOCK_SIZE = 128 }]\nrefine = 1\n'
                   'constexprs = { ACT = [""], BLOCK_SIZE = [128], num_warps = [4] }\n')
    result = CliRunner().invoke(main, ["check", "--manifest", str(bad)])
    assert result.exit_code == 2 and "kernels.row_scale.refine" in result.output and "call site" in result.output
    negative = _project(tmp_path, HEADER + ROW_SCALE + 'shapes = [{ n_cols = 100 }]\nrefine = -1\n'
                        'constexprs = { ACT = [""], BLOCK_SIZE = [128], num_warps = [4] }\n', "neg")
    result = CliRunner().invoke(main, ["check", "--manifest", str(negative)])
    assert result.exit_code == 2 and "must be 0" in result.output


def test_schema_matches_committed_file_and_validates_manifest() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from forge_aot.manifest import json_schema

    schema = json_schema()
    committed = json.loads((REPO / "forge_aot" / "manifest.schema.json").read_text())
    assert schema == committed, "regenerate: forge-aot schema > forge_aot/manifest.schema.json"
    data = tomllib.loads((REPO / "kernel_manifest.toml").read_text())
    jsonschema.validate(data, schema)
    bad = json.loads(json.dumps(data))
    bad["kernels"]["add"]["tune"]["num_wraps"] = [4]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)

    def walk(node: dict) -> None:
        for name, prop in node.get("properties", {}).items():
            assert prop.get("description"), f"field {name} has no docstring"
            walk(prop)
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"])

    walk(schema)


@pytest.mark.parametrize(("exit_with", "code", "stderr"), [("None", 0, ""), ("3", 3, ""), ("'no luck'", 1, "no luck"),
                                                          ("0", 0, "")])
def test_console_script_ends_quickly_with_the_commands_exit_code(exit_with: str, code: int, stderr: str) -> None:
    """``entry`` skips torch's teardown once torch is imported: the command's exit code and output survive."""
    script = ("import sys, torch\nfrom forge_aot import cli\n"
              f"def main():\n    print('written', flush=False)\n    sys.exit({exit_with})\n"
              "cli.main = main\ncli.entry()\nprint('not reached')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (code, "written\n", stderr)


def test_console_script_runs_a_command_that_imports_torch() -> None:
    """``forge-aot check`` plans (the kernel files import torch): it ends through the quick exit with its report."""
    done = subprocess.run([sys.executable, "-m", "forge_aot.cli", "check", "--manifest", "kernel_manifest.toml"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "4 kernels" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "forge_aot.cli", "check", "--manifest", "missing.toml"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.startswith("error: "), bad.stderr


def test_console_script_runs_atexit_handlers_and_survives_a_closed_stdout() -> None:
    """What the skipped teardown would still have done: atexit handlers (profilers, logging, finalizers) run; a
    closed stdout does not turn success into a traceback."""
    script = ("import atexit, sys, torch\nfrom forge_aot import cli\n"
              "atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
              "cli.main = lambda: sys.exit(0)\ncli.entry()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert (done.returncode, done.stderr.strip()) == (0, "atexit ran")
    closed = subprocess.run([sys.executable, "-c", script.replace("atexit.register", "sys.stdout = None; "
                                                                   "atexit.register")],
                            capture_output=True, text=True, cwd=REPO)
    assert (closed.returncode, closed.stderr.strip()) == (0, "atexit ran")


def test_console_script_lets_non_daemon_threads_finish(tmp_path: Path) -> None:
    out = tmp_path / "late.txt"
    script = ("import sys, threading, time, torch\nfrom forge_aot import cli\n"
              f"threading.Thread(target=lambda: (time.sleep(0.2), open({str(out)!r}, 'w').write('done'))).start()\n"
              "cli.main = lambda: sys.exit(0)\ncli.entry()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "done"


SIGNATURELESS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * s, mask=offs < n)


def scale(x, s):
    out = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), s, BLOCK=256)
    return out


def examples(device="cuda"):
    for dtype in DTYPES:
        scale(torch.randn(1000, device=device, dtype=dtype), 0.5)
'''


def _signatureless(root: Path, dtypes: str = "(torch.float16,)", extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "k.py").write_text(SIGNATURELESS.replace("DTYPES", dtypes))
    (root / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_test_nosig"\nversion = "0.1"\ntargets = ["sm_90"]\n\n'
        f'[kernels.scale]\nsource = "k.py:scale_kernel"\nops = ["scale"]\nexamples = "examples"\n{extra}')
    return root / "kernel_manifest.toml"


def test_with_examples_the_signature_may_be_left_out(tmp_path: Path) -> None:
    """The traced calls type every runtime parameter, as Triton's JIT types the values (all three hunts over real
    files in session 39 had to write a one-entry signature first: "required key is missing")."""
    plan = make_plan(load_manifest(_signatureless(tmp_path)), ["sm_90"])
    assert plan.kernels["scale"].params[:4] == [("x_ptr", "*fp16"), ("out_ptr", "*fp16"), ("n", "i32"),
                                                ("s", "fp32")]


def test_without_signature_or_examples_the_message_names_both(tmp_path: Path) -> None:
    manifest = _signatureless(tmp_path)
    manifest.write_text(manifest.read_text().replace('examples = "examples"\n', ""))
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "kernels.scale.signature" in result.output \
        and "examples function" in result.output, result.output


def test_without_signature_tensors_of_several_dtypes_ask_for_a_type_variable(tmp_path: Path) -> None:
    manifest = _signatureless(tmp_path, "(torch.float16, torch.float32)")
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "kernels.scale.signature.x_ptr" in result.output \
        and "give it a type variable of dtypes" in result.output, result.output
    # every such parameter in one message, not one per run (lmdeploy's attention kernel took four runs)
    assert "2 runtime parameters of scale_kernel have no type" in result.output \
        and "kernels.scale.signature.out_ptr: runtime parameter 'out_ptr'" in result.output, result.output
    # what the message asks for: one pointer typed with the variable, the rest still from the calls
    manifest = _signatureless(tmp_path, "(torch.float16, torch.float32)",
                              'signature = { x_ptr = "*T" }\ndtypes = { T = ["fp16", "fp32"] }\n')
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    assert plan.kernels["scale"].params[:2] == [("x_ptr", "*T"), ("out_ptr", "*T")]


def test_without_signature_a_scalar_passed_as_int_and_float_asks_for_one_type(tmp_path: Path) -> None:
    """SGLang's quantization passes ``torch.iinfo`` bounds (ints) on one path and ``finfo`` bounds (floats) on
    another to one parameter: Triton's JIT compiles a binary for each type. The message says what to write; with it
    the calls' ints are passed as floats."""
    manifest = _signatureless(tmp_path)
    source = tmp_path / "k.py"
    source.write_text(source.read_text() + "    scale(torch.randn(77, device=device, dtype=torch.float16), 3)\n")
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "kernels.scale.signature.s" in result.output and "pass int and float" in \
        result.output and 'signature = { s = "fp32" } under [kernels.scale]' in result.output, result.output
    manifest.write_text(manifest.read_text() + 'signature = { s = "fp32" }\n')
    assert make_plan(load_manifest(manifest), ["sm_90"]).kernels["scale"].params[3] == ("s", "fp32")


def test_without_signature_do_not_specialize_names_a_runtime_parameter(tmp_path: Path) -> None:
    manifest = _signatureless(tmp_path, extra='do-not-specialize = ["m"]\n')
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "kernels.scale.do-not-specialize[0]" in result.output \
        and "'m' is not a runtime parameter of scale_kernel (accepted: x_ptr, out_ptr, n, s)" in result.output, \
        result.output


def test_host_side_tensor_descriptors_are_typed_from_the_traced_calls(tmp_path: Path) -> None:
    """A parameter the examples pass host-side ``TensorDescriptor``s (the tutorials' TMA kernels) is typed
    ``tensordesc<dtype>`` from them (the third hunt's tutorial 06 had to list ``tensordesc<fp16>`` four times): the
    plan is the one the written signature gives, binaries included."""
    source = (REPO / "benchmarks" / "launch" / "launch_kernels.py").resolve()

    def plan_of(signature: str):
        (tmp_path / "kernel_manifest.toml").write_text(
            '[project]\nname = "forge_test_desc"\nversion = "0.1"\ntargets = ["sm_90"]\n\n'
            f'[kernels.add_desc]\nsource = "{source}:add_desc_kernel"\nops = ["add_desc"]\n'
            f'signature = {{ {signature} }}\nexamples = "examples"\n')
        plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"), ["sm_90"])
        binaries = {(e.variant, row.preferences[0].id, b) for e in plan.entries for rows in e.tables.values()
                    for row in rows for b in plan.binaries_for(e, row.key, row.preferences[0])}
        return plan.kernels["add_desc"], binaries

    written, written_binaries = plan_of('x_desc = "tensordesc<fp32>", y_desc = "tensordesc<fp32>", '
                                        'o_desc = "tensordesc<fp32>", M = "i32", N = "i32"')
    typed, typed_binaries = plan_of('M = "i32"')
    assert typed.params == written.params and typed.params[0] == ("x_desc", "tensordesc<fp32>")
    assert typed.spec_params == written.spec_params and typed_binaries == written_binaries and typed_binaries


def test_descriptors_over_tensors_of_a_type_variable_take_it(tmp_path: Path) -> None:
    """Descriptors over fp16 and bf16 tensors in the traced calls: the type variable their first one has (one
    parameter typed with it, as for pointers), or, with none, the message asks for one."""
    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl
        from triton.tools.tensor_descriptor import TensorDescriptor


        @triton.jit
        def copy_kernel(x_desc, o_desc, BM: tl.constexpr, BN: tl.constexpr):
            o_desc.store([0, 0], x_desc.load([0, 0]))


        def copy(x):
            out = torch.empty_like(x)
            M, N = x.shape
            descs = [TensorDescriptor(t, [M, N], [N, 1], [32, 32]) for t in (x, out)]
            copy_kernel[(1,)](*descs, BM=32, BN=32)
            return out


        def examples(device="cpu"):
            for dtype in (torch.float16, torch.bfloat16):
                copy(torch.randn(64, 64, device=device, dtype=dtype))
        '''))

    def manifest(signature: str) -> Path:
        (tmp_path / "kernel_manifest.toml").write_text(
            '[project]\nname = "forge_test_desc_tv"\nversion = "0.1"\ntargets = ["sm_90"]\n\n'
            f'[kernels.copy]\nsource = "k.py:copy_kernel"\nops = ["copy"]\n{signature}examples = "examples"\n')
        return tmp_path / "kernel_manifest.toml"

    plan = make_plan(load_manifest(manifest('signature = { x_desc = "tensordesc<T>" }\n'
                                            'dtypes = { T = ["fp16", "bf16"] }\n')), ["sm_90"])
    assert plan.kernels["copy"].params[:2] == [("x_desc", "tensordesc<T>"), ("o_desc", "tensordesc<T>")]
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest(""))])
    assert result.exit_code == 2 and "kernels.copy.signature.x_desc" in result.output \
        and "its descriptors are over bf16, fp16 tensors: give it a type variable" in result.output, result.output


POINTER_OR_INT = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def k(OUT, X, IDX, OFFS, n, IS_OFFS_TENSOR: tl.constexpr, HAS_IDX: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    if not IS_OFFS_TENSOR:
        o = OFFS
    else:
        o = tl.load(OFFS)
    if HAS_IDX:
        o += tl.load(IDX)
    tl.store(OUT + i, tl.load(X + i, mask=i < n) + o, mask=i < n)


def add_offset(x, offs=0, idx=None):
    out = torch.empty_like(x)
    k[(1,)](out, x, idx, offs, x.numel(), isinstance(offs, torch.Tensor), idx is not None,
            triton.next_power_of_2(x.numel()))
    return out


def examples(device="cuda"):
    x = torch.randn(37, device=device, dtype=torch.float16)
    add_offset(x, 3)
    add_offset(x, torch.tensor([1], device=device, dtype=torch.int32))
    add_offset(x, torch.tensor([1], device=device, dtype=torch.int64),
               torch.tensor([2], device=device, dtype=torch.int32))
'''


def test_a_pointer_or_int_type_variable_source_given_an_int_types_nothing(tmp_path: Path) -> None:
    """flash-attn's rotary takes ``SEQLEN_OFFSETS`` as an int or an int32/int64 tensor (``*S|i32``, ``S`` a type
    variable): typing another untyped pointer from the traced calls compared its dtype with ``S``'s source in every
    call and crashed on the int ("'int' object has no attribute 'dtype'"). A call that passes the source an int says
    nothing about ``S``, as at run time."""
    from tests.test_localmods import one_file_project

    manifest = one_file_project(tmp_path / "p", "forge_test_ptr_or_int", POINTER_OR_INT, "k", ["add_offset"],
                                extra='signature = { OFFS = "*S|i32" }\ndtypes = { S = ["i32", "i64"] }\n')
    params = dict(make_plan(load_manifest(manifest), ["sm_90"]).kernels["k"].params)
    assert (params["OFFS"], params["IDX"], params["X"]) == ("*S", "*i32", "*fp16")  # (OFFS takes an i32 too)


OPTIONAL_POINTERS = '''\
import torch
import triton
import triton.language as tl


# flash-attn's layer norm: optional pointers whose presence heuristics compute
@triton.heuristics({"HAS_A": lambda args: args["A"] is not None})
@triton.heuristics({"HAS_B": lambda args: args["B"] is not None})
@triton.heuristics({"HAS_C": lambda args: args["C"] is not None})
@triton.heuristics({"HAS_D": lambda args: args["D"] is not None})
@triton.jit
def k(Y, X, A, B, C, D, n, BLOCK: tl.constexpr, HAS_A: tl.constexpr, HAS_B: tl.constexpr, HAS_C: tl.constexpr,
      HAS_D: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n)
    if HAS_A:
        x += tl.load(A + i, mask=i < n)
    if HAS_B:
        x += tl.load(B + i, mask=i < n)
    if HAS_C:
        x += tl.load(C + i, mask=i < n)
    if HAS_D:
        x += tl.load(D + i, mask=i < n)
    tl.store(Y + i, x, mask=i < n)


def add4(x, a=None, b=None, c=None, d=None):
    y = torch.empty_like(x)
    k[(1,)](y, x, a, b, c, d, x.numel(), triton.next_power_of_2(x.numel()))
    return y


def examples(device="cuda"):
    x = torch.randn(64, device=device)
    add4(x)
    add4(x, x, x, x, x)
'''


def test_every_none_combination_false_builds_the_traced_combinations_only(tmp_path: Path) -> None:
    """Every subset of the optional pointers is built by default (a call may leave out any): 2^k binaries per table
    row, 1864 for flash-attn's layer-norm backward in a helper's hunt. ``every-none-combination = false`` builds the
    combinations the traced calls pass."""
    from tests.test_localmods import one_file_project

    def heuristic_sets(extra: str) -> set[tuple[bool, ...]]:
        root = tmp_path / str(len(extra))
        plan = make_plan(load_manifest(one_file_project(root, "forge_test_optional", OPTIONAL_POINTERS, "k",
                                                        ["add4"], extra=extra)), ["sm_90"])
        return {tuple(v for n, v in b.heur if n.startswith("HAS_")) for e in plan.entries
                for rows in e.tables.values() for row in rows
                for b in plan.binaries_for(e, row.key, row.preferences[0])}

    assert len(heuristic_sets("")) == 16
    assert heuristic_sets("every-none-combination = false\n") == {(False,) * 4, (True,) * 4}


GATED_BIAS = '''\
import torch
import triton
import triton.language as tl


@triton.heuristics({"HAS_BIAS": lambda args: args["B"] is not None})
@triton.jit
def k(X, B, Y, N, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N)
    if HAS_BIAS:
        x += tl.load(B + offs, mask=offs < N)
    if NORM_BEFORE_GATE:
        x = x * 2
    tl.store(Y + offs, x, mask=offs < N)


def gated(x, b=None, norm_before_gate=False):
    y = torch.empty_like(x)
    k[(1,)](x, b, y, x.numel(), BLOCK=1024, NORM_BEFORE_GATE=norm_before_gate)
    return y


def examples(device="cuda"):
    x = torch.randn(1000, device=device)
    gated(x, None, norm_before_gate=False)
    gated(x, torch.randn(1000, device=device), norm_before_gate=True)
'''
"""lightllm's gated RMSNorm: an optional bias (a ``HAS_BIAS`` heuristic) beside a call-site flag, each value of the
flag traced with one presence of the bias only."""


def test_a_pointer_whose_presence_follows_the_variant_is_named_by_check(tmp_path: Path) -> None:
    """Session 47's lightllm hunt: a bias traced only with ``NORM_BEFORE_GATE=True`` is built with that value only,
    as each variant is built for what its own calls pass (crossing every variant would build binaries no call
    reaches where a flag is computed from the pointer: FLA's ``USE_G=g is not None`` went from 20 binaries to 128,
    the realworld fixtures from 3514 to 14094). ``check`` said "each combination with the values other calls pass
    there is built"; it now says per variant (at every row, since session 50), and names such a pointer with what to
    do."""
    from tests.test_localmods import one_file_project

    def built_and_output(source: str, root: Path) -> tuple[set[tuple[bool, bool]], str]:
        manifest = one_file_project(root, "forge_test_gated", source, "k", ["gated"])
        plan = make_plan(load_manifest(manifest), ["sm_90"])
        built = {(e.assignment["NORM_BEFORE_GATE"], dict(b.heur)["HAS_BIAS"]) for e in plan.entries
                 for rows in e.tables.values() for row in rows
                 for b in plan.binaries_for(e, row.key, row.preferences[0])}
        result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
        assert result.exit_code == 0, result.output
        return built, result.output

    built, output = built_and_output(GATED_BIAS, tmp_path / "p")
    assert built == {(False, False), (True, True)}
    assert "(each combination with the values other calls of the same variant pass there is built, at every row)" \
        in output
    assert "note: B: None in all traced calls of some variants, passed in all of others; each is built as its " \
        "calls pass it, and another combination raises NotBuiltError (trace it in the examples if it occurs)" \
        in output
    # traced with both presences in one variant: crossed there, and nothing to note
    built, output = built_and_output(GATED_BIAS.replace(
        "    gated(x, None, norm_before_gate=False)\n",
        "    gated(x, None, norm_before_gate=False)\n    gated(x, x, norm_before_gate=False)\n"), tmp_path / "q")
    assert built == {(False, False), (False, True), (True, True)}
    assert "note: B:" not in output


def test_a_type_variable_named_like_a_constexpr_parameter_is_refused(tmp_path: Path) -> None:
    """FLA's l2norm kernels take ``T: tl.constexpr`` (the row count) where FLA projects name their dtype variable
    ``T``: the two shared one variant axis, so the traced row counts were lost and one binary served every count,
    without a word."""
    from tests.test_localmods import one_file_project

    source = ("import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
              "def k(x, y, T: tl.constexpr, D: tl.constexpr):\n    i = tl.arange(0, D)\n"
              "    tl.store(y + tl.program_id(0) * D + i, tl.load(x + tl.program_id(0) * D + i) * T)\n\n\n"
              "def op(x):\n    y = torch.empty_like(x)\n    k[(x.shape[0],)](x, y, T=x.shape[0], D=x.shape[1])\n"
              "    return y\n\n\ndef examples(device='cuda'):\n"
              "    op(torch.randn(126, 64, device=device, dtype=torch.float16))\n"
              "    op(torch.randn(520, 64, device=device, dtype=torch.bfloat16))\n")
    manifest = one_file_project(tmp_path / "p", "forge_test_tv_clash", source, "k", ["op"],
                                extra='signature = { x = "*T" }\ndtypes = { T = ["fp16", "bf16"] }\n')
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert result.exit_code == 2 and "kernels.k.dtypes.T: type variable 'T' has the name of k's constexpr " \
        "parameter 'T'" in result.output, result.output
    manifest.write_text(manifest.read_text().replace('"*T"', '"*DT"').replace("{ T = [", "{ DT = ["))
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    assert {e.assignment["T"] for e in plan.entries} == {126, 520}


VARLEN = '''\
import torch
import triton
import triton.language as tl


@triton.heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.jit
def copy_kernel(x, y, cu_seqlens, chunk_indices, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    # FLA's style: IS_VARLEN comes from cu_seqlens, and chunk_indices is read under it (both None or both set)
    i_t = tl.program_id(0)
    if IS_VARLEN:
        i_n, i_t = tl.load(chunk_indices + i_t * 2).to(tl.int32), tl.load(chunk_indices + i_t * 2 + 1).to(tl.int32)
        bos = tl.load(cu_seqlens + i_n).to(tl.int32)
        T = tl.load(cu_seqlens + i_n + 1).to(tl.int32) - bos
    else:
        bos = 0
    offs = i_t * BT + tl.arange(0, BT)
    tl.store(y + bos + offs, tl.load(x + bos + offs, mask=offs < T), mask=offs < T)


def copy_op(x, cu_seqlens=None):
    y = torch.empty_like(x)
    if cu_seqlens is not None:
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        idx = torch.cat([torch.arange(triton.cdiv(n, 64)) for n in lens])
        chunk_indices = torch.stack([idx.eq(0).cumsum(0) - 1, idx], 1).to(cu_seqlens)
        nt = len(chunk_indices)
    else:
        chunk_indices, nt = None, triton.cdiv(x.numel(), 64)
    copy_kernel[(nt,)](x, y, cu_seqlens, chunk_indices, x.numel(), BT=64)
    return y


def examples(device="cuda"):
    x = torch.randn(193, device=device)
    copy_op(x)
    copy_op(x, torch.tensor([0, 63, 193], device=device))
'''


@pytest.mark.slow
def test_untraced_none_combinations_that_do_not_compile_are_counted_not_dumped(tmp_path: Path) -> None:
    """FLA passes ``cu_seqlens`` and ``chunk_indices`` together, and the kernel reads ``chunk_indices`` under the
    heuristic ``cu_seqlens`` sets: the build's every-subset combinations include ``cu_seqlens`` without
    ``chunk_indices``, which Triton cannot compile. A helper's FLA 0.3.0 build printed each such binary's traceback
    (about 450 lines with ``-q``) under "their table rows use the next config", which none does. Now one line per
    kernel counts them, with the compiler's last line and what to write instead."""
    from tests.test_localmods import one_file_project

    manifest = one_file_project(tmp_path / "p", "forge_test_varlen", VARLEN, "copy_kernel", ["copy_op"],
                                entry="copy")
    result = CliRunner().invoke(main, ["build", "--manifest", str(manifest), "--target", "sm_90", "-q", "-j", "2",
                                       "--out", str(tmp_path / "dist"), "--build-dir", str(tmp_path / "work")])
    assert result.exit_code == 0, result.output
    assert "binaries for combinations of None arguments no example passed did not compile and were left out" \
        in result.output and "every-none-combination = false" in result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("  - copy: ")]
    assert "'NoneType' object has no attribute 'type'" in line
    assert "tl.load(chunk_indices" not in result.output and "use the next config" not in result.output
