"""gsplat-style spherical harmonics to colour (tests/fixtures/realworld/kernels/sh_to_color.py): a
``@triton.heuristics`` that computes the launch option ``num_warps`` (no such parameter), as gsplat's kernels do.

CPU: the heuristic's value is part of each binary's identity and compiled as its option (a real compile for sm_90:
the binary's own ``num_warps``). GPU: colours against a torch reference in fp64 and bit for bit against the file
under Triton's JIT, for every traced (degree, block size) and odd point counts."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, poison_allocator


def test_the_heuristic_sets_each_binarys_num_warps(realworld_plan, tmp_path) -> None:
    from forge_aot import targets
    from forge_aot._compile_worker import compile_one
    from forge_aot.plan import job_for

    kp = realworld_plan.kernels["sh_to_color"]
    assert kp.launch_heuristics == ["num_warps"] and kp.spec_json()["launch_heuristics"] == ["num_warps"]
    seen = {}
    for e in realworld_plan.entries:
        if e.kernel != "sh_to_color" or e.target != "sm_90":
            continue
        for rows in e.tables.values():
            for row in rows:
                for b in realworld_plan.binaries_for(e, row.key, row.preferences[0]):
                    seen[e.assignment["BLOCK_SIZE"]] = dict(b.heur)["num_warps"]
                    job = job_for(realworld_plan, e, row.preferences[0], b)
    assert seen == {64: 2, 128: 4, 256: 8}
    t = targets.TARGETS["sm_90"]
    payload = {**job.to_json(), "binary_stem": job.binary_stem, "out_dir": str(tmp_path),
               "target_info": {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size}}
    payload["source"] = str(REALWORLD / job.source)
    sidecar = compile_one(payload)["sidecar"]
    assert sidecar["num_warps"] == dict(job.binary.heur)["num_warps"] != job.config.num_warps


# -- GPU ---------------------------------------------------------------------------------------------------------


def _reference(sh, dirs, deg):
    import torch

    c0, c1 = 0.28209479177387814, 0.4886025119029199
    d = torch.nn.functional.normalize(dirs.double(), dim=-1)
    sh = sh.double()
    out = c0 * sh[:, 0]
    if deg >= 1:
        x, y, z = d[:, 0:1], d[:, 1:2], d[:, 2:3]
        out = out + c1 * (-y * sh[:, 1] + z * sh[:, 2] - x * sh[:, 3])
    return out


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "sh_to_color.py", "_sh_to_color_jit")


@pytest.mark.gpu
@pytest.mark.parametrize(("deg", "block_size"), [(0, 128), (1, 256), (1, 64)])
@pytest.mark.parametrize("n", [1, 10_001, 65_536, 333_333])
def test_sh_to_color_against_torch_and_the_jit(realworld, jit, deg, block_size, n) -> None:
    import torch

    k = (deg + 1) ** 2
    sh = torch.randn(n, k, 3, device="cuda")
    dirs = torch.randn(n, 3, device="cuda")
    poison_allocator(n * 3 * 4)
    out = realworld.sh_to_color(sh, dirs, deg, block_size)
    ref = jit.sh_to_color(sh, dirs, deg, block_size)
    torch.cuda.synchronize()
    assert torch.allclose(out.double(), _reference(sh, dirs, deg), atol=1e-5, rtol=1e-5)
    assert torch.equal(out, ref)


@pytest.mark.gpu
def test_a_block_size_that_was_not_built_is_named(realworld) -> None:
    import torch

    sh = torch.randn(100, 4, 3, device="cuda")
    with pytest.raises(ValueError, match=r"BLOCK_SIZE=512 was not built"):
        realworld.sh_to_color(sh, torch.randn(100, 3, device="cuda"), 1, 512)
