"""Boolean ``@triton.heuristics`` whose values follow from a variant's constexprs and the config alone (scattermoe
passes ``K`` as a constexpr and computes ``NO_K_MASK = K % BLOCK_K == 0``): the build had built both values of
every boolean heuristic for shapes between table rows, and for scattermoe 120 of its 217 binaries could never
launch. Those are now built for their one value; heuristics reading a runtime argument keep both."""

from __future__ import annotations

from pathlib import Path

from forge_aot.manifest import load_manifest
from forge_aot.plan import make_plan
from tests.test_localmods import one_file_project

ROWCOPY = '''\
import os

import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({'BLOCK_K': 32}, num_warps=4)], key=['K'])
@triton.heuristics({"NO_K_MASK": lambda args: (args['K'] % args['BLOCK_K']) == 0,
                    "EVEN_ROWS": lambda args: args['N'] % 16 == 0,
                    "FAST": lambda args: os.environ.get("ROWCOPY_FAST") == "1"})
@triton.jit
def _rowcopy(src_ptr, tgt_ptr, N, K: tl.constexpr, BLOCK_K: tl.constexpr, NO_K_MASK: tl.constexpr,
             EVEN_ROWS: tl.constexpr, FAST: tl.constexpr):
    row = tl.program_id(0)
    for i in range(0, tl.cdiv(K, BLOCK_K)):
        k = i * BLOCK_K + tl.arange(0, BLOCK_K)
        if NO_K_MASK:
            tl.store(tgt_ptr + row * K + k, tl.load(src_ptr + row * K + k))
        else:
            tl.store(tgt_ptr + row * K + k, tl.load(src_ptr + row * K + k, mask=k < K), mask=k < K)


def rowcopy(x):
    y = torch.empty_like(x)
    _rowcopy[(x.size(0),)](x, y, x.size(0), x.size(1))
    return y


def examples(device="cpu"):
    rowcopy(torch.randn(64, 128, device=device))
    rowcopy(torch.randn(64, 100, device=device))
'''


def test_heuristics_settled_by_the_variant_and_config_are_built_for_their_one_value(tmp_path: Path) -> None:
    """``NO_K_MASK`` (from the constexpr ``K`` and the config) gets only its value per variant; ``EVEN_ROWS`` (from
    the runtime ``N``) and ``FAST`` (from the environment, a process-wide setting) are still built both ways."""
    manifest = one_file_project(tmp_path / "p", "forge_settled", ROWCOPY, "_rowcopy", ["rowcopy"],
                                extra='signature = { src_ptr = "*fp32", tgt_ptr = "*fp32" }\n')
    plan = make_plan(load_manifest(manifest))
    seen: dict[int, set[tuple[bool, bool, bool]]] = {}
    for e in plan.entries:
        for rows in e.tables.values():
            for row in rows:
                for config in row.preferences:
                    for b in plan.binaries_for(e, row.key, config):
                        h = dict(b.heur)
                        seen.setdefault(e.assignment["K"], set()).add((h["NO_K_MASK"], h["EVEN_ROWS"], h["FAST"]))
    both = {(a, b) for a in (False, True) for b in (False, True)}
    assert seen == {128: {(True, *v) for v in both}, 100: {(False, *v) for v in both}}, seen
