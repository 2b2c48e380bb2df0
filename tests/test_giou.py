"""The GIoU loss of a Towards Data Science post (tests/fixtures/realworld/kernels/giou.py), packaged unchanged:
``BLOCK_SIZE`` set from the sample's box count at the call, a ``torch.bool`` output, two dtype variables (bf16
predictions against fp32 targets, as autocast leaves them), ``torch.empty_strided`` and torch reductions after the
launch.

CPU: the plan builds the traced (T, U, BLOCK_SIZE) variants only, each aligned and unaligned, and a real sm_90
compile of the mixed-dtype binary takes the bool output as ``*i1``. GPU: the loss against an fp64 torch reference
and bit for bit against the file under Triton's JIT, with padding boxes, odd batch sizes and unaligned inputs;
torch.compile(fullgraph=True) over the post's training-step shape of the call; box counts and dtype pairs that were
not built are named before any launch."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, offset_view, poison_allocator

PAIRS = [("bf16", "fp32"), ("fp32", "fp32"), ("bf16", "bf16")]
"""(predictions, targets) dtypes the fixture's examples trace."""
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}
"""Relative error of the loss against fp64, by the predictions' dtype (the kernel computes in it)."""


def test_only_the_traced_dtype_pairs_and_box_counts_are_built(realworld_plan) -> None:
    built = set()
    for e in realworld_plan.entries:
        if e.kernel == "giou" and e.target == "sm_90":
            built.add((e.assignment["T"], e.assignment["U"], e.assignment["BLOCK_SIZE"]))
    assert built == {(t, u, n) for t, u in PAIRS for n in (64, 128, 256)}
    specs = {b.spec for e in realworld_plan.entries if e.kernel == "giou" and e.target == "sm_90"
             for rows in e.tables.values() for row in rows
             for b in realworld_plan.binaries_for(e, row.key, row.preferences[0])}
    # every pointer 16-byte aligned (what the examples traced), and the binary that assumes nothing
    assert specs == {"DDDD", "xxxx"}, specs


def test_the_mixed_dtype_binary_compiles_for_sm_90_with_a_bool_output(realworld_plan, tmp_path) -> None:
    from forge_aot import targets
    from forge_aot._compile_worker import compile_one
    from forge_aot.plan import job_for

    (entry,) = [e for e in realworld_plan.entries if e.kernel == "giou" and e.target == "sm_90"
                and (e.assignment["T"], e.assignment["U"], e.assignment["BLOCK_SIZE"]) == ("bf16", "fp32", 128)]
    (rows,) = entry.tables.values()
    row = rows[0]
    binary = next(b for b in realworld_plan.binaries_for(entry, row.key, row.preferences[0]) if b.spec == "DDDD")
    job = job_for(realworld_plan, entry, row.preferences[0], binary)
    t = targets.TARGETS["sm_90"]
    payload = {**job.to_json(), "binary_stem": job.binary_stem, "out_dir": str(tmp_path),
               "target_info": {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size}}
    payload["source"] = str(REALWORLD / job.source)
    done = compile_one(payload)
    sidecar = done["sidecar"]
    assert sidecar["signature"] == {"preds_ptr": "*bf16", "targets_ptr": "*fp32", "output_ptr": "*bf16",
                                    "valid_ptr": "*i1", "BLOCK_SIZE": "constexpr"}, sidecar["signature"]
    cubin = (tmp_path / f"{job.binary_stem}.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF" and b"giou_kernel" in cubin


def test_a_dtype_pair_built_only_apart_is_a_dtype_error(realworld_plan) -> None:
    from forge_aot import runtime as rt
    from forge_aot.index import build_index

    index = build_index(realworld_plan, None, "jit", {m: "x.py" for m in realworld_plan.modules})
    kernel = rt.Kernel("giou", index["kernels"]["giou"], index["targets"], backend=None)
    assert kernel.find_variant(("bf16", "fp32", 128))[0] == "T=bf16,U=fp32,BLOCK_SIZE=128"
    # fp32 predictions and bf16 targets were each built, never together: a TypeError as for any unbuilt dtype
    with pytest.raises(rt.UnsupportedDtypeError, match=r"the combination T=fp32,U=bf16,BLOCK_SIZE=64 was not built"):
        kernel.find_variant(("fp32", "bf16", 64))
    with pytest.raises(rt.NotBuiltError, match=r"constexpr BLOCK_SIZE=100 was not built"):
        kernel.find_variant(("fp32", "fp32", 100))
    # a value built only with another dtype (the fused softmax's 32768-column rows: fp16 only) is a value error
    softmax = rt.Kernel("fused_softmax", index["kernels"]["fused_softmax"], index["targets"], backend=None)
    assert softmax.axes[:2] == ["T", "BLOCK_SIZE"]
    values = next(v["assign"] for v in softmax.variants.values() if v["assign"]["BLOCK_SIZE"] == 32768)
    with pytest.raises(rt.NotBuiltError, match=r"the combination T=fp32,BLOCK_SIZE=32768,.* was not built"):
        softmax.find_variant(tuple({**values, "T": "fp32"}[a] for a in softmax.axes))


# -- GPU ---------------------------------------------------------------------------------------------------------


def _reference(pred, targets):
    """The post's loss_with_padding in fp64: GIoU of each (prediction, target) pair, padding targets masked."""
    import torch

    p, g = pred.double(), targets.double()
    eps = 1e-5
    area1 = (p[..., 2] - p[..., 0]) * (p[..., 3] - p[..., 1])
    area2 = (g[..., 2] - g[..., 0]) * (g[..., 3] - g[..., 1])
    lt, rb = torch.maximum(p[..., :2], g[..., :2]), torch.minimum(p[..., 2:], g[..., 2:])
    inter = (rb - lt).clamp_min(0).prod(-1)
    union = area1 + area2 - inter
    iou = inter / union.clamp_min(eps)
    elt, erb = torch.minimum(p[..., :2], g[..., :2]), torch.maximum(p[..., 2:], g[..., 2:])
    enclose = (erb - elt).clamp_min(0).prod(-1)
    giou = iou - (enclose - union) / enclose.clamp_min(eps)
    mask = (g[..., 3] > 0).double()
    return (giou * mask).sum() / mask.sum().clamp_min(1)


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "giou.py", "_giou_jit")


def _inputs(jit, batch, n_boxes, pred_dtype, target_dtype, seed):
    import torch

    from tests.conftest import torch_dtype

    g = torch.Generator(device="cuda").manual_seed(seed)
    return (jit.random_boxes(batch, n_boxes, torch_dtype(pred_dtype), "cuda", padding=0.0, generator=g),
            jit.random_boxes(batch, n_boxes, torch_dtype(target_dtype), "cuda", padding=0.3, generator=g))


@pytest.mark.gpu
@pytest.mark.parametrize(("pred_dtype", "target_dtype"), PAIRS)
@pytest.mark.parametrize("n_boxes", [64, 128, 256])
@pytest.mark.parametrize("batch", [1, 7, 32, 333])
def test_giou_loss_against_torch_and_the_jit(realworld, jit, pred_dtype, target_dtype, n_boxes, batch) -> None:
    import torch

    pred, targets = _inputs(jit, batch, n_boxes, pred_dtype, target_dtype, seed=batch * 1000 + n_boxes)
    assert 0 < (targets[..., 3] > 0).sum() < targets[..., 3].numel()  # padding boxes among real ones
    poison_allocator(batch * n_boxes * 8)
    loss = realworld.loss_with_triton(pred, targets)
    ref = jit.loss_with_triton(pred, targets)
    torch.cuda.synchronize()
    assert loss.dtype == pred.dtype and loss.shape == ()
    expected = _reference(pred, targets)
    assert abs(loss.double() - expected) <= TOLERANCE[pred_dtype] * abs(expected), (loss.item(), expected.item())
    assert torch.equal(loss, ref)


@pytest.mark.gpu
@pytest.mark.parametrize(("pred_dtype", "target_dtype"), PAIRS)
def test_unaligned_inputs_take_the_binary_that_assumes_nothing(realworld, jit, pred_dtype, target_dtype) -> None:
    import torch

    from tests.conftest import launched_specs, reset_handle

    pred, targets = _inputs(jit, 9, 128, pred_dtype, target_dtype, seed=5)
    pred, targets = offset_view(pred, 1), offset_view(targets, 3)
    reset_handle("forge_realworld._ops.giou", "giou_kernel")
    loss = realworld.loss_with_triton(pred, targets)
    # the examples traced aligned pointers only: the binary that assumes nothing (never a wrong one)
    assert launched_specs("forge_realworld._ops.giou", "giou_kernel") == {"xxxx"}
    expected = _reference(pred, targets)
    assert abs(loss.double() - expected) <= TOLERANCE[pred_dtype] * abs(expected)
    assert torch.equal(loss, jit.loss_with_triton(pred, targets))


@pytest.mark.gpu
def test_the_posts_training_step_under_torch_compile_fullgraph(realworld, jit) -> None:
    import torch

    pred, targets = _inputs(jit, 32, 256, "bf16", "fp32", seed=11)
    eager = realworld.loss_with_triton(pred, targets)
    compiled = torch.compile(lambda p, t: realworld.loss_with_triton(p, t) * 2, fullgraph=True)
    assert torch.equal(compiled(pred, targets), eager * 2)
    assert torch.equal(torch.ops.forge_realworld.loss_with_triton(pred, targets), eager)

    class Step(torch.nn.Module):
        def forward(self, p, t):
            return realworld.loss_with_triton(p, t)

    exported = torch.export.export(Step(), (pred, targets))
    assert any("forge_realworld.loss_with_triton" in str(n.target) for n in exported.graph.nodes)
    assert torch.equal(exported.module()(pred, targets), eager)


@pytest.mark.gpu
def test_a_box_count_or_dtype_pair_that_was_not_built_is_named(realworld, jit) -> None:
    import torch

    pred, targets = _inputs(jit, 4, 100, "fp32", "fp32", seed=2)
    with pytest.raises(ValueError, match=r"BLOCK_SIZE=100 was not built"):
        realworld.loss_with_triton(pred, targets)
    pred, targets = _inputs(jit, 4, 64, "fp32", "bf16", seed=2)
    with pytest.raises(TypeError, match=r"giou_kernel\(\): the combination T=fp32,U=bf16,BLOCK_SIZE=64 was not"):
        realworld.loss_with_triton(pred, targets)
    torch.cuda.synchronize()
