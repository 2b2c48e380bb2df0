"""Mamba-2's chunk cumsum forward (tests/fixtures/realworld/kernels/chunk_cumsum.py), packaged unchanged: an
``@triton.autotune`` keyed on (chunk_size, nheads), ``tl.cumsum``, a ``@triton.jit`` softplus from the package's
own helper module, an optional bias passed as ``None`` (``HAS_DT_BIAS`` by keyword), ``dt_limit`` floats whose
upper bound defaults to ``inf``, a 3-D grid under ``torch.cuda.device``.

CPU: the plan builds the bias and no-bias calls as separate binaries (the ``None`` pointer's specialization) and
keys its tables on the traced (chunk_size, nheads). GPU: both outputs against an fp64 torch reference and against
the file under Triton's JIT (which autotunes its own head block), with and without the bias, softplus and limits,
traced and untraced sequence lengths and head counts, the padded tail of the last chunk zeroed."""

from __future__ import annotations

import math

import pytest

from tests.conftest import REALWORLD, import_fixture_file, poison_allocator, torch_dtype


def test_the_bias_passed_as_none_and_the_traced_keys_are_built(realworld_plan) -> None:
    entries = [e for e in realworld_plan.entries if e.kernel == "chunk_cumsum" and e.target == "sm_90"]
    keys = {row.key for e in entries for rows in e.tables.values() for row in rows}
    assert {(256, 24), (256, 80), (64, 8)} <= keys, keys
    flags = {(e.assignment["DT_SOFTPLUS"], e.assignment["HAS_DT_BIAS"]) for e in entries}
    assert flags == {(True, True), (False, False)}
    specs = {b.spec for e in entries for rows in e.tables.values() for row in rows
             for b in realworld_plan.binaries_for(e, row.key, row.preferences[0])}
    # dt_bias_ptr (the third pointer) is N (None) in the no-bias calls' binaries and a tensor in the others'
    assert any(s[2] == "N" for s in specs) and any(s[2] in "Dx" for s in specs), specs


def test_a_default_the_schema_cannot_spell_is_optional_and_comes_back(realworld_plan) -> None:
    """dt_limit=(0.0, float("inf")): schemas have no inf, so the custom op takes ``float[]? dt_limit=None`` and its
    implementations hand the host function its own default where the call left it out."""
    import torch

    from forge_aot.runtime.custom_ops import _host_defaults

    schema = realworld_plan.modules["chunk_cumsum"]["schemas"]["_chunk_cumsum_fwd"]
    assert schema == ("(Tensor dt, Tensor A, int chunk_size, Tensor? dt_bias=None, bool dt_softplus=False, "
                      "float[]? dt_limit=None) -> (Tensor, Tensor)"), schema
    torch._C.parse_schema("_chunk_cumsum_fwd" + schema)

    def host(dt, A, chunk_size, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf"))):
        return dt_limit

    inf_default = (0.0, float("inf"))
    assert _host_defaults(host, (1, 2, 64, None, True, None), {}) == ((1, 2, 64, None, True, inf_default), {})
    assert _host_defaults(host, (1, 2, 64), {"dt_limit": None}) == ((1, 2, 64), {"dt_limit": inf_default})
    # a value the call passes, and a None where the host's own default is None, stay as they are
    assert _host_defaults(host, (1, 2, 64, None, True, [0.1, 0.2]), {}) == ((1, 2, 64, None, True, [0.1, 0.2]), {})


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    import sys

    sys.path.insert(0, str(REALWORLD))  # the fixture's helper package, importable as for its authors
    return import_fixture_file(REALWORLD / "kernels" / "chunk_cumsum.py", "_chunk_cumsum_jit")


CASES = [  # (batch, seqlen, nheads, chunk_size, dtype, bias and softplus, dt_limit)
    (2, 1000, 24, 256, "bf16", True, (0.0, float("inf"))),
    (1, 4096, 80, 256, "fp32", True, (0.0, float("inf"))),
    (3, 333, 8, 64, "fp16", True, (0.0, float("inf"))),
    (2, 1000, 24, 256, "bf16", False, (0.001, 0.1)),
    (3, 333, 8, 64, "fp16", False, (0.001, 0.1)),
    (2, 1234, 13, 256, "fp32", True, (0.0, float("inf"))),  # untraced length and head count
    (1, 77, 80, 64, "fp16", False, (0.001, 0.1)),  # a shorter sequence than one chunk
]


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "seqlen", "nheads", "chunk_size", "dtype", "bias", "limit"), CASES)
def test_chunk_cumsum_against_torch_and_the_jit(realworld, jit, batch, seqlen, nheads, chunk_size, dtype, bias,
                                                limit) -> None:
    import torch

    dt, A, dt_bias = jit.make_inputs(batch, seqlen, nheads, torch_dtype(dtype), "cuda", bias=bias, seed=seqlen)
    kwargs = {"dt_bias": dt_bias, "dt_softplus": bias, "dt_limit": limit}
    poison_allocator(batch * nheads * math.ceil(seqlen / chunk_size) * chunk_size * 8)
    dA_cs, dt_out = realworld._chunk_cumsum_fwd(dt, A, chunk_size, **kwargs)
    j_cs, j_out = jit._chunk_cumsum_fwd(dt, A, chunk_size, **kwargs)
    torch.cuda.synchronize()
    # the fixture's fp64 reference (forge-aot tune checks every candidate against it too)
    ref_cs, ref_out = jit.tune_reference(dt, A, chunk_size, dt_bias, bias, limit)
    assert torch.allclose(dt_out.double(), ref_out, rtol=1e-5, atol=1e-6)
    assert torch.allclose(dA_cs.double(), ref_cs, rtol=1e-4, atol=1e-5)
    tail = math.ceil(seqlen / chunk_size) * chunk_size - seqlen
    if tail:
        assert torch.count_nonzero(dt_out[..., -1, chunk_size - tail:]) == 0
    # the JIT picks its own head block (autotune): the same values, cumsum order aside
    assert torch.equal(dt_out, j_out)
    assert torch.allclose(dA_cs, j_cs, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_the_custom_op_under_torch_compile_with_and_without_the_inf_default(realworld, jit) -> None:
    import torch

    dt, A, dt_bias = jit.make_inputs(2, 1000, 24, torch.bfloat16, "cuda", seed=3)
    for limit in ({}, {"dt_limit": (0.001, 0.1)}):
        eager = realworld._chunk_cumsum_fwd(dt, A, 256, dt_bias=dt_bias, dt_softplus=True, **limit)
        compiled = torch.compile(lambda d, a, b, lim=limit: realworld._chunk_cumsum_fwd(
            d, a, 256, dt_bias=b, dt_softplus=True, **lim), fullgraph=True)
        out = compiled(dt, A, dt_bias)
        assert all(torch.equal(o, e) for o, e in zip(out, eager))
        direct = torch.ops.forge_realworld._chunk_cumsum_fwd(dt, A, 256, dt_bias, True, *limit.values())
        assert all(torch.equal(o, e) for o, e in zip(direct, eager))


@pytest.mark.gpu
def test_a_chunk_size_that_was_not_built_is_named(realworld, jit) -> None:
    import torch

    dt, A, dt_bias = jit.make_inputs(1, 500, 8, torch.float32, "cuda")
    with pytest.raises(ValueError, match=r"BLOCK_SIZE_CHUNK=128 was not built"):
        realworld._chunk_cumsum_fwd(dt, A, 128, dt_bias=dt_bias, dt_softplus=True)


@pytest.mark.gpu
def test_forge_aot_tune_tunes_every_row_the_bias_passed_as_none_too(tmp_path) -> None:
    """``forge-aot tune --kernel chunk_cumsum`` on a copy of the fixture project without its chunk_cumsum results:
    every row gets a verified winner, the no-bias rows too (their bias pointer is None; the first H100 run failed
    every candidate of those rows where the timer moved the pointer arguments' memory: session 25, r2)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO

    # the whole fixtures tree: the project's manifest names a kernel file beside it (../kernels)
    shutil.copytree(REALWORLD.parent, tmp_path / "fixtures",
                    ignore=shutil.ignore_patterns("build", "__pycache__", "chunk_cumsum.jsonl"))
    project = tmp_path / "fixtures" / REALWORLD.name
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("FORGE_AOT_TUNE_WORKER", None)
    result = subprocess.run([sys.executable, "-m", "forge_aot.cli", "tune", "-q", "--kernel", "chunk_cumsum",
                             "--no-report"], cwd=project, env=env, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in (project / "tuning" / "chunk_cumsum.jsonl").read_text().splitlines()]
    winners = [r for r in records if r["kind"] == "winner"]
    variants = [dict(part.split("=") for part in w["variant"].split(",")) for w in winners]  # "T=bf16,..."
    assert {(v["HAS_DT_BIAS"], v["T"]) for v in variants} == {
        (bias, t) for bias in ("True", "False") for t in ("bf16", "fp32", "fp16")}, result.stdout
    for w in winners:
        assert w["verified"]["rel_err"] <= w["verified"]["tolerance"]
    assert not [r for r in records if r["kind"] == "measurement" and r["status"] == "failed"]
