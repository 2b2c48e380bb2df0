"""Host-side tensor descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``), as the Triton tutorial's TMA
matmul (tests/fixtures/realworld/kernels/matmul_tma_host.py) and FlagGems / TLX copies of it write them: the host
builds descriptors with a dummy block shape and each autotune config's ``pre_hook`` sets the real ones.

CPU: the host code's import, the runtime's descriptor against Triton's (checks, signature text), the block shapes
the plan reads per config, and a tiny project cross-compiled for sm_90 and sm_80 whose wheel, in a fresh process
on a fake driver, encodes tensor maps and lays out the parameters as the binary declares them. GPU: the wheel
against torch and Triton's JIT (odd shapes, a strided view, both layouts of the tutorial's call).
"""

from __future__ import annotations

import json
import struct
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REALWORLD

torch = pytest.importorskip("torch")


def test_host_code_keeps_the_descriptor_import(tmp_path: Path) -> None:
    from forge_aot.sourcesplit import parse_source

    src = parse_source(REALWORLD / "kernels" / "matmul_tma_host.py", {"matmul_tma"})
    lines = src.host_source.splitlines()
    assert "TensorDescriptor = triton.tools.tensor_descriptor.TensorDescriptor" in lines
    assert not any(line.startswith("def matmul_get_configs") for line in lines)  # the decorator's, Triton-side
    assert any(line.startswith("def matmul_tma_set_block_size_hook") for line in lines)


@pytest.mark.parametrize("statement", ["import triton.tools.tensor_descriptor as td",
                                       "from triton.tools.tensor_descriptor import TensorDescriptor, foo"])
def test_other_forms_of_the_import_are_refused(tmp_path: Path, statement: str) -> None:
    from forge_aot.errors import SourceError
    from forge_aot.sourcesplit import parse_source

    path = tmp_path / "k.py"
    path.write_text(textwrap.dedent(f"""
        import triton
        import triton.language as tl
        {statement}

        @triton.jit
        def k(x_ptr):
            pass

        def op(x):
            d = td if False else None
            k[(1,)](x)
        """).replace("td if False else None", "td" if "as td" in statement else "TensorDescriptor"))
    with pytest.raises(SourceError, match=r"TensorDescriptor|triton\.tools"):
        parse_source(path, {"op"})


def test_the_runtime_descriptor_matches_tritons() -> None:
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.tools.tensor_descriptor import TensorDescriptor as Triton

    from forge_aot.runtime.descriptors import TensorDescriptor as Ours
    from forge_aot.runtime.descriptors import desc_signature

    x = torch.randn(100, 64, dtype=torch.float16)
    y = torch.randn(3, 5, 8, dtype=torch.bfloat16)
    for t, block in ((x, [32, 64]), (y, [1, 4, 8]), (x[:, :40], [16, 8])):
        ours, theirs = Ours.from_tensor(t, block), Triton.from_tensor(t, block)
        assert (list(ours.shape), list(ours.strides), ours.block_shape, ours.padding) == \
            (list(theirs.shape), list(theirs.strides), theirs.block_shape, theirs.padding)
        assert desc_signature("fp16" if t.dtype == torch.float16 else "bf16", ours.block_shape) == \
            native_specialize_impl(CUDABackend, theirs, False, True, True)[0]
        assert ours.dtype == t.dtype
    # Triton refuses (assertions, ValueError for block sizes) what the runtime refuses with ValueError
    bad = [lambda c: c(x, [100, 64], [64, 1], [32]),                 # rank mismatch
           lambda c: c(x[:, 1:], [100, 63], [64, 1], [32, 32]),      # base not 16-byte aligned
           lambda c: c(x, [100, 64], [3, 1], [32, 32]),              # stride not 16-byte aligned
           lambda c: c(x, [100, 64], [64, 2], [32, 32]),             # last dimension not contiguous
           lambda c: c(x, [100, 64], [64, 1], [32, 24]),             # block not a power of two
           lambda c: c(x, [100, 64], [64, 1], [32, 32], "inf")]      # padding
    for make in bad:
        with pytest.raises((AssertionError, ValueError)):
            make(Triton)
        with pytest.raises((ValueError, TypeError)):
            make(Ours)


def test_parameters_without_tma_are_tritons_decomposition() -> None:
    """A binary compiled without TMA (sm_80) takes the pointer, shape, strides, the NaN-padding flag, then the shape
    and strides again (Triton 3.6's make_tensordesc_arg with no metadata)."""
    from forge_aot.runtime.descriptors import TensorDescriptor, expand, param_codes

    x = torch.randn(100, 64, dtype=torch.float16)
    d = TensorDescriptor(x, [100, 64], [64, 1], [16, 64], padding="nan")
    assert expand(d, None, None) == [x.data_ptr(), 100, 64, 64, 1, 1, 100, 64, 64, 1]
    assert param_codes(2, False) == ["Q", "q", "q", "q", "q", "b", "i", "i", "q", "q"]
    assert param_codes(2, True) == ["M", "i", "i", "q", "q"]
    seen = []
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [16, 64], "fp4_padded": False}
    out = expand(TensorDescriptor(x, [100, 64], [64, 1], [16, 64]), meta, lambda *a: seen.append(a) or b"m" * 128)
    assert out == [b"m" * 128, 100, 64, 64, 1]
    # innermost first, byte strides without the innermost; element type 9 on the device is 8 on the host (bf16)
    assert seen == [(x.data_ptr(), 8, 2, [64, 100], [128], [64, 16], 3, False)]


def test_tensor_maps_are_encoded_once_per_tensor_and_layout() -> None:
    """A launcher remembers the maps it encoded: the same tensor, shape and strides again reuse the map (torch's
    caching allocator hands the same addresses back); another address, shape, stride or padding encodes anew."""
    from forge_aot.runtime.descriptors import TensorDescriptor, expander

    calls = []
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 6, "block_size": [64, 64], "fp4_padded": False}
    run = expander(meta, lambda *a: calls.append(a) or bytes([len(calls)]) * 128, limit=3)
    x = torch.randn(256, 128, dtype=torch.float16)
    assert run(TensorDescriptor.from_tensor(x, [64, 64]))[0] == b"\x01" * 128
    assert run(TensorDescriptor.from_tensor(x, [64, 64]))[0] == b"\x01" * 128 and len(calls) == 1
    run(TensorDescriptor(x, [128, 128], [128, 1], [64, 64]))  # another shape
    run(TensorDescriptor.from_tensor(x[64:], [64, 64]))  # another address
    run(TensorDescriptor.from_tensor(x, [64, 64], padding="nan"))  # another padding: the memory was full, cleared
    assert len(calls) == 4
    assert run(TensorDescriptor.from_tensor(x, [64, 64]))[0] == b"\x05" * 128 and len(calls) == 5
    no_tma = expander(None, None)
    assert no_tma(TensorDescriptor.from_tensor(x, [64, 64]))[:3] == [x.data_ptr(), 256, 128]


def test_the_plan_reads_each_configs_block_shapes_from_its_pre_hook(realworld_plan) -> None:
    from forge_aot.plan import job_for

    plan = realworld_plan
    kp = plan.kernels["matmul_tma_host"]
    assert kp.descriptor_params == ["a_desc", "b_desc", "c_desc"]
    assert kp.type_args == {"T": "a_desc"}
    entries = [e for e in plan.entries if e.kernel == "matmul_tma_host"]
    assert {e.target for e in entries} == {"sm_80", "sm_90"}
    for e in entries:
        for row in e.tables["default"]:
            for config in row.preferences:
                bm, bn, bk = (config.meta[f"BLOCK_SIZE_{a}"] for a in "MNK")
                binaries = plan.binaries_for(e, row.key, config)
                assert {b.descs for b in binaries} == {(("a_desc", (bm, bk)), ("b_desc", (bn, bk)),
                                                        ("c_desc", (bm, bn)))}
                job = job_for(plan, e, config, binaries[0])
                assert job.signature["a_desc"] == f"tensordesc<fp16[{bm}, {bk}]>"
                assert job.signature["c_desc"] == f"tensordesc<fp16[{bm}, {bn}]>"
                assert job.to_json()["descriptors"] == {"a_desc": [bm, bk], "b_desc": [bn, bk], "c_desc": [bm, bn]}


def test_tuning_compiles_each_candidate_with_its_block_shapes(realworld_plan) -> None:
    """forge-aot tune's rows: the decorator's configs less those its early_config_prune drops, each compiled with
    the block shapes its pre-hook sets on the row's traced call."""
    from forge_aot.tune.candidates import make_items
    from forge_aot.tune.runner import item_jobs

    items = make_items(realworld_plan, kernels=("matmul_tma_host",))
    assert {it.key for it in items} == {(512, 512, 512), (1000, 1024, 1000), (4096, 4096, 4096)}
    for it in items:
        assert len(it.candidates) == 12  # 16 configs, 4 pruned (256-wide tiles with 4 warps)
        for job in item_jobs(realworld_plan, it).values():
            bm, bn, bk = (job.config.meta[f"BLOCK_SIZE_{a}"] for a in "MNK")
            assert (job.signature["a_desc"], job.signature["b_desc"], job.signature["c_desc"]) == (
                f"tensordesc<fp16[{bm}, {bk}]>", f"tensordesc<fp16[{bn}, {bk}]>", f"tensordesc<fp16[{bm}, {bn}]>")


def test_a_descriptor_parameter_needs_an_element_type(tmp_path: Path) -> None:
    from forge_aot.errors import ManifestError
    from forge_aot.manifest import load_manifest

    (tmp_path / "kernel_manifest.toml").write_text(textwrap.dedent("""\
        [project]
        name = "p"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.k]
        source = "k.py:k"
        signature = { x_desc = "tensordesc<fp61>", n = "i32" }
        """))
    (tmp_path / "k.py").write_text("import triton\n\n@triton.jit\ndef k(x_desc, n):\n    pass\n")
    with pytest.raises(ManifestError, match=r"did you mean .fp64") as err:
        load_manifest(tmp_path / "kernel_manifest.toml")
    assert err.value.key_path == "kernels.k.signature.x_desc"


TINY_KERNEL = '''\
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


def _set_blocks(nargs):
    nargs["x_desc"].block_shape = [nargs["BM"], nargs["BN"]]
    nargs["y_desc"].block_shape = [nargs["BM"], nargs["BN"]]


@triton.autotune(configs=[triton.Config({"BM": 16, "BN": 32}, num_warps=4, pre_hook=_set_blocks),
                          triton.Config({"BM": 32, "BN": 64}, num_warps=4, pre_hook=_set_blocks)], key=["M"])
@triton.jit
def scale2d_kernel(x_desc, y_desc, M, N, s, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    x = x_desc.load([pid_m * BM, pid_n * BN])
    y_desc.store([pid_m * BM, pid_n * BN], (x.to(tl.float32) * s).to(x.dtype))


def scale2d(x, s):
    y = torch.empty_like(x)
    M, N = x.shape
    x_desc = TensorDescriptor.from_tensor(x, [1, 1])
    y_desc = TensorDescriptor(y, [M, N], [N, 1], [1, 1])
    scale2d_kernel[lambda META: (triton.cdiv(M, META["BM"]), triton.cdiv(N, META["BN"]))](x_desc, y_desc, M, N, s)
    return y


def examples(device="cpu"):
    for m, n in ((100, 72), (4096, 64)):
        scale2d(torch.randn(m, n, device=device, dtype=torch.float16), 0.5)
'''

DUAL_KERNEL = '''\
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


def _blocks(nargs):
    if not isinstance(nargs["src"], TensorDescriptor):
        return
    nargs["src"].block_shape = [nargs["BM"], nargs["BN"]]


@triton.jit
def _maybe_desc(desc_or_ptr, shape, strides, block_shape):
    if isinstance(desc_or_ptr, tl.tensor_descriptor):
        return desc_or_ptr
    else:
        return tl.make_tensor_descriptor(desc_or_ptr, shape, strides, block_shape)


@triton.autotune(configs=[triton.Config({"BM": 16, "BN": 32}, num_warps=4, pre_hook=_blocks)], key=["M"])
@triton.jit
def copy2d_kernel(src, dst, M, N, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    s = _maybe_desc(src, [M, N], [N, 1], [BM, BN])
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    x = s.load([pid_m * BM, pid_n * BN])
    tl.store(dst + offs_m[:, None] * N + offs_n[None, :], x, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def copy2d(x, host_descriptor: bool):
    y = torch.empty_like(x)
    M, N = x.shape
    src = TensorDescriptor.from_tensor(x, [1, 1]) if host_descriptor else x
    copy2d_kernel[lambda META: (triton.cdiv(M, META["BM"]), triton.cdiv(N, META["BN"]))](src, y, M, N)
    return y


def examples(device="cpu"):
    for host_descriptor in (False, True):
        copy2d(torch.randn(100, 72, device=device, dtype=torch.float16), host_descriptor)
'''

TINY_MANIFEST = """\
[project]
name = "forge_tmadesc"
version = "0.1.0"
targets = ["sm_80", "sm_90", "gfx942"]

[kernels.scale2d]
source = "kernels/scale2d.py:scale2d_kernel"
ops = ["scale2d"]
signature = { x_desc = "tensordesc<T>", y_desc = "tensordesc<T>", M = "i32", N = "i32", s = "fp32" }
dtypes = { T = ["fp16"] }
examples = "examples"

[kernels.copy2d]
# the Triton tutorial's attention style: a pointer parameter that takes a host descriptor or a tensor
source = "kernels/copy2d.py:copy2d_kernel"
ops = ["copy2d"]
signature = { src = "*T", dst = "*T", M = "i32", N = "i32" }
dtypes = { T = ["fp16"] }
examples = "examples"
"""


@pytest.mark.slow
def test_a_descriptor_kernel_builds_and_its_wheel_encodes_tensor_maps(tmp_path: Path) -> None:
    """A tiny project cross-compiled for real: the sm_90 binaries record Triton's TMA metadata per descriptor, the
    sm_80 and gfx942 ones none (plain loads); in a fresh process with neither Triton nor forge-aot importable, on a fake
    driver, the op's call runs the config's pre-hook, picks the binary of those block shapes, encodes a tensor map
    per descriptor with the binary's metadata and lays out the parameter block as the binary declares it."""
    from tests.c_launch_support import build_fake_cuda
    from tests.test_localmods import _installed, _run_fresh

    root = tmp_path / "project"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "scale2d.py").write_text(TINY_KERNEL)
    (root / "kernels" / "copy2d.py").write_text(DUAL_KERNEL)
    (root / "kernel_manifest.toml").write_text(TINY_MANIFEST)
    target = _installed(root / "kernel_manifest.toml", tmp_path)
    index = json.loads((target / "forge_tmadesc" / "_forge" / "index.json").read_text())
    # the pointer parameter src: binaries for tensors (no descriptors) and for descriptors (code T, block 16x32)
    dual = index["kernels"]["copy2d"]["variants"]["T=fp16"]["targets"]["sm_90"]["configs"]
    built = {(b["spec"][0], json.dumps(b.get("descs"))) for c in dual.values() for b in c["binaries"].values()}
    assert {code for code, _ in built} == {"D", "x", "T"}
    assert {d for code, d in built if code == "T"} == {json.dumps({"src": [16, 32]})}
    assert {d for code, d in built if code != "T"} == {"null"}
    variant = index["kernels"]["scale2d"]["variants"]["T=fp16"]["targets"]
    for arch, configs in ((a, variant[a]["configs"]) for a in ("sm_80", "sm_90", "gfx942")):
        for config in configs.values():
            bm, bn = config["meta"]["BM"], config["meta"]["BN"]
            for b in config["binaries"].values():
                assert b["descs"] == {"x_desc": [bm, bn], "y_desc": [bm, bn]}
                metas = b["tensordesc_meta"]
                if arch != "sm_90":  # no TMA: pointer, shape and strides
                    assert metas == {"x_desc": None, "y_desc": None}
                else:
                    assert {m["elem_type"] for m in metas.values()} == {6} and \
                        all(m["elem_size"] == 2 and m["block_size"][0] == bm for m in metas.values())
    lib = build_fake_cuda(tmp_path)
    code = textwrap.dedent(f'''\
        import ctypes, json, struct, sys
        sys.modules["triton"] = None
        sys.modules["forge_aot"] = None
        import torch
        torch.Tensor.get_device = lambda self: 0  # every tensor is on the fake cuda:0
        torch._C._cuda_getCurrentRawStream = lambda device: 0x5EED0
        import forge_tmadesc
        from forge_tmadesc._runtime import cuda, drivers
        lib = ctypes.CDLL({lib._name!r})
        drivers._driver = cuda.open_driver({lib._name!r})

        class Tma(ctypes.Structure):
            _fields_ = [("calls", ctypes.c_int), ("dtype", ctypes.c_int), ("rank", ctypes.c_uint),
                        ("address", ctypes.c_ulonglong), ("dims", ctypes.c_ulonglong * 5),
                        ("strides", ctypes.c_ulonglong * 5), ("box", ctypes.c_uint * 5),
                        ("elem_strides", ctypes.c_uint * 5), ("interleave", ctypes.c_int), ("swizzle", ctypes.c_int),
                        ("l2", ctypes.c_int), ("fill", ctypes.c_int), ("aligned", ctypes.c_int)]
        tma = Tma.in_dll(lib, "fake_tma")

        class Fake(ctypes.Structure):  # tests/c_launch_support.FakeState
            _fields_ = [("calls", ctypes.c_int), ("function", ctypes.c_void_p), ("grid", ctypes.c_uint * 3),
                        ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                        ("ctx_at_launch", ctypes.c_void_p), ("nparams", ctypes.c_int), ("block_size", ctypes.c_int),
                        ("offsets", ctypes.c_longlong * 80), ("params", ctypes.c_ubyte * 4096)]
        fake = Fake.in_dll(lib, "fake")
        # the fake copies this much: 2 x (tensor map, 2 x i32, 2 x i64), M, N (i32), s (fp32), 2 scratch pointers
        fake.nparams, fake.block_size = 15, 376
        import forge_tmadesc._ops.scale2d as host
        x = torch.randn(100, 72, dtype=torch.float16)
        y = host.scale2d(x, 0.5)
        params = bytes(fake.params[:376])
        offsets = list(fake.offsets[:15])
        tma_after = {{"calls": tma.calls, "dtype": tma.dtype, "rank": tma.rank, "address": tma.address,
                     "dims": list(tma.dims[:2]), "strides": [tma.strides[0]], "box": list(tma.box[:2]),
                     "elem_strides": list(tma.elem_strides[:2]), "interleave": tma.interleave,
                     "swizzle": tma.swizzle, "l2": tma.l2, "fill": tma.fill, "aligned": tma.aligned}}
        # the next call takes the C path (pre-hook, x's tensor map remembered, y_c's encoded), never Kernel.run
        kernel, runs, encoded = host.scale2d_kernel, [], tma.calls
        kernel.run = lambda g, a, kw: (runs.append(1), type(kernel).run(kernel, g, a, kw))[1]
        y_c = host.scale2d(x, 0.5)
        del kernel.run
        c_call = {{"runs": len(runs), "params": bytes(fake.params[:376]).hex(), "y": y_c.data_ptr(),
                  "encoded": tma.calls - encoded, "fast": kernel._fast is not None}}
        # a descriptor where the kernel also takes a pointer: the map, its shape and strides, then dst, M, N, scratch
        fake.nparams, fake.block_size = 10, 184
        import forge_tmadesc._ops.copy2d as dual
        y2 = dual.copy2d(x, True)
        dual_params, dual_offsets = bytes(fake.params[:184]), list(fake.offsets[:10])
        dual_spec = [key[2] for state in dual.copy2d_kernel._states.values() for key in state.launchers]
        print(json.dumps({{"calls": fake.calls, "offsets": offsets, "dual_params": dual_params.hex(),
                          "dual_offsets": dual_offsets, "dual_spec": dual_spec, "y2": y2.data_ptr(),
                          "params": params.hex(), "x": x.data_ptr(), "y": y.data_ptr(),
                          "tma": tma_after, "c_call": c_call}}))
        ''')
    res = _run_fresh(code, target)
    assert res["calls"] == 3  # scale2d twice, copy2d once
    assert res["dual_spec"][0][0] == "T" and len(res["dual_spec"]) == 1
    assert res["dual_offsets"] == [0, 128, 132, 136, 144, 152, 160, 164, 168, 176]
    dual_params = bytes.fromhex(res["dual_params"])
    assert struct.unpack_from("<iiqqQii", dual_params, 128) == (100, 72, 72, 1, res["y2"], 100, 72)
    # tensor map (64-byte aligned), shape as i32, strides as i64; the same for y; M, N (i32), s (fp32); scratch
    assert res["offsets"] == [0, 128, 132, 136, 144, 192, 320, 324, 328, 336, 344, 348, 352, 360, 368]
    params = bytes.fromhex(res["params"])

    def pattern(dtype: int, address: int) -> bytes:
        return bytes((i ^ dtype ^ (address >> 4)) & 0xFF for i in range(128))

    assert params[0:128] == pattern(6, res["x"]) and params[192:320] == pattern(6, res["y"])
    assert dual_params[0:128] == pattern(6, res["x"])  # the map of x, encoded again: another binary's memory

    assert struct.unpack_from("<iiqq", params, 128) == (100, 72, 72, 1)
    assert struct.unpack_from("<iiqq", params, 320) == (100, 72, 72, 1)
    assert struct.unpack_from("<iif", params, 344) == (100, 72, 0.5)
    # the last map scale2d encoded is y's: element type fp16 (6), innermost first, byte strides, the metadata's box
    sm90 = next(iter(variant["sm_90"]["configs"].values()))
    box = next(iter(sm90["binaries"].values()))["tensordesc_meta"]["y_desc"]["block_size"]
    tma = res["tma"]
    assert tma == {"calls": 2, "dtype": 6, "rank": 2, "address": res["y"], "dims": [72, 100], "strides": [144],
                   "box": box[::-1], "elem_strides": [1, 1], "interleave": 0, "swizzle": tma["swizzle"], "l2": 2,
                   "fill": 0, "aligned": 1}
    assert tma["swizzle"] == next(iter(sm90["binaries"].values()))["tensordesc_meta"]["y_desc"]["swizzle"]
    c_call = res["c_call"]
    c_params = bytes.fromhex(c_call["params"])
    assert c_call["runs"] == 0 and c_call["fast"] and c_call["encoded"] == 1
    assert c_params[0:128] == pattern(6, res["x"]) and c_params[192:320] == pattern(6, c_call["y"])
    assert c_params[128:192] == params[128:192] and c_params[320:] == params[320:]


@pytest.fixture(scope="module")
def jit():
    from forge_aot.dev import load_dev_ops

    return load_dev_ops(REALWORLD / "kernel_manifest.toml")


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(512, 512, 512), (1000, 1024, 1000), (4096, 4096, 4096), (777, 264, 136),
                                 (8, 4096, 512)])
def test_tma_matmul_against_torch_and_the_jit(realworld, jit, mnk) -> None:
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    ref = a.double() @ b.double().T
    out = realworld.matmul_tma(a, b)
    torch.testing.assert_close(out.double(), ref, atol=0.05 * k ** 0.5, rtol=1e-2)
    # the same binary's config under Triton's JIT: bit for bit
    assert torch.equal(out, jit["matmul_tma"](a, b))


@pytest.mark.gpu
def test_tma_matmul_on_a_strided_view_and_repeated_calls(realworld) -> None:
    """A row-strided A (every other row of a larger tensor: stride 2K) and B sliced from a wider tensor; the
    descriptors describe the views; calls with other shapes in between take their own tensor maps."""
    big = torch.randn(2 * 600, 512, device="cuda", dtype=torch.float16)
    a = big[::2]
    wide = torch.randn(384, 1024, device="cuda", dtype=torch.float16)
    b = wide[:, 256:768]
    assert not a.is_contiguous() and not b.is_contiguous()
    for _ in range(2):
        out = realworld.matmul_tma(a, b)
        torch.testing.assert_close(out.double(), a.double() @ b.double().T, atol=0.05 * 512 ** 0.5, rtol=1e-2)
        small = realworld.matmul_tma(b[:64], a[:128])
        torch.testing.assert_close(small.double(), b[:64].double() @ a[:128].double().T, atol=0.05 * 512 ** 0.5,
                                   rtol=1e-2)


@pytest.mark.gpu
def test_a_block_shape_no_config_builds_is_refused_before_any_launch(realworld) -> None:
    import forge_realworld._ops.matmul_tma_host as host
    from forge_realworld._runtime.errors import NotBuiltError

    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    c = torch.full((256, 256), float("nan"), device="cuda", dtype=torch.float16)
    descs = [host.TensorDescriptor.from_tensor(t, [64, 32]) for t in (a, a, c)]
    kernel = host.matmul_kernel_tma
    saved = dict(kernel.pre_hooks)
    kernel.pre_hooks = {name: (lambda nargs: None) for name in saved}  # leave the 64x32 blocks as they are
    try:
        with pytest.raises(NotBuiltError, match="block shapes"):
            kernel[(1,)](*descs, 256, 256, 256, FP8_OUTPUT=False)
    finally:
        kernel.pre_hooks = saved
    torch.cuda.synchronize()
    assert torch.isnan(c).all()
