import torch, forge_realworld as fr
x = torch.randn(64, 512, device="cuda", dtype=torch.float16)
w = torch.randn(512, device="cuda", dtype=torch.float16)
for prenorm in (False, True):
    def f(x, w):
        return fr.layer_norm_fn(x, w, None, prenorm=prenorm)
    try:
        out = torch.compile(f, fullgraph=True)(x, w)
        print("prenorm", prenorm, "compiled ok", type(out))
    except Exception as e:
        print("prenorm", prenorm, "compile failed:", type(e).__name__, str(e)[:600])
