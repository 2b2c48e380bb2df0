"""The Triton 3.6 tutorial's fused attention forward (tests/fixtures/realworld/kernels/attention_tutorial.py): pointer
parameters that take a host-side TensorDescriptor or a tensor, as the host decides per device and per call, and a
kernel that builds the descriptor itself when given a pointer (``_maybe_make_tensor_desc``). Its kernel is named
``_attn_fwd`` like the block-pointer attention's in another file of the same project.
"""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD

torch = pytest.importorskip("torch")

DESCS = ("desc_q", "desc_k", "desc_v", "desc_o")


def test_pointer_parameters_passed_descriptors_are_specialized_as_descriptors(realworld_plan) -> None:
    """Hopper (without warp specialization, the only build there): the four parameters are descriptors (code T),
    with the block shapes the config's pre-hook sets; sm_80's host code passes tensors: pointer binaries."""
    from forge_aot.plan import job_for

    plan = realworld_plan
    kp = plan.kernels["attention_tutorial"]
    slots = [kp.spec_params.index(n) for n in DESCS]
    entries = [e for e in plan.entries if e.kernel == "attention_tutorial"]
    seen = set()
    for e in entries:
        host_descs = e.target == "sm_90" and not e.assignment["warp_specialize"]
        seen.add((e.target, e.assignment["warp_specialize"]))
        for row in e.tables["default"]:
            config = row.preferences[0]
            bm, bn, d = config.meta["BLOCK_M"], config.meta["BLOCK_N"], e.assignment["HEAD_DIM"]
            for b in plan.binaries_for(e, row.key, config):
                codes = {b.spec[i] for i in slots}
                if host_descs:
                    assert codes == {"T"}
                    assert b.descs == (("desc_q", (bm, d)), ("desc_k", (bn, d)), ("desc_v", (bn, d)),
                                       ("desc_o", (bm, d)))
                    sig = job_for(plan, e, config, b).signature
                    assert sig["desc_q"] == f"tensordesc<fp16[{bm}, {d}]>"
                    assert sig["desc_v"] == f"tensordesc<fp16[{bn}, {d}]>"
                else:
                    assert "T" not in codes and b.descs == ()
                    assert job_for(plan, e, config, b).signature["desc_q"] == "*fp16"
    assert seen == {("sm_80", False), ("sm_90", False)}


def test_descriptor_and_pointer_specializations_never_stand_in_for_each_other() -> None:
    from forge_aot.runtime.tables import argument_spec, spec_fits

    class Desc:
        def __init__(self) -> None:
            self.block_shape, self.base = [64, 64], None

    assert argument_spec([(0, True), (1, True), (2, True)], [Desc(), None, 4096]) == "TND"
    assert spec_fits("TND", "TND") and spec_fits("TNx", "TND")
    assert not spec_fits("xND", "TND") and not spec_fits("TND", "DND") and not spec_fits("TxD", "TND")


def test_a_binary_is_chosen_by_its_descriptors_block_shapes_whatever_their_order() -> None:
    """The index's JSON sorts a binary's ``descs`` by name; a call's block shapes compare by name too (desc_q comes
    before desc_k in the parameters, after it in the JSON)."""
    from types import SimpleNamespace

    from forge_aot.runtime.descriptors import TensorDescriptor, block_shapes
    from forge_aot.runtime.errors import NotBuiltError
    from forge_aot.runtime.tables import choose_binary

    x = torch.randn(256, 64, dtype=torch.float16)
    kernel = SimpleNamespace(function="_attn_fwd", heuristic_names=[], desc_pos=[], ptr_pos=[0, 1, 2],
                             runtime_names=["desc_q", "desc_k", "M"])
    call = [TensorDescriptor.from_tensor(x, [128, 64]), TensorDescriptor.from_tensor(x, [64, 64]), x]
    descs = block_shapes(kernel, call)
    assert descs == (("desc_k", (64, 64)), ("desc_q", (128, 64)))
    binaries = {"a": {"spec": "TTD", "descs": {"desc_k": [64, 64], "desc_q": [64, 64]}},
                "b": {"spec": "TTD", "descs": {"desc_k": [64, 64], "desc_q": [128, 64]}}}
    assert choose_binary(kernel, binaries, (), "TTD", descs) is binaries["b"]
    with pytest.raises(NotBuiltError, match="block shapes"):
        choose_binary(kernel, {"a": binaries["a"]}, (), "TTD", descs)


def test_kernels_of_the_same_name_in_two_files_each_bind_their_own(realworld_plan) -> None:
    """flash_attention.py and attention_tutorial.py both define ``_attn_fwd``: each host module's name is bound to
    its own kernel entry (before, the later entry's spec was bound in both)."""
    from forge_aot import runtime as rt
    from forge_aot.index import build_index

    plan = realworld_plan
    index = build_index(plan, None, "jit", {m: str(spec["path"]) for m, spec in plan.modules.items()})
    assert {index["kernels"][n]["function"] for n in ("attention", "attention_tutorial")} == {"_attn_fwd"}
    for mod, entry in (("flash_attention", "attention"), ("attention_tutorial", "attention_tutorial")):
        spec = plan.modules[mod]
        module = rt.bind_module(f"_forge_test_same_name_{mod}", index, mod, None, rt.Kernel,
                                (spec["path"], spec["host_source"]))
        assert module._attn_fwd.name == entry
        assert module._attn_fwd.spec["module"] == mod


@pytest.fixture(scope="module")
def jit():
    from forge_aot.dev import load_dev_ops

    return load_dev_ops(REALWORLD / "kernel_manifest.toml")


def _launched_specs(kernel) -> set[str]:
    return {key[2] for state in kernel._states.values() for key in state.launchers}


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("warp_specialize", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 1024, 64), (1, 2, 128, 64), (3, 5, 384, 64)])
def test_tutorial_attention_against_torch_and_the_jit(realworld, jit, causal, warp_specialize, shape) -> None:
    import forge_realworld._ops.attention_tutorial as host

    from tests.conftest import reset_handle

    reset_handle("forge_realworld._ops.attention_tutorial", "_attn_fwd")
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.float16) for _ in range(3))
    if warp_specialize:  # not built (see the fixture's examples): refused before launching
        from forge_realworld._runtime.errors import NotBuiltError

        with pytest.raises(NotBuiltError, match="warp_specialize"):
            realworld.tutorial_attention(q, k, v, causal, 0.5, warp_specialize)
        return
    out = realworld.tutorial_attention(q, k, v, causal, 0.5, warp_specialize)
    ref = _reference(q, k, v, causal, 0.5)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)
    # the same config's binary under Triton's JIT (development mode): bit for bit
    assert torch.equal(out, jit["tutorial_attention"](q, k, v, causal, 0.5, warp_specialize))
    specs = _launched_specs(host._attn_fwd)
    # on the H100 the host passes descriptors (without warp specialization): the binary took them as descriptors
    assert specs and all(s[3:7] == "TTTT" for s in specs)  # spec slots: M, Z, H, desc_q..desc_o, N_CTX


def _reference(q, k, v, causal, sm_scale):
    p = torch.matmul(q.double(), k.double().transpose(2, 3)) * sm_scale
    if causal:
        n = q.shape[2]
        p = p.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device)), float("-inf"))
    return torch.matmul(torch.softmax(p, dim=-1), v.double()).float()
