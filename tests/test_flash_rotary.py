"""flash-attn's Triton rotary embedding as flash-attn writes it (tests/fixtures/realworld/flashattnlike/: its
ops/triton/rotary.py and the autograd Function of layers/rotary.py, both named rotary.py like the repository's own
kernels/rotary.py). ``SEQLEN_OFFSETS`` "could be int or a pointer": an int offset for a chunk of a sequence, a
per-sequence tensor of offsets when decoding with a KV cache, the constexpr ``IS_SEQLEN_OFFSETS_TENSOR`` saying
which. Triton's JIT types each call's value; forge-aot types the parameter ``*i32|i32`` from the traced calls and
builds binaries taking an integer there (specialization codes ``i``, ``d``, ``o``) beside those taking a tensor.

CPU: the inferred type, the codes per variant, the compile jobs' signatures, the module names of the three
rotary.py files, the manifest's check of such a type. GPU: against a float64 reference and the file under Triton's
JIT (forward, conjugate, interleaved, partial rotary, in place, packed sequences, int and tensor offsets, offsets
the examples never passed, misaligned inputs), the autograd Function's backward, the binaries calls take (and the
C path serving int offsets), an int64 offsets tensor refused naming the parameter."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, assert_manifest_errors, import_fixture_file, relative_error, torch_dtype

MODULE = "forge_realworld._ops.triton_rotary"


def test_seqlen_offsets_is_typed_pointer_or_integer(realworld_plan) -> None:
    from forge_aot.plan import job_for

    kp = realworld_plan.kernels["flash_rotary"]
    params = dict(kp.params)
    assert params["SEQLEN_OFFSETS"] == "*i32" and kp.pointer_ints == {"SEQLEN_OFFSETS": "i32"}
    assert kp.inferred["SEQLEN_OFFSETS"] == "*i32|i32"
    assert realworld_plan.modules["triton_rotary"]["kernels"] == ["rotary_kernel"]
    assert kp.spec_json()["pointer_ints"] == {"SEQLEN_OFFSETS": "i32"}
    at = kp.spec_params.index("SEQLEN_OFFSETS")
    seen: dict[bool, set[str]] = {False: set(), True: set()}
    for e in realworld_plan.entries:
        if e.kernel != "flash_rotary":
            continue
        tensor = e.assignment["IS_SEQLEN_OFFSETS_TENSOR"]
        for rows in e.tables.values():
            for row in rows:
                built = realworld_plan.binaries_for(e, row.key, row.preferences[0])
                specs = {(b.spec, b.heur) for b in built}
                for b in built:  # an offset varies call by call: one assumed 0 has a sibling for any, all else kept
                    if b.spec[at] in "do":
                        assert (b.spec[:at] + "i" + b.spec[at + 1:], b.heur) in specs, b.spec
                for b in built:
                    code = b.spec[at]
                    seen[tensor].add(code)
                    job = job_for(realworld_plan, e, row.preferences[0], b)
                    i = [n for n, _ in kp.params].index("SEQLEN_OFFSETS")
                    assert job.signature["SEQLEN_OFFSETS"] == ("*i32" if code in "xD" else "i32"), code
                    assert (i in job.divisible) == (code in "Dd"), code
    # tensors where the constexpr says so (aligned or not), integers elsewhere: 0 and 7 in the examples
    assert seen[True] == {"D", "x"} and seen[False] == {"d", "i"}


def test_three_files_named_rotary_get_their_own_modules(realworld_plan) -> None:
    mods = realworld_plan.modules
    assert {"kernels_rotary", "triton_rotary", "layers_rotary"} <= set(mods) and "rotary" not in mods
    assert mods["layers_rotary"]["exports"] == ["ApplyRotaryEmb", "apply_rotary_emb"]
    assert mods["kernels_rotary"]["path"].endswith("kernels/rotary.py")
    assert mods["triton_rotary"]["path"].endswith("flashattnlike/ops/triton/rotary.py")


def test_a_pointer_or_integer_type_is_checked(tmp_path) -> None:
    (tmp_path / "k.py").write_text("")
    head = '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n[kernels.k]\nsource = "k.py:k"\n'
    message = "a parameter that takes a pointer or an integer is typed '*T|i32'"
    assert_manifest_errors(tmp_path, head, [
        ('signature = { X = "*fp16|fp32" }\n', "kernels.k.signature.X", message),
        ('signature = { X = "i32|i32" }\n', "kernels.k.signature.X", message),
        ('signature = { X = "*fp16|" }\n', "kernels.k.signature.X", message),
        ('signature = { X = "*fp15|i32" }\n', "kernels.k.signature.X", "unknown type '*fp15'"),
    ])


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "flashattnlike" / "layers" / "rotary.py", "_flash_rotary_layers_jit")


def _reference(x, cos, sin, offsets, cu_seqlens, interleaved, conjugate):
    """float64: each row at position t of its sequence rotated by the angle at t + its offset."""
    import torch

    out = x.double().clone()
    half = cos.shape[1]
    c64, s64 = cos.double(), -sin.double() if conjugate else sin.double()
    if cu_seqlens is None:
        seqs = [(b, x[b]) for b in range(x.shape[0])]
        views = [out[b] for b in range(x.shape[0])]
    else:
        bounds = cu_seqlens.tolist()
        seqs = [(b, x[bounds[b]:bounds[b + 1]]) for b in range(len(bounds) - 1)]
        views = [out[bounds[b]:bounds[b + 1]] for b in range(len(bounds) - 1)]
    for (b, seq), view in zip(seqs, views):
        off = int(offsets[b]) if hasattr(offsets, "shape") else offsets
        pos = torch.arange(seq.shape[0], device=x.device) + off
        c, s = c64[pos][:, None, :], s64[pos][:, None, :]
        s64_x = seq.double()
        x1, x2 = (s64_x[..., 0:2 * half:2], s64_x[..., 1:2 * half:2]) if interleaved else \
            (s64_x[..., :half], s64_x[..., half:2 * half])
        o1, o2 = x1 * c - x2 * s, x1 * s + x2 * c
        if interleaved:
            view[..., 0:2 * half:2], view[..., 1:2 * half:2] = o1, o2
        else:
            view[..., :half], view[..., half:2 * half] = o1, o2
    return out


TOLERANCE = {"fp32": 1e-6, "fp16": 2e-3, "bf16": 1e-2}

CASES = [
    # (name, batch, seqlen, nheads, headdim, rotary_dim, offsets, varlen, interleaved): each a variant the examples
    # built (block sizes, flags), at lengths, offsets and head sizes they did not use
    ("train", 2, 999, 8, 128, 128, 0, False, False),
    ("int-offset-5", 3, 77, 4, 128, 128, 5, False, False),
    ("int-offset-1", 2, 33, 4, 128, 128, 1, False, False),
    ("int-offset-48-interleaved-partial", 2, 300, 6, 128, 32, 48, False, True),
    ("int-offset-7-interleaved-partial", 2, 45, 3, 64, 32, 7, False, True),
    ("tensor-offsets-decode", 8, 1, 32, 128, 128, "tensor", False, False),
    ("tensor-offsets-prefill", 3, 40, 4, 128, 128, "tensor", False, False),
    ("varlen", None, None, 8, 64, 64, 0, True, False),
    ("varlen-int-offset-3-partial", None, None, 4, 96, 64, 3, True, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("conjugate", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("misaligned", [False, True])
def test_against_float64_and_the_jit(realworld, jit, dtype, case, conjugate, inplace, misaligned) -> None:
    import torch
    from forge_realworld._ops.triton_rotary import apply_rotary

    from tests.conftest import offset_view, poison_allocator

    name, batch, seqlen, nheads, headdim, rotary_dim, offsets, varlen, interleaved = case
    torch.manual_seed(hash(name) % 1000)
    dt = torch_dtype(dtype)
    cu = max_seqlen = None
    if varlen:
        cu = torch.tensor([0, 1, 130, 131, 600], device="cuda", dtype=torch.int32)
        max_seqlen = 469
        x = torch.randn(600, nheads, headdim, device="cuda", dtype=dt)
        batch = 4
    else:
        x = torch.randn(batch, seqlen, nheads, headdim, device="cuda", dtype=dt)
    seqlen_ro = 2048
    cos, sin = (torch.randn(seqlen_ro, rotary_dim // 2, device="cuda", dtype=dt) for _ in range(2))
    if offsets == "tensor":
        offsets = torch.randint(0, seqlen_ro - (seqlen or max_seqlen), (batch,), device="cuda", dtype=torch.int32)
    if misaligned:
        x = offset_view(x)
    ref = _reference(x, cos, sin, offsets, cu, interleaved, conjugate)
    results = []
    for fn in (apply_rotary, jit.apply_rotary):
        xi = x.clone() if inplace else x
        poison_allocator(x.numel() * x.element_size())
        out = fn(xi, cos, sin, seqlen_offsets=offsets, cu_seqlens=cu, max_seqlen=max_seqlen, interleaved=interleaved,
                 inplace=inplace, conjugate=conjugate)
        assert (out is xi) == inplace
        results.append(out)
    assert relative_error(results[0], ref) < TOLERANCE[dtype], name
    if misaligned and dtype == "fp32":
        # a binary specialized less than the one Triton compiles for this very call (the package does not build
        # every specialization): its fp32 results may differ in rounding (fp16 and bf16 outputs round it away)
        assert relative_error(results[0], results[1].double()) < 1e-6, name
    else:
        assert torch.equal(results[0], results[1]), name


@pytest.mark.gpu
@pytest.mark.parametrize("offsets", [0, 7, 1, "tensor"])
def test_the_autograd_function_trains_as_under_the_jit(realworld, jit, offsets) -> None:
    """flash-attn's ApplyRotaryEmb, exported as it is: the backward applies the conjugate rotation through the same
    op (an int offset saved on ctx, a tensor one with save_for_backward)."""
    import torch

    torch.manual_seed(3)
    x = torch.randn(2, 64, 4, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = (torch.randn(256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dy = torch.randn_like(x)
    if offsets == "tensor":
        offsets = torch.tensor([3, 100], device="cuda", dtype=torch.int32)
    grads = []
    for fn in (realworld.apply_rotary_emb, jit.apply_rotary_emb):
        xi = x.detach().clone().requires_grad_()
        y = fn(xi, cos, sin, seqlen_offsets=offsets)
        y.backward(dy)
        grads.append((y.detach(), xi.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    # the backward of a rotation is the rotation back: dx is dy rotated by the conjugate
    ref = _reference(dy, cos, sin, offsets, None, False, True)
    assert relative_error(grads[0][1], ref) < TOLERANCE["bf16"]
    assert realworld.ApplyRotaryEmb.__name__ == "ApplyRotaryEmb"


@pytest.mark.gpu
def test_int_and_tensor_offsets_take_their_binaries_and_the_c_path(realworld) -> None:
    import torch
    from forge_realworld._ops.triton_rotary import apply_rotary

    from tests.conftest import launched_specs, reset_handle

    x = torch.randn(2, 64, 4, 128, device="cuda", dtype=torch.float16)
    cos, sin = (torch.randn(256, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    handle = __import__(MODULE, fromlist=["rotary_kernel"]).rotary_kernel
    at = handle.spec_slots.index(next(s for s in handle.spec_slots if handle.runtime_names[s[0]] == "SEQLEN_OFFSETS"))
    for offsets, codes in ((0, {"d"}), (32, {"d"}), (7, {"i"}), (1, {"i"}),
                           (torch.tensor([3, 9], device="cuda", dtype=torch.int32), {"D"})):
        reset_handle(MODULE, "rotary_kernel")
        for _ in range(3):  # the first call resolves (Python path) and registers; the next two take the C path
            apply_rotary(x, cos, sin, seqlen_offsets=offsets)
        assert {s[at] for s in launched_specs(MODULE, "rotary_kernel")} == codes, offsets
        if handle._fast is not None:
            assert handle._fast.size() >= 1, offsets


@pytest.mark.gpu
def test_an_int64_offsets_tensor_is_refused_naming_the_parameter(realworld) -> None:
    import torch
    from forge_realworld._ops.triton_rotary import apply_rotary
    from forge_realworld._runtime.errors import UnsupportedDtypeError

    x = torch.randn(2, 1, 4, 128, device="cuda", dtype=torch.float16)
    cos, sin = (torch.randn(256, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    offsets = torch.tensor([3, 9], device="cuda", dtype=torch.int64)
    with pytest.raises(UnsupportedDtypeError, match="'SEQLEN_OFFSETS' is i64, and its binaries take i32"):
        apply_rotary(x, cos, sin, seqlen_offsets=offsets)
