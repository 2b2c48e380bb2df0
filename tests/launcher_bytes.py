"""What the C launcher hands the driver, for comparing one architecture's extension with another's.

Run as a script by any CPython >= 3.9, with neither torch nor pytest (``tests/test_wheel_platforms.py`` runs it
natively and under ``qemu-aarch64`` on an aarch64 CPython):

    python launcher_bytes.py DIR_WITH_FASTLAUNCH LIBFAKECUDA

It loads ``_fastlaunch.abi3.so`` from the directory, makes ``Launcher``s over the fake driver
(``fixtures/fake_cuda/fake_cuda.c``, compiled for the same architecture) for every argument kind the C path packs,
launches them with edge values (fp16/bf16 rounding, integer extremes, a pointer above 2**47), and prints, as JSON,
what each launch gave the driver (grid, block, shared memory, stream, context, parameter block and offsets), each
value the C path leaves to the Python path, and the driver error the check callback heard.
"""

from __future__ import annotations

import ctypes
import json
import sys

# (kind name, C kind number as runtime/fastpath.py numbers them, size in bytes, values)
KINDS = [
    ("ptr", 0, 8, [0x7F00_1234_5670, 0, 2**63 + 16]),
    ("i1", 1, 1, [0, 1, True, -128]),
    ("i16", 2, 2, [-32768, 32767, -300]),
    ("i32", 3, 4, [-(2**31), 2**31 - 1, -7]),
    ("i64", 4, 8, [-(2**63), 2**63 - 1, 2**40 + 3]),
    ("u8", 5, 1, [0, 255]),
    ("u16", 6, 2, [65535, 1]),
    ("u32", 7, 4, [2**32 - 1, 0]),
    ("u64", 8, 8, [2**64 - 1, 2**63]),
    ("fp16", 9, 2, [1.5, 0.1, -65504.0, 65519.0, 6e-8, 1e-9, 3, float("inf"), -0.0]),
    ("bf16", 10, 2, [1.5, 0.1, 3.0e38, -1.0e-40, 7, float("-inf"), 1.00390625, 1.01171875]),
    ("fp32", 11, 4, [1 / 3, -2.5e-39, 3.4028235e38, 1e-46, 5]),
    ("fp64", 12, 8, [3.141592653589793, -1e-310, 2**60 + 1]),
]
OUT_OF_RANGE = [("i16", 2, 2, 32768), ("i32", 3, 4, 2**31), ("u8", 5, 1, -1), ("i64", 4, 8, 2**63),
                ("fp16", 9, 2, "not a number"), ("fp32", 11, 4, 1e39)]


class FakeState(ctypes.Structure):
    """``struct fake_state`` of fixtures/fake_cuda/fake_cuda.c (the C launch path tests read it too)."""

    _fields_ = [("calls", ctypes.c_int), ("function", ctypes.c_void_p), ("grid", ctypes.c_uint * 3),
                ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("ctx_at_launch", ctypes.c_void_p), ("nparams", ctypes.c_int), ("block_size", ctypes.c_int),
                ("offsets", ctypes.c_longlong * 80), ("params", ctypes.c_ubyte * 4096), ("current", ctypes.c_void_p),
                ("pushes", ctypes.c_int), ("pops", ctypes.c_int), ("depth", ctypes.c_int),
                ("stack", ctypes.c_void_p * 16), ("launch_result", ctypes.c_int), ("push_result", ctypes.c_int),
                ("pop_result", ctypes.c_int), ("loads", ctypes.c_int), ("recorded", ctypes.c_int)]

    def launch_record(self) -> tuple:
        """Everything the last launch received (set ``block_size = -1`` first to have the whole parameter block
        copied, however long)."""
        size = self.recorded if self.block_size < 0 else self.block_size
        return (self.function, tuple(self.grid), tuple(self.block), self.shared, self.stream, self.ctx_at_launch,
                bytes(self.params[:size]), tuple(self.offsets[: self.nparams]))


class FakeLaunchEx(ctypes.Structure):
    """``struct fake_ex_state`` of fixtures/fake_cuda/fake_cuda.c: the launch attributes of the last
    ``cuLaunchKernelEx`` (``launch_pdl=``, ``launch_cooperative_grid=``) and how many such launches there were."""

    _fields_ = [("calls", ctypes.c_int), ("n_attrs", ctypes.c_int), ("ids", ctypes.c_int * 4),
                ("values", ctypes.c_int * 4)]

    def attributes(self) -> list[tuple[int, int]]:
        """(id, value) of each attribute the last ``cuLaunchKernelEx`` received."""
        return [(self.ids[i], self.values[i]) for i in range(self.n_attrs)]


FAKE_BASE, FAKE_SPAN = 0x7F0000000000, 0x100000 * 4096
"""Where ``renumber_addresses`` puts the addresses launches see."""


def renumber_addresses(torch: object) -> dict[int, int]:
    """In a fake-driver child process: ``Tensor.data_ptr`` answers each tensor's address renumbered in order of first
    use (its alignment mod 64 kept), so two runs of the same calls pass the same parameter bytes. Returns the map
    (real → seen): clear it before each call that is compared."""
    real = torch.Tensor.data_ptr  # type: ignore[attr-defined]
    seen: dict[int, int] = {}

    def data_ptr(self: object) -> int:
        p = real(self)
        return seen.setdefault(p, FAKE_BASE + 0x100000 * len(seen) + p % 64)

    torch.Tensor.data_ptr = data_ptr  # type: ignore[attr-defined]
    return seen


def canonical_block(block: bytes, offsets: tuple[int, ...]) -> str:
    """A launch's parameter block (hex) with the renumbered addresses it holds numbered again in their order in the
    block: two paths that first use the same tensors in another order compare equal, which argument is which
    tensor and each address's alignment still compared."""
    out, order = bytearray(block), {}
    for o in offsets:
        v = int.from_bytes(out[o:o + 8], "little") if o % 8 == 0 and o + 8 <= len(out) else 0
        if FAKE_BASE <= v < FAKE_BASE + FAKE_SPAN:
            v = FAKE_BASE + 0x100000 * order.setdefault(v - v % 64, len(order)) + v % 64
            out[o:o + 8] = v.to_bytes(8, "little")
    return out.hex()


def main(ext_dir: str, libfake: str) -> dict:
    sys.path.insert(0, ext_dir)
    import _fastlaunch  # type: ignore[import-not-found]

    lib = ctypes.CDLL(libfake)
    fake = FakeState.in_dll(lib, "fake")
    address = {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
               for name in ("cuLaunchKernel", "cuCtxGetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2")}
    heard: list = []

    def launcher(kinds: list[tuple[int, int]]) -> tuple:
        offsets, at = [], 0
        for _, size in kinds:
            at = (at + size - 1) // size * size
            offsets.append(at)
            at += size
        offsets += [(at + 7) // 8 * 8, (at + 7) // 8 * 8 + 8]  # the two scratch pointers' slots
        size = offsets[-1] + 8
        made = _fastlaunch.Launcher(
            0xF00D, 0xC000, 128, 1024, tuple(range(len(kinds))), bytes(k for k, _ in kinds), tuple(offsets), size,
            0, 0, None, lambda device: 0x5EA0 + device, 3, lambda code, what: heard.append([code, what]), "probe",
            address["cuLaunchKernel"], address["cuCtxGetCurrent"], address["cuCtxPushCurrent_v2"],
            address["cuCtxPopCurrent_v2"])
        return made, size, len(offsets)

    def record() -> dict:
        return {"grid": list(fake.grid), "block": list(fake.block), "shared": fake.shared, "stream": fake.stream,
                "ctx": fake.ctx_at_launch, "params": bytes(fake.params[: fake.block_size]).hex(),
                "offsets": list(fake.offsets[: fake.nparams]), "pushes": fake.pushes, "pops": fake.pops}

    out: dict = {"launches": {}, "left_to_python": {}, "errors": []}
    fake.current = 0xC000
    for name, kind, size, values in KINDS:
        made, block_size, n_params = launcher([(kind, size)] * len(values) + [(3, 4)])
        fake.block_size, fake.nparams = block_size, n_params
        made((7, 2, 1), [*values, 42])
        out["launches"][name] = record()
    for name, kind, size, value in OUT_OF_RANGE:
        made, _, _ = launcher([(kind, size)])
        try:
            made((1,), [value])
            out["left_to_python"][name] = "launched"
        except (ValueError, TypeError) as exc:
            out["left_to_python"][name] = f"{type(exc).__name__}: {exc}"
    # Under another context the launch pushes ours and pops it; a failing launch reaches the check callback.
    made, block_size, n_params = launcher([(4, 8)])
    fake.block_size, fake.nparams, fake.current = block_size, n_params, 0xD000
    made((3, 1, 1), [-1])
    out["launches"]["pushed"] = record()
    fake.launch_result = 700
    made((1,), [5])
    out["errors"] = heard
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2]), sort_keys=True))
