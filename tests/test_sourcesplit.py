"""Host code extraction: kernel lines blanked, line numbers kept, Triton use in host code refused."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from forge_aot.errors import SourceError
from forge_aot.sourcesplit import function_writes, parse_source
from tests.conftest import REPO


def test_host_code_keeps_line_numbers_and_drops_kernels() -> None:
    path = REPO / "kernels" / "matmul.py"
    src = parse_source(path)
    original = path.read_text().splitlines()
    host = src.host_source.splitlines()
    assert len(host) == len(original)
    assert "matmul_kernel" in src.kernels and "@triton.jit" not in src.host_source
    assert "import triton" not in src.host_source
    line = next(i for i, text in enumerate(original) if text.startswith("def matmul("))
    assert host[line] == original[line]
    assert src.kernel_refs["_matmul_tiled"] == {"matmul_kernel"}
    assert src.kernel_refs["_matmul_tma"] == {"matmul_tma_kernel"} and src.kernel_refs["matmul"] == frozenset()
    params = [(p.name, p.constexpr) for p in src.kernels["matmul_kernel"].params]
    assert params[0] == ("a_ptr", False) and params[-1] == ("GROUP_M", True)
    assert sorted({(s.kernel, s.function, s.keywords) for s in src.launches}) == [
        ("matmul_kernel", "_matmul_tiled", ()), ("matmul_tma_kernel", "_matmul_tma", ())]


@pytest.mark.parametrize(("body", "message"), [
    ("def op(x):\n    return triton.language.arange(0, 4)\n", "triton.language"),
    ("def op(x):\n    import triton\n    return x\n", "imports Triton"),
    ("DTYPE = tl.arange(0, 4)\n\ndef op(x):\n    return DTYPE\n", "defined with Triton"),
    # the Triton tutorials end with their benchmark, run at import: script code
    ("@triton.testing.perf_report([])\ndef bench(n):\n    pass\n\nbench.run(print_data=True)\n",
     r"host code uses 'bench', defined with Triton on line 9; module code that runs it when the file is imported .*"
     r"if __name__ == \"__main__\":"),
    # torchao's int_matmul: a module-level list of configs its own autotuner searches at run time (do_bench)
    ("CONFIGS = [triton.Config({'B': 64}, num_warps=4)]\n\ndef op(x):\n    return triton.testing.do_bench("
     "lambda: CONFIGS[0])\n", r"host code uses triton.testing"),
])
def test_host_code_may_not_need_triton(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "k.py"
    f.write_text("import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x):\n    pass\n\n" + body)
    with pytest.raises(SourceError, match=message):
        parse_source(f, {"op"})


def test_host_code_may_build_triton_configs(tmp_path: Path) -> None:
    """``triton.Config`` is a host value (Cut Cross-Entropy builds heuristics from one's ``all_kwargs()``): host
    code that reads one ships, with the runtime's ``triton.Config``; a config list nothing shipped reads does not."""
    f = tmp_path / "k.py"
    f.write_text("import triton\n\n@triton.autotune(configs=SPACE, key=[])\n@triton.jit\ndef k(x):\n    pass\n\n"
                 "SPACE = [triton.Config({'B': 32})]\nCONFIGS = [triton.Config({'B': 64}, num_warps=4)]\n\n"
                 "def op(x):\n    return CONFIGS[0].all_kwargs()\n")
    host = parse_source(f, {"op"}).host_source
    assert "CONFIGS = [triton.Config(" in host and "SPACE = __forge_kernel_side__('SPACE', __name__)" in host


AUTOTUNED = """\
import torch
import triton
import triton.language as tl


def get_configs():
    return [triton.Config({"BLOCK": b}, num_warps=w) for b in (64, 128) for w in (4, 8)]


def is_cuda():
    return triton.runtime.driver.active.get_current_target().backend == "cuda"


def pick():
    return get_configs() if is_cuda() else get_configs()[:1]


@triton.autotune(configs=pick(), key=["n"])
@triton.heuristics({
    "EVEN": lambda args: args["n"] % args["BLOCK"] == 0,
})
@triton.heuristics(values={"HALF": lambda args: triton.next_power_of_2(args["BLOCK"]) // 2})
@triton.jit(do_not_specialize=["n"])
def k(x_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr, HALF: tl.constexpr):
    pass


def op(x):
    k[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, x.numel())
    return x
"""


def test_autotuned_kernel_heuristics_become_host_registrations(tmp_path: Path) -> None:
    f = tmp_path / "k.py"
    f.write_text(AUTOTUNED)
    src = parse_source(f, {"op"})
    ks = src.kernels["k"]
    assert ks.decorators == ("autotune", "heuristics", "heuristics", "jit") and ks.do_not_specialize == ("n",)
    host = src.host_source.splitlines()
    original = AUTOTUNED.splitlines()
    assert len(host) == len(original)
    # Config-list helpers that use Triton and that only the decorator reaches are left out: their names stay bound,
    # on their def lines, to stand-ins (the kernel's to its handle), as a module re-exporting them needs.
    for helper in ("get_configs", "is_cuda", "pick", "k"):
        line = next(i for i, text in enumerate(original) if text.startswith(f"def {helper}("))
        assert host[line] == f"{helper} = __forge_kernel_side__({helper!r}, __name__)"
    assert "return get_configs()" not in src.host_source and "driver.active" not in src.host_source
    first = next(i for i, line in enumerate(original) if line.startswith("@triton.heuristics({"))
    assert host[first].rstrip() == "__forge_heuristics__('k', {"
    assert host[first + 1] == original[first + 1]
    second = next(i for i, line in enumerate(original) if line.startswith("@triton.heuristics(values"))
    assert host[second].startswith("__forge_heuristics__('k', {\"HALF\"") and host[second].endswith("})")
    compile(src.host_source, str(f), "exec")  # the rewritten host code is valid Python
    assert "op" in src.host_functions


REBOUND = """\
import torch
import triton
import triton.language as tl


def _rope(Q, n, BACKWARD_PASS: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    q = tl.load(Q + offs, mask=offs < n)
    tl.store(Q + offs, -q if BACKWARD_PASS else q, mask=offs < n)


_rope = triton.jit(_rope)
_rope = triton.heuristics(
    {
        "BACKWARD_PASS": lambda args: bool(args["BACKWARD_PASS"]),
    }
)(_rope)


def _plain(X, n, BLOCK: tl.constexpr):
    pass


_plain = triton.jit(_plain, do_not_specialize=["n"])
not_a_kernel = triton.cdiv(7, 2)


def op(q):
    _rope[(1,)](q, q.numel(), BACKWARD_PASS=0, BLOCK_SIZE=1024)
    _plain[(1,)](q, q.numel(), BLOCK=64)
    return q
"""


def test_kernels_wrapped_by_assignment_are_kernels_as_decorated_ones(tmp_path: Path) -> None:
    """Unsloth wraps its kernels after the def (``_rope = triton.jit(_rope)``, then ``_rope =
    triton.heuristics({...})(_rope)``): the same kernel, decorators and host code as the decorated form."""
    f = tmp_path / "k.py"
    f.write_text(REBOUND)
    src = parse_source(f, {"op"})
    assert src.kernels["_rope"].decorators == ("heuristics", "jit")
    assert src.kernels["_plain"].decorators == ("jit",) and src.kernels["_plain"].do_not_specialize == ("n",)
    host, original = src.host_source.splitlines(), REBOUND.splitlines()
    assert len(host) == len(original)
    for line in ("def _rope", "def _plain", "= triton.jit(", "= triton.heuristics("):
        assert line not in src.host_source
    first = original.index("_rope = triton.heuristics(")
    assert host[first].rstrip() == "__forge_heuristics__('_rope',"
    # the values, on their lines, registered before any heuristics above (a rebinding wraps them: Triton runs it first)
    assert host[first + 1:first + 5] == ["{", original[first + 2], "    }, True)", ""]
    assert host[original.index("not_a_kernel = triton.cdiv(7, 2)")] == "not_a_kernel = triton.cdiv(7, 2)"
    assert [site.kernel for site in src.launches] == ["_rope", "_plain"]
    compile(src.host_source, str(f), "exec")
    # a function or class in between binding the name locally (its own scope) leaves the def the def
    f.write_text(REBOUND.replace("_plain = triton.jit(_plain,",
                                 "class Other:\n    def method(self):\n        _plain = 1\n        return _plain\n\n\n"
                                 "_plain = triton.jit(_plain,"))
    assert parse_source(f, {"op"}).kernels["_plain"].decorators == ("jit",)
    # a name bound again in between (an import, an if/try block) is no longer the def: not a kernel
    for between in ("from fastlib import _plain", "try:\n    _plain = fastlib._plain\nexcept ImportError:\n    pass"):
        f.write_text(REBOUND.replace("_plain = triton.jit(_plain,", between + "\n_plain = triton.jit(_plain,"))
        with pytest.raises(SourceError, match="host code uses '_plain', defined with Triton"):
            parse_source(f, {"op"})
    # a rebinding that is not Triton's leaves the function a function (which host code may then not launch)
    f.write_text(REBOUND.replace("_plain = triton.jit(_plain, do_not_specialize=[\"n\"])",
                                 "_plain = functools.wraps(_plain)(_plain)"))
    with pytest.raises(SourceError, match="host code uses '_plain', defined with Triton"):
        parse_source(f, {"op"})


def test_host_op_reaching_a_triton_helper_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "k.py"
    # (a list of triton.Config alone is a host value: test_host_code_may_build_triton_configs)
    f.write_text(AUTOTUNED.replace("    return x\n", "    return len(get_configs())\n")
                 .replace("for w in (4, 8)]", "for w in (4, 8)] + [tl.arange(0, 4)]"))
    with pytest.raises(SourceError, match="get_configs"):
        parse_source(f, {"op"})


def test_host_op_may_ask_tritons_driver_about_the_device(tmp_path: Path) -> None:
    # is_cuda() reads triton.runtime.driver.active.get_current_target(), which the runtime answers: an op that
    # calls it ships it; the same helper reached only by a decorator stays out (previous test's file)
    f = tmp_path / "k.py"
    f.write_text(AUTOTUNED.replace("    return x\n", "    return is_cuda()\n"))
    src = parse_source(f, {"op"})
    assert "def is_cuda" in src.host_source and "def get_configs" not in src.host_source and src.reads_device
    plain = tmp_path / "plain.py"
    plain.write_text(AUTOTUNED)
    assert not parse_source(plain, {"op"}).reads_device


def test_driver_import_binds_the_runtimes_driver_on_its_own_line(tmp_path: Path) -> None:
    f = tmp_path / "k.py"
    f.write_text("import torch\nimport triton\nfrom triton.runtime import driver\nfrom triton.runtime import "
                 "driver as drv\n\n@triton.jit\ndef k(x):\n    pass\n\n"
                 "props = driver.active.utils.get_device_properties(0)\n"
                 "TARGET = drv.active.get_current_target()\nUNUSED = triton.runtime.driver.active.get_current_target()"
                 "\n\ndef op(x):\n    c = k.warmup(x, grid=(1,), num_warps=8)\n"
                 "    c[(props['multiprocessor_count'],)](x)\n    return TARGET\n")
    src = parse_source(f, {"op"})
    lines = src.host_source.splitlines()
    assert lines[2] == "driver = triton.runtime.driver" and lines[3] == "drv = triton.runtime.driver"
    assert lines[9].startswith("props = driver.active") and lines[10].startswith("TARGET = drv.active")
    # a device query nothing shipped reads is left out, its name bound to a stand-in
    assert lines[11] == "UNUSED = __forge_kernel_side__('UNUSED', __name__)"
    assert src.reads_device
    (site,) = src.launches  # the warmup binds the launch; grid= is not a kernel argument
    assert (site.kernel, site.keywords, site.positional) == ("k", ("num_warps",), 1)
    compile(src.host_source, str(f), "exec")


@pytest.mark.parametrize(("body", "message"), [
    ("from triton.runtime import autotuner\n\ndef op(x):\n    return autotuner\n", "'autotuner', which is Triton"),
    ("def op(x):\n    return triton.runtime.cache\n", r"triton\.runtime.* triton\.runtime\.driver"),
])
def test_only_the_driver_of_tritons_runtime_is_host_code(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "k.py"
    f.write_text("import triton\n\n@triton.jit\ndef k(x):\n    pass\n\n" + body)
    with pytest.raises(SourceError, match=message):
        parse_source(f, {"op"})


def test_host_provided_imports_anywhere_in_host_code_bind_the_runtimes(tmp_path: Path) -> None:
    """``from triton.tools.tensor_descriptor import TensorDescriptor`` and ``from triton.runtime import driver`` inside
    a function or a ``try`` (FlagGems checks for host descriptors that way) become the runtime's, on the same line:
    left as written they would import Triton in a deployed process."""
    f = tmp_path / "k.py"
    f.write_text("import triton\n\ntry:\n    from triton.tools.tensor_descriptor import TensorDescriptor\n"
                 "    HOST_DESC = True\nexcept ImportError:\n    HOST_DESC = False\n\n"
                 "@triton.jit\ndef k(x):\n    pass\n\n"
                 "def op(x):\n    from triton.tools.tensor_descriptor import TensorDescriptor as TD\n"
                 "    from triton.runtime import driver\n    return TD, driver, HOST_DESC, x\n")
    src = parse_source(f, {"op"})
    lines = src.host_source.splitlines()
    # the try: its body, as the build (which has Triton) runs it (sourcesplit._triton_guard)
    assert lines[3] == "TensorDescriptor = triton.tools.tensor_descriptor.TensorDescriptor"
    assert lines[4] == "HOST_DESC = True" and "HOST_DESC = False" not in src.host_source
    assert lines[13] == "    TD = triton.tools.tensor_descriptor.TensorDescriptor"
    assert lines[14] == "    driver = triton.runtime.driver"
    assert "from triton" not in src.host_source and src.reads_device
    with pytest.raises(SourceError, match="TensorDescriptor' only"):
        f.write_text("import triton\n\n@triton.jit\ndef k(x):\n    pass\n\n"
                     "def op(x):\n    from triton.tools.tensor_descriptor import TensorDescriptor, other\n"
                     "    return x\n")
        parse_source(f, {"op"})


def test_tritons_host_helpers_imported_by_name_are_the_runtimes(tmp_path: Path) -> None:
    """attorch's kernel files start ``from triton import cdiv, next_power_of_2`` and size grids and blocks with them
    in host code: the names bind the runtime's helpers, on the same line; anything else imported so is Triton's."""
    f = tmp_path / "k.py"
    f.write_text("import triton\nimport triton.language as tl\nfrom triton import cdiv, next_power_of_2 as np2\n\n"
                 "@triton.jit\ndef k(x, n, BLOCK: tl.constexpr):\n    pass\n\n"
                 "def op(x):\n    BLOCK = min(np2(x.numel()), 1024)\n"
                 "    k[(cdiv(x.numel(), BLOCK),)](x, x.numel(), BLOCK=BLOCK)\n")
    src = parse_source(f, {"op"})
    assert src.host_source.splitlines()[2] == "cdiv = triton.cdiv; np2 = triton.next_power_of_2"
    from forge_aot.runtime.host_triton import host_triton

    namespace = {"triton": host_triton}
    exec(src.host_source.splitlines()[2], namespace)
    assert namespace["cdiv"](10, 3) == 4 and namespace["np2"](1000) == 1024
    # imported beside other Triton names (kernel side): the helpers still bind the runtime's, the rest stay Triton's
    f.write_text(f.read_text().replace("next_power_of_2 as np2", "jit, next_power_of_2 as np2, Config"))
    assert parse_source(f, {"op"}).host_source.splitlines()[2] == "cdiv = triton.cdiv; np2 = triton.next_power_of_2"
    f.write_text(f.read_text().replace("    BLOCK = min(", "    jit(op)\n    BLOCK = min("))
    with pytest.raises(SourceError, match="'jit'"):
        parse_source(f, {"op"})
    # a triton.Config host code builds is the runtime's (runtime/host_decorators.py), bound only where it is read
    f.write_text(f.read_text().replace("    jit(op)\n", "    Config({})\n"))
    assert parse_source(f, {"op"}).host_source.splitlines()[2] == \
        "cdiv = triton.cdiv; np2 = triton.next_power_of_2; Config = triton.Config"


@pytest.mark.parametrize(("block", "where"), [
    ("if not triton_usable():\n    def op(x):\n        return None\nelse:\n", "the if block at line 5"),
    ("def _lazy_init():\n", "the function _lazy_init at line 5"),
])
def test_a_kernel_inside_a_block_is_named_with_where_it_is(tmp_path: Path, block: str, where: str) -> None:
    """Kernels under a test the build cannot answer from Triton's names (a project's own check whose branch imports
    no Triton), or inside a lazy-init function (torchao): forge-aot reads module-level kernels, and says where these
    are instead of finding none. (``if triton is None:`` ... ``else:`` is read as the build takes it:
    ``test_a_test_of_tritons_names_takes_the_branch_the_build_takes``.)"""
    f = tmp_path / "k.py"
    f.write_text("import triton\nimport triton.language as tl\n\n\n" + block
                 + "    @triton.jit\n    def k(x):\n        pass\n")
    with pytest.raises(SourceError, match=f"k.py:{block.count(chr(10)) + 6}: k is a @triton.jit function inside "
                                          f"{where}: forge-aot reads kernels"):
        parse_source(f, {"op"})


def test_a_test_of_tritons_names_takes_the_branch_the_build_takes(tmp_path: Path) -> None:
    """``if triton is None:`` a stub op, ``else:`` the kernel: the build has Triton, so the else branch, brought to
    module level on its own lines; the stub is left out."""
    f = tmp_path / "k.py"
    f.write_text("import triton\nimport triton.language as tl\n\n\nif triton is None:\n    def op(x):\n"
                 "        return None\nelse:\n    @triton.jit\n    def k(x):\n        pass\n\n"
                 "    def op(x):\n        k[(1,)](x)\n        return x\n")
    src = parse_source(f, {"op"})
    assert src.kernels["k"].line == 10 and src.branch_kernels == {"k": (5, 9, 15)}
    assert src.host_source.splitlines()[12:15] == ["def op(x):", "    k[(1,)](x)", "    return x"]
    assert "return None" not in src.host_source


TRY_FALLBACK = """\
import triton
import triton.language as tl

try:
    uint_to_uniform_float = tl.uint_to_uniform_float
except AttributeError:
    @triton.jit
    def uint_to_uniform_float(x):
        x = x.to(tl.int32, bitcast=True)
        return tl.where(x < 0, -x - 1, x) * 4.6566127342e-10


@triton.jit
def k(y, seed, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y + o, uint_to_uniform_float(tl.randint(seed, o)))


def op(y, x=0):
    k[(1,)](y, 7, BLOCK=128)
    return y
"""


def test_a_block_that_binds_only_kernel_side_names_is_kernel_side(tmp_path: Path) -> None:
    """FlagGems' ``random_utils.py``: ``try: uint_to_uniform_float = tl.uint_to_uniform_float`` with a
    ``@triton.jit`` fallback under ``except AttributeError``. The block is left out of host code like a Triton
    import (it had been host code using ``tl``), its names are Triton's: host code using one is refused."""
    f = tmp_path / "k.py"
    f.write_text(TRY_FALLBACK)
    src = parse_source(f, {"op"})
    host = src.host_source.splitlines()
    assert "tl.uint_to_uniform_float" not in src.host_source and "def op(y, x=0):" in src.host_source
    assert host[3] == "uint_to_uniform_float = __forge_kernel_side__('uint_to_uniform_float', __name__)"
    assert host[13] == "k = __forge_kernel_side__('k', __name__)"  # the kernel's handle where the package has one
    assert len(host) == len(TRY_FALLBACK.splitlines())  # lines kept
    f.write_text(TRY_FALLBACK.replace("def op(y, x=0):", "def op(y, x=uint_to_uniform_float):"))
    with pytest.raises(SourceError, match="uint_to_uniform_float"):
        parse_source(f, {"op"})
    # a block that also binds a host value is Triton's too (session 32: a block binds what its branches bind, as
    # FLA's ``if IS_INTEL: _O_CONFIGS += [...]``): left out where host code takes none of its names, refused where
    # it takes one
    f.write_text(TRY_FALLBACK.replace("except AttributeError:", "    HOST = 1\nexcept AttributeError:"))
    assert "HOST = 1" not in parse_source(f, {"op"}).host_source
    f.write_text(TRY_FALLBACK.replace("except AttributeError:", "    HOST = 1\nexcept AttributeError:")
                 .replace("def op(y, x=0):", "def op(y, x=HOST):"))
    with pytest.raises(SourceError, match="host code uses 'HOST', defined with Triton on line 4"):
        parse_source(f, {"op"})
    # a block that binds nothing (module code run for its effect) stays host code, refused for its Triton use
    f.write_text(TRY_FALLBACK.replace("except AttributeError:", "    print(1)\nexcept AttributeError:"))
    with pytest.raises(SourceError, match="tl"):
        parse_source(f, {"op"})


def test_build_only_helpers_are_left_out_unless_shipped_code_calls_them(tmp_path: Path) -> None:
    f = tmp_path / "k.py"
    f.write_text(
        "import torch\nimport triton\nimport triton.language as tl\n\n\n"
        "@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n    pass\n\n\n"
        "def _fast(x):\n    k[(1,)](x)\n    return x\n\n\n"
        "def _slow(x):\n    return _fast(x)\n\n\n"
        "def op(x):\n    return _slow(x) if x.numel() > 4 else x\n\n\n"
        "def tune_inputs(key, variant, device):\n    return (torch.randn(4, device=device),)\n\n\n"
        "def run_for_tuning(x):\n    return _fast(x)\n")
    src = parse_source(f, {"op"})
    # the tuning op _fast is reached from op through _slow: shipped; tune_inputs and the runner are not
    shipped = src.shipped_source({"_fast", "tune_inputs", "run_for_tuning"})
    assert "def _fast" in shipped and "def _slow" in shipped and "def op" in shipped
    assert "def tune_inputs" not in shipped and "def run_for_tuning" not in shipped
    assert shipped.count("\n") == src.host_source.count("\n")


def test_imports_only_kernels_use_leave_the_host_code(tmp_path: Path) -> None:
    # flash-linear-attention's kernel files take @triton.jit helpers and tl aliases from a project module
    f = tmp_path / "k.py"
    f.write_text("import torch\nimport triton\nimport triton.language as tl\n"
                 "from mylib.op import exp, safe_exp, block_for\nimport mylib.jitonly as jo\n\n"
                 "@triton.jit\ndef k(x, BLOCK: tl.constexpr):\n    jo.f(safe_exp(exp(tl.load(x))))\n\n"
                 "def op(x):\n    k[(1,)](x, BLOCK=block_for(x.numel()))\n    return x\n")
    src = parse_source(f, {"op"})
    host = src.host_source.splitlines()
    assert host[3] == "from mylib.op import block_for" and host[4] == ""
    compile(src.host_source, str(f), "exec")


@pytest.mark.parametrize("annotation", ["tl.constexpr", '"tl.constexpr"', "'constexpr'", "triton.language.constexpr",
                                        "constexpr"])
def test_constexpr_annotations_as_triton_reads_them(tmp_path: Path, annotation: str) -> None:
    """Triton's rule (KernelParam.is_constexpr): an annotation that says "constexpr", written as an expression or a
    string (``from __future__ import annotations`` makes every annotation one)."""
    path = tmp_path / "k.py"
    path.write_text("from __future__ import annotations\n\nimport triton\nimport triton.language as tl\n"
                    "from triton.language import constexpr\n\n\n@triton.jit\n"
                    f"def k(x, n: tl.int32, BLOCK: {annotation} = 128):\n    pass\n\n\ndef op(x):\n    k[(1,)](x, 1)\n")
    params = {p.name: p for p in parse_source(path, {"op"}).kernels["k"].params}
    assert params["BLOCK"].constexpr and params["BLOCK"].default == 128
    assert not params["x"].constexpr and not params["n"].constexpr


@pytest.mark.parametrize("definition", ["BLOCK = tl.constexpr(1024)", "BLOCK = triton.language.constexpr(1024)",
                                        "BLOCK: tl.constexpr = 1024", "BLOCK: tl.constexpr = tl.constexpr(1024)"])
def test_host_code_reads_a_constexpr_global_as_its_value(tmp_path: Path, definition: str) -> None:
    """A block size defined once for the kernel's default and the host grid (``tl.constexpr(...)`` is how Triton
    3.6 lets kernels read a global): the host module binds the value, with no Triton, on the same line (a
    ``tl.constexpr`` object with its ``.value``, which Liger-Kernel reads to map its reduction names); the kernel's
    default is that value; a global whose value needs Triton stays refused."""
    from forge_aot.runtime.host_triton import KernelSide, host_triton

    path = tmp_path / "k.py"
    path.write_text("import triton\nimport triton.language as tl\n\n" + definition + "\nSCALE = tl.constexpr(0.5)\n"
                    "MODES = {'mean': BLOCK.value if hasattr(BLOCK, 'value') else BLOCK, 'scale': SCALE.value}\n\n"
                    "@triton.jit\ndef k(x, n, BLOCK_SIZE: tl.constexpr = BLOCK):\n"
                    "    offs = tl.arange(0, BLOCK_SIZE)\n    tl.store(x + offs, tl.load(x + offs) * SCALE)\n\n\n"
                    "def op(x):\n    k[(triton.cdiv(x.numel(), BLOCK),)](x, x.numel())\n    return x\n")
    src = parse_source(path, {"op"})
    host = src.host_source.splitlines()
    wrapped = "tl.constexpr(" in definition or "language.constexpr(" in definition
    assert host[3] == ("BLOCK = triton._host_constexpr(1024)" if wrapped else "BLOCK = 1024")
    assert host[4] == "SCALE = triton._host_constexpr(0.5)"  # one only kernels read is harmless there too
    assert "tl." not in src.host_source
    (param,) = [p for p in src.kernels["k"].params if p.name == "BLOCK_SIZE"]
    assert param.constexpr and param.has_default and param.default == 1024
    namespace: dict = {"triton": host_triton, "__forge_kernel_side__": KernelSide}
    exec(compile(src.host_source, str(path), "exec"), namespace)
    assert namespace["BLOCK"] == 1024 and namespace["MODES"] == {"mean": 1024, "scale": 0.5}
    assert type(namespace["MODES"]["mean"]) is int and hash(namespace["BLOCK"]) == hash(1024)
    assert str(namespace["BLOCK"]) == repr(namespace["BLOCK"]) == "1024"
    path.write_text(path.read_text().replace("(1024)", "(tl.arange(0, 4))").replace("= 1024", "= tl.arange(0, 4)"))
    with pytest.raises(SourceError, match="defined with Triton"):
        parse_source(path, {"op"})


WRITES = """\
import triton
import triton.language as tl
from mylib.jit_helpers import fancy_store


@triton.jit
def _store_through(ptr, value):
    tl.store(ptr, value)


@triton.jit
def _read(ptr):
    return tl.load(ptr)


@triton.jit
def k(out, x, acc, desc, lock, blk, other, n, stride, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    out += offs * stride                         # a pointer moved in place, then stored to
    v = tl.load(x + offs) + _read(x)             # loads give values: x is only read
    tl.store(out, v)
    tl.atomic_add(acc, tl.sum(v, 0))
    desc.store([0, 0], v)                        # a host-side tensor descriptor's store
    _store_through(lock + 1, v)                  # a @triton.jit helper of the file that stores its argument
    p = tl.make_block_ptr(blk, (n,), (1,), (0,), (BLOCK,), (0,))
    tl.store(p, v)
    fancy_store(other, v.to(tl.float16))         # a helper from elsewhere: counted as writing what it is given
    fancy_store(other, v.to(x.dtype.element_ty))  # x's element type points nowhere (Cut Cross-Entropy's backward)
"""


def test_the_parameters_a_kernel_writes_through(tmp_path: Path) -> None:
    """What makes an op that passes a tensor there write it (its custom op's ``Tensor(a!)``): stores, atomics and
    descriptor stores, through assignments, block pointers and the file's helpers; a helper from another module
    may write whatever it is given; a loaded value, and a pointer's ``.dtype`` / ``.shape``, are no pointers."""
    path = tmp_path / "k.py"
    path.write_text(WRITES)
    src = parse_source(path)
    pointers = {"out", "x", "acc", "desc", "lock", "blk", "other"}
    assert set(src.kernels["k"].writes) & pointers == {"out", "acc", "desc", "lock", "blk", "other"}
    assert src.kernels["_store_through"].writes == ("ptr",) and src.kernels["_read"].writes == ()


IMPORTED_HELPERS = """\
import triton
import triton.language as tl
from .utils import *
from .more import store_row as put, _private_store
from . import more
import lib.ops.utils as u
import some_library


@triton.jit
def k(a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, f_ptr, g_ptr, h_ptr, i_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    a = load_ptr(a_ptr, offs)          # gemlite's ``from .utils import *``: a helper that only loads
    b = load_twice(b_ptr, offs)        # one that loads through another helper of its module
    put(c_ptr + offs, a + b)           # an imported helper, renamed, that stores
    _private_store(d_ptr, offs, a)     # an underscored one, named explicitly
    unknown_helper(e_ptr, a)           # a name no resolved module defines: counted as writing
    more.store_row(f_ptr, a)           # a helper of a module bound to a name, that stores
    u.load_ptr(g_ptr, offs)            # ... that loads
    some_library.helper(h_ptr, a)      # a module that is no file of the project: counted as writing
    more.not_there(i_ptr, a)           # a name the module does not define: counted as writing
"""

IMPORTED_UTILS = """\
import triton
from triton import language as tlang


@triton.jit
def load_ptr(ptr, offs):
    return tlang.load(ptr + offs)


@triton.jit
def _load(ptr, offs):
    return tlang.load(ptr + offs)


@triton.jit
def load_twice(ptr, offs):
    return _load(ptr, offs) + _load(ptr, offs)
"""

IMPORTED_MORE = """\
import triton
import triton.language as tl


@triton.jit
def store_row(ptr, v):
    tl.store(ptr, v)


@triton.jit
def _private_store(ptr, offs, v):
    tl.atomic_add(ptr + offs, v)
"""


def test_helpers_imported_from_project_modules_write_only_what_they_store(tmp_path: Path) -> None:
    """gemlite's gemv kernels take ``load_ptr`` from ``.utils`` with a star import: counted as writing whatever it was
    given, the op's schema said ``Tensor(a!) x, Tensor(b!) W_q`` for inputs it only reads, and torch.compile would
    have copied the weights on every call. Helpers of project modules are read where they are defined."""
    pkg = tmp_path / "lib" / "ops"
    pkg.mkdir(parents=True)
    (tmp_path / "lib" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "utils.py").write_text(IMPORTED_UTILS)
    (pkg / "more.py").write_text(IMPORTED_MORE)
    (pkg / "k.py").write_text(IMPORTED_HELPERS)
    assert parse_source(pkg / "k.py").kernels["k"].writes == ("c_ptr", "d_ptr", "e_ptr", "f_ptr", "h_ptr", "i_ptr")


FLAG_WRITES = """\
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, o_ptr, r_ptr, n, HAS_OUTPUT: tl.constexpr, HAS_RESIDUAL: tl.constexpr, MODE: tl.constexpr):
    offs = tl.arange(0, 128)
    x = tl.load(x_ptr + offs)
    dst = o_ptr if HAS_OUTPUT else x_ptr        # FlashInfer's rms_norm: out-of-place where HAS_OUTPUT
    tl.store(dst + offs, x)
    if HAS_RESIDUAL and not HAS_OUTPUT:
        tl.store(r_ptr + offs, x)
    if MODE == 2:                               # a test of no flag: both branches count
        tl.atomic_add(r_ptr, 1.0)
"""


def test_the_parameters_written_follow_the_flags_a_launch_passes(tmp_path: Path) -> None:
    """FlashInfer's ``rms_norm`` always passes ``HAS_OUTPUT=True`` and the kernel stores to ``o_ptr if HAS_OUTPUT
    else x_ptr``: the schema said ``Tensor(a!) x`` for an input it only reads (torch.compile would copy it)."""
    path = tmp_path / "k.py"
    path.write_text(FLAG_WRITES)
    ks = parse_source(path).kernels["k"]
    assert ks.writes == ("x_ptr", "o_ptr", "r_ptr")
    assert ks.writes_for({"HAS_OUTPUT": True, "HAS_RESIDUAL": True}) == ("o_ptr", "r_ptr")  # r_ptr: MODE's branch
    assert ks.writes_for({"HAS_OUTPUT": False, "HAS_RESIDUAL": True}) == ("x_ptr", "r_ptr")
    assert ks.writes_for({"HAS_OUTPUT": True, "HAS_RESIDUAL": False}) == ("o_ptr", "r_ptr")
    assert ks.writes_for({"HAS_OUTPUT": 1}) == ks.writes  # no bool: every branch
    path.write_text(FLAG_WRITES.replace("        tl.atomic_add(r_ptr, 1.0)\n", "        pass\n"))
    ks = parse_source(path).kernels["k"]
    assert ks.writes_for({"HAS_OUTPUT": True, "HAS_RESIDUAL": True}) == ("o_ptr",)
    assert ks.writes_for({"HAS_OUTPUT": False, "HAS_RESIDUAL": True}) == ("x_ptr", "r_ptr")


FUNCTION_WRITES = """\
import triton
import triton.language as tl


@triton.jit
def bias_mod(qk, aux_ptr, offs):        # SGLang's score_mod: reads its aux tensor
    return qk + tl.load(aux_ptr + offs)


@triton.jit
def logging_mod(qk, aux_ptr, offs):     # one that writes it
    tl.store(aux_ptr + offs, qk)
    return qk


@triton.jit
def k(x_ptr, y_ptr, aux_ptr, n, SCORE_MOD: tl.constexpr, FLAG: tl.constexpr):
    offs = tl.arange(0, 128)
    qk = tl.load(x_ptr + offs)
    if SCORE_MOD is not None:
        qk = SCORE_MOD(qk, aux_ptr + 0, offs=offs)
    tl.store((y_ptr if FLAG else x_ptr) + offs, qk)
"""


def test_what_a_kernel_hands_a_function_valued_constexpr_is_written_where_that_function_writes(
        tmp_path: Path) -> None:
    """SGLang's attention calls ``SCORE_MOD(qk, Aux0, ...)``, a ``@triton.jit`` function host code passes as a
    constexpr: any call of a name the file does not define counted what it was handed as written, so ``check`` and
    the schema said the op writes ``Aux0`` (``Tensor(a!)``: torch.compile copies it). Now what is handed there is
    written where the function passed writes it (``function_writes``), and all of it where that is unknown."""
    path = tmp_path / "k.py"
    path.write_text(FUNCTION_WRITES)
    ks = parse_source(path).kernels["k"]
    assert ks.writes == ("x_ptr", "y_ptr") and ks.all_writes == ("x_ptr", "y_ptr", "aux_ptr")
    # qk is handed back in: its value may point where the call's result may (slot 0); offs= carries no pointer
    assert ks.writes_through == (("SCORE_MOD", ((0, ("aux_ptr",)), (1, ("aux_ptr",)))),)
    # (any name in a stored address counts: offs too, here handed no pointer)
    assert function_writes(path, "bias_mod") == frozenset() and function_writes(path, "logging_mod") == {
        1, "aux_ptr", 2, "offs"}
    assert function_writes(path, "no_such") is None and function_writes(tmp_path / "none.py", "k") is None

    def resolve(value):
        return function_writes(path, value) if value != "unknown" else None

    flag = {"FLAG": True}
    assert ks.writes_for({**flag, "SCORE_MOD": None}, resolve) == ("y_ptr",)
    assert ks.writes_for({**flag, "SCORE_MOD": "bias_mod"}, resolve) == ("y_ptr",)
    assert ks.writes_for({**flag, "SCORE_MOD": "logging_mod"}, resolve) == ("y_ptr", "aux_ptr")
    assert ks.writes_for({**flag, "SCORE_MOD": "unknown"}, resolve) == ("y_ptr", "aux_ptr")
    assert ks.writes_for({**flag, "SCORE_MOD": "bias_mod"}) == ("y_ptr", "aux_ptr")  # no resolver: all of it


def test_a_constexpr_global_passed_as_a_runtime_float_is_specialized_as_a_float() -> None:
    """``LOG2E = tl.constexpr(1.44...)`` is a float with ``.value`` in host code; passed as a runtime argument it is
    a float to the specialization (never ``1`` or divisible-by-16, which only integers are)."""
    from forge_aot.runtime.host_triton import host_constexpr
    from forge_aot.runtime.tables import argument_spec

    assert argument_spec([(0, False)], [host_constexpr(1.0)]) == argument_spec([(0, False)], [1.0]) == "x"
    assert argument_spec([(0, False)], [host_constexpr(32.0)]) == "x"
    assert argument_spec([(0, False)], [host_constexpr(32)]) == argument_spec([(0, False)], [32]) == "D"


LIBRARY_WAYS = '''\
import inspect
import os

import torch
import triton
import triton.language as tl
from triton.experimental import gluon

HAS_GATHER = hasattr(triton.language, "gather")
CACHE = "cache_results" in inspect.signature(triton.autotune).parameters
USE_TMA = (os.environ.get("X", "1") == "1"
           and hasattr(tl, "make_tensor_descriptor"))
ROWS = triton.cdiv(7, 2)

CONFIGS = [triton.Config({"BLOCK": 128}, num_warps=4)]
if os.environ.get("INTEL"):
    CONFIGS += [triton.Config({"BLOCK": 256}, num_warps=8)]
benchmarks = []
for n in [1024, 4096]:
    benchmarks.append(triton.testing.Benchmark(x_names=["N"], x_vals=[n], line_arg="p", line_vals=["t"],
                                               line_names=["T"], ylabel="GB/s", plot_name=f"k-{n}", args={}))

try:
    import triton.language as tl2
    tl2.extra.patched = True
    PATCHED = True
except (ImportError, AttributeError):
    PATCHED = False


def npu_options():
    try:
        from triton.backends.ascend.compiler import NPUOptions
        return NPUOptions
    except ImportError:
        return None


@gluon.jit
def gl_kernel(x):
    pass


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def k(y, n, BLOCK: tl.constexpr):
    tl.store(y + tl.arange(0, BLOCK), 1.0)


def op(y):
    if HAS_GATHER and CACHE and USE_TMA and not PATCHED and npu_options() is None:
        k[(ROWS,)](y, y.numel())
    return y


if __name__ == "__main__":
    triton.testing.do_bench(lambda: op(torch.empty(8, device="cuda")))
'''


def test_library_ways_of_writing_module_code(tmp_path: Path) -> None:
    """Session 32's hunt over flash-linear-attention and the Triton tutorials: feature probes take the building
    Triton's answers (not a host helper's call, which the wheel runs itself); a block that builds a config list or
    benchmarks with Triton is Triton's like a single statement; Triton imports under ``except ImportError`` raise
    ImportError in the wheel; Gluon kernels are kernels; a ``__main__`` tail is left out. Every line keeps its
    number."""
    f = tmp_path / "k.py"
    f.write_text(LIBRARY_WAYS)
    src = parse_source(f, {"op"})
    host = src.host_source
    assert len(host.splitlines()) == len(LIBRARY_WAYS.splitlines())
    lines = host.splitlines()
    assert lines[8] == "HAS_GATHER = (True)" and lines[9] == "CACHE = (True)"
    assert lines[10:12] == ['USE_TMA = (os.environ.get("X", "1") == "1"', "           and (True))"]
    assert lines[12] == "ROWS = triton.cdiv(7, 2)"  # a host helper: the wheel's own
    assert "triton.Config" not in host and "benchmarks.append" not in host and "def gl_kernel" not in host
    assert lines[14] == "CONFIGS = __forge_kernel_side__('CONFIGS', __name__)"
    assert lines[39] == "gl_kernel = __forge_kernel_side__('gl_kernel', __name__)"
    assert "do_bench" not in host
    assert host.count('raise ImportError("packaged host code runs without Triton")') == 2
    from forge_aot.runtime.host_triton import KernelSide, host_triton

    ns: dict = {"triton": host_triton, "__forge_kernel_side__": KernelSide}
    exec(compile(host, str(f), "exec"), ns)
    assert ns["PATCHED"] is False and ns["npu_options"]() is None and ns["USE_TMA"] is True
    # FBGEMM's triton_gemm/utils.py probes with dir(): refused as host code using Triton (dir was no build-time
    # builtin), with a hint about benchmarks
    import triton.language

    f.write_text('import triton\nimport triton.language as tl\nHAS_TMA_DESC = "nv_tma_desc_type" in dir(tl)\n\n\n'
                 '@triton.jit\ndef k(x):\n    pass\n\n\ndef op(x):\n    if HAS_TMA_DESC:\n        x = x + 1\n'
                 '    k[(1,)](x)\n    return x\n')
    host = parse_source(f, {"op"}).host_source.splitlines()
    assert host[2] == f"HAS_TMA_DESC = ({'nv_tma_desc_type' in dir(triton.language)})", host


def test_the_driver_imported_beside_other_triton_runtime_names_is_the_runtimes(tmp_path: Path) -> None:
    """Cut Cross-Entropy's ``tl_autotune.py``: ``from triton.runtime import autotuner, driver``, and a perf model
    asking ``driver.active.utils.get_device_properties``: the driver counted as Triton's with ``autotuner`` (the
    host function "uses 'estimate_matmul_time', defined with Triton"); it is the runtime's, ``autotuner`` kernel
    side."""
    f = tmp_path / "k.py"
    f.write_text("import triton\nfrom triton.runtime import autotuner, driver\n\n\n@triton.jit\ndef k(x):\n"
                 "    pass\n\n\ndef sms():\n    return driver.active.utils.get_device_properties(0)"
                 "['multiprocessor_count']\n\n\ndef op(x):\n    k[(sms(),)](x)\n    return x\n")
    src = parse_source(f, {"op"})
    host = src.host_source.splitlines()
    assert host[1] == "driver = triton.runtime.driver" and "sms" in src.host_functions, host
    assert src.reads_device


def test_stand_ins_bind_every_name_of_a_line_and_no_others(tmp_path: Path) -> None:
    """Where Triton code is left out, the names it bound stay bound on its line: both statements' names where two
    share a line, and never a name the statement only changes (``cfg["f"] = ...``), which a host binding holds."""
    from forge_aot.sourcesplit import _kernel_side_bindings

    f = tmp_path / "k.py"
    f.write_text("import triton\nimport triton.language as tl\n\nexp = tl.exp; log = tl.log\n\n@triton.jit\n"
                 "def k(x):\n    pass\n\n\ndef op(x):\n    k[(1,)](x)\n    return x\n")
    host = parse_source(f, {"op"}).host_source.splitlines()
    assert host[3] == ("exp = __forge_kernel_side__('exp', __name__); log = __forge_kernel_side__('log', __name__)")
    assign = ast.parse("cfg['f'] = tl.exp\nobj.attr = tl.exp\na, (b, *c) = tl.exp").body
    assert [_kernel_side_bindings(s) for s in assign] == [set(), set(), {"a", "b", "c"}]


def test_a_pre_hook_left_out_as_triton_code_is_named_when_bound(tmp_path: Path) -> None:
    """A config pre-hook that uses Triton is left out of the host code: binding the module says so, naming it."""
    from forge_aot.runtime import ForgeRuntimeError, exec_host_module

    f = tmp_path / "k.py"
    f.write_text("import triton\nimport triton.language as tl\n\ndef hook(nargs):\n    return tl.zeros((1,), "
                 "tl.float32)\n\n@triton.jit\ndef k(x):\n    pass\n\n\ndef op(x):\n    k[(1,)](x)\n    return x\n")
    src = parse_source(f, {"op"})

    class Handle:
        function, spec, pre_hooks = "k", {"pre_hooks": ["hook"]}, {}

    with pytest.raises(ForgeRuntimeError, match="config pre-hook 'hook' of k uses Triton, so the packaged host code "
                                                "leaves it out"):
        exec_host_module("_hooked", str(f), {"k": Handle()}, src.host_source)


def test_tl_dtype_in_host_code_is_the_runtimes_element_type_class(tmp_path: Path) -> None:
    """vLLM's ``invoke_fused_moe_kernel(..., compute_type: tl.dtype, ...)``: an annotation Python evaluates when the
    ``def`` runs, which made the whole host function (and its callers) kernel-side. The runtime's ``triton.language``
    has ``dtype``, the class of its element types, as it has the element types."""
    from forge_aot.runtime import KERNEL_SIDE_HOOK, HostDtype, host_triton

    f = tmp_path / "k.py"
    f.write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def scale_kernel(x_ptr, n, compute_type: tl.constexpr):
            pass


        def invoke(x: torch.Tensor, compute_type: tl.dtype) -> None:
            scale_kernel[(1,)](x, x.numel(), compute_type=compute_type)


        def scale(x):
            invoke(x, tl.bfloat16)
        '''))
    src = parse_source(f, {"scale"})
    namespace = {"triton": host_triton, KERNEL_SIDE_HOOK: lambda name, module: None, "__name__": "k"}
    exec(compile(src.host_source, str(f), "exec", dont_inherit=True), namespace)
    assert namespace["invoke"].__annotations__["compute_type"] is HostDtype


def test_reading_a_guarded_file_runs_none_of_its_other_module_code(tmp_path: Path, capsys) -> None:
    """The guard reader (``_triton_guard``) evaluates Triton's flags and feature probes where the file sets them, and
    nothing else: module code such as ``LOG = open(...)`` or ``BANNER = print(...)`` is its own import's business at
    build time (once), never run again by reading the file; builtins that write, read or run code are never called."""
    log = tmp_path / "side_effect.log"
    f = tmp_path / "k.py"
    f.write_text(textwrap.dedent(f'''\
        try:
            import triton
            import triton.language as tl
            _HAS_TRITON = True
        except ImportError:
            _HAS_TRITON = False
        LOG = open({str(log)!r}, "w")
        BANNER = print("side effect")
        HAS_REDUCE = _HAS_TRITON and hasattr(tl, "reduce")
        WRITES = _HAS_TRITON and open({str(log)!r}, "w")

        if HAS_REDUCE:
            @triton.jit
            def k(x):
                pass


        def op(x):
            return x
        '''))
    src = parse_source(f, {"op"})
    assert "k" in src.kernels and not log.exists() and "side effect" not in capsys.readouterr().out


FLOW_CASES = {
    # FLA's chunk_gated_delta_rule_fwd_kernel_h: one block pointer name, from v to load, from v_new to store
    "reassigned before the store": ("""
        p_v = tl.make_block_ptr(v, (4,), (1,), (0,), (4,), (0,))
        b_v = tl.load(p_v)
        if SAVE:
            p_v = tl.make_block_ptr(v_new, (4,), (1,), (0,), (4,), (0,))
            tl.store(p_v, b_v)
        """, {"v_new"}),
    "a branch's assignment or the one before it": ("""
        p = v
        if SAVE:
            p = v_new
        tl.store(p, 1)
        """, {"v", "v_new"}),
    "a loop's back edge": ("""
        p = v
        for i in range(n):
            tl.store(p, 1)
            p = v_new
        """, {"v", "v_new"}),
    "killed within the loop body": ("""
        while n:
            p = v
            tl.store(p, 1)
            p = v_new
        """, {"v"}),
    "an augmented assignment keeps what came before": ("""
        p = v
        for i in range(n):
            p += 4
            tl.store(p, 1)
        """, {"v"}),
    "a parameter reassigned in a branch": ("""
        if SAVE:
            v = v_new
        tl.store(v, 1)
        """, {"v", "v_new"}),
    "a for target": ("""
        for p in (v, v_new):
            tl.store(p, 1)
        """, {"v", "v_new"}),
    "an exception handler sees what came before the try": ("""
        p = v
        try:
            x = 1
        except Exception:
            tl.store(p, x)
        """, {"v"}),
    "a declaration without a value assigns nothing": ("""
        p = v
        p: tl.tensor
        tl.store(p, 1)
        """, {"v"}),
}


@pytest.mark.parametrize("case", sorted(FLOW_CASES))
def test_a_store_writes_through_what_reaches_it(case: str) -> None:
    """Writes follow the assignments that reach each store (session 42: FLA's fwd_h stored through ``v_new`` after
    loading through ``v`` under one name, and its schema said ``v`` was written): never fewer than may reach it."""
    from forge_aot.sourcesplit import _pointer_flow

    body, written = FLOW_CASES[case]
    fn = ast.parse("def k(v, v_new, n, SAVE: tl.constexpr):\n" + textwrap.indent(textwrap.dedent(body), "    "))
    params = ["v", "v_new", "n", "SAVE"]
    assert {params[i] for i in _pointer_flow(fn.body[0], {}, {"tl"}, {})[0]} == written  # type: ignore[arg-type]
