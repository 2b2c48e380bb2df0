"""flash-linear-attention-style chunk-local cumulative sum (tests/fixtures/realworld/kernels/chunk_local_cumsum.py):
the kernel is tuned by FLA's own caching autotuner (an ``Autotuner`` subclass applied by ``fla_cache_autotune``
with ``**autotune_cache_kwargs``) keyed on ``IS_VARLEN``, which ``@triton.heuristics`` computes; ``scale`` is a
float passed as None when absent (``HAS_SCALE``); packed batches come as ``cu_seqlens``.

CPU: the decorator is read as an autotuner (its configs are the space), the heuristic's name leaves the key with
a note, and no binary takes ``scale=None`` with ``HAS_SCALE=True`` (such a binary does not compile: the build had
planned one and failed). GPU: against a float64 reference and the file under Triton's JIT, forward and reversed,
scaled and not, packed sequences the examples did not use, odd lengths and a misaligned input; the one combination
the examples never ran (a packed batch reversed and unscaled) is refused naming the heuristics' values."""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import REALWORLD, import_fixture_file, relative_error, torch_dtype


def test_flas_caching_autotuner_and_its_varlen_key(realworld_plan) -> None:
    kp = realworld_plan.kernels["chunk_local_cumsum"]
    assert kp.autotune is not None and [c.id for c in kp.space] == ["w1-s3", "w2-s3", "w4-s3", "w8-s3"]
    assert kp.key == ["B", "H", "BT", "REVERSE"] and kp.heuristic_names == ["HAS_SCALE", "IS_VARLEN"]
    assert any("key names IS_VARLEN, which @triton.heuristics computes" in n for n in kp.notes)
    at = {n: kp.spec_params.index(n) for n in ("scale", "cu_seqlens")}
    seen = set()
    for e in realworld_plan.entries:
        if e.kernel != "chunk_local_cumsum":
            continue
        for rows in e.tables.values():
            for row in rows:
                for b in realworld_plan.binaries_for(e, row.key, row.preferences[0]):
                    heur = dict(b.heur)
                    assert heur["HAS_SCALE"] == (b.spec[at["scale"]] != "N")
                    assert heur["IS_VARLEN"] == (b.spec[at["cu_seqlens"]] != "N")
                    seen.add((heur["HAS_SCALE"], heur["IS_VARLEN"]))
    assert seen == {(False, False), (True, False), (False, True), (True, True)}
    schema = realworld_plan.modules["chunk_local_cumsum"]["schemas"]["chunk_local_cumsum"]
    assert "float? scale=None" in schema and "Tensor? cu_seqlens=None" in schema


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "chunk_local_cumsum.py", "_chunk_local_cumsum_jit")


def _reference(g, chunk, reverse, scale, cu_seqlens):
    import torch

    out = torch.empty_like(g, dtype=torch.float64)
    bounds = cu_seqlens.tolist() if cu_seqlens is not None else [0, g.shape[1]]
    for b in range(g.shape[0]):
        for bos, eos in itertools.pairwise(bounds):
            for c in range(bos, eos, chunk):
                x = g[b, c:min(c + chunk, eos)].double()
                out[b, c:min(c + chunk, eos)] = x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0)
    return out * (scale if scale is not None else 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("scale", [None, 0.5])
@pytest.mark.parametrize(("B", "T", "cu_seqlens"), [(2, 1000, None), (2, 77, None), (2, 4096, None),
                                                     (1, 1000, [0, 37, 800, 1000]), (1, 333, [0, 1, 64, 300, 333])])
@pytest.mark.parametrize("misaligned", [False, True])
def test_against_float64_and_the_jit(realworld, jit, dtype, reverse, scale, B, T, cu_seqlens, misaligned) -> None:
    import torch

    torch.manual_seed(T + B)
    n = B * T * 4
    base = torch.randn(n + 1, device="cuda", dtype=torch_dtype(dtype))
    g = (base[1:] if misaligned else base[:n]).view(B, T, 4)
    cu = torch.tensor(cu_seqlens, device="cuda", dtype=torch.int32) if cu_seqlens is not None else None
    if cu is not None and reverse and scale is None:
        # the examples ran packed batches reversed only scaled: that variant (B=1, REVERSE=True) has no binary
        # for an absent scale (as for an absent pointer, only the combinations its own calls show are built)
        from forge_realworld._runtime.errors import NotBuiltError

        with pytest.raises(NotBuiltError, match=r"'HAS_SCALE': False, 'IS_VARLEN': True.*not built"):
            realworld.chunk_local_cumsum(g, 64, reverse=reverse, scale=scale, cu_seqlens=cu)
        return
    out = realworld.chunk_local_cumsum(g, 64, reverse=reverse, scale=scale, cu_seqlens=cu)
    ref = jit.chunk_local_cumsum(g, 64, reverse=reverse, scale=scale, cu_seqlens=cu)
    torch.cuda.synchronize()
    assert out.dtype == torch.float32 and out.shape == g.shape
    assert relative_error(out, _reference(g, 64, reverse, scale, cu)) < 1e-6
    assert relative_error(out, ref.double()) < 1e-6


NOT_A_TUNER = """\
import torch
import triton
import triton.language as tl


def cached(configs, key):  # takes autotune's arguments, makes no Autotuner
    return lambda fn: fn


@cached(configs=[], key=["n"])
def host_helper(n):  # not a kernel: no @triton.jit, so not read as one
    return n


@cached(configs=[triton.Config({}, num_warps=4)], key=["n"])
@triton.jit
def k(x, n, BLOCK: tl.constexpr):
    pass


def op(x):
    k[(1,)](x, host_helper(x.numel()), BLOCK=128)
    return x
"""


def test_a_decorator_with_autotunes_arguments_must_make_an_autotuner(tmp_path) -> None:
    from forge_aot.errors import SourceError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(NOT_A_TUNER)
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\nsource = "k.py:k"\n'
        'ops = ["op"]\nsignature = { x = "*fp32", n = "i32" }\n')
    with pytest.raises(SourceError, match=r"k.py:\d+: k has a decorator with configs= and key= that does not make a "
                                          r"Triton Autotuner"):
        make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
