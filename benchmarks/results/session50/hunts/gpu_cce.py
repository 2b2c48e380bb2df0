"""Session 50 (session 49's script, each case's result or error recorded on its own): the Cut Cross-Entropy hunt
wheel (ml-cross-entropy 25.6's files packaged by forge-aot on the CPU
machine, bf16 / int64 only) on a GPU. Correctness: the wheel in a fresh process with Triton blocked, the library's
own files under Triton's JIT in another fresh process, both on the same seeded inputs, each against an fp64 torch
reference (loss and both gradients). Timing: both in one process, interleaved rounds, forward + backward, medians.

    CCE_SRC=.hunt/cce_src python3 gpu_cce.py [--json out.json]
"""
import json
import os
import subprocess
import sys

CASES = [(4096, 1024, 32000, "mean", None), (1000, 768, 50257, "sum", None), (2 * 1537, 512, 32003, "none", 30.0)]

CHECK = r'''
import sys, json
if sys.argv[1] == "wheel":
    sys.modules["triton"] = None  # the wheel must not need it
    import forge_cce_small as lib
else:
    sys.path.insert(0, sys.argv[2])
    import cut_cross_entropy as lib
import torch
CASES = json.loads(sys.argv[3])
out, saved = {}, {}
def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
for n, d, v, red, cap in CASES:
    g = torch.Generator(device="cuda").manual_seed(n + d + v)
    e = (torch.randn(n + 1, d, device="cuda", generator=g) * 0.2).to(torch.bfloat16)[1:]  # misaligned rows
    c = (torch.randn(v, d, device="cuda", generator=g) * 0.2).to(torch.bfloat16)
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[::11] = -100
    e1, c1 = e.clone().requires_grad_(), c.clone().requires_grad_()
    try:
        loss = lib.linear_cross_entropy(e1, c1, t, reduction=red, softcap=cap)
        w = torch.randn(loss.shape, device="cuda", generator=g) if loss.dim() else torch.ones((), device="cuda")
        (loss.float() * w).sum().backward()
    except Exception as exc:
        out[f"{n}x{d}x{v}_{red}_cap{cap}"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        continue
    e2, c2 = e.double().requires_grad_(), c.double().requires_grad_()
    logits = e2 @ c2.T
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    ref = torch.nn.functional.cross_entropy(logits, t, ignore_index=-100, reduction=red)
    (ref * w.double()).sum().backward()
    out[f"{n}x{d}x{v}_{red}_cap{cap}"] = {"loss": rel(loss, ref), "dE": rel(e1.grad, e2.grad),
                                         "dC": rel(c1.grad, c2.grad),
                                         "loss_head": loss.flatten()[:4].float().tolist()}
    saved[f"{n}x{d}x{v}_{red}_cap{cap}"] = [loss.detach().cpu(), e1.grad.cpu(), c1.grad.cpu()]
torch.save(saved, f"/tmp/cce_{sys.argv[1]}.pt")
print(json.dumps(out))
'''

TIME = r'''
import sys, json, statistics, torch
sys.path.insert(0, sys.argv[1])
import forge_cce_small as wheel
import cut_cross_entropy as jit
n, d, v = 4096, 1024, 32000
e = (torch.randn(n, d, device="cuda") * 0.2).to(torch.bfloat16).requires_grad_()
c = (torch.randn(v, d, device="cuda") * 0.2).to(torch.bfloat16).requires_grad_()
t = torch.randint(0, v, (n,), device="cuda")
def step(lib):
    e.grad = c.grad = None
    lib.linear_cross_entropy(e, c, t).backward()
def torch_step():
    e.grad = c.grad = None
    torch.nn.functional.cross_entropy((e @ c.T).float(), t).backward()
fns = {"forge-aot wheel": lambda: step(wheel), "Triton JIT": lambda: step(jit), "torch": torch_step}
for f in fns.values():
    for _ in range(3):
        f()
torch.cuda.synchronize()
times = {k: [] for k in fns}
for r in range(7):
    for k, f in fns.items():
        s, t_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            f()
        t_.record(); torch.cuda.synchronize()
        times[k].append(s.elapsed_time(t_) / 10)
print(json.dumps({k: {"median_ms": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times.items()}))
'''


def main() -> None:
    src = os.path.abspath(os.environ.get("CCE_SRC", ".hunt/cce_src"))
    results = {}
    for side in ("wheel", "jit"):
        p = subprocess.run([sys.executable, "-c", CHECK, side, src, json.dumps(CASES)], capture_output=True,
                           text=True, cwd="/tmp")
        results[side] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else p.stderr[-3000:]
        print(side, json.dumps(results[side], indent=1))
    try:  # the wheel against the library under the JIT, on the same inputs
        import torch

        w, j = torch.load("/tmp/cce_wheel.pt"), torch.load("/tmp/cce_jit.pt")
        results["wheel_vs_jit"] = {case: [((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
                                          for a, b in zip(w[case], j[case])] for case in w if case in j}
        print("wheel vs jit (loss, dE, dC)", json.dumps(results["wheel_vs_jit"], indent=1))
    except Exception as exc:  # one side failed: its stderr is above
        results["wheel_vs_jit"] = repr(exc)
    p = subprocess.run([sys.executable, "-c", TIME, src], capture_output=True, text=True, cwd="/tmp")
    results["time_fwd_bwd_4096x1024x32000"] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 \
        else p.stderr[-3000:]
    print("timing", json.dumps(results["time_fwd_bwd_4096x1024x32000"], indent=1))
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
