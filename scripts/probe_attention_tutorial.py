"""Probe (GPU): the tutorial attention fixture's calls in the installed forge_realworld wheel against development mode
(Triton's JIT, same config), counting NaNs in each output. Session 22 found the warp-specialized build (tensors
passed, descriptors made in the kernel) returning NaNs under the JIT too on the H100, and left it unbuilt.

    PYTHONPATH=$PWD python3 scripts/probe_attention_tutorial.py
"""

import sys

import torch

sys.path.insert(0, ".")
import forge_realworld as wheel
import forge_realworld._ops.attention_tutorial as host

from forge_aot.dev import load_dev_ops

jit = load_dev_ops("tests/fixtures/realworld/kernel_manifest.toml")
torch.manual_seed(0)
for shape, causal, ws in (((2, 4, 1024, 64), False, False), ((2, 4, 1024, 64), True, False),
                          ((1, 2, 128, 64), False, False)):
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.float16) for _ in range(3))
    try:
        a = wheel.tutorial_attention(q, k, v, causal, 0.5, ws)
    except Exception as exc:  # a build the wheel does not have
        print(shape, causal, ws, "wheel:", type(exc).__name__, exc)
        continue
    b = jit["tutorial_attention"](q, k, v, causal, 0.5, ws)
    torch.cuda.synchronize()
    state = next(iter(host._attn_fwd._states.values()))
    print(shape, causal, ws, "wheel nan", a.isnan().sum().item(), "jit nan", b.isnan().sum().item(),
          "equal", torch.equal(a, b), "launched", [(key[0], key[2], key[3]) for key in state.launchers])
    host._attn_fwd._states.clear()
