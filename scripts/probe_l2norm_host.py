import cProfile, pstats, sys, time, importlib.util, torch
sys.path.insert(0, "tests/fixtures/realworld")
import forge_realworld as w
spec = importlib.util.spec_from_file_location("_jit_l2", "tests/fixtures/realworld/kernels/l2norm.py")
jit = importlib.util.module_from_spec(spec); spec.loader.exec_module(jit)
x = torch.randn(32768, 128, device="cuda", dtype=torch.float16)
for name, fn in (("wheel", w.l2norm), ("jit", jit.l2norm)):
    for _ in range(10): fn(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(100): fn(x)
    torch.cuda.synchronize()
    print(name, "per call us", (time.perf_counter() - t) * 1e4)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(50): fn(x)
    torch.cuda.synchronize()
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(12)
