"""Kernel files that import the project's own helper modules (as Liger-Kernel's ops import
``liger_kernel.ops.utils``): found from the source, shipped with the host code, resolved to the shipped copies in
a deployed process, and part of the kernel's code hash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from forge_aot.localmods import _is_local, local_imports

KERNEL = '''\
"""A kernel whose host code takes its block size from a helper package of the project."""

import torch
import triton
import triton.language as tl
from mylib.ops import block_for
{sibling_import}


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def scale(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    BLOCK, num_warps = block_for(n)
    {sibling_call}
    scale_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, num_warps=num_warps)
    return out


def examples(device="cpu"):
    for n in (1000, 4096):
        scale(torch.randn(n, device=device, dtype=torch.float16))
'''

MANIFEST = '''\
[project]
name = "forge_localmods"
version = "0.1.0"
targets = ["sm_90"]

[kernels.scale]
source = "kernels/scale.py:scale_kernel"
ops = ["scale"]
signature = { x_ptr = "*fp16", out_ptr = "*fp16", n = "i32" }
key = ["n"]
examples = "examples"
'''


def _project(root: Path, *, sibling: bool = True) -> Path:
    """A project: kernels/scale.py importing mylib.ops (a package whose __init__ re-exports from .utils, which
    imports triton and a sibling helper) and, script-style, kernels/tiny_helpers.py."""
    (root / "kernels").mkdir(parents=True)
    (root / "mylib" / "ops").mkdir(parents=True)
    (root / "kernel_manifest.toml").write_text(MANIFEST)
    (root / "kernels" / "scale.py").write_text(KERNEL.format(
        sibling_import="from tiny_helpers import check_size" if sibling else "",
        sibling_call="check_size(n)" if sibling else ""))
    (root / "kernels" / "tiny_helpers.py").write_text("def check_size(n):\n    assert n > 0, n\n")
    (root / "mylib" / "__init__.py").write_text('"""A helper library of the project."""\n')
    (root / "mylib" / "ops" / "__init__.py").write_text("from .utils import block_for\n")
    (root / "mylib" / "ops" / "utils.py").write_text(textwrap.dedent('''\
        import triton

        from mylib.ops.limits import MAX_BLOCK


        def block_for(n):
            """(BLOCK, num_warps) for n elements."""
            block = min(triton.next_power_of_2(n), MAX_BLOCK)
            return block, 4 if block <= 1024 else 8
        '''))
    (root / "mylib" / "ops" / "limits.py").write_text("MAX_BLOCK = 2048\n")
    (root / "build").mkdir()  # a directory named like an installed module is not a module of the project
    # project files named like standard or installed modules never shadow them (the build imports `build`)
    (root / "build.py").write_text("raise RuntimeError('the project build.py was imported')\n")
    (root / "kernels" / "math.py").write_text("raise RuntimeError('the project math.py was imported')\n")
    return root / "kernel_manifest.toml"


def test_local_imports_follow_the_import_system(tmp_path: Path) -> None:
    _project(tmp_path)
    kernel = tmp_path / "kernels" / "scale.py"
    kernel.write_text(kernel.read_text() + "\nimport json\nimport math\n")
    found = local_imports(kernel, tmp_path)
    assert sorted(found) == ["mylib", "mylib.ops", "mylib.ops.limits", "mylib.ops.utils", "tiny_helpers"]
    assert found["mylib"].package and found["mylib"].path.name == "__init__.py"
    assert found["mylib.ops"].package and not found["mylib.ops.utils"].package
    assert found["tiny_helpers"].path == tmp_path / "kernels" / "tiny_helpers.py"
    # installed packages inside the project (a virtual environment there) are not the project's code
    assert not _is_local(tmp_path / ".venv" / "lib" / "python3.11" / "site-packages" / "x.py", tmp_path)
    assert _is_local(tmp_path / "mylib" / "ops" / "utils.py", tmp_path)


def test_a_helper_edit_changes_the_code_hash_of_the_kernels_importing_it(tmp_path: Path) -> None:
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan
    from forge_aot.tune.apply import kernel_code_sha256

    manifest = _project(tmp_path)

    def code_hash() -> str:
        return kernel_code_sha256(make_plan(load_manifest(manifest), ["sm_90"]).kernels["scale"])

    before = code_hash()
    limits = tmp_path / "mylib" / "ops" / "limits.py"
    limits.write_text("MAX_BLOCK = 4096\n")
    assert code_hash() != before


def _installed(manifest: Path, tmp_path: Path) -> Path:
    """The project's wheel, built and installed into a directory of its own."""
    from forge_aot.pipeline import build

    wheel = build(manifest, out_dir=tmp_path / "dist", build_dir=tmp_path / "work").wheel
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True)
    return target


def one_file_project(root: Path, name: str, source: str, kernel: str, ops: list[str], extra: str = "",
                     entry: str = "k") -> Path:
    """A project of one kernel file ``k.py`` (``source``) whose kernel ``kernel`` serves ``ops``, traced from its
    ``examples`` function, for sm_90 (``entry``: the manifest entry's name; ``extra``: more of it); its manifest's
    path."""
    root.mkdir(parents=True)
    (root / "k.py").write_text(source)
    (root / "kernel_manifest.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n'
        f'[kernels.{entry}]\nsource = "k.py:{kernel}"\nops = {ops!r}\nexamples = "examples"\n{extra}'
        .replace("'", '"'))
    return root / "kernel_manifest.toml"


def _run_fresh(code: str, target: Path) -> dict:
    """``code`` in a fresh process that has only the installed package importable (not the project, not forge-aot);
    its last line of output, as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env)
    if out.returncode:
        raise FreshProcessError(out.returncode, "python -c <code>", out.stdout, out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


class FreshProcessError(subprocess.CalledProcessError):
    """A fresh process's failure, with what it said (a CalledProcessError shows only that it failed)."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stdout or '')[-3000:]}\n{(self.stderr or '')[-6000:]}"


def wheel_max_error(manifest: Path, tmp_path: Path, package: str, call: str, reference: str,
                    sizes: tuple[int, ...], scale: str = "") -> float:
    """The project's wheel, installed and run in a fresh process that blocks Triton: the largest absolute error of
    ``<package>.<call>(x)`` against ``reference`` (an expression of ``x``) over CUDA inputs of ``sizes`` elements,
    each starting one element into its allocation (misaligned; ``scale``: a factor such as ``* 1000``)."""
    target = _installed(manifest, tmp_path)
    code = textwrap.dedent(f'''\
        import json, sys
        sys.modules["triton"] = None
        import torch, {package}
        errs = []
        for n in {sizes!r}:
            x = (torch.randn(n + 1, device="cuda"){scale})[1:]
            errs.append(({package}.{call}(x) - ({reference})).abs().max().item())
        print(json.dumps({{"max_err": max(errs)}}))
        ''')
    return _run_fresh(code, target)["max_err"]


@pytest.mark.slow
def test_the_wheel_ships_the_helpers_and_its_imports_reach_the_shipped_copies(tmp_path: Path) -> None:
    target = _installed(_project(tmp_path / "project"), tmp_path)
    shipped = sorted(str(p.relative_to(target / "forge_localmods" / "_ops" / "_local"))
                     for p in (target / "forge_localmods" / "_ops" / "_local").rglob("*.py"))
    assert shipped == ["__init__.py", "mylib/__init__.py", "mylib/ops/__init__.py", "mylib/ops/limits.py",
                       "mylib/ops/utils.py", "tiny_helpers.py"]
    # A fresh process that has neither the project nor forge-aot nor Triton importable: the custom op's meta
    # implementation runs the host code (launches skipped), which imports the helpers.
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None  # importing Triton would raise
        sys.modules["mylib"] = None  # so would reaching the project's own names
        import torch, forge_localmods
        # a shipped helper imported before any op ran (as unpickling an object it defines would)
        from forge_localmods._ops._local.mylib.ops import utils
        assert utils.block_for(100) == (128, 4)
        out = torch.ops.forge_localmods.scale(torch.empty(3000, device="meta", dtype=torch.float16))
        import forge_localmods._ops.scale as host
        print(json.dumps({"shape": list(out.shape), "dtype": str(out.dtype), "block": host.block_for(3000),
                          "helper_module": host.block_for.__module__,
                          "loaded": sorted(m for m in sys.modules if m.startswith("forge_localmods._ops"))}))
        ''')
    res = _run_fresh(code, target)
    assert res["shape"] == [3000] and res["dtype"] == "torch.float16"
    assert res["block"] == [2048, 8] and res["helper_module"] == "forge_localmods._ops._local.mylib.ops.utils"
    assert res["loaded"] == ["forge_localmods._ops", "forge_localmods._ops._local", "forge_localmods._ops._local.mylib",
                             "forge_localmods._ops._local.mylib.ops", "forge_localmods._ops._local.mylib.ops.limits",
                             "forge_localmods._ops._local.mylib.ops.utils",
                             "forge_localmods._ops._local.tiny_helpers", "forge_localmods._ops.scale"]


def test_a_project_subpackage_named_triton_is_the_projects_own(tmp_path: Path) -> None:
    """FlashInfer keeps its kernels in ``flashinfer/triton/`` and imports them relatively (``from .triton.page import
    ...``, inside a function in ``page.py``; ``from ..triton.gemm import ...`` at module level): read as imports of
    Triton itself, the build refused the host code ("host code imports Triton"). The wheel binds them as the
    project's own modules: the custom ops' meta implementations run the host code, imports included, in a fresh
    process without Triton."""
    pkg = tmp_path / "p" / "rtp"
    (pkg / "triton").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "triton" / "__init__.py").write_text("")
    (pkg / "triton" / "k.py").write_text(textwrap.dedent("""\
        import triton
        import triton.language as tl


        @triton.jit
        def fill_kernel(o_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(o_ptr + offs, offs.to(tl.float32), mask=offs < n)
        """))
    op = textwrap.dedent("""\
        import torch
        import triton
        {top}

        def {name}(x: torch.Tensor) -> torch.Tensor:
            {local}
            o = torch.empty_like(x)
            fill_kernel[(triton.cdiv(x.numel(), 128),)](o, x.numel(), BLOCK=128)
            return o


        def examples(device="cuda"):
            {name}(torch.randn(1000, device=device))
        """)
    (pkg / "ops.py").write_text(op.format(top="from .triton.k import fill_kernel\n", name="fill_like", local=""))
    (pkg / "ops_local.py").write_text(op.format(top="", name="fill_like_local",
                                                local="from .triton.k import fill_kernel  # FlashInfer's page.py"))
    manifest = tmp_path / "p" / "kernel_manifest.toml"
    manifest.write_text(
        '[project]\nname = "forge_test_rel_triton"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.fill]\n'
        'source = "rtp/triton/k.py:fill_kernel"\nexamples = "rtp/ops.py:examples"\n\n[ops.fill_like]\n'
        'source = "rtp/ops.py"\nexamples = "examples"\n\n[ops.fill_like_local]\nsource = "rtp/ops_local.py"\n'
        'examples = "examples"\n')
    target = _installed(manifest, tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None  # importing Triton would raise
        import torch, forge_test_rel_triton
        x = torch.empty(1000, device="meta")
        ops = torch.ops.forge_test_rel_triton
        print(json.dumps({"shapes": [list(ops.fill_like(x).shape), list(ops.fill_like_local(x).shape)]}))
        ''')
    assert _run_fresh(code, target)["shapes"] == [[1000], [1000]]


def test_a_function_local_import_of_triton_language_gets_the_runtimes_element_types(tmp_path: Path) -> None:
    """mlstm_kernels' ``torch2triton_dtype`` imports ``triton.language as tl`` inside the function to map torch
    dtypes to Triton's: refused ("host code imports Triton"), where the same import at module level was the
    runtime's ``triton.language``. Inside host code it is that too, in a helper module and a kernel file alike."""
    pkg = tmp_path / "p" / "mlk"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "utils.py").write_text(textwrap.dedent("""\
        import torch


        def torch2triton_dtype(dtype):
            import triton.language as tl

            return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]
        """))
    (pkg / "scale.py").write_text(textwrap.dedent("""\
        import torch
        import triton
        import triton.language as tl

        from .utils import torch2triton_dtype


        @triton.jit
        def scale_kernel(x, out, n, BLOCK: tl.constexpr, DTYPE: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(out + offs, (tl.load(x + offs, mask=m).to(tl.float32) * 2).to(DTYPE), mask=m)


        def scale(x: torch.Tensor) -> torch.Tensor:
            from triton import language as language  # the other spelling, in a kernel file
            assert language.float16 is not None
            out = torch.empty_like(x)
            scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024,
                                                         DTYPE=torch2triton_dtype(x.dtype))
            return out


        def examples(device="cuda"):
            for dt in (torch.float16, torch.bfloat16):
                scale(torch.randn(4096, device=device, dtype=dt))
        """))
    manifest = tmp_path / "p" / "kernel_manifest.toml"
    manifest.write_text('[project]\nname = "forge_test_local_tl"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n'
                        '[kernels.scale]\nsource = "mlk/scale.py:scale_kernel"\nops = ["scale"]\n'
                        'signature = { x = "*T" }\ndtypes = { T = ["fp16", "bf16"] }\nexamples = "examples"\n')
    target = _installed(manifest, tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None  # importing Triton would raise
        import torch, forge_test_local_tl
        out = torch.ops.forge_test_local_tl.scale(torch.empty(100, device="meta", dtype=torch.bfloat16))
        from forge_test_local_tl._ops._local.mlk.utils import torch2triton_dtype
        print(json.dumps({"dtype": str(out.dtype), "tl": str(torch2triton_dtype(torch.float16))}))
        ''')
    assert _run_fresh(code, target) == {"dtype": "torch.bfloat16", "tl": "tl.float16"}


def _package_project(root: Path) -> Path:
    """Kernels inside a package that import by relative imports (as unsloth's ``from .utils import
    calculate_settings``), the package's ``__init__`` re-exporting the op from the kernel file itself."""
    kernels = root / "unslothish" / "kernels"
    kernels.mkdir(parents=True)
    (root / "unslothish" / "__init__.py").write_text('"""A library."""\n')
    (kernels / "__init__.py").write_text("from .scale import scale\n\n__all__ = ['scale']\n")
    (kernels / "utils.py").write_text("import triton\n\n\ndef block_for(n):\n"
                                      "    return min(triton.next_power_of_2(n), 2048), 4\n")
    (kernels / "scale.py").write_text(KERNEL.format(sibling_import="", sibling_call="").replace(
        "from mylib.ops import block_for", "from .utils import block_for"))
    manifest = root / "kernel_manifest.toml"
    manifest.write_text(MANIFEST.replace("kernels/scale.py", "unslothish/kernels/scale.py"))
    return manifest


def test_relative_imports_of_a_kernel_file_inside_a_package(tmp_path: Path) -> None:
    from forge_aot.localmods import package_of

    manifest = _package_project(tmp_path)
    kernel = tmp_path / "unslothish" / "kernels" / "scale.py"
    assert package_of(kernel) == ("unslothish.kernels", tmp_path.resolve())
    found = local_imports(kernel, tmp_path)
    # the package __init__ imports the kernel file back: it is shipped too (its host code)
    assert sorted(found) == ["unslothish", "unslothish.kernels", "unslothish.kernels.scale", "unslothish.kernels.utils"]
    assert manifest.exists()


@pytest.mark.slow
def test_a_wheel_of_kernels_with_relative_imports_runs_them_from_the_shipped_copies(tmp_path: Path) -> None:
    target = _installed(_package_project(tmp_path / "project"), tmp_path)
    code = textwrap.dedent('''\
        import json, sys, warnings
        sys.modules["triton"] = None
        sys.modules["unslothish"] = None
        import torch, forge_localmods
        # relative imports resolve against the module's spec (Python 3.12 warns where __package__ disagrees with
        # it, and later versions read the spec alone)
        warnings.filterwarnings("error", message="__package__ != __spec__.parent")
        out = forge_localmods.scale  # the exported op; its custom op's meta implementation runs the host code
        y = torch.ops.forge_localmods.scale(torch.empty(5000, device="meta", dtype=torch.float16))
        import forge_localmods._ops.scale as host
        print(json.dumps({"shape": list(y.shape), "package": host.__package__, "spec_parent": host.__spec__.parent,
                          "name": host.__name__, "helper": host.block_for.__module__}))
        ''')
    res = _run_fresh(code, target)
    assert res == {"shape": [5000], "package": "forge_localmods._ops._local.unslothish.kernels",
                   "spec_parent": "forge_localmods._ops._local.unslothish.kernels",
                   "name": "forge_localmods._ops.scale",
                   "helper": "forge_localmods._ops._local.unslothish.kernels.utils"}


TWICE = '''\
"""A second kernel file of the package whose host code calls the first file's op (as unsloth's fast_lora calls
the swiglu host functions)."""

import torch
import triton
import triton.language as tl

from .scale import scale
from .utils import block_for


@triton.jit
def neg_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, -tl.load(x_ptr + offs, mask=mask), mask=mask)


def neg_scale(x: torch.Tensor) -> torch.Tensor:
    y = scale(scale(x))
    out = torch.empty_like(y)
    n = y.numel()
    BLOCK, num_warps = block_for(n)
    neg_kernel[(triton.cdiv(n, BLOCK),)](y, out, n, BLOCK=BLOCK, num_warps=num_warps)
    return out


def examples(device="cpu"):
    for n in (1000, 4096):
        neg_scale(torch.randn(n, device=device, dtype=torch.float16))
'''


def _forget_package(top: str) -> None:
    """The project package and its modules out of sys.modules (a later test's project may have the same name)."""
    for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        del sys.modules[name]


def _plan_of(manifest: Path, package: str = "unslothish", importable: Path | None = None):
    """The project's plan for sm_90, its package forgotten afterwards (``importable``: a folder on sys.path
    meanwhile, for helper packages its files import by their project name)."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    if importable is not None:
        sys.path.insert(0, str(importable))
    try:
        return make_plan(load_manifest(manifest), ["sm_90"])
    finally:
        if importable is not None:
            sys.path.remove(str(importable))
        _forget_package(package)


def _two_file_package_project(root: Path) -> Path:
    """``_package_project`` with a second kernel file whose host code imports the first one's op, and the package
    ``__init__`` importing both kernel files."""
    manifest = _package_project(root)
    kernels = root / "unslothish" / "kernels"
    (kernels / "twice.py").write_text(TWICE)
    (kernels / "__init__.py").write_text("from .scale import scale\nfrom .twice import neg_scale\n")
    manifest.write_text(manifest.read_text() + textwrap.dedent('''
        [kernels.neg]
        source = "unslothish/kernels/twice.py:neg_kernel"
        ops = ["neg_scale"]
        signature = { x_ptr = "*fp16", out_ptr = "*fp16", n = "i32" }
        key = ["n"]
        examples = "examples"
        '''))
    return manifest


@pytest.mark.slow
def test_a_kernel_file_that_project_code_imports_is_its_bound_host_module(tmp_path: Path) -> None:
    target = _installed(_two_file_package_project(tmp_path / "project"), tmp_path)
    local = target / "forge_localmods" / "_ops" / "_local"
    # the kernel files ship once, as host modules; only the package and its helper are project modules
    assert sorted(str(p.relative_to(local)) for p in local.rglob("*.py")) == [
        "__init__.py", "unslothish/__init__.py", "unslothish/kernels/__init__.py", "unslothish/kernels/utils.py"]
    index = json.loads((target / "forge_localmods" / "_forge" / "index.json").read_text())
    assert index["modules"]["scale"]["imported_as"] == ["unslothish.kernels.scale"]
    assert index["modules"]["twice"]["imported_as"] == ["unslothish.kernels.twice"]
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        sys.modules["unslothish"] = None
        import torch, forge_localmods
        local = "forge_localmods._ops._local.unslothish.kernels"
        if sys.argv[1] == "package-first":  # the project package imported first: its __init__ imports both files
            pkg = __import__(local, fromlist=["*"])
        y = torch.ops.forge_localmods.neg_scale(torch.empty(5000, device="meta", dtype=torch.float16))
        import forge_localmods._ops.scale as scale_host, forge_localmods._ops.twice as twice_host
        pkg = sys.modules[local]
        print(json.dumps({"shape": list(y.shape),
                          "calls_bound_scale": twice_host.scale is scale_host.scale,
                          "aliases": [sys.modules[local + ".scale"] is scale_host,
                                      sys.modules[local + ".twice"] is twice_host],
                          "package_exports": [pkg.scale is scale_host.scale, pkg.neg_scale is twice_host.neg_scale],
                          "kernel": type(scale_host.scale_kernel).__name__,
                          "specs": [scale_host.__spec__.name, twice_host.__spec__.name,
                                    scale_host.__spec__.origin == scale_host.__file__]}))
        ''')
    for order in ("op-first", "package-first"):
        res = _run_fresh(check.replace("sys.argv[1]", repr(order)), target)
        assert res == {"shape": [5000], "calls_bound_scale": True, "aliases": [True, True],
                       "package_exports": [True, True], "kernel": "Kernel",
                       # named in the project package, as relative imports need (the module keeps its name)
                       "specs": ["forge_localmods._ops._local.unslothish.kernels.scale",
                                 "forge_localmods._ops._local.unslothish.kernels.twice", True]}, order


def test_a_helper_that_host_code_takes_must_be_host_code(tmp_path: Path) -> None:
    from forge_aot.errors import SourceError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    manifest = _project(tmp_path)
    # triton.language's cdiv is a @triton.jit function (``from triton import cdiv``, the host helper, is host code)
    (tmp_path / "mylib" / "ops" / "utils.py").write_text(textwrap.dedent('''\
        from triton.language import cdiv

        def block_for(n):
            return min(cdiv(n, 128) * 128, 2048), 4
        '''))
    with pytest.raises(SourceError, match="cdiv"):
        make_plan(load_manifest(manifest), ["sm_90"])


def test_two_helpers_of_one_name_cannot_ship(tmp_path: Path) -> None:
    from forge_aot.errors import SourceError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    manifest = _project(tmp_path)
    other = tmp_path / "more"
    other.mkdir()
    (other / "scale2.py").write_text((tmp_path / "kernels" / "scale.py").read_text()
                                     .replace("scale", "scale2").replace("scale2_kernel", "scale2_kernel"))
    (other / "tiny_helpers.py").write_text("def check_size(n):\n    assert n >= 0, n\n")
    manifest.write_text(manifest.read_text() + MANIFEST.split("\n\n", 1)[1]
                        .replace("kernels.scale", "kernels.scale2").replace("kernels/scale.py:scale_kernel",
                                                                          "more/scale2.py:scale2_kernel")
                        .replace('ops = ["scale"]', 'ops = ["scale2"]'))
    with pytest.raises(SourceError, match="imports 'tiny_helpers' from"):
        make_plan(load_manifest(manifest), ["sm_90"])


def test_what_only_build_time_functions_import_is_hashed_but_not_shipped(tmp_path: Path) -> None:
    """An examples function (left out of the wheel) that imports a project test helper needing Triton: the
    build takes it, the package does not ship it, and the kernel's code hash follows it."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    manifest = _project(tmp_path)
    (tmp_path / "mylib" / "testing.py").write_text(textwrap.dedent('''\
        import torch
        import triton.language as tl

        FP = tl.float16  # Triton at module scope: never host code


        def sample(n, device):
            return torch.randn(n, device=device, dtype=torch.float16)
        '''))
    kernel = tmp_path / "kernels" / "scale.py"
    kernel.write_text(kernel.read_text().replace(
        "    for n in (1000, 4096):\n        scale(torch.randn(n, device=device, dtype=torch.float16))",
        "    from mylib.testing import sample\n\n    for n in (1000, 4096):\n        scale(sample(n, device))"))
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    assert "mylib.testing" in plan.kernels["scale"].local_modules
    assert sorted(plan.modules["scale"]["local_sources"]) == ["mylib", "mylib.ops", "mylib.ops.limits",
                                                              "mylib.ops.utils", "tiny_helpers"]


def test_development_mode_binds_an_imported_kernel_file_like_the_wheel(tmp_path: Path) -> None:
    """Development mode (and the build's tracer) bind the file another imports under its project name while they
    bind, each after the files its own code imports; the project's own modules are in sys.modules afterwards."""
    from forge_aot.dev import load_dev_ops

    manifest = _two_file_package_project(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        ops = load_dev_ops(manifest, ["sm_90"])
        bound_scale = ops["scale"].__globals__
        assert ops["neg_scale"].__globals__["scale"] is ops["scale"]  # the bound op, not the JIT one
        assert bound_scale["__name__"] != "unslothish.kernels.scale"
        from forge_aot.runtime.kernel import Kernel

        assert isinstance(bound_scale["scale_kernel"], Kernel)  # development mode's own subclass of it
        real = sys.modules["unslothish.kernels.scale"]  # the project's own module again, with its JIT kernel
        assert real.__name__ == "unslothish.kernels.scale" and type(real.scale_kernel).__name__ == "JITFunction"
    finally:
        sys.path.remove(str(tmp_path))
        _forget_package("unslothish")


def test_the_build_binds_an_imported_kernel_file_before_the_file_importing_it(tmp_path: Path) -> None:
    """The importing file sorts first (a_twice.py imports scale.py): the build still binds scale first, so the
    tracer's a_twice reaches the traced scale op, not the project's JIT one (which fails on the CPU)."""

    manifest = _two_file_package_project(tmp_path)
    kernels = tmp_path / "unslothish" / "kernels"
    (kernels / "twice.py").rename(kernels / "a_twice.py")
    (kernels / "__init__.py").write_text("from .scale import scale\nfrom .a_twice import neg_scale\n")
    manifest.write_text(manifest.read_text().replace("kernels/twice.py", "kernels/a_twice.py"))
    plan = _plan_of(manifest)
    assert plan.modules["a_twice"]["imports_host"] == ["scale"]
    assert plan.modules["scale"]["imported_as"] == ["unslothish.kernels.scale"]
    # the examples of a_twice ran through the traced scale: its launches were recorded for the scale kernel too
    assert {e.kernel for e in plan.entries} == {"scale", "neg"}


@pytest.mark.gpu
def test_a_kernel_file_imported_by_another_runs_its_kernels_on_the_gpu(tmp_path: Path) -> None:
    """The wheel of the two-file package: one op's host code calls the other file's op, whose kernels launch from
    the bound host module (a second copy of the file would have none), in a fresh process; odd sizes, an offset
    input, each output poisoned once read (the next call's allocation reuses its memory); then torch.compile with
    dynamic shapes over three sizes: one graph."""
    target = _installed(_two_file_package_project(tmp_path / "project"), tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        sys.modules["unslothish"] = None
        import torch, forge_localmods
        errs = []
        for n in (1000, 4097, 70001):
            base = torch.randn(n + 3, device="cuda", dtype=torch.float16)
            x = base[3:]  # 6 bytes past the allocation: no 16-byte alignment
            for _ in range(2):
                y = forge_localmods.neg_scale(x)
                ref = -(x.double() * 4)
                errs.append((y.double() - ref).abs().max().item())
                y.fill_(float("nan"))
        # torch.compile with dynamic shapes: the host code's block size from n (next_power_of_2) leaves n symbolic
        # in the custom op's fake implementation, so three sizes take one graph
        graphs = []
        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        compiled = torch.compile(lambda x: forge_localmods.neg_scale(x) + 1, backend=backend, dynamic=True,
                                 fullgraph=True)
        for n in (1000, 4097, 70001):
            x = torch.randn(n, device="cuda", dtype=torch.float16)
            errs.append((compiled(x).double() - (-(x * 4) + 1).double()).abs().max().item())  # fp16 add, as eager
        torch.cuda.synchronize()
        print(json.dumps({"max_err": max(errs), "triton": sys.modules.get("triton") is not None,
                          "graphs": len(graphs)}))
        ''')
    res = _run_fresh(code, target)
    assert res == {"max_err": 0.0, "triton": False, "graphs": 1}


def test_a_kernel_file_imported_inside_a_function_reaches_the_traced_op(tmp_path: Path) -> None:
    """twice.py imports scale.py inside its op's body (and the package __init__ imports nothing): the examples
    run after binding, and the import there still reaches the traced scale op, not the project's JIT one."""

    manifest = _two_file_package_project(tmp_path)
    kernels = tmp_path / "unslothish" / "kernels"
    (kernels / "__init__.py").write_text("")
    twice = kernels / "twice.py"
    twice.write_text(twice.read_text().replace("from .scale import scale\n", "").replace(
        "    y = scale(scale(x))\n", "    from .scale import scale\n\n    y = scale(scale(x))\n"))
    plan = _plan_of(manifest)
    assert plan.modules["scale"]["imported_as"] == ["unslothish.kernels.scale"]
    # neg_scale's examples ran through the traced scale op: its launches were recorded as scale's
    scale_calls = [c for e in plan.entries if e.kernel == "scale" for cs in e.calls.values() for c in cs]
    assert {c.key for c in scale_calls} >= {(1000,), (4096,)}


TRITON_UTILS = '''\
"""vLLM's vllm/triton_utils (importing.py and __init__.py, abridged to the lines that decide): Triton where exactly one
of its drivers is active, else a placeholder module."""
import types
from importlib.util import find_spec

HAS_TRITON = find_spec("triton") is not None
if HAS_TRITON:
    from triton.backends import backends

    active_drivers = [x.driver for x in backends.values() if x.driver and x.driver.is_active()]
    if len(active_drivers) != 1:
        HAS_TRITON = False


class TritonPlaceholder(types.ModuleType):
    def __init__(self):
        super().__init__("triton")
        self.jit = lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda f: f))
        self.cdiv = lambda a, b: -(-a // b)


if HAS_TRITON{force}:
    import triton
    import triton.language as tl
else:
    triton = TritonPlaceholder()
    tl = types.ModuleType("triton.language")
'''

VLLM_STYLE_KERNEL = '''\
import torch

from mylib.triton_utils import tl, triton


@triton.jit
def scale_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x, dtype=tl.float16):
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def examples(device="cpu"):
    scale(torch.empty(4096, dtype=torch.float16, device=device))
'''


def test_triton_taken_from_a_reexporting_module_is_triton(tmp_path: Path) -> None:
    """vLLM's kernel files import Triton as ``from vllm.triton_utils import tl, triton``: that line is a Triton import
    (kernel side; host code gets the runtime's triton and its element types), the re-exporting module is not shipped,
    and the build checks that what it handed out is Triton (vLLM's placeholder, where no Triton driver is active, is
    named instead of compiling nothing)."""
    from forge_aot.errors import SourceError
    from forge_aot.pipeline import build
    from forge_aot.sourcesplit import parse_source

    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("")
    (tmp_path / "mylib" / "triton_utils.py").write_text(TRITON_UTILS.format(force=""))
    (tmp_path / "k.py").write_text(VLLM_STYLE_KERNEL)
    src = parse_source(tmp_path / "k.py", {"scale"})
    assert list(src.kernels) == ["scale_kernel"]
    assert src.host_source.splitlines()[2] == "tl = triton.language"  # host code reads tl.float16
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "vllm_style"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.scale]\n'
        'source = "k.py:scale_kernel"\nops = ["scale"]\nsignature = { X = "*fp16" }\nexamples = "examples"\n')
    result = build(tmp_path / "kernel_manifest.toml", out_dir=tmp_path / "dist", build_dir=tmp_path / "work",
                   platforms=["any"])
    assert result.report.results and all(r.ok for r in result.report.results)
    import zipfile

    with zipfile.ZipFile(result.wheel) as zf:
        assert not [n for n in zf.namelist() if "triton_utils" in n]
    # Where it hands out its placeholder, the build says so instead of compiling nothing.
    (tmp_path / "mylib" / "triton_utils.py").write_text(TRITON_UTILS.format(force=" and False"))
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from forge_aot.introspect import load_kernel_module; "
            f"load_kernel_module({str(tmp_path / 'k.py')!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "'triton' is not triton but" in proc.stderr
    assert SourceError.__name__ in proc.stderr


def test_a_triton_element_type_from_a_helper_module_is_a_constexpr_like_one_from_the_file(tmp_path: Path) -> None:
    """Liger-Kernel's ``torch_to_triton_dtype`` lives in ``liger_kernel/ops/utils.py``: at build time that helper
    runs with Triton itself, so the trace saw a real ``tl.bfloat16``, which no compile job could carry (the job's
    JSON failed in the pool's thread, and the build resubmitted it forever). The trace records it as the runtime's
    stand-in, as the wheel's host code passes it; the binary is compiled with the element type."""
    import zipfile

    from forge_aot.pipeline import build

    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("")
    (tmp_path / "mylib" / "utils.py").write_text(
        "import torch\nimport triton.language as tl\n\n"
        "torch_to_triton_dtype = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}\n")
    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        from mylib.utils import torch_to_triton_dtype


        @triton.jit
        def cast_kernel(x_ptr, y_ptr, n, OUT: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n).to(OUT), mask=offs < n)


        def cast(x, dtype):
            y = torch.empty_like(x, dtype=dtype)
            cast_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), torch_to_triton_dtype[dtype], BLOCK=256)
            return y


        def examples(device="cpu"):
            for dtype in (torch.bfloat16, torch.float16):
                cast(torch.randn(1000, device=device), dtype)
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "helper_dtype"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.cast]\n'
        'source = "k.py:cast_kernel"\nops = ["cast"]\nsignature = { x_ptr = "*fp32", y_ptr = "*T" }\n'
        'dtypes = { T = ["bf16", "fp16"] }\nexamples = "examples"\n')
    result = build(tmp_path / "kernel_manifest.toml", out_dir=tmp_path / "dist", build_dir=tmp_path / "work",
                   platforms=["any"])
    assert sorted(e.variant for e in result.plan.entries) == ["T=bf16,OUT=tl.bfloat16,BLOCK=256",
                                                             "T=fp16,OUT=tl.float16,BLOCK=256"]
    assert result.report.results and all(r.ok for r in result.report.results)
    with zipfile.ZipFile(result.wheel) as zf:
        assert "helper_dtype/_ops/_local/mylib/utils.py" in zf.namelist()  # shipped: the wheel's host code needs it


def test_a_job_the_pool_cannot_send_fails_instead_of_hanging_the_build(tmp_path: Path) -> None:
    """A compile job whose values cannot be written to the worker failed in the pool's thread, which died without
    an answer, and the build resubmitted the job forever: it is now a failed binary with the reason."""
    import dataclasses

    from forge_aot.compiler import CompilePool
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import job_for, make_plan
    from tests.test_build import TINY

    plan = make_plan(load_manifest(TINY), ["sm_90"])
    e = plan.entries[0]
    row = next(r for rows in e.tables.values() for r in rows)
    c = row.preferences[0]
    job = job_for(plan, e, c, next(iter(plan.binaries_for(e, row.key, c))))
    bad = dataclasses.replace(job, constexprs={**job.constexprs, "BLOCK_SIZE": object()})
    pool = CompilePool(1, cache_dir=tmp_path / "cache", root=TINY.parent)
    try:
        (result,) = pool.run([bad], tmp_path / "out")
    finally:
        pool.close()
    assert not result.ok and "TypeError" in result.error and "JSON serializable" in result.error


@pytest.mark.parametrize("host_names", ["HAS_TRITON", ""])
def test_triton_re_exported_beside_host_names_leaves_the_host_import_without_it(tmp_path: Path, host_names) -> None:
    """``from vllm.triton_utils import HAS_TRITON, tl, triton``: tl and triton are Triton (kernel side); the host keeps
    the rest of the import, its tl's element types bound to the runtime's."""
    from forge_aot.sourcesplit import parse_source

    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("")
    (tmp_path / "mylib" / "triton_utils.py").write_text(TRITON_UTILS.format(force=""))
    uses = "    assert HAS_TRITON\n" if host_names else ""
    text = (VLLM_STYLE_KERNEL.replace("from mylib.triton_utils import tl, triton",
                                      "from mylib.triton_utils import HAS_TRITON, tl, triton")
            .replace("    y = torch.empty_like(x)\n", "    y = torch.empty_like(x)\n" + uses))
    (tmp_path / "k.py").write_text(text)
    src = parse_source(tmp_path / "k.py", {"scale"})
    line = src.host_source.splitlines()[2]
    # (a name nothing uses stays imported, as the author wrote it; only what kernels alone use leaves)
    assert line == "from mylib.triton_utils import HAS_TRITON; tl = triton.language", line
    assert list(src.kernels) == ["scale_kernel"]
    compile(src.host_source, "k.py", "exec")


def test_what_a_helpers_own_kernels_take_is_not_its_host_codes(tmp_path: Path) -> None:
    """FLA: ``fla/ops/utils/index.py`` spreads ``fla.utils.autotune_cache_kwargs`` into its own kernels'
    autotuners, and the kernel file takes only a host helper from it. ``fla.utils`` computes that name from Triton
    (``inspect.signature(triton.autotune)``): it had counted as host code the package ships, and been refused. The
    shipped host code of index.py imports nothing from fla.utils, so the wheel ships index.py alone; the kernel's
    code hash still covers both files."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "flaish").mkdir()
    (tmp_path / "flaish" / "__init__.py").write_text("")
    (tmp_path / "flaish" / "utils.py").write_text(textwrap.dedent('''\
        import inspect

        import triton

        SUPPORTS_AUTOTUNE_CACHE = "cache_results" in inspect.signature(triton.autotune).parameters
        autotune_cache_kwargs = {"cache_results": True} if SUPPORTS_AUTOTUNE_CACHE else {}
        '''))
    (tmp_path / "flaish" / "index.py").write_text(textwrap.dedent('''\
        import triton
        import triton.language as tl

        from flaish.utils import autotune_cache_kwargs


        @triton.autotune(configs=[triton.Config({}, num_warps=4)], key=["B"], **autotune_cache_kwargs)
        @triton.jit
        def fill(y, B: tl.constexpr):
            tl.store(y + tl.arange(0, B), tl.arange(0, B))


        def cdiv_rows(n):
            return triton.cdiv(n, 1024)
        '''))
    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        from flaish.index import cdiv_rows


        @triton.jit
        def copy_kernel(x, y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + o, tl.load(x + o, mask=o < n), mask=o < n)


        def copy_op(x):
            y = torch.empty_like(x)
            copy_kernel[(cdiv_rows(x.numel()),)](x, y, x.numel(), BLOCK=1024)
            return y


        def examples(device="cpu"):
            copy_op(torch.randn(4096, device=device))
        '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.copy]\nsource = "k.py:copy_kernel"\n'
        'ops = ["copy_op"]\nsignature = { x = "*fp32", y = "*fp32", n = "i32" }\nexamples = "examples"\n')
    sys.path.insert(0, str(tmp_path))
    try:
        plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    finally:
        sys.path.remove(str(tmp_path))
        _forget_package("flaish")
    shipped = plan.modules["k"]["local_sources"]
    assert sorted(shipped) == ["flaish", "flaish.index"]
    assert "autotune_cache_kwargs" not in str(shipped["flaish.index"]) and "def cdiv_rows" in str(shipped)
    assert sorted(plan.kernels["copy"].local_modules) == ["flaish", "flaish.index", "flaish.utils"]  # the code hash's


@pytest.mark.slow
def test_host_code_reads_the_version_of_the_triton_that_built_the_wheel(tmp_path: Path) -> None:
    """FLA's ``fla/utils.py`` checks ``triton.__version__`` when imported (``check_environments``) and its ops branch
    on ``TRITON_ABOVE_3_4_0``: packaged host code reads the version of the Triton that compiled the wheel's binaries
    (its build record), with no Triton importable."""
    from importlib.metadata import version

    (tmp_path / "flv").mkdir()
    (tmp_path / "flv" / "__init__.py").write_text("")
    (tmp_path / "flv" / "utils.py").write_text(textwrap.dedent('''\
        import triton

        TRITON_VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])


        def check_environments():
            if TRITON_VERSION < (3, 2):
                raise RuntimeError(f"needs Triton 3.2 or later, not {triton.__version__}")


        check_environments()


        def rows(n):
            return triton.cdiv(n, 1024) if TRITON_VERSION >= (3, 0) else None
        '''))
    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        from flv.utils import rows


        @triton.jit
        def copy_kernel(x, y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + o, tl.load(x + o, mask=o < n), mask=o < n)


        def copy_op(x: torch.Tensor) -> torch.Tensor:
            y = torch.empty_like(x)
            copy_kernel[(rows(x.numel()),)](x, y, x.numel(), BLOCK=1024)
            return y


        def examples(device="cpu"):
            copy_op(torch.randn(4096, device=device))
        '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_tver"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.copy]\n'
        'source = "k.py:copy_kernel"\nops = ["copy_op"]\nsignature = { x = "*fp32", y = "*fp32", n = "i32" }\n'
        'examples = "examples"\n')
    try:
        target = _installed(tmp_path / "kernel_manifest.toml", tmp_path)
    finally:
        _forget_package("flv")
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        sys.modules["flv"] = None
        import torch, forge_tver
        out = torch.ops.forge_tver.copy_op(torch.empty(3000, device="meta"))
        from forge_tver._ops._local.flv import utils
        from forge_tver._ops.k import triton as host_triton
        print(json.dumps({"version": host_triton.__version__, "parsed": list(utils.TRITON_VERSION),
                          "shape": list(out.shape)}))
        ''')
    res = _run_fresh(code, target)
    assert res["version"] == version("triton") and res["shape"] == [3000]
    assert res["parsed"] == [int(p) for p in version("triton").split(".")[:2]]


@pytest.mark.slow
def test_files_of_one_name_and_a_kernel_file_with_no_op(tmp_path: Path) -> None:
    """flash-attn's layout: ops/triton/rotary.py (the kernel, no op of the package's) and layers/rotary.py (the
    autograd Function, exported) are both rotary.py: each host module is named by the tail of its path that tells
    it apart, and ``import <package>._ops.<module>`` of the kernel file binds its kernel handles as the exported
    file's import of it by project name does (one module for both)."""
    for d in ("fa", "fa/ops", "fa/layers"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "fa" / "ops" / "rotary.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def copy_kernel(x, y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + o, tl.load(x + o, mask=o < n), mask=o < n)


        def apply(x):
            y = torch.empty_like(x)
            copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
            return y


        def examples(device="cpu"):
            apply(torch.randn(4096, device=device))
        '''))
    (tmp_path / "fa" / "layers" / "rotary.py").write_text(
        "from fa.ops.rotary import apply\n\n\ndef apply_twice(x):\n    return apply(apply(x))\n")
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_fa"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.copy]\n'
        'source = "fa/ops/rotary.py:copy_kernel"\nsignature = { x = "*fp32", y = "*fp32", n = "i32" }\n'
        'examples = "examples"\n\n[exports]\napply_twice = "fa/layers/rotary.py"\n')
    try:
        target = _installed(tmp_path / "kernel_manifest.toml", tmp_path)
    finally:
        _forget_package("fa")
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        sys.modules["fa"] = None
        import forge_fa
        import forge_fa._ops.ops_rotary as kernels
        fn = forge_fa.apply_twice
        print(json.dumps({"handle": type(kernels.copy_kernel).__name__, "export": fn.__module__,
                          "same": sys.modules["forge_fa._ops._local.fa.ops.rotary"] is kernels,
                          "modules": sorted(json.load(open(forge_fa.__path__[0] + "/_forge/index.json"))["modules"])}))
        ''')
    res = _run_fresh(code, target)
    # a packaged handle (cold until its first call needs the full Kernel: runtime/cold.py)
    assert res["handle"] in ("ColdKernel", "Kernel") and res["same"] and res["export"] == "forge_fa._ops.layers_rotary"
    assert res["modules"] == ["layers_rotary", "ops_rotary"]


@pytest.mark.slow
def test_flash_linear_attentions_utils_package_ships_as_it_is_written(tmp_path: Path) -> None:
    """fla 0.6.0's ``fla/utils/`` is a package whose ``__init__`` re-exports ``env.py`` and ``hardware.py``: Triton
    feature probes at module level (``inspect.signature(triton.autotune)``, ``hasattr(triton.language, ...)``) take
    the building Triton's answers, as ``triton.__version__`` does; Triton imports under ``try: ... except
    ImportError`` (an NPU-only import in a function, a module-level patch of ``tl.extra``) raise ImportError in the
    wheel, as where Triton is not installed. The kernel file's own way: a computed ``do_not_specialize`` (read from
    the imported kernel), ``@triton.heuristics`` on a kernel the manifest does not list, a ``__main__`` tail."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    utils = tmp_path / "flz" / "utils"
    utils.mkdir(parents=True)
    (tmp_path / "flz" / "__init__.py").write_text("")
    (utils / "__init__.py").write_text(
        "from flz.utils.env import SUPPORTS_AUTOTUNE_CACHE, autotune_cache_kwargs\n"
        "from flz.utils.hardware import IS_GATHER_SUPPORTED, IS_TMA_SUPPORTED, ascend_compile_kwargs, rows\n")
    (utils / "env.py").write_text(textwrap.dedent('''\
        import inspect

        import triton

        SUPPORTS_AUTOTUNE_CACHE = "cache_results" in inspect.signature(triton.autotune).parameters
        autotune_cache_kwargs = {"cache_results": True} if SUPPORTS_AUTOTUNE_CACHE else {}
        '''))
    (utils / "hardware.py").write_text(textwrap.dedent('''\
        import os
        import sys

        import triton

        IS_GATHER_SUPPORTED = hasattr(triton.language, 'gather')
        IS_TMA_SUPPORTED = (
            os.environ.get('FLZ_USE_TMA', '1') == '1'
            and (hasattr(triton.language, '_experimental_make_tensor_descriptor') or
                 hasattr(triton.language, 'make_tensor_descriptor'))
        )
        PATCHED = "no"


        def ascend_compile_kwargs():
            kwargs = {}
            try:
                from triton.backends.ascend.compiler import NPUOptions
                kwargs["multibuffer"] = "multibuffer" in NPUOptions.__dataclass_fields__
            except ImportError:
                return kwargs
            return kwargs


        try:
            import triton.language as tl
            if not hasattr(tl.extra, 'ascend') and hasattr(tl.extra, 'cann'):
                tl.extra.ascend = sys.modules['triton.language.extra.ascend'] = tl.extra.cann
            PATCHED = "yes"
        except (ImportError, AttributeError):
            PATCHED = "no Triton"


        def rows(n):
            return triton.cdiv(n, 1024)
        '''))
    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        from flz.utils import autotune_cache_kwargs, rows

        IS_HOPPER = True


        @triton.autotune(configs=[triton.Config({}, num_warps=4)], key=["n"], **autotune_cache_kwargs)
        @triton.jit(do_not_specialize=["n"] if IS_HOPPER else [])
        def copy_kernel(x, y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + o, tl.load(x + o, mask=o < n), mask=o < n)


        @triton.heuristics({"EVEN": lambda args: args["n"] % 16 == 0})
        @triton.jit(do_not_specialize=["n"] if IS_HOPPER else [])
        def backward_kernel(x, n, EVEN: tl.constexpr):  # not in the manifest
            pass


        def copy_op(x: torch.Tensor) -> torch.Tensor:
            y = torch.empty_like(x)
            copy_kernel[(rows(x.numel()),)](x, y, x.numel(), BLOCK=1024)
            return y


        def examples(device="cpu"):
            copy_op(torch.randn(4096, device=device))


        if __name__ == "__main__":
            print(triton.testing.do_bench(lambda: copy_op(torch.randn(4096, device="cuda"))))
        '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_flz"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.copy]\n'
        'source = "k.py:copy_kernel"\nops = ["copy_op"]\nsignature = { x = "*fp32", y = "*fp32" }\n'
        'examples = "examples"\n')
    sys.path.insert(0, str(tmp_path))
    try:
        plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
        target = _installed(tmp_path / "kernel_manifest.toml", tmp_path)
    finally:
        sys.path.remove(str(tmp_path))
        _forget_package("flz")
    assert plan.kernels["copy"].do_not_specialize == {"n"} and "n" not in plan.kernels["copy"].spec_params
    hardware = (target / "forge_flz" / "_ops" / "_local" / "flz" / "utils" / "hardware.py").read_text()
    assert "IS_GATHER_SUPPORTED = (True)" in hardware  # Triton 3.6 has tl.gather
    assert hardware.count('raise ImportError("packaged host code runs without Triton")') == 2
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        sys.modules["flz"] = None
        import torch, forge_flz
        out = torch.ops.forge_flz.copy_op(torch.empty(3000, device="meta"))
        from forge_flz._ops._local.flz.utils import env, hardware
        print(json.dumps({"shape": list(out.shape), "cache": env.autotune_cache_kwargs,
                          "tma": hardware.IS_TMA_SUPPORTED, "npu": hardware.ascend_compile_kwargs(),
                          "patched": hardware.PATCHED}))
        ''')
    res = _run_fresh(code, target)
    assert res == {"shape": [3000], "cache": {"cache_results": True}, "tma": True, "npu": {},
                   "patched": "no Triton"}


def test_an_op_taken_through_its_packages_re_export_reaches_the_bound_kernel(tmp_path: Path) -> None:
    """FLA imports its ops through package ``__init__`` re-exports (``from fla.ops.utils import
    chunk_local_cumsum``): an ``[ops]`` file's ``from pkg import add``, where ``pkg/__init__`` re-exports the kernel
    file's op, reaches the bound kernel while the build traces (it had reached the unbound one, which launched
    through Triton itself), bound after the kernel file although its name sorts first (an import of a package
    above a kernel file orders the binding as one of the file would)."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "rxp").mkdir()
    (tmp_path / "rxp" / "__init__.py").write_text("from rxp.zk import add\n")
    (tmp_path / "rxp" / "zk.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def add_kernel(x, y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)


        def add(x):
            y = torch.empty_like(x)
            add_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
            return y
        '''))
    (tmp_path / "rxp" / "aop.py").write_text(textwrap.dedent('''\
        import torch

        from rxp import add


        def add_twice(x: torch.Tensor) -> torch.Tensor:
            return add(add(x))


        def examples(device="cpu"):
            add_twice(torch.randn(1000, device=device))
        '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.add]\n'
        'source = "rxp/zk.py:add_kernel"\nops = ["add"]\nsignature = { x = "*fp32", y = "*fp32", n = "i32" }\n\n'
        '[ops.add_twice]\nsource = "rxp/aop.py"\nexamples = "examples"\n')
    sys.path.insert(0, str(tmp_path))
    try:
        plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
        real = sys.modules.get("rxp")
    finally:
        sys.path.remove(str(tmp_path))
        _forget_package("rxp")
    assert plan.modules["aop"]["schemas"]["add_twice"] == "(Tensor x) -> Tensor"
    assert any(e.kernel == "add" for e in plan.entries)
    assert real is None or real.add.__module__ == "rxp.zk"  # the project's own package is back afterwards


def test_launch_options_an_ops_file_passes_to_a_kernel_taken_through_a_package_re_export(tmp_path: Path) -> None:
    """mlstm_kernels' op files import their kernels through package ``__init__`` re-exports (``from .kernels import
    add_kernel``) and launch them with ``num_warps=`` and ``num_stages=``: those launches were not read as the
    kernel's, so the options were never built ("num_warps was not built as a call-site option")."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "rxk" / "kernels").mkdir(parents=True)
    (tmp_path / "rxk" / "__init__.py").write_text("")
    (tmp_path / "rxk" / "kernels" / "__init__.py").write_text("from .add import add_kernel as add_kernel\n")
    (tmp_path / "rxk" / "kernels" / "add.py").write_text(textwrap.dedent('''\
        import triton
        import triton.language as tl


        @triton.jit
        def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out + o, tl.load(x + o, mask=o < n) + tl.load(y + o, mask=o < n), mask=o < n)
        '''))
    (tmp_path / "rxk" / "ops.py").write_text(textwrap.dedent('''\
        import torch
        import triton

        from .kernels import add_kernel


        def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(x)
            add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024, num_warps=4, num_stages=1)
            return out


        def examples(device="cuda"):
            add(torch.randn(4096, device=device), torch.randn(4096, device=device))
        '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.add]\n'
        'source = "rxk/kernels/add.py:add_kernel"\nexamples = "rxk/ops.py:examples"\n\n'
        '[ops.add]\nsource = "rxk/ops.py"\n')
    sys.path.insert(0, str(tmp_path))
    try:
        plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    finally:
        sys.path.remove(str(tmp_path))
        _forget_package("rxk")
    kp = plan.kernels["add"]
    assert kp.launch_axes == ["num_warps", "num_stages"]
    assert [(s.function, s.keywords) for s in kp.launches] == [("add", ("BLOCK", "num_warps", "num_stages"))]
    assert {(e.assignment["num_warps"], e.assignment["num_stages"]) for e in plan.entries} == {(4, 1)}


OPS_FILE_KERNELS = """\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)


@triton.jit
def scale_bwd_kernel(dy, dx, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dx + o, tl.load(dy + o, mask=o < n) * 2, mask=o < n)


def scale_fwd(x):
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


def scale_bwd(dy):
    dx = torch.empty_like(dy)
    scale_bwd_kernel[(triton.cdiv(dy.numel(), 128),)](dy, dx, dy.numel(), BLOCK=128)
    return dx
"""

OPS_FILE_OP = """\
import torch

from opsf.kern import scale_bwd, scale_fwd


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return scale_fwd(x)

    @staticmethod
    def backward(ctx, dy):
        return scale_bwd(dy)


def scale(x: torch.Tensor) -> torch.Tensor:
    return Scale.apply(x)


def examples(device="cpu"):
    scale(torch.randn(1000, device=device))
"""


def test_an_ops_files_backward_that_launches_an_unlisted_kernel_is_named_at_check(tmp_path: Path) -> None:
    """An ``[ops.NAME]`` file's autograd backward calling a kernel file's launcher of a kernel the manifest does not
    list (flash-linear-attention's simple GLA imports ``chunk_bwd_dh``; session 40's note) passed ``check`` in
    silence, and the wheel's backward raised at run time. It is a warning naming the launcher, the file importing
    it and the kernel (a forward-only package is a choice); the kernel file's own ops launching it stay an error."""
    from forge_aot.errors import SourceError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "opsf").mkdir()
    (tmp_path / "opsf" / "__init__.py").write_text("")
    (tmp_path / "opsf" / "kern.py").write_text(OPS_FILE_KERNELS)
    (tmp_path / "opsf" / "op.py").write_text(OPS_FILE_OP)
    manifest = tmp_path / "kernel_manifest.toml"
    head = '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.scale]\n' \
        'source = "opsf/kern.py:scale_kernel"\nsignature = { x = "*fp32", y = "*fp32", n = "i32" }\n'
    manifest.write_text(head + '\n[ops.scale]\nsource = "opsf/op.py"\nexamples = "examples"\n')
    sys.path.insert(0, str(tmp_path))
    try:
        plan = make_plan(load_manifest(manifest))
        manifest.write_text(head + 'ops = ["scale_fwd", "scale_bwd"]\n')
        with pytest.raises(SourceError, match=r"host function 'scale_bwd' launches 'scale_bwd_kernel', which has no "
                                              r"entry in kernel_manifest.toml"):
            make_plan(load_manifest(manifest))
    finally:
        sys.path.remove(str(tmp_path))
        _forget_package("opsf")
    assert plan.warnings == [
        "opsf/kern.py: host function 'scale_bwd', which opsf/op.py imports, launches 'scale_bwd_kernel', which has no "
        "entry in kernel_manifest.toml: a call of the wheel's ops that reaches it (a backward, say) raises "
        "ForgeRuntimeError; give the kernel an entry to package it"]
    assert plan.to_json()["warnings"] == plan.warnings
    # imported through another function (SGLang's examples import decode_attention_fwd, which reaches its ROCm-only
    # lean attention): the warning said the file imports the launcher itself
    (tmp_path / "opsf" / "kern.py").write_text(OPS_FILE_KERNELS + "\n\ndef scale_bwd_twice(dy):\n"
                                                "    return scale_bwd(scale_bwd(dy))\n")
    (tmp_path / "opsf" / "op.py").write_text(OPS_FILE_OP.replace("scale_bwd", "scale_bwd_twice"))
    manifest.write_text(head + '\n[ops.scale]\nsource = "opsf/op.py"\nexamples = "examples"\n')
    sys.path.insert(0, str(tmp_path))
    try:
        plan = make_plan(load_manifest(manifest))
    finally:
        sys.path.remove(str(tmp_path))
        _forget_package("opsf")
    assert plan.warnings[0].startswith("opsf/kern.py: host function 'scale_bwd', which opsf/op.py reaches through "
                                       "scale_bwd_twice, which it imports, launches 'scale_bwd_kernel'"), plan.warnings


def test_launch_wrappers_apply_to_the_kernels_of_the_helper_modules_shipped_code_reaches(tmp_path: Path) -> None:
    """FlagGems: every kernel wears ``@libentry()`` (``project.launch-wrappers``), and an op file's ``from flag_gems
    import runtime`` runs the package ``__init__``, which imports every op family: the shipped helper modules'
    kernels wear it too. The wrapper was applied to the manifest's kernel files only, so the build refused a
    helper module's kernel for the very decorator the manifest lists (found by session 38's hunt over FlagGems'
    layernorm)."""
    pkg = tmp_path / "gemsish"
    (pkg / "other").mkdir(parents=True)
    (pkg / "ops").mkdir()
    (pkg / "__init__.py").write_text("from gemsish.other.tuned import tuned_kernel  # noqa: F401\n")
    (pkg / "wrappers.py").write_text("def libentry():\n    return lambda fn: fn\n")
    (pkg / "other" / "__init__.py").write_text("")
    (pkg / "other" / "tuned.py").write_text(textwrap.dedent('''\
        import triton
        import triton.language as tl

        from gemsish.wrappers import libentry


        @libentry()
        @triton.jit
        def tuned_kernel(x_ptr, n, B: tl.constexpr):
            pass
        '''))
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "add.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        from gemsish import wrappers  # noqa: F401  (runs the package __init__, as flag_gems' ops do)
        from gemsish.wrappers import libentry


        @libentry()
        @triton.jit
        def add_one_kernel(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


        def add_one(x):
            add_one_kernel[(triton.cdiv(x.numel(), 1024),)](x, x.numel(), BLOCK=1024)


        def examples(device="cuda"):
            add_one(torch.zeros(4096, device=device))
        '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\nlaunch-wrappers = ["libentry"]\n\n'
        '[kernels.add_one]\nsource = "gemsish/ops/add.py:add_one_kernel"\nops = ["add_one"]\n'
        'signature = { x_ptr = "*fp32" }\nexamples = "examples"\n')
    plan = _plan_of(tmp_path / "kernel_manifest.toml", "gemsish", tmp_path)
    shipped = plan.modules["add"]["local_sources"]
    tuned = shipped["gemsish.other.tuned"][0]  # its kernel, as every shipped helper's: a kernel-side stand-in
    assert "tuned_kernel = __forge_kernel_side__('tuned_kernel', __name__)" in tuned and "@libentry" not in tuned


@pytest.mark.slow
def test_a_name_the_kernel_file_imports_and_never_uses_may_need_triton(tmp_path: Path) -> None:
    """bitsandbytes' int8 matmul imports ``early_config_prune, estimate_matmul_time`` from its performance model for
    a ``prune_configs_by`` it left commented out: shipped as host code, the helper was refused (it asks Triton's
    testing module for the GPU's TFLOPS). A name a module takes and never uses is imported, not used: the import
    stays as written (the helper still runs), and there the name is a stand-in where it needs Triton. A name the
    module's ``__all__`` lists counts as used (it is exported). A module imported whole and never read is imported
    only, likewise."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    root = tmp_path / "p"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "perf_model.py").write_text(textwrap.dedent('''\
        import triton

        LOADED = []


        def bandwidth():
            return triton.testing.get_dram_gbps()


        def estimate(nbytes):
            return nbytes / bandwidth()


        def unrelated():
            return 1


        LOADED.append(True)
        '''))
    (root / "pkg" / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        from .perf_model import LOADED, estimate, unrelated
        from . import perf_model as _perf_model  # noqa: F401  (as a whole module, never read either)

        __all__ = ["double", "unrelated"]


        @triton.jit
        def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


        def double(x):
            y = torch.empty_like(x)
            _double[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
            return y


        def examples(device="cuda"):
            double(torch.randn(1001, device=device))
        '''))
    (root / "kernel_manifest.toml").write_text(
        '[project]\nname = "forge_test_unused"\nversion = "0.1"\ntargets = ["sm_90"]\n\n'
        '[kernels.double]\nsource = "pkg/k.py:_double"\nops = ["double"]\nexamples = "examples"\n')
    plan = make_plan(load_manifest(root / "kernel_manifest.toml"), ["sm_90"])
    (mod,) = plan.modules.values()
    assert "from .perf_model import LOADED, estimate, unrelated\n" in mod["host_source"]
    assert "from . import perf_model as _perf_model" in mod["host_source"]
    shipped = mod["local_sources"]["pkg.perf_model"][0]
    assert "def unrelated" in shipped and "get_dram_gbps" not in shipped
    assert "estimate = __forge_kernel_side__('estimate', __name__)" in shipped
    target = _installed(root / "kernel_manifest.toml", tmp_path)
    res = _run_fresh(textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = sys.modules["pkg"] = None
        import forge_test_unused._ops.k as host
        try:
            host.estimate(1)
        except Exception as exc:
            refused = type(exc).__name__
        print(json.dumps({"loaded": host.LOADED, "unrelated": host.unrelated(), "refused": refused,
                          "same": host._perf_model.unrelated is host.unrelated}))
        '''), target)
    assert res == {"loaded": [True], "unrelated": 1, "refused": "ForgeRuntimeError", "same": True}, res
