"""FBGEMM's block-wise fp8 matmul: the hunt wheel against the same files under Triton's JIT, one process each."""
import json
import os
import subprocess
import sys

CODE = r'''
import sys, json, os
MODE = sys.argv[1]
if MODE == "wheel":
    sys.modules["triton"] = None
    import forge_fbgemm as F8
else:
    sys.path.insert(0, os.environ["PROJ"])
    import triton.testing
    triton.testing.get_max_tensorcore_tflops = lambda *a, **k: 1000.0  # (fp8 "dtype not supported" in 3.6's table)
    import fbgemm_gpu.experimental.gemm.triton_gemm.fp8_gemm as F8
    pm = sys.modules["fbgemm_gpu.experimental.gemm.triton_gemm.matmul_perf_model"]
    if hasattr(pm, "get_max_tensorcore_tflops"):
        pm.get_max_tensorcore_tflops = triton.testing.get_max_tensorcore_tflops
import torch
torch.manual_seed(0)
n = k = 2880
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
x = torch.randn(17, k, device="cuda", dtype=torch.bfloat16)
wq, ws = F8.quantize_fp8_block(w, 256, 256)
xq, xs = F8.quantize_fp8_block(x, 256, 256)
y = F8.matmul_fp8_block(xq, wq, xs, ws, 256, 256, 256)
y2 = F8.matmul_fp8_block(xq, wq, xs, ws, 256, 256, 256, fp8_fast_accum=False)
torch.save({"wq": wq.view(torch.uint8).cpu(), "ws": ws.cpu(), "xq": xq.view(torch.uint8).cpu(), "xs": xs.cpu(),
            "y": y.float().cpu(), "y2": y2.float().cpu()}, f"/tmp/fb_{MODE}.pt")
print(json.dumps({"ws": list(ws.shape), "xs": list(xs.shape), "y": list(y.shape), "dtype": str(y.dtype)}))
'''
here = os.path.dirname(os.path.abspath(__file__))
site = "/tmp/site_fbgemm"
wheel = next(f for f in os.listdir(os.path.join(here, "wheels")) if f.startswith("forge_fbgemm-"))
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", site,
                os.path.join(here, "wheels", wheel)], check=True)
for mode in ("wheel", "jit"):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = site if mode == "wheel" else ""
    env["PROJ"] = os.path.join(here, "fbgemm_proj")
    r = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, cwd="/", env=env,
                       timeout=150)
    print(mode, r.returncode, r.stdout.strip()[-500:], r.stderr[-2500:] if r.returncode else "", flush=True)
import torch  # noqa: E402  (after the children: this process never touches the GPU before them)

a, b = torch.load("/tmp/fb_wheel.pt"), torch.load("/tmp/fb_jit.pt")
def rel(p, q):
    return ((p.double() - q.double()).norm() / q.double().norm().clamp_min(1e-30)).item()
out = {k: (torch.equal(a[k], b[k]) if a[k].dtype != torch.float32 else rel(a[k], b[k])) for k in a}
print(json.dumps({"wheel_vs_jit": out}))
