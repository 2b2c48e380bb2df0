"""SGLang-style paged decode attention (tests/fixtures/realworld/kernels/decode_attention.py): index tensors read in
the kernel, a split-KV stage and a merge stage, GQA and the logit cap as keyword constexprs, ``num_warps`` from the
group size and ``num_stages=2`` at the launch, an op that writes the caller's output and scratch and returns None.

CPU: the plan's variants and the op's mutating schema (three written arguments). GPU: against fp64 attention over
the gathered pages for GQA and MHA, with and without the cap, sequence lengths the examples never traced (1, 64,
333, 2049), bit for bit against the file under Triton's JIT, the op under torch.compile(fullgraph=True), and a group
size that was not built refused before any launch."""

from __future__ import annotations

import pytest

from tests.conftest import HALF_TOL, REALWORLD, import_fixture_file, relative_error, torch_dtype


def test_call_site_constexprs_become_variants_and_the_op_writes_three_arguments(realworld_plan) -> None:
    stage1 = {e.variant for e in realworld_plan.entries if e.kernel == "decode_attention_stage1"
              and e.target == "sm_90"}
    assert len(stage1) == 8  # two dtypes x GQA (group 4, two warps) and MHA (group 1, four) x cap 0 and 30
    assert any("kv_group_num=4" in v and "num_warps=2" in v and "logit_cap=30.0" in v for v in stage1)
    assert any("kv_group_num=1" in v and "num_warps=4" in v and "logit_cap=0.0" in v for v in stage1)
    assert all("num_stages=2" in v for v in stage1)
    schema = realworld_plan.modules["decode_attention"]["schemas"]["decode_attention_fwd"]
    assert schema == ("(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor kv_indptr, Tensor kv_indices, "
                      "Tensor(b!) attn_logits, Tensor(c!) attn_lse, Tensor num_kv_splits, int max_kv_splits, "
                      "float sm_scale, float logit_cap=0.0) -> ()")


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "decode_attention.py", "_jit_decode_attention")


def _reference(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale, logit_cap):
    import torch

    batch, heads, _ = q.shape
    group = heads // k_buffer.shape[1]
    out = torch.empty(batch, heads, v_buffer.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(batch):
        idx = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
        k = k_buffer[idx].double().repeat_interleave(group, dim=1)  # (tokens, heads, dim): head h reads h // group
        v = v_buffer[idx].double().repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].double(), k) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        out[b] = torch.einsum("hn,nhd->hd", s.softmax(-1), v)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(32, 8), (16, 16)])
@pytest.mark.parametrize("logit_cap", [0.0, 30.0])
@pytest.mark.parametrize("seq_lens", [[1, 64, 333], [2049], [17, 300, 1025, 5]])
def test_decode_attention_against_fp64_and_the_jit(realworld, jit, dtype, heads, kv_heads, logit_cap,
                                                    seq_lens) -> None:
    import torch

    args = jit.make_inputs(len(seq_lens), heads, kv_heads, 128, seq_lens, torch_dtype(dtype), "cuda",
                           seed=len(seq_lens))
    q, k_buffer, v_buffer, o, kv_indptr, kv_indices, logits, lse, splits, max_splits = args
    o.fill_(float("nan"))
    logits.fill_(float("nan"))
    assert realworld.decode_attention_fwd(*args, sm_scale=128 ** -0.5, logit_cap=logit_cap) is None
    torch.cuda.synchronize()
    ref = _reference(q, k_buffer, v_buffer, kv_indptr, kv_indices, 128 ** -0.5, logit_cap)
    assert relative_error(o, ref) < 2 * HALF_TOL[dtype]
    o_jit = torch.full_like(o, float("nan"))
    jit.decode_attention_fwd(q, k_buffer, v_buffer, o_jit, kv_indptr, kv_indices, torch.empty_like(logits),
                             torch.empty_like(lse), splits, max_splits, sm_scale=128 ** -0.5, logit_cap=logit_cap)
    assert torch.equal(o, o_jit)


@pytest.mark.gpu
def test_decode_attention_compiles_fullgraph_and_refuses_a_group_size_not_built(realworld, jit) -> None:
    import torch

    args = jit.make_inputs(2, 32, 8, 128, [100, 700], torch.bfloat16, "cuda")
    q, k_buffer, v_buffer, o, kv_indptr, kv_indices, logits, lse, splits, max_splits = args
    realworld.decode_attention_fwd(*args, sm_scale=0.08)
    expected = o.clone()

    def step(q, o):
        realworld.decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, logits, lse, splits,
                                       max_splits, 0.08)
        return o * 2

    o2 = torch.full_like(o, float("nan"))
    doubled = torch.compile(step, fullgraph=True)(q, o2)
    assert torch.equal(o2, expected) and torch.equal(doubled, expected * 2)
    # 32 query heads over 16 KV heads (a group of 2) was never traced: refused, naming what was built
    bad = jit.make_inputs(1, 32, 16, 128, [64], torch.bfloat16, "cuda")
    with pytest.raises(Exception, match=r"kv_group_num=2 was not built; built values: \[1, 4\]"):
        realworld.decode_attention_fwd(*bad, sm_scale=0.08)
