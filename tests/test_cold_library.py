"""Cold handles (``runtime/cold.py``) for kernels as libraries write them: a wheel of Liger-, mamba-, FLA- and
torchao-style files (``tests/fixtures/realworld/cold_manifest.toml``: host code choosing BLOCK_SIZE and num_warps,
every argument by keyword, constexprs by position and between runtime parameters, a string constexpr, None to a float,
project modules imported, autograd Functions, a custom op with a backward, FLA's ``@triton.heuristics`` on None
arguments, torchao's ``wrap_triton(kernel)[grid](...)`` inside a ``@triton_op``, Unsloth's heuristics coercing
flags the call also passes, gsplat's heuristic ``num_warps``, ``launch_pdl=``, ``launch_cooperative_grid=``, an
autotune config's pre-hook, flash-attn's rotary taking an integer or a tensor for one pointer), in fresh processes
against the fake libcuda (CPU tensors answer as tensors of GPU 0, addresses renumbered per call so two runs
compare). Every launch the cold handles make is the one the full ``Kernel`` makes for the same call (its launch
attributes too), none of the full binding's modules load (its launch, its tables, its host-module binding), and a
call-site value that was not built promotes the handle and is reported as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import FAKE_GPU_PRELUDE, fake_driver_child, fixture_site
from tests.launcher_bytes import FAKE_BASE, FAKE_SPAN

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "tests" / "fixtures" / "realworld" / "cold_manifest.toml"

CHILD = FAKE_GPU_PRELUDE + textwrap.dedent("""
    ZEROED = [0]  # Tensor.zero_ calls: what the autotune config's pre-hook does before each launch
    real_zero = torch.Tensor.zero_

    def counting_zero(self):
        ZEROED[0] += 1
        return real_zero(self)

    torch.Tensor.zero_ = counting_zero
    import builtins
    INDEX_READS = []  # the whole package index (_forge/index.json): no first call should need it
    real_open = builtins.open

    def spy_open(file, *args, **kwargs):
        if str(file).endswith("index.json"):
            INDEX_READS.append(str(file))
        return real_open(file, *args, **kwargs)

    builtins.open = spy_open
    import forge_coldlib as lib
    fake = FakeState.in_dll(ctypes.CDLL("libcuda.so.1"), "fake")
    fake_ex = FakeLaunchEx.in_dll(ctypes.CDLL("libcuda.so.1"), "fake_ex")
    fake.block_size = -1  # the whole parameter block of every launch
    torch.manual_seed(0)

    cases = []
    triton_cdiv = lambda a, b: (a + b - 1) // b
    for dtype in (torch.float16, torch.bfloat16):
        for rows, cols in ((3, 1000), (4, 4096), (5, 5000)):
            x, w = odd(rows, cols, dtype=dtype), torch.randn(cols, dtype=dtype)
            dy = torch.randn(rows, cols, dtype=dtype)
            mode = "llama" if dtype == torch.float16 else "gemma"
            cases.append(lambda x=x, w=w, mode=mode: lib.rms_norm(x, w, eps=1e-6, casting_mode=mode))
            cases.append(lambda x=x, w=w, dy=dy, mode=mode: lib.rms_norm_grad(dy, x, w, 1e-6, 0.0, mode))
    for dtype in (torch.float32, torch.bfloat16):
        for V in (30000, 32000):
            logits, target = torch.randn(6, V, dtype=dtype), torch.randint(0, V, (6,))
            target[1] = -100
            cases.append(lambda a=logits, t=target: lib.liger_cross_entropy(a.clone(), t))
            if dtype == torch.bfloat16:  # (built in bf16 only, as the examples call it)
                cases.append(lambda a=logits, t=target: lib.liger_cross_entropy(
                    a.clone(), t, label_smoothing=0.1, softcap=30.0, return_z_loss=True, lse_square_scale=1e-4,
                    reduction="none"))
    cases += fused_add_rms_norm_cases(lib)  # (conftest's prelude)

    for dtype in (torch.float16, torch.float32):  # torchao's wrap_triton(kernel)[grid](...) in a @triton_op
        for rows, cols in ((3, 1000), (4, 4096)):
            x, s = odd(rows, cols, dtype=dtype), torch.rand(rows, dtype=torch.float32)
            cases.append(lambda x=x, s=s: lib.scale_rows(x, s))

    for dtype in (torch.float32, torch.bfloat16):  # FLA: heuristics on None arguments (HAS_SCALE, IS_VARLEN)
        g, packed = odd(2, 1000, 4, dtype=dtype), odd(1, 1000, 4, dtype=dtype)
        cu_seqlens = torch.tensor([0, 100, 555, 1000], dtype=torch.int32)
        for reverse in (False, True):
            cases.append(lambda g=g, r=reverse: lib.chunk_local_cumsum(g, 64, reverse=r))
            cases.append(lambda g=g, r=reverse: lib.chunk_local_cumsum(g, 64, reverse=r, scale=0.5))
        cases.append(lambda p=packed, c=cu_seqlens: lib.chunk_local_cumsum(p, 64, scale=0.5, cu_seqlens=c))

    for dtype in (torch.float16, torch.bfloat16):  # Unsloth: DO_SOFTCAPPING=... passed, the heuristic coerces it
        for rows in (3, 8):
            logits, labels = torch.randn(rows, 32000, dtype=dtype), torch.randint(0, 32000, (rows,))
            labels[0] = -100
            for cap, scale in ((0, 0), (30.0, 0), (0, 0.0625)):
                cases.append(lambda a=logits, t=labels, c=cap, s=scale: lib.cross_entropy_loss(a, t, c, s))
    for pdl in (True, False):  # launch attributes: launch_pdl=, launch_cooperative_grid=
        for n in (1024, 98432):
            x = odd(n, dtype=torch.float32)
            cases.append(lambda x=x, p=pdl: lib.add(x, x, launch_pdl=p))
    for dtype in (torch.float32, torch.float16):
        cases.append(lambda x=odd(100_003, dtype=dtype): lib.grid_sum(x))
    for deg, block in ((0, 128), (1, 256), (1, 64)):  # gsplat: num_warps from a heuristic
        k = (deg + 1) ** 2
        cases.append(lambda s=odd(10_001, k, 3, dtype=torch.float32), d=odd(10_001, 3, dtype=torch.float32), g=deg,
                     b=block: lib.sh_to_color(s, d, g, b))
    # a config pre-hook zeroes the accumulator (then EVEN, a heuristic; lean since session 65: before the rotary's
    # hand-over)
    for dtype in (torch.float32, torch.float16):
        for n in (1000, 4096, 65536):
            cases.append(lambda x=odd(n, dtype=dtype): lib.total(x))
    # the same kernel under a grid reading the argument n by name, as Triton allows: called after the hook on every
    # path (with the arguments by name), never a second zeroing
    for dtype, n in ((torch.float32, 2000), (torch.float16, 5000)):  # (sizes the C path has not seen)
        cases.append(lambda x=odd(n, dtype=dtype), n=n: sys.modules["forge_coldlib._ops.autotuned"].sum_kernel[
            lambda meta: (triton_cdiv(meta["n"], meta["BLOCK"]),)](x, torch.empty(1), n))
    for dtype in (torch.float16, torch.float32):  # flash-attn's rotary: an int or a tensor to SEQLEN_OFFSETS
        x, q, xv = odd(2, 1000, 8, 128, dtype=dtype), odd(8, 1, 32, 128, dtype=dtype), odd(2000, 8, 64, dtype=dtype)
        cos, sin = torch.randn(2048, 64, dtype=dtype), torch.randn(2048, 64, dtype=dtype)
        part = torch.randn(2048, 16, dtype=dtype), torch.randn(2048, 16, dtype=dtype)
        cos8k, sin8k = torch.randn(8192, 64, dtype=dtype), torch.randn(8192, 64, dtype=dtype)
        offsets = torch.randint(0, 8000, (8,), dtype=torch.int32)
        cu, cs4k = torch.tensor([0, 100, 612, 2000], dtype=torch.int32), torch.randn(4096, 32, dtype=dtype)
        cases.append(lambda x=x, c=cos, s=sin: lib.apply_rotary_emb(x, c, s))  # offset 0 (an integer, 16 | 0)
        cases.append(lambda x=x, p=part: lib.apply_rotary_emb(x, *p, interleaved=True, seqlen_offsets=7))
        cases.append(lambda q=q, c=cos8k, s=sin8k, o=offsets: lib.apply_rotary_emb(q, c, s, seqlen_offsets=o))
        cases.append(lambda x=xv, c=cs4k, u=cu: lib.apply_rotary_emb(x, c, c, cu_seqlens=u, max_seqlen=1388))

    # the host modules the lean path binds (LeanPackage.modules is the full Package's dict after a hand-over)
    import forge_coldlib._runtime.lean_kernel  # (not `from ... import`: the package's __getattr__ would load names)
    lean_kernel, bound_lean = sys.modules["forge_coldlib._runtime.lean_kernel"], set()
    lean_bind = lean_kernel.bind
    lean_kernel.bind = lambda state, mod, part: (m := lean_bind(state, mod, part)) is not None and bound_lean.add(
        mod) or m

    def handles():
        return {f"{m}.{n}": h for m, mod in list(sys.modules.items()) if m.startswith("forge_coldlib._ops.")
                for n, h in vars(mod).items() if type(h).__name__ in ("LeanKernel", "ColdKernel", "Kernel")}

    def run_all():
        out = []
        for case in cases:
            SEEN.clear()
            before, before_ex, zeroed = fake.calls, fake_ex.calls, ZEROED[0]
            case()
            r = fake.launch_record()
            attrs = fake_ex.attributes() if fake_ex.calls > before_ex else []
            out.append([fake.calls - before, r[1], r[2], r[3], canonical_block(r[6], r[7]), list(r[7]), attrs,
                        ZEROED[0] - zeroed])
        return out

    cold = run_all()
    index_reads = list(INDEX_READS)
    # the same calls again: the C path launches every one (a miss would reach the handle's Python run)
    from forge_coldlib._runtime.cold import ColdKernel
    misses, classes = [], [ColdKernel]
    if "forge_coldlib._runtime.lean_kernel" in sys.modules:  # (lean handles: their Python run too)
        from forge_coldlib._runtime.basics import extension
        from forge_coldlib._runtime.lean_kernel import _handle_class
        classes.append(_handle_class(extension()))
    runs = [c.run for c in classes]
    for c, run in zip(classes, runs):
        c.run = lambda self, grid, args, kwargs, run=run: misses.append(self.function) or run(self, grid, args, kwargs)
    again = run_all()
    for c, run in zip(classes, runs):
        c.run = run
    # one binary launched with and without an attribute: one module load, as the full path's siblings share theirs
    pdl = handles()["forge_coldlib._ops.pdl_add.add_kernel"]
    x = odd(1024, dtype=torch.float32)  # (as lib.add(x, x, launch_pdl=False) above: the same binary)
    loads = fake.loads
    pdl[(1,)](x, x, torch.empty_like(x), 1024, BLOCK_SIZE=1024, USE_GDC=False, launch_pdl=True)
    shared_module = [fake.loads - loads, fake_ex.attributes()]
    kinds = sorted({type(h).__name__ for h in handles().values()})
    loaded = sorted(m for m in ("kernel", "launch", "tables", "host_modules")
                    if f"forge_coldlib._runtime.{m}" in sys.modules)
    cold_paths = sorted({p for h in handles().values() if "_cold" in h.__dict__ for _, p, _ in h._cold.launchers})
    lean_state = sys.modules["forge_coldlib._runtime.lean"].PACKAGES.get("forge_coldlib")
    lean_modules = sorted(bound_lean) if lean_state is not None else []
    # (the ops' globals of the modules bound lean: routed as the full runtime routes them, see route_in_module)
    routed_globals = sorted(f"{m}.{n}" for m in lean_modules for n, f in vars(sys.modules[f"forge_coldlib._ops.{m}"])
                            .items() if getattr(f, "__forge_host__", None) is not None)
    from forge_coldlib._runtime.cold import promoted
    for h in handles().values():
        promoted(h)
    # (read after the promotion: a package served lean to the end has not handed over before it)
    routed = bool(sys.modules["forge_coldlib._runtime.entry"].PACKAGES["forge_coldlib"].routed)
    full = run_all()
    backend = next(iter(handles().values())).backend
    full_paths = sorted({p for _, p in backend._loaded})

    # a block size the package has no build of (a longer row than the examples'): reported by the full path
    SEEN.clear()
    err = None
    try:
        lib.rms_norm(torch.randn(2, 40000, dtype=torch.float16), torch.randn(40000, dtype=torch.float16))
    except Exception as exc:
        err = [type(exc).__name__, str(exc)]
    print(json.dumps({"cold": cold, "full": full, "kinds": kinds, "n_handles": len(handles()), "loaded": loaded,
                      "routed": routed, "index_reads": index_reads, "names": sorted(handles()), "again": again,
                      "misses": misses, "lean_modules": lean_modules, "routed_globals": routed_globals,
                      "cold_paths": cold_paths, "shared_module": shared_module,
                      "full_paths": full_paths, "error": err}))
""")


@pytest.fixture(scope="module")
def coldlib_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fixture_site(tmp_path_factory.mktemp("coldlib"), MANIFEST, "forge_coldlib")


def test_library_style_first_calls_are_cold_and_launch_as_the_full_kernel(coldlib_site, fake_libcuda) -> None:
    # (FORGE_NO_LEAN: the package's modules with lean plans are cold ones here; test_library_style_routed_package_
    # serves_its_lean_modules_lean runs them lean)
    got = fake_driver_child(CHILD, coldlib_site, fake_libcuda, FORGE_NO_LEAN="1")
    assert got["kinds"] == ["ColdKernel"] and got["n_handles"] == 15, got["kinds"]
    # flash-attn's kernel file is imported by its layers module under its package's name: one module, two names
    assert [n for n in got["names"] if "rotary" in n] == [
        "forge_coldlib._ops._local.flashattnlike.ops.triton.rotary.rotary_kernel",
        "forge_coldlib._ops.triton_rotary.rotary_kernel"], got["names"]
    assert got["routed"], "the package routes ops by name (a custom op with a backward): cold handles all the same"
    assert got["loaded"] == [], f"the cold first calls loaded the full binding's {got['loaded']}"
    # a project module imported (ligerlike.ops.utils) reads the index without its kernels (_forge/modules.json)
    assert got["index_reads"] == [], got["index_reads"]
    # Liger's keywords, mamba's positional constexprs, defaults left out: the second calls are the C path's
    assert got["misses"] == [] and got["again"] == got["cold"], got["misses"]
    assert len(got["cold"]) == len(got["full"]) == 44 + 12 + 4 + 2 + 3 + 8 + 8
    # launch attributes as the full path sets them (cuLaunchKernelEx: 6 programmatic serialization, 2 cooperative)
    assert [c[6] for c in got["cold"][44 + 12:]] == [[[6, 1]]] * 2 + [[]] * 2 + [[[2, 1]]] * 2 + [[]] * 19
    # flash-attn's offsets: the integers 0 and 7 passed as integers (i32 in the block), the tensor as its address
    # (after four pointers, CU_SEQLENS=None compiled in: the fifth parameter, then the i32 seqlen)
    rotary = got["cold"][44 + 12 + 4 + 2 + 3 + 8:][:8]
    for case in (rotary[1], rotary[5]):  # seqlen_offsets=7: an i32 in the block
        block, at = bytes.fromhex(case[4]), case[5]
        assert at[5] - at[4] == 4 and block[at[4]:at[4] + 4] == (7).to_bytes(4, "little"), case
    for case in (rotary[2], rotary[6]):  # a tensor of offsets: its address
        block, at = bytes.fromhex(case[4]), case[5]
        assert at[5] - at[4] == 8 and FAKE_BASE <= int.from_bytes(block[at[4]:at[4] + 8], "little") < FAKE_BASE \
            + FAKE_SPAN, case
    # the config's pre-hook ran once before each launch of the autotuned sum: cold, on the C path (again), promoted
    total = slice(44 + 12 + 4 + 2 + 3, 44 + 12 + 4 + 2 + 3 + 8)  # (the last two: a grid reading n by name)
    assert [c[7] for c in got["cold"][total]] == [c[7] for c in got["again"][total]] == [1] * 8
    assert [c[7] for c in got["full"][total]] == [1] * 8
    for i, (cold, full) in enumerate(zip(got["cold"], got["full"])):
        assert cold[0] >= 1 and cold[4], f"case {i} launched nothing"
        assert cold == full, f"case {i}: cold {cold} != full {full}"
    assert got["cold_paths"] and set(got["cold_paths"]) <= set(got["full_paths"])
    assert got["shared_module"] == [0, [[6, 1]]], got["shared_module"]
    kind, message = got["error"]
    assert kind == "NotBuiltError" and "BLOCK_SIZE=65536" in message, got["error"]


def test_library_style_calls_without_cold_handles_launch_the_same(coldlib_site, fake_libcuda) -> None:
    cold = fake_driver_child(CHILD, coldlib_site, fake_libcuda, FORGE_NO_LEAN="1")
    full = fake_driver_child(CHILD, coldlib_site, fake_libcuda, FORGE_NO_COLD="1")
    assert full["kinds"] == ["Kernel"] and full["cold_paths"] == []
    assert full["full"] == cold["full"] == cold["cold"]


def test_library_style_routed_package_serves_its_lean_modules_lean(coldlib_site, fake_libcuda) -> None:
    """The package routes ops by name (rms_norm's custom op has a backward in the manifest): since session 63 its
    host modules with a lean plan are still bound lean, their ops' globals routed as the full runtime routes them;
    the others hand the package over and bind cold handles. Every launch is the cold run's and the full one's."""
    lean = fake_driver_child(CHILD, coldlib_site, fake_libcuda)
    cold = fake_driver_child(CHILD, coldlib_site, fake_libcuda, FORGE_NO_LEAN="1")
    assert lean["kinds"] == ["LeanKernel"], lean["kinds"]
    # (every module bound lean: since session 66 flash-attn's rotary, an integer or a tensor to one pointer, too)
    # (the autotuned sum's config pre-hook, since session 65: lean, on the C path after its first call, and promoted
    # to the full Kernel, each launch after exactly one zeroing as in the cold and full runs)
    assert lean["lean_modules"] == ["autotuned", "chunk_local_cumsum", "cross_entropy", "fused_add_rms_norm",
                                    "grid_sum", "layers_rotary", "liger_cross_entropy", "pdl_add", "rms_norm",
                                    "sh_to_color", "triton_rotary", "wrap_triton_scale"], lean["lean_modules"]
    total = slice(44 + 12 + 4 + 2 + 3, 44 + 12 + 4 + 2 + 3 + 8)  # (the last two: a grid reading n by name)
    assert [c[7] for c in lean["cold"][total]] == [c[7] for c in lean["again"][total]] == [1] * 8
    assert lean["shared_module"] == [0, [[6, 1]]], lean["shared_module"]  # (one module, two launch attributes)
    assert "rms_norm.rms_norm" in lean["routed_globals"], lean["routed_globals"]
    assert lean["routed"] and lean["loaded"] == [], lean["loaded"]
    assert lean["misses"] == [] and lean["again"] == lean["cold"]
    assert lean["cold"] == cold["cold"] == lean["full"]
    assert lean["error"] == cold["error"]


GPU_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import forge_coldlib as lib
    torch.manual_seed(0)
    outs = []

    ATOMIC = []  # outputs summed with atomics: their order, so their last bits, differ from run to run

    def keep(value, atomic=False):
        if isinstance(value, torch.Tensor):
            outs.append(value.detach().clone())
            ATOMIC.append(atomic)
        elif isinstance(value, (tuple, list)):
            for v in value:
                keep(v, atomic)

    def odd(*shape, dtype, grad=False):  # misaligned by one element
        n = 1
        for s in shape:
            n *= s
        return torch.randn(n + 1, device="cuda", dtype=dtype)[1:].view(*shape).requires_grad_(grad)

    for dtype, mode in ((torch.float16, "llama"), (torch.bfloat16, "gemma")):
        for rows, cols in ((3, 1000), (4, 4096), (5, 5000)):
            x, w = odd(rows, cols, dtype=dtype), torch.randn(cols, device="cuda", dtype=dtype)
            keep(lib.rms_norm(x, w, eps=1e-6, casting_mode=mode))
            keep(lib.rms_norm_grad(torch.randn(rows, cols, device="cuda", dtype=dtype), x, w, 1e-6, 0.0, mode))
    for dtype in (torch.float32, torch.bfloat16):
        for V in (30000, 32000):
            logits = torch.randn(6, V, device="cuda", dtype=dtype)
            target = torch.randint(0, V, (6,), device="cuda")
            target[1] = -100
            keep(lib.liger_cross_entropy(logits.clone(), target))
            if dtype == torch.bfloat16:
                keep(lib.liger_cross_entropy(logits.clone(), target, label_smoothing=0.1, softcap=30.0,
                                             return_z_loss=True, lse_square_scale=1e-4, reduction="none"))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape in ((3, 3500), (2, 37, 4096)):
            X, R = odd(*shape, dtype=dtype, grad=True), odd(*shape, dtype=dtype, grad=True)
            W = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
            gemma = dtype == torch.bfloat16
            Y, S = lib.liger_fused_add_rms_norm(X, R, W, 1e-6, 1.0 if gemma else 0.0, "gemma" if gemma else "llama")
            (Y.float().sum() + S.float().sum()).backward()
            keep([Y, S, X.grad, R.grad, W.grad])
    for dtype in (torch.float16, torch.float32):
        for rows, cols in ((3, 1000), (4, 4096)):
            keep(lib.scale_rows(odd(rows, cols, dtype=dtype), torch.rand(rows, device="cuda")))
    for dtype in (torch.float32, torch.bfloat16):
        g, packed = odd(2, 1000, 4, dtype=dtype), odd(1, 1000, 4, dtype=dtype)
        cu_seqlens = torch.tensor([0, 100, 555, 1000], device="cuda", dtype=torch.int32)
        for reverse in (False, True):
            keep(lib.chunk_local_cumsum(g, 64, reverse=reverse))
            keep(lib.chunk_local_cumsum(g, 64, reverse=reverse, scale=0.5))
        keep(lib.chunk_local_cumsum(packed, 64, scale=0.5, cu_seqlens=cu_seqlens))
    for dtype in (torch.float16, torch.bfloat16):
        for rows in (3, 8):
            logits = torch.randn(rows, 32000, device="cuda", dtype=dtype)
            labels = torch.randint(0, 32000, (rows,), device="cuda")
            labels[0] = -100
            for cap, scale in ((0, 0), (30.0, 0), (0, 0.0625)):
                keep(lib.cross_entropy_loss(logits, labels, cap, scale))
    for pdl in (True, False):
        for n in (1024, 98432):
            x = odd(n, dtype=torch.float32)
            keep(lib.add(x, x, launch_pdl=pdl))
    # the binary of launch_pdl=False launched with the attribute: one module, two launchers
    import forge_coldlib._ops.pdl_add as pdl_host
    x = odd(1024, dtype=torch.float32)
    out = torch.full_like(x, float("nan"))
    pdl_host.add_kernel[(1,)](x, x, out, 1024, BLOCK_SIZE=1024, USE_GDC=False, launch_pdl=True)
    keep(out)
    for dtype in (torch.float32, torch.float16):
        keep(lib.grid_sum(odd(100_003, dtype=dtype)))
    for deg, block in ((0, 128), (1, 256), (1, 64)):
        k = (deg + 1) ** 2
        keep(lib.sh_to_color(odd(10_001, k, 3, dtype=torch.float32), odd(10_001, 3, dtype=torch.float32), deg, block))
    for dtype in (torch.float32, torch.float16):  # (the pre-hook's module: lean before the rotary's hand-over)
        for n in (1000, 4096, 65536):
            keep(lib.total(odd(n, dtype=dtype)), atomic=True)  # (tl.atomic_add over the programs)
    for dtype in (torch.float16, torch.float32):  # flash-attn's rotary: an int or a tensor to SEQLEN_OFFSETS
        x, q, xv = odd(2, 1000, 8, 128, dtype=dtype), odd(8, 1, 32, 128, dtype=dtype), odd(2000, 8, 64, dtype=dtype)
        cos, sin = torch.randn(2048, 64, device="cuda", dtype=dtype), torch.randn(2048, 64, device="cuda", dtype=dtype)
        part = torch.randn(2048, 16, device="cuda", dtype=dtype), torch.randn(2048, 16, device="cuda", dtype=dtype)
        cos8k, sin8k = (torch.randn(8192, 64, device="cuda", dtype=dtype) for _ in range(2))
        offsets = torch.randint(0, 8000, (8,), device="cuda", dtype=torch.int32)
        cu = torch.tensor([0, 100, 612, 2000], device="cuda", dtype=torch.int32)
        cs4k = torch.randn(4096, 32, device="cuda", dtype=dtype)
        keep(lib.apply_rotary_emb(x, cos, sin))
        keep(lib.apply_rotary_emb(x, *part, interleaved=True, seqlen_offsets=7))
        keep(lib.apply_rotary_emb(q, cos8k, sin8k, seqlen_offsets=offsets))
        keep(lib.apply_rotary_emb(xv, cs4k, cs4k, cu_seqlens=cu, max_seqlen=1388))
    torch.cuda.synchronize()
    kinds = sorted({type(h).__name__ for m, mod in list(sys.modules.items()) if m.startswith("forge_coldlib._ops.")
                    for h in vars(mod).values() if type(h).__name__ in ("LeanKernel", "ColdKernel", "Kernel")})
    torch.save([(o.cpu(), a) for o, a in zip(outs, ATOMIC)], sys.argv[1])
    print(json.dumps({"kinds": kinds, "n": len(outs), "finite": all(bool(o.float().isfinite().all()) for o in outs)}))
""")


@pytest.mark.gpu
def test_library_style_cold_handles_on_the_gpu_match_the_full_kernels_bit_for_bit(coldlib_site, tmp_path) -> None:
    import torch

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FORGE_NO_C_LAUNCH", "FORGE_NO_COLD",
                                                            "FORGE_NO_LEAN")}
    env["PYTHONPATH"] = str(coldlib_site)
    got = {}
    # (lean: the routed package's modules with a lean plan bound lean, since session 63; the others cold)
    for name, extra in (("lean", {}), ("cold", {"FORGE_NO_LEAN": "1"}), ("full", {"FORGE_NO_COLD": "1"})):
        proc = subprocess.run([sys.executable, "-c", GPU_CHILD, str(tmp_path / f"{name}.pt")], capture_output=True,
                              text=True, cwd="/", env=env | extra)
        assert proc.returncode == 0, proc.stderr
        got[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["cold"]["kinds"] == ["ColdKernel"] and got["full"]["kinds"] == ["Kernel"]
    assert got["lean"]["kinds"] == ["LeanKernel"], got["lean"]["kinds"]
    assert got["lean"]["n"] == got["cold"]["n"] == got["full"]["n"] >= 76 and got["cold"]["finite"]
    full = torch.load(tmp_path / "full.pt")
    pairs = [(a, b) for name in ("cold", "lean") for a, b in zip(torch.load(tmp_path / f"{name}.pt"), full)]
    for i, ((a, atomic), (b, _)) in enumerate(pairs):
        assert a.dtype == b.dtype and a.shape == b.shape, f"output {i} differs"
        if atomic:  # the same binary, its atomics' order aside (the pre-hook zeroed the accumulator both times)
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), f"output {i} differs: {a} {b}"
        else:
            assert torch.equal(a, b), f"output {i} differs"


NOT_LEAN_FIRST = FAKE_GPU_PRELUDE + textwrap.dedent("""
    import forge_coldlib as lib
    at_import = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("forge_coldlib._runtime."))
    x, c = odd(2, 1000, 8, 128, dtype=torch.float16), torch.randn(2048, 64, dtype=torch.float16)
    lib.apply_rotary_emb(x, c, c)  # (flash-attn's rotary: its modules left out of _LEAN by the test)
    kind = type(sys.modules["forge_coldlib._ops.triton_rotary"].rotary_kernel).__name__
    loaded = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("forge_coldlib._runtime."))
    print(json.dumps({"at_import": at_import, "kind": kind, "loaded": loaded}))
""")


def test_a_module_without_a_lean_plan_hands_over_at_once(coldlib_site, fake_libcuda, tmp_path) -> None:
    """The generated ``__init__`` names the host modules with a lean plan (``_LEAN``): the first call of another
    module's op hands over to the full runtime without loading the lean binding or reading its part for it; a
    package with none (``_LEAN = ()``) runs the full runtime from import on, as before session 63."""
    import re
    import shutil

    init = (coldlib_site / "forge_coldlib" / "__init__.py").read_text()
    parts = (coldlib_site / "forge_coldlib" / "_forge" / "modules").glob("*.json")
    planned = sorted(p.stem for p in parts if json.loads(p.read_bytes()).get("lean") is not None)  # ({}: no kernel)
    assert re.search(r"^_LEAN = \((.*)\)$", init, re.M).group(1) == "".join(f"{m!r}, " for m in planned).rstrip()
    # (every module of this package has a plan since session 66: the rotary's two left out of _LEAN in a copy)
    some = tmp_path / "some"
    shutil.copytree(coldlib_site, some)
    (some / "forge_coldlib" / "__init__.py").write_text(re.sub(
        r"^_LEAN = .*$", lambda m: m.group(0).replace("'layers_rotary', ", "").replace("'triton_rotary', ", ""), init,
        flags=re.M))
    got = fake_driver_child(NOT_LEAN_FIRST, some, fake_libcuda)
    assert got["at_import"] == ["lean"] and got["kind"] == "ColdKernel"
    assert "lean_kernel" not in got["loaded"], got["loaded"]  # (lean_launch: its bind_call is cold handles' too)
    none = tmp_path / "site"
    shutil.copytree(coldlib_site, none)
    path = none / "forge_coldlib" / "__init__.py"
    path.write_text(re.sub(r"^_LEAN = \(.*\)$", "_LEAN = ()", init, flags=re.M))
    got = fake_driver_child(NOT_LEAN_FIRST, none, fake_libcuda)
    assert "entry" in got["at_import"] and got["kind"] == "ColdKernel", got["at_import"]
