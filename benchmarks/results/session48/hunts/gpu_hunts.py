"""Session 48: the attorch, FBGEMM and Cut Cross-Entropy hunt wheels (built on the CPU machine from the libraries'
files) against torch on the GPU, each in a fresh process with Triton blocked. Prints one JSON line per library."""
import json
import os
import subprocess
import sys

ATTORCH = r'''
import sys, json
sys.modules["triton"] = None
import torch, torch.nn.functional as F
import forge_attorch as A
torch.manual_seed(0)
out = {}
def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
for dtype in (torch.float32, torch.float16):
    h = (torch.randn(5 * 7 * 1000 + 1, device="cuda", dtype=dtype)[1:]).view(5, 7, 1000).requires_grad_()
    ln = A.LayerNorm(1000, dtype=dtype).cuda()
    with torch.no_grad():
        ln.weight.copy_(torch.randn_like(ln.weight)); ln.bias.copy_(torch.randn_like(ln.bias))
    y = ln(h); g = torch.randn_like(y); y.backward(g)
    h2 = h.detach().double().requires_grad_(); w2 = ln.weight.detach().double().requires_grad_()
    b2 = ln.bias.detach().double().requires_grad_()
    y2 = F.layer_norm(h2, (1000,), w2, b2, ln.eps); y2.backward(g.double())
    out[f"layernorm_{dtype}"] = [rel(y, y2), rel(h.grad, h2.grad), rel(ln.weight.grad, w2.grad)]
    s = torch.randn(6, 1000, device="cuda", dtype=dtype, requires_grad=True)
    p = A.Softmax(dim=-1)(s); gp = torch.randn_like(p); p.backward(gp)
    s2 = s.detach().double().requires_grad_(); p2 = torch.softmax(s2, -1); p2.backward(gp.double())
    out[f"softmax_{dtype}"] = [rel(p, p2), rel(s.grad, s2.grad)]
    logits = torch.randn(37, 1000, device="cuda", dtype=dtype, requires_grad=True)
    target = torch.randint(0, 1000, (37,), device="cuda")
    l = A.CrossEntropyLoss()(logits, target); l.backward()
    l2i = logits.detach().double().requires_grad_(); l2 = F.cross_entropy(l2i, target); l2.backward()
    out[f"xent_{dtype}"] = [rel(l, l2), rel(logits.grad, l2i.grad)]
inp = torch.randn(4, 50, 300, device="cuda", requires_grad=True)
lin = A.Linear(300, 200, act_func="relu").cuda()
y = lin(inp); g = torch.randn_like(y); y.backward(g)
i2 = inp.detach().double().requires_grad_(); W = lin.weight.detach().double().requires_grad_()
B = lin.bias.detach().double().requires_grad_()
y2 = F.relu(F.linear(i2, W if W.shape == (200, 300) else W.T, B)); y2.backward(g.double())
out["linear_relu_fp32"] = [rel(y, y2), rel(inp.grad, i2.grad)]
print(json.dumps(out))
'''

FBGEMM = r'''
import sys, json
sys.modules["triton"] = None
import torch
import forge_fbgemm as F8
torch.manual_seed(0)
out = {}
def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
n, k = 2880, 2880
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
wq, ws = F8.quantize_fp8_row(w)
out["quant_row_w"] = rel(wq.double() * ws.double()[:, None], w)
for m in (17, 1, 200):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq, xs = F8.quantize_fp8_row(x)
    ref = (xq.double() * xs.double()[:, None]) @ (wq.double() * ws.double()[:, None]).T
    y = F8.matmul_fp8_row(xq, wq, xs, ws, tma_persistent=False)
    out[f"matmul_row_m{m}"] = rel(y, ref)
    y = F8.matmul_fp8_row(xq, wq, xs, ws, no_use_persistent=True)
    out[f"matmul_row_nonpersistent_m{m}"] = rel(y, ref)
wq, ws = F8.quantize_fp8_block(w, 256, 256)
wd = F8.dequantize_fp8_block(wq, ws, 256, 256)
out["block_dequant"] = rel(wd, w)
x = torch.randn(17, k, device="cuda", dtype=torch.bfloat16)
xq, xs = F8.quantize_fp8_block(x, 256, 256)
xd = F8.dequantize_fp8_block(xq, xs, 256, 256)
y = F8.matmul_fp8_block(xq, wq, xs, ws, 256, 256, 256)
out["matmul_block_m17"] = rel(y, xd.double() @ wd.double().T)
print(json.dumps(out))
'''

CCE = r'''
import sys, json
sys.modules["triton"] = None
import torch, torch.nn.functional as F
import forge_cce as C
torch.manual_seed(0)
out = {}
def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
for dtype in (torch.bfloat16, torch.float16):
    for (N, D, V) in ((300, 96, 1000), (257, 80, 5003)):
        e = (torch.randn(N, D, dtype=dtype, device="cuda") * 0.1).requires_grad_()
        c = (torch.randn(V, D, dtype=dtype, device="cuda") * 0.1).requires_grad_()
        t = torch.randint(0, V, (N,), device="cuda")
        loss = C.linear_cross_entropy(e, c, t); loss.backward()
        e2 = e.detach().double().requires_grad_(); c2 = c.detach().double().requires_grad_()
        l2 = F.cross_entropy(e2 @ c2.T, t); l2.backward()
        out[f"{dtype}_{N}x{D}x{V}"] = [rel(loss, l2), rel(e.grad, e2.grad), rel(c.grad, c2.grad)]
print(json.dumps(out))
'''

here = os.path.dirname(os.path.abspath(__file__))
for name, code in (("attorch", ATTORCH), ("fbgemm", FBGEMM)):  # (the CCE wheel, 31 MB, exceeds what a call carries)
    site = f"/tmp/site_{name}"
    wheel = next(f for f in os.listdir(os.path.join(here, "wheels")) if f.startswith(f"forge_{name}-"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", site,
                    os.path.join(here, "wheels", wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = site
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env, timeout=100)
    line = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None
    print(json.dumps({"library": name, "rc": r.returncode, "result": json.loads(line) if line else None,
                      "stderr": None if line else r.stderr[-3000:]}), flush=True)
