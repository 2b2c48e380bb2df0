"""Host-side tensor descriptors and config pre-hooks on the C launch path, against the Python path, on the CPU with
the fake libcuda (tests/test_c_launch.py has the rest of the C path).

The Triton tutorials' TMA matmul and attention (and libraries written after them) pass
``triton.tools.tensor_descriptor.TensorDescriptor`` objects, to ``tensordesc<T>`` parameters or to pointer
parameters, with a dummy block shape that each autotune config's ``pre_hook`` sets. Until session 33 every such
call took the pure-Python path (descriptor binaries had no C launcher) and every call of a kernel with a pre-hook
the Python path. Compared here on the bytes the fake driver receives: the tensor maps (the fake fills one with a
pattern of its element type and address), each descriptor's shape and strides, the NaN-padding flag of the layout
without TMA, the maps' encoding arguments, the errors.
"""

from __future__ import annotations

import ctypes
import struct

import pytest

from forge_aot.extension import compiler
from tests import c_launch_support as cs
from tests.test_c_launch import _launch_both, _tensor

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler: the C launch path cannot be built")


class FakeTma(ctypes.Structure):
    """``struct fake_tma_state`` of fixtures/fake_cuda/fake_cuda.c: the last cuTensorMapEncodeTiled call."""

    _fields_ = [("calls", ctypes.c_int), ("dtype", ctypes.c_int), ("rank", ctypes.c_uint),
                ("address", ctypes.c_ulonglong), ("dims", ctypes.c_ulonglong * 5), ("strides", ctypes.c_ulonglong * 5),
                ("box", ctypes.c_uint * 5), ("elem_strides", ctypes.c_uint * 5), ("interleave", ctypes.c_int),
                ("swizzle", ctypes.c_int), ("l2", ctypes.c_int), ("fill", ctypes.c_int), ("aligned", ctypes.c_int),
                ("result", ctypes.c_int)]


@pytest.fixture
def tma(fake_lib, fake):
    state = FakeTma.in_dll(fake_lib, "fake_tma")
    ctypes.memset(ctypes.addressof(state), 0, ctypes.sizeof(state))
    return state


def _meta(block: list[int]) -> dict:
    # Triton's tensordesc metadata of an fp16 descriptor (device element type 6, 128-byte swizzle)
    return {"elem_size": 2, "elem_type": 6, "block_size": block, "swizzle": 3, "fp4_padded": False}


SCALE2D = [["x_desc", "tensordesc<T>"], ["y_desc", "tensordesc<T>"], ["M", "i32"], ["N", "i32"], ["s", "fp32"],
           ["BM", "meta"], ["BN", "meta"]]


def _desc_kernel(rt, root, name, params, binaries, *, meta, pre_hook=None, spec_params=(), type_arg="x_desc"):
    """One variant (T=fp16), one config, the given binaries (spec -> fields) for sm_90."""
    built = {}
    for spec, fields in binaries.items():
        b = cs.binary(root, name, spec + str(sorted(fields.get("descs", {}).items())), **fields)
        b["spec"] = spec
        built[f"{spec}-{len(built)}"] = b
    config = {"meta": meta, "num_warps": 4, "num_stages": 1, "binaries": built}
    if pre_hook:
        config["pre_hook"] = pre_hook
    spec = {"function": f"{name}_kernel", "params": params, "dtype_args": {"T": type_arg}, "key": [], "axes": ["T"],
            "spec_params": list(spec_params), "constraints": [], "constexpr_defaults": {},
            "pre_hooks": [pre_hook] if pre_hook else [],
            "variants": {"T=fp16": {"assign": {"T": "fp16"}, "targets": {"sm_90": {
                "configs": {"c": config}, "tables": {"default": [["c"]]}}}}}}
    return rt.Kernel(name, spec, cs.TARGETS, rt.BinaryBackend(str(root)))


def _on(t, device: int = 0):
    """A view of a fake-device tensor is a new tensor object: on the same fake device."""
    cs.on(device, t)
    return t


def _matrix(rows: int = 100, cols: int = 72, device: int = 0):
    return _on(_tensor(device, rows * cols).view(rows, cols), device)


def _scale2d(rt, root, *, tma_meta: bool, pre_hook: str | None = None):
    blocks = {"x_desc": [64, 32], "y_desc": [64, 32]}
    metas = {n: _meta(b) if tma_meta else None for n, b in blocks.items()}
    return _desc_kernel(rt, root, "scale2d", SCALE2D, {"": {"descs": blocks, "tensordesc_meta": metas}},
                        meta={"BM": 64, "BN": 32}, pre_hook=pre_hook)


@pytest.mark.parametrize("hooked", [False, True])
def test_tensordesc_parameters_launch_from_c_with_the_python_paths_bytes(rt, fake, tma, tmp_path, hooked) -> None:
    """``tensordesc<T>`` parameters with TMA (sm_90): the tensor map, shape (i32) and strides (i64) of each, as the
    Python path lays them out; the map encoded with the binary's metadata; the C path takes the calls after the
    first. With the tutorial's pre-hook, the call passes a dummy block shape that the hook sets per config."""
    x = _matrix()
    y = _matrix()
    k = _scale2d(rt, tmp_path, tma_meta=True, pre_hook="blocks" if hooked else None)
    ran = []

    def blocks(nargs):
        ran.append(nargs["BM"])
        nargs["x_desc"].block_shape = [nargs["BM"], nargs["BN"]]
        nargs["y_desc"].block_shape = [nargs["BM"], nargs["BN"]]

    k.pre_hooks["blocks"] = blocks
    desc = rt.descriptors.TensorDescriptor
    block = [1, 1] if hooked else [64, 32]
    xd, yd = desc(x, [100, 72], [72, 1], list(block)), desc(y, [100, 72], [72, 1], list(block))
    fake.block_size, fake.nparams = 376, 15
    records, fallbacks = _launch_both(rt, fake, k, (2, 3), (xd, yd, 100, 72, 0.5))
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert ran == ([64] * 3 if hooked else [])
    params, offsets = records[0][6], records[0][7]
    assert offsets == (0, 128, 132, 136, 144, 192, 320, 324, 328, 336, 344, 348, 352, 360, 368)

    def pattern(address: int) -> bytes:
        return bytes((i ^ 6 ^ (address >> 4)) & 0xFF for i in range(128))

    assert params[:128] == pattern(x.data_ptr()) and params[192:320] == pattern(y.data_ptr())
    assert struct.unpack_from("<iiqq", params, 128) == struct.unpack_from("<iiqq", params, 320) == (100, 72, 72, 1)
    assert struct.unpack_from("<iif", params, 344) == (100, 72, 0.5)
    # innermost first, byte strides, the binary's box (not the call's block shape), 128-byte swizzle, L2 promotion
    assert (tma.dtype, tma.rank, tma.address, list(tma.dims[:2]), tma.strides[0], list(tma.box[:2])) == \
        (6, 2, y.data_ptr(), [72, 100], 144, [32, 64])
    assert (list(tma.elem_strides[:2]), tma.interleave, tma.swizzle, tma.l2, tma.fill, tma.aligned) == \
        ([1, 1], 0, 3, 2, 0, 1)
    # the ctypes path encoded two maps, the C launcher two (its first call), then reused them
    assert tma.calls == 4


def test_tensor_maps_are_remembered_per_address_shape_and_padding(rt, fake, tma, tmp_path) -> None:
    """The C launcher encodes a tensor map once per (address, shape, strides, padding) among the last eight it
    encoded: calls that reuse their buffers (torch's caching allocator) skip the driver; another tensor, another
    shape or NaN padding encode again."""
    k = _scale2d(rt, tmp_path, tma_meta=True)
    desc = rt.descriptors.TensorDescriptor
    fake.block_size, fake.nparams = 376, 15
    y = _matrix()
    yd = desc(y, [100, 72], [72, 1], [64, 32])
    xs = [_matrix() for _ in range(10)]
    for x in xs[:2]:
        k[(1,)](desc(x, [100, 72], [72, 1], [64, 32]), yd, 100, 72, 1.0)
    first = tma.calls
    assert first == 3  # x0, y, x1 (the first call resolved on the Python path, launched by the C launcher)
    for x in xs[:2] * 3:
        k[(1,)](desc(x, [100, 72], [72, 1], [64, 32]), yd, 100, 72, 1.0)
    assert tma.calls == first  # remembered: new descriptor objects, same memory
    k[(1,)](desc(xs[0], [50, 72], [72, 1], [64, 32]), yd, 100, 72, 1.0)
    k[(1,)](desc(xs[0], [100, 72], [72, 1], [64, 32], padding="nan"), yd, 100, 72, 1.0)
    assert tma.calls == first + 2 and tma.fill == 1
    for x in xs:  # more tensors than the memory holds: the oldest are encoded again
        k[(1,)](desc(x, [100, 72], [72, 1], [64, 32]), yd, 100, 72, 1.0)
    assert tma.calls == first + 2 + 8


def test_descriptors_without_tma_lay_out_pointer_shape_and_strides(rt, fake, tma, tmp_path) -> None:
    """A binary compiled without TMA (sm_80) takes each descriptor as its base pointer, shape and strides (i64),
    the NaN-padding flag, then the shape (i32) and strides (i64) again: same bytes on both paths, no map encoded."""
    k = _scale2d(rt, tmp_path, tma_meta=False)
    x = _matrix()
    y = _matrix()
    desc = rt.descriptors.TensorDescriptor
    xd, yd = desc(x, [100, 72], [72, 1], [64, 32], padding="nan"), desc(y, [100, 72], [72, 1], [64, 32])
    codes = [*rt.descriptors.param_codes(2, False) * 2, "i", "i", "f", "Q", "Q"]
    offsets, size = rt.packing.block_layout(codes)
    fake.block_size, fake.nparams = size, len(offsets)
    records, fallbacks = _launch_both(rt, fake, k, (1,), (xd, yd, 100, 72, 2.0))
    assert records[0] == records[1] == records[2] and fallbacks == 1 and tma.calls == 0
    params = records[0][6]
    assert records[0][7] == tuple(offsets) and offsets[:12] == [0, 8, 16, 24, 32, 40, 44, 48, 56, 64, 72, 80]
    assert struct.unpack_from("<Qqqqqb", params, 0) == (x.data_ptr(), 100, 72, 72, 1, 1)
    assert struct.unpack_from("<ii", params, 44) == (100, 72) and struct.unpack_from("<qq", params, 56) == (72, 1)
    assert struct.unpack_from("<Qqqqqb", params, 72) == (y.data_ptr(), 100, 72, 72, 1, 0)


COPY2D = [["src", "*T"], ["dst", "*T"], ["M", "i32"], ["N", "i32"], ["BM", "meta"], ["BN", "meta"]]


def test_a_pointer_parameter_passed_a_descriptor(rt, fake, tma, tmp_path) -> None:
    """The Triton tutorial's attention passes host descriptors to pointer parameters on Hopper (specialization code
    T, its own binary) and tensors elsewhere: both forms launch from C, each with its binary, the descriptor's
    tensor map where the other call passes an address."""
    blocks = {"src": [16, 32]}
    k = _desc_kernel(rt, tmp_path, "copy2d", COPY2D, {
        "TDxx": {"descs": blocks, "tensordesc_meta": {"src": _meta([16, 32])}}, "DDxx": {}, "xxxx": {}},
        meta={"BM": 16, "BN": 32}, spec_params=["src", "dst", "M", "N"], type_arg="src")
    x = _matrix()
    out = _matrix()
    desc = rt.descriptors.TensorDescriptor(x, [100, 72], [72, 1], [16, 32])
    fake.block_size, fake.nparams = 184, 10
    records, fallbacks = _launch_both(rt, fake, k, (4,), (desc, out, 100, 72))
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert records[0][7] == (0, 128, 132, 136, 144, 152, 160, 164, 168, 176)
    assert struct.unpack_from("<iiqqQii", records[0][6], 128) == (100, 72, 72, 1, out.data_ptr(), 100, 72)
    assert k._fast.spec((desc, out, 100, 72)) == "TDxx"
    fake.block_size, fake.nparams = 40, 6
    records, fallbacks = _launch_both(rt, fake, k, (4,), (x, out, 100, 72))
    assert records[0] == records[1] == records[2] and fallbacks == 1
    assert struct.unpack_from("<QQii", records[0][6], 0) == (x.data_ptr(), out.data_ptr(), 100, 72)


def _run_python(rt, k, grid, args):
    rt.fastpath.use_c_launch(k, False)
    try:
        k[grid](*args)
    finally:
        rt.fastpath.use_c_launch(k, True)


@pytest.mark.parametrize("case", ["unbuilt block", "strides", "rank", "i32", "driver"])
def test_errors_are_the_python_paths(rt, fake, tma, tmp_path, case) -> None:
    """What a descriptor call gets wrong raises the Python path's error on the C path too, before any launch: a
    block shape (set by the pre-hook) no binary was built for, a last dimension that is not contiguous, a descriptor
    changed after it was made to another rank or to an extent beyond i32, the driver refusing the tensor map."""
    k = _scale2d(rt, tmp_path, tma_meta=True, pre_hook="blocks")
    wanted = [64, 32]
    k.pre_hooks["blocks"] = lambda nargs: [setattr(nargs[n], "block_shape", list(wanted)) for n in ("x_desc", "y_desc")]
    x = _matrix()
    y = _matrix()
    desc = rt.descriptors.TensorDescriptor
    fake.block_size, fake.nparams = 376, 15
    xd, yd = desc(x, [100, 72], [72, 1], [1, 1]), desc(y, [100, 72], [72, 1], [1, 1])
    k[(1,)](xd, yd, 100, 72, 1.0)  # the Python path resolves, the C path takes the next calls
    k[(1,)](xd, yd, 100, 72, 1.0)
    calls = fake.calls
    if case == "unbuilt block":
        wanted[:] = [128, 32]
    elif case == "strides":
        xd.strides = [72, 2]
    elif case == "rank":
        xd.shape, xd.strides = [10, 10, 72], [720, 72, 1]
    elif case == "i32":
        xd.shape = [2**31, 72]
    else:
        tma.result = 1  # CUDA_ERROR_INVALID_VALUE
        xd = desc(_on(x[1:]), [99, 72], [72, 1], [1, 1])
    errors = []
    for python in (False, True):
        with pytest.raises(Exception) as info:
            (_run_python(rt, k, (1,), (xd, yd, 100, 72, 1.0)) if python else k[(1,)](xd, yd, 100, 72, 1.0))
        errors.append((type(info.value).__name__, str(info.value)))
    assert errors[0] == errors[1] and fake.calls == calls
    expected = {"unbuilt block": "NotBuiltError", "strides": "ValueError", "rank": "ValueError", "i32": "OverflowError",
                "driver": "DriverError"}[case]
    assert errors[0][0] == expected, errors
    if case == "driver":
        assert "cuTensorMapEncodeTiled (element type 6, rank 2, address 0x" in errors[0][1]
        assert "shape [99, 72], box [64, 32], swizzle 3)" in errors[0][1]


def test_an_init_to_zero_pre_hook_runs_before_each_c_launch(rt, fake, tmp_path) -> None:
    """Split-K matmuls zero their output in a config pre-hook (``init_to_zero("C")``): on the C path too the hook
    runs once per call, with the call's own tensors by name, before that call's launch."""
    k = _kernel_with_hook(rt, tmp_path)
    zeroed = []

    def init_to_zero(nargs):
        nargs["out_ptr"].zero_()
        zeroed.append((nargs["out_ptr"].data_ptr(), fake.calls))

    k.pre_hooks["zero"] = init_to_zero
    outs = [_tensor(0) for _ in range(3)]
    x = _tensor(0)
    for o in outs:
        o.fill_(7)
        k[(1,)](x, x, o, 64)
    assert [p for p, _ in zeroed] == [o.data_ptr() for o in outs] and all(float(o.abs().sum()) == 0 for o in outs)
    assert [c for _, c in zeroed] == [zeroed[0][1] + i for i in range(3)] and k._fast.size() == 1


def _kernel_with_hook(rt, root):
    from tests.test_c_launch import ADD

    spec = cs.kernel_spec(root, "zeroing", ADD, dtypes={"T": ["fp16"]}, specs=["DDDD", "xxxx"], pre_hook="zero")
    return rt.Kernel("zeroing", spec, cs.TARGETS, rt.BinaryBackend(str(root)))


def test_a_pre_hook_that_gives_an_argument_new_storage(rt, fake, tmp_path) -> None:
    """``Kernel.run`` reads the pointers after the pre-hook: a hook that points an argument at other memory
    (``set_``) launches with the new address on the C path too, and where the new address changes the
    specialization (misaligned) the Python path launches that call with its own binary."""
    k = _kernel_with_hook(rt, tmp_path)
    fake.block_size, fake.nparams = 40, 5
    x, o = _tensor(0), _tensor(0)
    targets = [_tensor(0), _tensor(0), _tensor(0, offset_bytes=2)]
    swap = {"to": targets[0]}
    k.pre_hooks["zero"] = lambda nargs: nargs["out_ptr"].set_(swap["to"])
    for target in targets:
        swap["to"] = target
        rt.fastpath.use_c_launch(k, False)
        k[(1,)](x, x, o, 64)
        python = fake.launch_record()
        rt.fastpath.use_c_launch(k, True)
        for _ in range(3):  # the first resolves on the Python path, the others take the C path
            k[(1,)](x, x, o, 64)
            assert fake.launch_record() == python
        assert struct.unpack_from("<Q", python[6], 16)[0] == target.data_ptr()


@pytest.mark.parametrize("kind", ["plain", "heuristics", "pre-hook", "descriptors"])
def test_kernels_the_c_path_served_are_collected(rt, fake, tma, tmp_path, kind) -> None:
    """A kernel handle the C path has served is garbage once nothing else holds it: its FastKernel and KernelBase
    take part in garbage collection, so the cycles a package makes (a heuristic or pre-hook whose module globals
    hold the handle) are collected."""
    import gc
    import weakref

    from tests.test_c_launch import ADD, _heuristics_kernel

    x = _tensor(0)
    if kind == "descriptors":
        k = _scale2d(rt, tmp_path, tma_meta=True)
        m = _matrix()
        desc = rt.descriptors.TensorDescriptor

        def call(k):
            k[(1,)](desc(m, [100, 72], [72, 1], [64, 32]), desc(m, [100, 72], [72, 1], [64, 32]), 100, 72, 1.0)
    else:
        if kind == "heuristics":
            k, seen = _heuristics_kernel(rt, fake, tmp_path, "collected")
            seen.append(k)  # the heuristics' closure now holds the handle, as module globals do
        elif kind == "pre-hook":
            k = _kernel_with_hook(rt, tmp_path)
            k.pre_hooks["zero"] = lambda nargs, k=k: None
        else:
            k = rt.Kernel("plain", cs.kernel_spec(tmp_path, "plain", ADD, specs=["DDDD"]), cs.TARGETS,
                          rt.BinaryBackend(str(tmp_path)))

        def call(k):
            k[(1,)](x, x, x, 64)
    for _ in range(3):
        call(k)
    assert k._fast is not None and k._fast.size() == 1
    ref = weakref.ref(k)
    del k, call
    if kind == "heuristics":
        del seen
    gc.collect()
    assert ref() is None
