#!/usr/bin/env python3
# ruff: noqa: E501, E741, I001, RUF059, SIM105, SIM108, SIM115  (a hunt's recorded script, kept as it ran)
"""GPU correctness + timing hunt for two forge-aot wheels (flashinfer.triton, lightning-attention).

Run from the repository root on the GPU machine, with both wheels pip-installed:

    python3 gpu_hunts50.py --src-fi <parent of flashinfer/> --src-la <parent of lightning_attn/> --json out.json

1. Correctness: each library runs in two fresh subprocesses (in parallel): the wheel with
   ``sys.modules["triton"] = None`` set before any import, and the library's own source under Triton's JIT.
   Both draw the same seeded inputs (torch.Generator(device=...).manual_seed(crc32(case name))) and compare
   against float64 torch references written from the math. Outputs are torch.save'd to /tmp and compared
   wheel vs JIT (bitwise and max abs diff).
2. Untraced shapes / dtypes on the wheel: expected NotBuiltError (type and message recorded).
3. Timing: one process with both imported: wheel / JIT / torch interleaved, 7 rounds x 20 calls, CUDA events.
4. Summary printed; everything written as JSON to --json.

CPU-only structural checks (no GPU): ``--selftest-refs`` (references vs the libraries' own torch code) and
``--dry-cpu`` (workers on CPU tensors, JIT under TRITON_INTERPRET=1; wheel calls are expected to fail there).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import zlib

HERE = os.path.abspath(__file__)
WHEEL_PKG = {"fi": "forge_flashinfer_triton", "la": "forge_lightning_attn"}
TMP_PREFIX = "/tmp/gpu_hunts50"

# The child process: block Triton for the wheel run before anything is imported, then load this file as a
# module and hand over. argv: [-c, script, lib, mode, ...]
CHILD_CODE = r'''
import sys
if sys.argv[3] == "wheel":
    sys.modules["triton"] = None  # the wheel must not need Triton
import importlib.util
_spec = importlib.util.spec_from_file_location("gpu_hunts50_child", sys.argv[1])
_m = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_m)
_m.child_main(sys.argv[2:])
'''


def _err(e):
    return f"{type(e).__name__}: {str(e)[:300]}"


def _seed(name):
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _clean(x):
    """JSON-safe (non-finite floats as strings)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _dump_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(obj), f, indent=1, allow_nan=False)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------
# float64 references (device-agnostic: they run on whatever device the inputs are on)
# ----------------------------------------------------------------------------------------------------------

def ref_merge_states(v, s):
    """v (seq, sets, heads, dim), s (seq, sets, heads): log-sum-exp states in base 2 (flashinfer uses exp2/log2).
    Returns merged v (seq, heads, dim) and s (seq, heads) in float64."""
    import torch
    s64 = s.double()
    v64 = v.double()
    m = s64.amax(dim=1, keepdim=True)
    w = torch.exp2(s64 - m)
    den = w.sum(dim=1)
    vm = (w.unsqueeze(-1) * v64).sum(dim=1) / den.unsqueeze(-1)
    sm = m.squeeze(1) + torch.log2(den)
    return vm, sm


def ref_merge_state(va, sa, vb, sb):
    import torch
    return ref_merge_states(torch.stack([va, vb], 1), torch.stack([sa, sb], 1))


def ref_merge_state_in_place(v, s, vo, so, mask=None):
    import torch
    vm, sm = ref_merge_state(v, s, vo, so)
    if mask is not None:
        keep = ~mask.bool()
        vm = torch.where(keep[:, None, None], v.double(), vm)
        sm = torch.where(keep[:, None], s.double(), sm)
    return vm, sm


def ref_variable_length_merge_states(v, s, indptr):
    """Empty segments merge to v = 0, s = -inf (the kernel's initial state normalised)."""
    import torch
    ip = [int(x) for x in indptr.tolist()]
    vs, ss = [], []
    for i in range(len(ip) - 1):
        a, b = ip[i], ip[i + 1]
        if b > a:
            vm, sm = ref_merge_states(v[a:b].unsqueeze(0), s[a:b].unsqueeze(0))
            vs.append(vm[0])
            ss.append(sm[0])
        else:
            vs.append(torch.zeros(v.shape[1:], dtype=torch.float64, device=v.device))
            ss.append(torch.full(s.shape[1:], -math.inf, dtype=torch.float64, device=v.device))
    return torch.stack(vs), torch.stack(ss)


def ref_rms_norm(x, w, eps):
    """out = x * w / sqrt(mean(x^2) + eps), float64."""
    import torch
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def ref_rms_norm_add_residual(x, r, w, eps):
    """r' = r + x; x' = rmsnorm(r') * w. Returns (x', r')."""
    r2 = x.double() + r.double()
    return ref_rms_norm(r2, w, eps), r2


def ref_scale_clamp(y, scale, lim):
    return (y * scale.double().reshape(())).clamp(-lim, lim)


def ref_silu_and_mul(x, x_scale=None):
    import torch
    d = x.shape[-1] // 2
    x64 = x.double()
    if x_scale is not None:
        x64 = x64 * x_scale.double().reshape(())
    a, b = x64[..., :d], x64[..., d:]
    return a * torch.sigmoid(a) * b


def ref_gemm(a, b, c=None, alpha=1.0, beta=0.0):
    """alpha * a @ b + beta * c (b is K x N)."""
    out = alpha * (a.double() @ b.double())
    if c is not None and beta != 0.0:
        out = out + beta * c.double()
    return out


def ref_build_pos_ids(seg, packed):
    import torch
    seg_l, pk = [int(x) for x in seg.tolist()], [int(x) for x in packed.tolist()]
    parts = [seg_l[i] + torch.arange(pk[i + 1] - pk[i], dtype=torch.int64) for i in range(len(seg_l) - 1)]
    return torch.cat(parts).to(seg.device) if parts else torch.zeros(0, dtype=torch.int64, device=seg.device)


def ref_chunk_cumsum(dt, A, chunk_size, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """Returns (dA_cumsum, dt_out), each (batch, nheads, nchunks, chunk_size), padded positions dt = 0."""
    import torch
    import torch.nn.functional as F
    b, L, h = dt.shape
    x = dt.double()
    if dt_bias is not None:
        x = x + dt_bias.double()
    if dt_softplus:
        x = torch.where(x <= 20.0, torch.log1p(torch.exp(x)), x)
    x = x.clamp(dt_limit[0], dt_limit[1])
    nch = math.ceil(L / chunk_size)
    x = F.pad(x, (0, 0, 0, nch * chunk_size - L))
    x = x.view(b, nch, chunk_size, h).permute(0, 3, 1, 2).contiguous()
    dA = x * A.double().view(1, h, 1, 1)
    return torch.cumsum(dA, dim=-1), x


def la_slopes(h):
    """lightning_attn.utils._build_slope_tensor (copied: the wheel does not export it), shape (h, 1, 1)."""
    import torch

    def get_slopes(n):
        def p2(n):
            start = 2 ** (-(2 ** -(math.log2(n) - 3)))
            return [start * start ** i for i in range(n)]
        if math.log2(n).is_integer():
            return p2(n)
        c = 2 ** math.floor(math.log2(n))
        return p2(c) + get_slopes(2 * c)[0::2][: n - c]
    return torch.tensor(get_slopes(h)).reshape(h, 1, 1)


def ref_linear_attn(q, k, v, s=None):
    """Causal linear attention with per-head exponential decay: o_i = sum_{j<=i} exp(-s_h (i-j)) (q_i.k_j) v_j.
    Differentiable (float64 when the inputs are)."""
    import torch
    n = q.shape[-2]
    idx = torch.arange(n, device=q.device)
    diff = (idx[:, None] - idx[None, :]).to(q.dtype)
    causal = diff >= 0
    if s is None:
        mask = causal.to(q.dtype)[None]
    else:
        sv = s.to(q.dtype).reshape(-1, 1, 1)
        mask = torch.where(causal, torch.exp(-sv * diff.clamp(min=0)), torch.zeros((), dtype=q.dtype,
                                                                                   device=q.device))
    return ((q @ k.transpose(-1, -2)) * mask) @ v


def ref_srms(x, eps):
    import torch
    x64 = x.double() if x.dtype != torch.float64 else x
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)


def srms_eps(dtype, eps=1e-6):
    import torch
    return max(eps, 1.6e-5) if dtype == torch.float16 else eps   # as _SrmsNorm.forward does


# ----------------------------------------------------------------------------------------------------------
# comparisons
# ----------------------------------------------------------------------------------------------------------

def default_tol(dtype):
    import torch
    return {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 2e-5,
            torch.float8_e4m3fn: 0.07, torch.int32: 0.0, torch.int64: 0.0}.get(dtype, 1e-2)


def compare(out, ref, tol=None):
    """Normwise: rel_err = max|out - ref| / max|ref| over positions where both are finite; non-finite positions
    must agree exactly (e.g. s = -inf for an empty segment)."""
    import torch
    if tol is None:
        tol = default_tol(out.dtype)
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64).to(o.device)
    if o.shape != r.shape:
        return {"error": f"shape {tuple(o.shape)} vs reference {tuple(r.shape)}", "ok": False}
    fo, fr = torch.isfinite(o), torch.isfinite(r)
    both = fo & fr
    nf_mismatch = int(((fo != fr) | (~fo & ~fr & (o != r))).sum())
    diff = (o - r).abs()[both]
    mae = float(diff.max()) if diff.numel() else 0.0
    scale = float(r[fr].abs().max()) if bool(fr.any()) else 0.0
    rel = mae / scale if scale > 0 else mae
    return {"max_abs_err": mae, "rel_err": rel, "tol": tol, "ref_absmax": scale,
            "nonfinite_out": int((~fo).sum()), "nonfinite_mismatch": nf_mismatch,
            "ok": bool(rel <= tol and nf_mismatch == 0), "shape": list(o.shape), "dtype": str(out.dtype)}


def wheel_vs_jit(a, b):
    import torch
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return {"error": f"wheel {tuple(a.shape)} {a.dtype} vs jit {tuple(b.shape)} {b.dtype}"}
    ab = a.contiguous().reshape(-1).view(torch.uint8)
    bb = b.contiguous().reshape(-1).view(torch.uint8)
    bitwise = bool(torch.equal(ab, bb))
    ao, bo = a.to(torch.float64), b.to(torch.float64)
    fa, fb = torch.isfinite(ao), torch.isfinite(bo)
    both = fa & fb
    d = (ao - bo).abs()[both]
    mad = float(d.max()) if d.numel() else 0.0
    bmax = float(bo[fb].abs().max()) if bool(fb.any()) else 0.0
    return {"bitwise_equal": bitwise, "max_abs_diff": mad, "rel_diff": mad / bmax if bmax > 0 else mad,
            "n_diff_elems": int((ab.view(-1) != bb.view(-1)).sum()) if ab.numel() == bb.numel() else None,
            "nonfinite_mismatch": int(((fa != fb) | (~fa & ~fb & (ao != bo))).sum())}


# ----------------------------------------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------------------------------------

def R(g, shape, dtype, dev, scale=1.0, offset=0):
    """Seeded randn of `shape`; offset > 0 gives a contiguous view starting `offset` elements into its storage
    (data pointer not 16-byte aligned)."""
    import torch
    n = math.prod(shape)
    t = torch.randn(n + offset, generator=g, device=dev, dtype=torch.float32)
    if scale != 1.0:
        t = t * scale
    t = t.to(dtype)
    return t[offset:].view(shape)


def RS(g, rows, cols, pad, dtype, dev):
    """(rows, cols) view of a (rows, cols + pad) tensor, starting at column pad: row stride cols + pad,
    misaligned data pointer."""
    return R(g, (rows, cols + pad), dtype, dev)[:, pad:]


# ----------------------------------------------------------------------------------------------------------
# API loading
# ----------------------------------------------------------------------------------------------------------

FI_NAMES = {  # op -> (source module, name)
    "merge_state": ("flashinfer.triton.cascade", "merge_state"),
    "merge_state_in_place": ("flashinfer.triton.cascade", "merge_state_in_place"),
    "merge_states": ("flashinfer.triton.cascade", "merge_states"),
    "variable_length_merge_states": ("flashinfer.triton.cascade", "variable_length_merge_states"),
    "rms_norm": ("flashinfer.triton.norm", "rms_norm"),
    "rms_norm_add_residual": ("flashinfer.triton.norm", "rms_norm_add_residual"),
    "silu_and_mul": ("flashinfer.triton.activation", "silu_and_mul"),
    "gemm": ("flashinfer.triton.sm_constraint_gemm", "gemm"),
    "gemm_persistent": ("flashinfer.triton.sm_constraint_gemm", "gemm_persistent"),
    "gemm_descriptor_persistent": ("flashinfer.triton.sm_constraint_gemm", "gemm_descriptor_persistent"),
    "build_pos_ids_from_segment_offsets_and_lengths": ("flashinfer.triton.format_conversion",
                                                       "build_pos_ids_from_segment_offsets_and_lengths"),
    "chunk_cumsum_fwd": ("flashinfer.triton.kernels.ssd_chunk_state", "chunk_cumsum_fwd"),
}
LA_NAMES = {
    "lightning_attn_func": ("lightning_attn.ops", "lightning_attn_func"),
    "lightning_attn2": ("lightning_attn.ops.triton", "lightning_attn2"),
    "lightning_attn2_no_decay": ("lightning_attn.ops.triton", "lightning_attn2_no_decay"),
    "SimpleRMSNorm": ("lightning_attn.ops.triton", "SimpleRMSNorm"),
}


class API:
    def __init__(self, fns, errors, origin):
        self.fns, self.errors, self.origin = fns, errors, origin

    def __getattr__(self, name):
        fns = self.__dict__.get("fns", {})
        if name in fns:
            return fns[name]
        errs = self.__dict__.get("errors", {})
        if name in errs:
            raise RuntimeError(f"{name} not importable: {errs[name]}")
        raise AttributeError(name)


def load_api(lib, mode):
    import importlib
    names = FI_NAMES if lib == "fi" else LA_NAMES
    fns, errors, origin = {}, {}, {}
    if mode == "wheel":
        p = importlib.import_module(WHEEL_PKG[lib])
        origin["package"] = getattr(p, "__file__", None)
        for op in names:
            try:
                fns[op] = getattr(p, op)
            except Exception as e:
                errors[op] = _err(e)
    else:
        for op, (mod, attr) in names.items():
            try:
                m = importlib.import_module(mod)
                fns[op] = getattr(m, attr)
                origin[mod] = getattr(m, "__file__", None)
            except Exception as e:
                errors[op] = _err(e)
    return API(fns, errors, origin)


def mock_api(lib):
    """DRY RUN ONLY (--dry-cpu --dry-mock-wheel): torch implementations with the libraries' call conventions,
    standing in for the wheel so that the case code, references, saving and wheel-vs-JIT plumbing run on CPU."""
    import torch

    def cast(t, like):
        return t.to(like.dtype)
    if lib == "fi":
        def merge_state(va, sa, vb, sb):
            v, s = ref_merge_state(va, sa, vb, sb)
            return cast(v, va), s.float()

        def merge_state_in_place(v, s, vo, so, mask=None):
            rv, rs = ref_merge_state_in_place(v, s, vo, so, mask)
            v.copy_(rv)
            s.copy_(rs)

        def merge_states(v, s):
            rv, rs = ref_merge_states(v, s)
            return cast(rv, v), rs.float()

        def variable_length_merge_states(v, s, indptr):
            rv, rs = ref_variable_length_merge_states(v, s, indptr)
            return cast(rv, v), rs.float()

        def rms_norm(x, w, out, eps, in_scale=None, out_scale=None):
            r = ref_rms_norm(x, w, eps)
            if out_scale is not None:
                r = ref_scale_clamp(r, out_scale, 448.0)
            out.copy_(r)

        def rms_norm_add_residual(x, residual, w, eps, x_out=None, x_in_scale=None, x_out_scale=None):
            rx, rr = ref_rms_norm_add_residual(x, residual, w, eps)
            residual.copy_(rr)
            (x if x_out is None else x_out).copy_(rx)

        def silu_and_mul(x, x_scale=None, o_scale=None, dtype=None):
            r = ref_silu_and_mul(x, x_scale)
            if o_scale is not None:
                r = ref_scale_clamp(r, o_scale, 448.0)
            return r.to(dtype or x.dtype)

        def gemm(a, b, c=None, alpha=1.0, beta=0.0, out_dtype=None):
            r = ref_gemm(a, b, c, alpha, beta).to(a.dtype)
            if c is not None:
                c.copy_(r)
                return c
            return r

        def gemm_descriptor_persistent(a, b, c=None, alpha=1.0, beta=0.0, out_dtype=None, num_sms=None,
                                       EPILOGUE_SUBTILE=False):
            return gemm(a, b.t(), c, alpha, beta)

        def build_pos_ids_from_segment_offsets_and_lengths(seg, packed, out=None):
            return ref_build_pos_ids(seg, packed).to(packed.dtype)

        def chunk_cumsum_fwd(dt, A, chunk_size, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                             dt_out_dtype=torch.float32):
            dA, d = ref_chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
            return dA.float(), d.to(dt_out_dtype)
        fns = dict(merge_state=merge_state, merge_state_in_place=merge_state_in_place, merge_states=merge_states,
                   variable_length_merge_states=variable_length_merge_states, rms_norm=rms_norm,
                   rms_norm_add_residual=rms_norm_add_residual, silu_and_mul=silu_and_mul, gemm=gemm,
                   gemm_persistent=gemm, gemm_descriptor_persistent=gemm_descriptor_persistent,
                   build_pos_ids_from_segment_offsets_and_lengths=build_pos_ids_from_segment_offsets_and_lengths,
                   chunk_cumsum_fwd=chunk_cumsum_fwd)
    else:
        def attn(q, k, v, s=None):
            return ref_linear_attn(q.float(), k.float(), v.float(), s).to(q.dtype)

        class SimpleRMSNorm(torch.nn.Module):
            def __init__(self, dim, eps=1e-6):
                super().__init__()
                self.eps = eps

            def forward(self, x):
                return ref_srms(x.float(), srms_eps(x.dtype, self.eps)).to(x.dtype)
        fns = dict(lightning_attn_func=attn, lightning_attn2=attn,
                   lightning_attn2_no_decay=lambda q, k, v: attn(q, k, v), SimpleRMSNorm=SimpleRMSNorm)
    return API(fns, {}, {"mock": "torch stand-in (dry run only)"})


def dry_cpu_patches():
    """DRY RUN ONLY: let the JIT source run on CPU under TRITON_INTERPRET=1 (no CUDA)."""
    import contextlib
    import types
    import torch
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(multi_processor_count=132)
    torch.cuda.device = lambda *a, **k: contextlib.nullcontext()
    try:
        import flashinfer.triton.cascade as c

        def check_input(x):
            assert x.is_contiguous(), "must be contiguous"
        c.check_input = check_input
    except Exception:
        pass


# ----------------------------------------------------------------------------------------------------------
# flashinfer cases. Each case: fn(api, g, dev) -> (outs: dict, refs: dict, tols: dict)
# ----------------------------------------------------------------------------------------------------------

def fi_cases():
    import torch
    f16, b16, f32, i32 = torch.float16, torch.bfloat16, torch.float32, torch.int32
    fp8 = torch.float8_e4m3fn
    cases = []  # (name, fn, meta)

    def add(name, fn, **meta):
        cases.append((name, fn, meta))

    def c_merge_state(dtype, seq=7, off=0):
        def fn(F, g, dev):
            va = R(g, (seq, 4, 64), dtype, dev, offset=off)
            sa = R(g, (seq, 4), f32, dev, offset=off)
            vb = R(g, (seq, 4, 64), dtype, dev, offset=off)
            sb = R(g, (seq, 4), f32, dev, offset=off)
            vm, sm = F.merge_state(va, sa, vb, sb)
            rv, rs = ref_merge_state(va, sa, vb, sb)
            return {"v": vm, "s": sm}, {"v": rv, "s": rs}, {}
        return fn

    def c_merge_in_place(dtype, with_mask, seq=7, off=0):
        def fn(F, g, dev):
            v = R(g, (seq, 4, 64), dtype, dev, offset=off)
            s = R(g, (seq, 4), f32, dev, offset=off)
            vo = R(g, (seq, 4, 64), dtype, dev, offset=off)
            so = R(g, (seq, 4), f32, dev, offset=off)
            mask = (torch.arange(seq, device=dev) % 3 != 1) if with_mask else None
            rv, rs = ref_merge_state_in_place(v, s, vo, so, mask)
            if with_mask:
                F.merge_state_in_place(v, s, vo, so, mask=mask)
            else:
                F.merge_state_in_place(v, s, vo, so)
            return {"v": v, "s": s}, {"v": rv, "s": rs}, {}
        return fn

    def c_merge_states(dtype, seq=5, sets=3, off=0):
        def fn(F, g, dev):
            v = R(g, (seq, sets, 4, 64), dtype, dev, offset=off)
            s = R(g, (seq, sets, 4), f32, dev, offset=off)
            vm, sm = F.merge_states(v, s)
            rv, rs = ref_merge_states(v, s)
            return {"v": vm, "s": sm}, {"v": rv, "s": rs}, {}
        return fn

    def c_vlms(dtype, indptr=(0, 2, 5, 9), off=0):
        def fn(F, g, dev):
            n = indptr[-1]
            v = R(g, (n, 4, 64), dtype, dev, offset=off)
            s = R(g, (n, 4), f32, dev, offset=off)
            ip = torch.tensor(indptr, dtype=i32, device=dev)
            vm, sm = F.variable_length_merge_states(v, s, ip)
            rv, rs = ref_variable_length_merge_states(v, s, ip)
            return {"v": vm, "s": sm}, {"v": rv, "s": rs}, {}
        return fn

    def c_rms_norm(dtype, n, odtype=None, b=3, layout="contig", eps=1e-6, out_scale=None):
        def fn(F, g, dev):
            od = odtype or dtype
            if layout == "strided":
                x = RS(g, b, n, 3, dtype, dev)
            elif layout == "offset":
                x = R(g, (b, n), dtype, dev, offset=1)
            else:
                x = R(g, (b, n), dtype, dev)
            w = R(g, (n,), dtype, dev)
            if layout == "strided":
                out = torch.zeros(b, n + 5, dtype=od, device=dev)[:, 5:]
            else:
                out = torch.empty(b, n, dtype=od, device=dev)
            ref = ref_rms_norm(x, w, eps)
            if out_scale is not None:
                osc = torch.full((1,), out_scale, dtype=f32, device=dev)
                F.rms_norm(x, w, out, eps, out_scale=osc)
                ref = ref_scale_clamp(ref, osc, 448.0)
            else:
                F.rms_norm(x, w, out, eps)
            return {"out": out}, {"out": ref}, {}
        return fn

    def c_rms_add(dtype, n, with_out, b=3, layout="contig"):
        def fn(F, g, dev):
            eps = 1e-6
            if layout == "strided":   # rms_norm_add_residual asserts x.stride(0) == residual.stride(0)
                x = RS(g, b, n, 3, dtype, dev)
                r = RS(g, b, n, 3, dtype, dev)
            else:
                x = R(g, (b, n), dtype, dev)
                r = R(g, (b, n), dtype, dev)
            w = R(g, (n,), dtype, dev)
            rx, rr = ref_rms_norm_add_residual(x, r, w, eps)
            x0 = x.clone()
            if with_out:
                xo = torch.empty(b, n, dtype=dtype, device=dev)
                F.rms_norm_add_residual(x, r, w, eps, x_out=xo)
                return {"x_out": xo, "residual": r, "x_unchanged": x}, \
                       {"x_out": rx, "residual": rr, "x_unchanged": x0}, {"x_unchanged": 0.0}
            F.rms_norm_add_residual(x, r, w, eps)
            return {"x": x, "residual": r}, {"x": rx, "residual": rr}, {}
        return fn

    def c_silu(dtype, b, d, layout="contig", fp8_scales=None):
        def fn(F, g, dev):
            x = RS(g, b, 2 * d, 3, dtype, dev) if layout == "strided" else R(g, (b, 2 * d), dtype, dev)
            if fp8_scales is not None:
                xs = torch.full((1,), fp8_scales[0], dtype=f32, device=dev)
                os_ = torch.full((1,), fp8_scales[1], dtype=f32, device=dev)
                o = F.silu_and_mul(x, x_scale=xs, o_scale=os_, dtype=fp8)
                ref = ref_scale_clamp(ref_silu_and_mul(x, xs), os_, 448.0)
            else:
                o = F.silu_and_mul(x)
                ref = ref_silu_and_mul(x)
            return {"o": o}, {"o": ref}, {}
        return fn

    def c_gemm(which, dtype, M=200, K=96, N=130, layout="contig", with_c=False, alpha=1.0, beta=0.0,
               subtile=False):
        def fn(F, g, dev):
            if layout == "offset_bT":   # a: misaligned contiguous; b: (K, N) transposed view (b may be non-contig)
                a = R(g, (M, K), dtype, dev, offset=1)
                b = R(g, (N, K), dtype, dev).t()
            else:
                a = R(g, (M, K), dtype, dev)
                b = R(g, (K, N), dtype, dev)
            if which == "gemm_descriptor_persistent":   # b is (N, K)
                bt = R(g, (N, K), dtype, dev)
                o = F.gemm_descriptor_persistent(a, bt, EPILOGUE_SUBTILE=True) if subtile else \
                    F.gemm_descriptor_persistent(a, bt)
                return {"c": o}, {"c": a.double() @ bt.double().t()}, {}
            if with_c:
                c = R(g, (M, N), dtype, dev)
                ref = ref_gemm(a, b, c, alpha, beta)
                o = getattr(F, which)(a, b, c=c, alpha=alpha, beta=beta)
                return {"c": o, "c_is_out": torch.tensor([o.data_ptr() == c.data_ptr()])}, \
                       {"c": ref, "c_is_out": torch.tensor([True])}, {"c_is_out": 0.0}
            o = getattr(F, which)(a, b)
            return {"c": o}, {"c": ref_gemm(a, b)}, {}
        return fn

    def c_pos_ids(seg, packed):
        def fn(F, g, dev):
            s = torch.tensor(seg, dtype=i32, device=dev)
            p = torch.tensor(packed, dtype=i32, device=dev)
            o = F.build_pos_ids_from_segment_offsets_and_lengths(s, p)
            return {"pos": o}, {"pos": ref_build_pos_ids(s, p)}, {}
        return fn

    def c_cumsum(L=100, h=6, bias=False, softplus=False, layout="contig", chunk=64, limit=None):
        def fn(F, g, dev):
            if layout == "strided":   # (2, L, h) view of (2, L, h + 1) from column 1: strided, misaligned
                dt = R(g, (2, L, h + 1), b16, dev)[..., 1:]
            else:
                dt = R(g, (2, L, h), b16, dev)
            A = -torch.rand(h, generator=g, device=dev, dtype=f32)
            db = R(g, (h,), f32, dev) if bias else None
            kw = {}
            if bias:
                kw["dt_bias"] = db
            if softplus:
                kw["dt_softplus"] = True
            if limit is not None:
                kw["dt_limit"] = limit
            dA, dto = F.chunk_cumsum_fwd(dt, A, chunk, **kw)
            rdA, rdt = ref_chunk_cumsum(dt, A, chunk, db, softplus, limit or (0.0, float("inf")))
            return {"dA_cumsum": dA, "dt_out": dto}, {"dA_cumsum": rdA, "dt_out": rdt}, {}
        return fn

    # --- traced shapes and dtypes (as examples.py) ---
    for dt, tag in ((f16, "fp16"), (b16, "bf16")):
        add(f"merge_state/{tag}", c_merge_state(dt))
        add(f"merge_state_in_place/{tag}", c_merge_in_place(dt, False))
        add(f"merge_state_in_place_mask/{tag}", c_merge_in_place(dt, True))
        add(f"merge_states/{tag}", c_merge_states(dt))
        add(f"variable_length_merge_states/{tag}", c_vlms(dt))
        for n in (4096, 1000):
            add(f"rms_norm/{tag}/n{n}", c_rms_norm(dt, n))
        add(f"rms_norm_add_residual/{tag}/n1000", c_rms_add(dt, 1000, False))
        add(f"rms_norm_add_residual_xout/{tag}/n4096", c_rms_add(dt, 4096, True))
        add(f"silu_and_mul/{tag}/d1000", c_silu(dt, 5, 1000))
        add(f"silu_and_mul/{tag}/d4096", c_silu(dt, 5, 4096))
        add(f"gemm/{tag}", c_gemm("gemm", dt))
        add(f"gemm_persistent/{tag}", c_gemm("gemm_persistent", dt))
        add(f"gemm_persistent_c/{tag}", c_gemm("gemm_persistent", dt, with_c=True, alpha=0.5, beta=1.0))
        add(f"gemm_descriptor_persistent/{tag}", c_gemm("gemm_descriptor_persistent", dt, N=128))
        add(f"gemm_descriptor_persistent_subtile/{tag}",
            c_gemm("gemm_descriptor_persistent", dt, N=128, subtile=True))
    add("silu_and_mul_fp8_scaled/bf16", c_silu(b16, 5, 1000, fp8_scales=(0.5, 2.0)))
    add("rms_norm_fp8_out_scaled/bf16", c_rms_norm(b16, 1000, odtype=fp8, out_scale=2.0))
    add("build_pos_ids", c_pos_ids([0, 10, 30, 33], [0, 5, 12, 15]))
    add("chunk_cumsum_fwd/bf16", c_cumsum())
    add("chunk_cumsum_fwd_bias_softplus/bf16", c_cumsum(bias=True, softplus=True))

    # --- misaligned / strided / other runtime sizes, traced constexprs and dtypes ---
    add("merge_state/fp16/offset1_seq33", c_merge_state(f16, seq=33, off=1), kind="misaligned")
    add("merge_state_in_place_mask/bf16/offset1_seq33", c_merge_in_place(b16, True, seq=33, off=1),
        kind="misaligned")
    add("merge_states/fp16/offset1_seq9_sets5", c_merge_states(f16, seq=9, sets=5, off=1), kind="misaligned")
    add("variable_length_merge_states/bf16/offset1_empty_segment",
        c_vlms(b16, indptr=(0, 3, 3, 8, 12), off=1), kind="misaligned")
    add("rms_norm/bf16/n1000/strided_misaligned", c_rms_norm(b16, 1000, layout="strided"), kind="misaligned")
    add("rms_norm/fp16/n4096/offset1_b5", c_rms_norm(f16, 4096, b=5, layout="offset"), kind="misaligned")
    add("rms_norm_add_residual/fp16/n1000/strided_misaligned", c_rms_add(f16, 1000, False, layout="strided"),
        kind="misaligned")
    add("silu_and_mul/fp16/d1000/strided_misaligned_b6", c_silu(f16, 6, 1000, layout="strided"),
        kind="misaligned")
    add("gemm/fp16/a_offset1_b_transposed", c_gemm("gemm", f16, layout="offset_bT"), kind="misaligned")
    add("gemm_persistent/bf16/a_offset1_b_transposed", c_gemm("gemm_persistent", b16, layout="offset_bT"),
        kind="misaligned")
    add("gemm_descriptor_persistent/bf16/M77_N256_K64",
        c_gemm("gemm_descriptor_persistent", b16, M=77, K=64, N=256), kind="runtime_sizes")
    add("chunk_cumsum_fwd/bf16/strided_misaligned_L130",
        c_cumsum(L=130, layout="strided"), kind="misaligned")
    add("chunk_cumsum_fwd/bf16/dt_limit", c_cumsum(bias=True, softplus=True, limit=(0.1, 1.5)),
        kind="runtime_sizes")
    add("build_pos_ids/other_segments", c_pos_ids([0, 100, 2000, 2001, 2500], [0, 7, 1207, 1207, 1500]),
        kind="runtime_sizes")

    # --- untraced on purpose: the wheel should raise NotBuiltError (JIT just compiles) ---
    add("UNTRACED rms_norm fp16->bf16 out", c_rms_norm(f16, 1000, odtype=b16), kind="untraced",
        expect_not_built=True)
    add("UNTRACED rms_norm eps=1e-5 (EPS is a constexpr)", c_rms_norm(b16, 1000, eps=1e-5), kind="untraced",
        expect_not_built=True)
    return cases


# ----------------------------------------------------------------------------------------------------------
# lightning-attention cases
# ----------------------------------------------------------------------------------------------------------

def la_cases():
    import torch
    f16, b16 = torch.float16, torch.bfloat16
    cases = []

    def add(name, fn, **meta):
        cases.append((name, fn, meta))

    def c_attn(op, shape, dtype, layout="contig", backward=True):
        b, h, n, d, e = shape

        def fn(L, g, dev):
            def mk(sh, off):
                if layout == "offset":
                    return R(g, sh, dtype, dev, offset=off)
                if layout == "transposed":   # (b, n, h, x) memory, viewed as (b, h, n, x)
                    return R(g, (sh[0], sh[2], sh[1], sh[3]), dtype, dev).transpose(1, 2)
                return R(g, sh, dtype, dev)
            q = mk((b, h, n, d), 1).detach().requires_grad_(backward)
            k = mk((b, h, n, d), 3).detach().requires_grad_(backward)
            v = mk((b, h, n, e), 5).detach().requires_grad_(backward)
            do = mk((b, h, n, e), 7).detach()
            s = la_slopes(h).to(dev).to(torch.float32)
            if op == "lightning_attn_func":
                o = L.lightning_attn_func(q, k, v, s)
            elif op == "lightning_attn2":
                o = L.lightning_attn2(q, k, v, s)
            else:
                o = L.lightning_attn2_no_decay(q, k, v)
            outs = {"o": o}
            if backward:
                o.backward(do)
                outs.update(dq=q.grad, dk=k.grad, dv=v.grad)
            qd, kd, vd = (t.detach().double().requires_grad_(backward) for t in (q, k, v))
            ro = ref_linear_attn(qd, kd, vd, None if op == "lightning_attn2_no_decay" else s.double())
            refs = {"o": ro}
            if backward:
                ro.backward(do.double())
                refs.update(dq=qd.grad, dk=kd.grad, dv=vd.grad)
            tol = 1e-2 if dtype == f16 else 3e-2   # kernels use tl.dot on fp32 (tf32) operands
            return {k_: v_.detach() for k_, v_ in outs.items()}, {k_: v_.detach() for k_, v_ in refs.items()}, \
                {k_: tol for k_ in outs}
        return fn

    def c_srms(dtype, shape=(3, 7, 1000), layout="contig"):
        def fn(L, g, dev):
            x = R(g, shape, dtype, dev, offset=1 if layout == "offset" else 0).detach().requires_grad_(True)
            dy = R(g, shape, dtype, dev)
            norm = L.SimpleRMSNorm(shape[-1])
            y = norm(x)
            y.backward(dy)
            eps = srms_eps(dtype)
            xd = x.detach().double().requires_grad_(True)
            ry = ref_srms(xd, eps)
            ry.backward(dy.double())
            return {"y": y.detach(), "dx": x.grad}, {"y": ry.detach(), "dx": xd.grad}, {}
        return fn

    for dt, tag in ((f16, "fp16"), (b16, "bf16")):
        add(f"lightning_attn_func/{tag}/b2h4n100d64e64", c_attn("lightning_attn_func", (2, 4, 100, 64, 64), dt))
        add(f"lightning_attn_func/{tag}/b1h2n256d128e48", c_attn("lightning_attn_func", (1, 2, 256, 128, 48), dt))
        add(f"lightning_attn2_no_decay/{tag}/b2h4n100d64e64",
            c_attn("lightning_attn2_no_decay", (2, 4, 100, 64, 64), dt))
        add(f"SimpleRMSNorm/{tag}/3x7x1000", c_srms(dt))
    add("lightning_attn2/fp16/b2h4n100d64e64", c_attn("lightning_attn2", (2, 4, 100, 64, 64), f16))
    # misaligned (contiguous views with offsets: .contiguous() keeps them, so kernels see unaligned pointers)
    add("lightning_attn_func/bf16/b2h4n100d64e64/offset_views",
        c_attn("lightning_attn_func", (2, 4, 100, 64, 64), b16, layout="offset"), kind="misaligned")
    add("lightning_attn_func/fp16/b1h2n256d128e48/transposed_bnhd",
        c_attn("lightning_attn_func", (1, 2, 256, 128, 48), f16, layout="transposed"), kind="misaligned")
    add("lightning_attn2_no_decay/fp16/offset_views",
        c_attn("lightning_attn2_no_decay", (2, 4, 100, 64, 64), f16, layout="offset"), kind="misaligned")
    add("SimpleRMSNorm/bf16/3x7x1000/offset1", c_srms(b16, layout="offset"), kind="misaligned")
    add("SimpleRMSNorm/fp16/5x1000/runtime_rows", c_srms(f16, shape=(5, 1000)), kind="runtime_sizes")
    # untraced: n = 128 (n is a constexpr of every kernel; examples used n = 100 and 256)
    add("UNTRACED lightning_attn_func n=128", c_attn("lightning_attn_func", (2, 4, 128, 64, 64), f16),
        kind="untraced", expect_not_built=True)
    return cases


# ----------------------------------------------------------------------------------------------------------
# child: correctness worker
# ----------------------------------------------------------------------------------------------------------

def correctness_worker(lib, mode, src, outprefix, dev, extra, only, deadline):
    if mode == "wheel":   # test the wheel as installed: nothing from the working directory
        cwd = os.getcwd()
        sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
    if extra:
        sys.path.insert(0, extra)
    if mode == "jit":
        sys.path.insert(0, src)
    import torch
    res = {"lib": lib, "mode": mode, "python": sys.version.split()[0], "torch": torch.__version__,
           "device": dev, "cases": {}, "started": time.time()}
    json_path, pt_path = outprefix + ".json", outprefix + ".pt"
    if dev.startswith("cuda"):
        try:
            res["gpu"] = torch.cuda.get_device_name(0)
            res["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
        except Exception as e:
            res["gpu"] = _err(e)
    try:
        if mode == "wheel" and dev == "cpu" and os.environ.get("GPU_HUNTS50_MOCK_WHEEL") == "1":
            api = mock_api(lib)   # dry run only
        else:
            api = load_api(lib, mode)
        if mode == "jit" and dev == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
            dry_cpu_patches()
        res["origin"], res["import_errors"] = api.origin, api.errors
    except Exception as e:
        res["import_error"] = _err(e)
        _dump_json(json_path, res)
        print(f"[{lib}/{mode}] import failed: {_err(e)}", flush=True)
        return
    saved = {}
    cases = fi_cases() if lib == "fi" else la_cases()
    for name, fn, meta in cases:
        if only and not any(o in name for o in only):
            continue
        rec = {"kind": meta.get("kind", "traced")}
        if meta.get("expect_not_built"):
            rec["expect_not_built"] = True
        if deadline and time.time() > deadline:
            rec["skipped"] = "time budget"
            res["cases"][name] = rec
            continue
        t0 = time.time()
        try:
            g = torch.Generator(device=dev).manual_seed(_seed(name))
            outs, refs, tols = fn(api, g, dev)
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            cmp = {k: compare(outs[k], refs[k], tols.get(k)) for k in outs}
            rec["outputs"] = cmp
            rec["ok"] = all(c.get("ok") for c in cmp.values())
            saved[name] = {k: v.detach().cpu() for k, v in outs.items()}
        except Exception as e:
            rec["error"] = _err(e)
            rec["error_type"] = type(e).__name__
            rec["error_mro"] = [c.__name__ for c in type(e).__mro__][:6]
            if dev.startswith("cuda"):
                try:
                    torch.cuda.synchronize()
                except Exception as e2:
                    rec["cuda_state_after"] = _err(e2)
        rec["seconds"] = round(time.time() - t0, 3)
        res["cases"][name] = rec
        status = "ERROR " + rec["error"][:120] if "error" in rec else ("ok" if rec["ok"] else "MISMATCH")
        print(f"[{lib}/{mode}] {name}: {status} ({rec['seconds']}s)", flush=True)
        _dump_json(json_path, res)
        torch.save(saved, pt_path)
    # what got imported
    mods = sys.modules
    res["triton_in_sys_modules"] = ("triton" in mods) and (mods["triton"] is not None)
    res["triton_blocked"] = ("triton" in mods) and (mods["triton"] is None)
    res["source_modules_loaded"] = sorted(m for m in mods if m.split(".")[0] in ("flashinfer", "lightning_attn"))[:40]
    res["triton_modules_loaded"] = sorted(m for m in mods if m.split(".")[0] == "triton" and mods[m] is not None)[:10]
    res["finished"] = time.time()
    _dump_json(json_path, res)
    torch.save(saved, pt_path)
    print(f"[{lib}/{mode}] done", flush=True)


# ----------------------------------------------------------------------------------------------------------
# child: timing worker (both the wheel and the JIT source imported; Triton importable)
# ----------------------------------------------------------------------------------------------------------

def bench(contenders, dev, rounds=7, calls=20, warm=3):
    import torch
    out = {}
    live = {}
    for name, f in contenders.items():
        try:
            for _ in range(warm):
                f()
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            live[name] = f
        except Exception as e:
            out[name] = {"error": _err(e)}
    times = {k: [] for k in live}
    cuda = dev.startswith("cuda")
    for _ in range(rounds):
        for name, f in live.items():
            try:
                if cuda:
                    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    st.record()
                    for _ in range(calls):
                        f()
                    en.record()
                    en.synchronize()
                    times[name].append(st.elapsed_time(en) / calls)
                else:
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        f()
                    times[name].append((time.perf_counter() - t0) * 1e3 / calls)
            except Exception as e:
                out[name] = {"error": _err(e)}
    for name, ts in times.items():
        if name in out:
            continue
        out[name] = {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts),
                     "rounds_ms": ts}
    return out


def timing_worker(src_fi, src_la, outprefix, dev, extra_fi, extra_la, libs, rounds, calls):
    for p in (extra_fi, extra_la):
        if p:
            sys.path.insert(0, p)
    sys.path.insert(0, src_la)
    sys.path.insert(0, src_fi)
    import torch
    import torch.nn.functional as Fn
    res = {"device": dev, "rounds": rounds, "calls_per_round": calls, "ops": {}}
    json_path = outprefix + ".json"
    cuda = dev.startswith("cuda")
    if cuda:
        res["gpu"] = torch.cuda.get_device_name(0)

    def run_op(key, contenders):
        t0 = time.time()
        try:
            res["ops"][key] = bench(contenders, dev, rounds, calls)
        except Exception as e:
            res["ops"][key] = {"error": _err(e)}
        res["ops"][key]["_seconds"] = round(time.time() - t0, 2)
        print(f"[timing] {key}: " + ", ".join(
            f"{k}={v['median_ms']:.4f}ms" if isinstance(v, dict) and "median_ms" in v else f"{k}=ERR"
            for k, v in res["ops"][key].items() if k != "_seconds"), flush=True)
        _dump_json(json_path, res)

    g = torch.Generator(device=dev).manual_seed(1234)
    if "fi" in libs:
        try:
            W = load_api("fi", "wheel")
            J = load_api("fi", "jit")
            res["fi_origin"] = {"wheel": W.origin, "jit": J.origin, "import_errors": {"wheel": W.errors,
                                                                                      "jit": J.errors}}
            bf = torch.bfloat16
            x = R(g, (3, 4096), bf, dev)
            w = R(g, (4096,), bf, dev)
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            run_op("fi rms_norm bf16 (3,4096)", {
                "wheel": lambda: W.rms_norm(x, w, o1, 1e-6),
                "jit": lambda: J.rms_norm(x, w, o2, 1e-6),
                "torch": lambda: Fn.rms_norm(x, (4096,), w, 1e-6),
            })
            xs = R(g, (5, 8192), bf, dev)
            run_op("fi silu_and_mul bf16 (5,8192)", {
                "wheel": lambda: W.silu_and_mul(xs),
                "jit": lambda: J.silu_and_mul(xs),
                "torch": lambda: Fn.silu(xs[:, :4096]) * xs[:, 4096:],
            })
            a = R(g, (200, 96), torch.float16, dev)
            bt = R(g, (128, 96), torch.float16, dev)
            run_op("fi gemm_descriptor_persistent fp16 (200x96)@(128x96)^T", {
                "wheel": lambda: W.gemm_descriptor_persistent(a, bt),
                "jit": lambda: J.gemm_descriptor_persistent(a, bt),
                "torch": lambda: a @ bt.t(),
            })
        except Exception as e:
            res["fi_error"] = _err(e)
    if "la" in libs:
        try:
            W = load_api("la", "wheel")
            J = load_api("la", "jit")
            res["la_origin"] = {"wheel": W.origin, "jit": J.origin, "import_errors": {"wheel": W.errors,
                                                                                      "jit": J.errors}}
            bf = torch.bfloat16
            b, h, n, d, e = 2, 4, 100, 64, 64
            q, k, v = (R(g, (b, h, n, x_), bf, dev) for x_ in (d, d, e))
            s = la_slopes(h).to(dev).to(torch.float32)
            idx = torch.arange(n, device=dev)
            diff = (idx[:, None] - idx[None, :]).float()
            mask = torch.where(diff >= 0, torch.exp(-s.view(-1, 1, 1) * diff.clamp(min=0)),
                               torch.zeros((), device=dev)).to(bf)

            def torch_la(q_, k_, v_):
                return ((q_ @ k_.transpose(-1, -2)) * mask) @ v_

            run_op("la lightning_attn_func fwd bf16 b2h4n100d64e64", {
                "wheel": lambda: W.lightning_attn_func(q, k, v, s),
                "jit": lambda: J.lightning_attn_func(q, k, v, s),
                "torch": lambda: torch_la(q, k, v),
            })
            qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
            do = R(g, (b, h, n, e), bf, dev)

            def fb(f):
                def run():
                    o = f(qg, kg, vg)
                    o.backward(do)
                return run
            run_op("la lightning_attn_func fwd+bwd bf16 b2h4n100d64e64", {
                "wheel": fb(lambda a_, b_, c_: W.lightning_attn_func(a_, b_, c_, s)),
                "jit": fb(lambda a_, b_, c_: J.lightning_attn_func(a_, b_, c_, s)),
                "torch": fb(torch_la),
            })
            xr = R(g, (3, 7, 1000), bf, dev)
            nw, nj = W.SimpleRMSNorm(1000), J.SimpleRMSNorm(1000)
            run_op("la SimpleRMSNorm fwd bf16 (3,7,1000)", {
                "wheel": lambda: nw(xr),
                "jit": lambda: nj(xr),
                "torch": lambda: (xr.float() * torch.rsqrt(xr.float().pow(2).mean(-1, keepdim=True) + 1e-6)
                                  ).type_as(xr),
            })
        except Exception as e:
            res["la_error"] = _err(e)
    res["triton_imported"] = "triton" in sys.modules and sys.modules["triton"] is not None
    _dump_json(json_path, res)


def child_main(argv):
    kind = argv[1]
    if kind in ("wheel", "jit"):
        lib, mode, src, outprefix, dev, extra, only, deadline = argv[:8]
        correctness_worker(lib, mode, src, outprefix, dev, extra, [o for o in only.split(",") if o],
                           float(deadline))
    elif kind == "timing":
        (_, _, src_fi, src_la, outprefix, dev, extra_fi, extra_la, libs, rounds, calls) = argv[:11]
        timing_worker(src_fi, src_la, outprefix, dev, extra_fi, extra_la, libs.split(","), int(rounds),
                      int(calls))
    else:
        raise SystemExit(f"unknown child kind {kind}")


# ----------------------------------------------------------------------------------------------------------
# CPU self test of the references against the libraries' own torch code
# ----------------------------------------------------------------------------------------------------------

def selftest_refs(src_la):
    import torch
    import torch.nn.functional as Fn
    sys.path.insert(0, src_la)
    out = {}

    def chk(name, a, b, tol=1e-5):
        a, b = a.double(), b.double()
        err = float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
        out[name] = {"rel_err": err, "ok": err <= tol}
        print(f"  selftest {name}: rel_err={err:.3g} {'ok' if err <= tol else 'FAIL'}")

    g = torch.Generator().manual_seed(0)
    # lightning attention vs lightning_attn.ops.torch.linear_attn (the library's own reference, float32)
    from lightning_attn.ops.torch import linear_attn, SimpleRMSNormTorch
    from lightning_attn.utils import _build_slope_tensor
    for h in (4, 2, 3):
        chk(f"la_slopes h={h}", la_slopes(h), _build_slope_tensor(h), 0)
    for (b, h, n, d, e) in ((2, 4, 20, 8, 6), (1, 2, 33, 16, 16)):
        q, k, v = (torch.randn(b, h, n, x_, generator=g) for x_ in (d, d, e))
        s = la_slopes(h).float()
        chk(f"linear_attn decay {b,h,n,d,e}", ref_linear_attn(q.double(), k.double(), v.double(), s.double()),
            linear_attn(q, k, v, s), 1e-4)
        chk(f"linear_attn no decay {b,h,n,d,e}", ref_linear_attn(q.double(), k.double(), v.double(), None),
            linear_attn(q, k, v, None), 1e-4)
        # gradient of the reference vs autograd through the library's float32 reference
        qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        do = torch.randn(b, h, n, e, generator=g)
        ref_linear_attn(qd, kd, vd, s.double()).backward(do.double())
        linear_attn(qf, kf, vf, s).backward(do)
        for nm, a_, b_ in (("dq", qd, qf), ("dk", kd, kf), ("dv", vd, vf)):
            chk(f"linear_attn grad {nm} {b,h,n,d,e}", a_.grad, b_.grad, 1e-4)
    x = torch.randn(3, 7, 100, generator=g)
    chk("srms vs SimpleRMSNormTorch", ref_srms(x, 1e-6), SimpleRMSNormTorch(100, 1e-6)(x), 1e-6)
    # flashinfer refs
    w = torch.randn(100, generator=g)
    xx = torch.randn(5, 100, generator=g)
    chk("rms_norm vs F.rms_norm", ref_rms_norm(xx, w, 1e-6), Fn.rms_norm(xx.double(), (100,), w.double(), 1e-6))
    va, vb = torch.randn(7, 4, 64, generator=g), torch.randn(7, 4, 64, generator=g)
    sa, sb = torch.randn(7, 4, generator=g) * 3, torch.randn(7, 4, generator=g) * 3
    vm, sm = ref_merge_state(va, sa, vb, sb)
    wa, wb = torch.exp2(sa.double()), torch.exp2(sb.double())
    chk("merge_state v vs direct formula", vm, (wa[..., None] * va.double() + wb[..., None] * vb.double())
        / (wa + wb)[..., None], 1e-12)
    chk("merge_state s vs logaddexp2", sm, torch.logaddexp2(sa.double(), sb.double()), 1e-12)
    mask = torch.tensor([1, 0, 1, 1, 0, 1, 1], dtype=torch.bool)
    vi, si = ref_merge_state_in_place(va, sa, vb, sb, mask)
    chk("merge_state_in_place masked rows kept", vi[~mask], va[~mask].double(), 0)
    chk("merge_state_in_place unmasked rows merged", vi[mask], vm[mask], 0)
    v3, s3 = torch.randn(9, 4, 64, generator=g), torch.randn(9, 4, generator=g)
    ip = torch.tensor([0, 3, 3, 6, 9], dtype=torch.int32)
    rv, rs = ref_variable_length_merge_states(v3, s3, ip)
    m2v, m2s = ref_merge_states(v3[3:6].unsqueeze(0), s3[3:6].unsqueeze(0))
    chk("vlms segment vs merge_states", rv[2], m2v[0], 0)
    out["vlms empty segment"] = {"ok": bool((rv[1] == 0).all() and (rs[1] == -math.inf).all())}
    print("  selftest vlms empty segment:", out["vlms empty segment"])
    # chunk cumsum vs a naive loop
    dt = torch.randn(2, 70, 3, generator=g)
    A = -torch.rand(3, generator=g)
    db = torch.randn(3, generator=g)
    dA, dto = ref_chunk_cumsum(dt, A, 32, db, True, (0.0, float("inf")))
    naive_dt = torch.zeros(2, 3, 3, 32, dtype=torch.float64)
    naive_dA = torch.zeros(2, 3, 3, 32, dtype=torch.float64)
    for bi in range(2):
        for hi in range(3):
            for c in range(3):
                acc = 0.0
                for j in range(32):
                    t = c * 32 + j
                    val = 0.0
                    if t < 70:
                        val = float(dt[bi, t, hi]) + float(db[hi])
                        val = math.log1p(math.exp(val)) if val <= 20 else val
                        val = max(val, 0.0)
                    naive_dt[bi, hi, c, j] = val
                    acc += val * float(A[hi])
                    naive_dA[bi, hi, c, j] = acc
    chk("chunk_cumsum dt_out vs naive", dto, naive_dt, 1e-12)
    chk("chunk_cumsum dA_cumsum vs naive", dA, naive_dA, 1e-12)
    chk("build_pos_ids", ref_build_pos_ids(torch.tensor([0, 10, 30, 33]), torch.tensor([0, 5, 12, 15])).double(),
        torch.tensor([0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 15, 16, 30, 31, 32]).double(), 0)
    chk("silu_and_mul", ref_silu_and_mul(xx), Fn.silu(xx[:, :50].double()) * xx[:, 50:].double(), 1e-12)
    return out


# ----------------------------------------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------------------------------------

def fmt_case(rec):
    if rec is None:
        return "-"
    if "skipped" in rec:
        return "SKIPPED(" + rec["skipped"] + ")"
    if "error" in rec:
        return "ERR " + rec["error"][:90]
    worst = max((o.get("rel_err", float("inf")) for o in rec["outputs"].values()), default=0.0)
    nf = sum(o.get("nonfinite_mismatch", 0) for o in rec["outputs"].values())
    return ("ok" if rec.get("ok") else "MISMATCH") + f" rel={worst:.2e}" + (f" nonfinite_mismatch={nf}" if nf else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src-fi", default="/tmp/hunt_fi/fi", help="directory holding the flashinfer/ package")
    ap.add_argument("--src-la", default="/tmp/hunt_fi/la", help="directory holding the lightning_attn/ package")
    ap.add_argument("--json", default="gpu_hunts50.json")
    ap.add_argument("--libs", default="fi,la")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names to run")
    ap.add_argument("--wheel-path-fi", default="", help="extra sys.path entry for the fi wheel (unzipped)")
    ap.add_argument("--wheel-path-la", default="", help="extra sys.path entry for the la wheel (unzipped)")
    ap.add_argument("--budget", type=float, default=140.0, help="seconds for the whole run")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--serial", action="store_true", help="run the correctness children one at a time")
    ap.add_argument("--dry-cpu", action="store_true",
                    help="structural test without a GPU: device cpu, JIT under TRITON_INTERPRET=1, serial")
    ap.add_argument("--dry-mock-wheel", action="store_true",
                    help="with --dry-cpu: a torch stand-in replaces the wheel (tests the plumbing)")
    ap.add_argument("--selftest-refs", action="store_true", help="CPU: check the references, then exit")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    src_fi, src_la = os.path.abspath(args.src_fi), os.path.abspath(args.src_la)

    if args.selftest_refs:
        r = selftest_refs(src_la)
        _dump_json(args.json, {"selftest_refs": r})
        bad = [k for k, v in r.items() if not v.get("ok")]
        print("selftest:", "all ok" if not bad else f"FAILED {bad}")
        sys.exit(1 if bad else 0)

    t_start = time.time()
    dev = "cpu" if args.dry_cpu else args.device
    serial = args.serial or args.dry_cpu
    libs = [l for l in args.libs.split(",") if l]
    extra = {"fi": args.wheel_path_fi, "la": args.wheel_path_la}
    src = {"fi": src_fi, "la": src_la}
    for lib in libs:
        pkg = {"fi": "flashinfer", "la": "lightning_attn"}[lib]
        if not os.path.isdir(os.path.join(src[lib], pkg)):
            print(f"WARNING: {src[lib]}/{pkg} not found: the JIT run of {lib} will fail to import")
    timing_reserve = 0 if args.no_timing else 30
    deadline = t_start + max(30.0, args.budget - timing_reserve)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    procs = []
    for lib in libs:
        for mode in ("wheel", "jit"):
            prefix = f"{TMP_PREFIX}_{lib}_{mode}"
            for suf in (".json", ".pt", ".log"):
                try:
                    os.remove(prefix + suf)
                except OSError:
                    pass
            cenv = dict(env)
            if args.dry_cpu and mode == "jit":
                cenv["TRITON_INTERPRET"] = "1"
            if args.dry_cpu and args.dry_mock_wheel and mode == "wheel":
                cenv["GPU_HUNTS50_MOCK_WHEEL"] = "1"
            cmd = [sys.executable, "-c", CHILD_CODE, HERE, lib, mode, src[lib], prefix, dev, extra[lib],
                   args.only, str(deadline - 5)]
            procs.append((lib, mode, prefix, cmd, cenv))
    results = {"argv": sys.argv, "device": dev, "correctness": {}, "wheel_vs_jit": {}, "untraced": {},
               "timing": None, "child_status": {}}

    def launch(item):
        lib, mode, prefix, cmd, cenv = item
        log = open(prefix + ".log", "w")
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=cenv), log

    running = []
    if serial:
        for item in procs:
            p, log = launch(item)
            try:
                rc = p.wait(timeout=max(1.0, deadline + 5 - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = "killed (timeout)"
                p.wait()
            log.close()
            results["child_status"][f"{item[0]}/{item[1]}"] = rc
    else:
        for item in procs:
            running.append((item, *launch(item)))
        for item, p, log in running:
            try:
                rc = p.wait(timeout=max(1.0, deadline + 5 - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = "killed (timeout)"
                p.wait()
            log.close()
            results["child_status"][f"{item[0]}/{item[1]}"] = rc

    import torch
    for lib in libs:
        per = {}
        saved = {}
        for mode in ("wheel", "jit"):
            prefix = f"{TMP_PREFIX}_{lib}_{mode}"
            try:
                with open(prefix + ".json") as f:
                    per[mode] = json.load(f)
            except Exception as e:
                per[mode] = {"error": f"no results: {_err(e)}"}
            try:
                with open(prefix + ".log") as f:
                    per[mode]["log_tail"] = f.read()[-3000:]
            except Exception:
                pass
            try:
                saved[mode] = torch.load(prefix + ".pt")
            except Exception as e:
                saved[mode] = {}
                per[mode]["saved_error"] = _err(e)
            per[mode]["saved_outputs"] = prefix + ".pt"
        results["correctness"][lib] = per
        wj = {}
        for case in sorted(set(saved["wheel"]) & set(saved["jit"])):
            wj[case] = {}
            for k in saved["wheel"][case]:
                if k in saved["jit"][case]:
                    try:
                        wj[case][k] = wheel_vs_jit(saved["wheel"][case][k], saved["jit"][case][k])
                    except Exception as e:
                        wj[case][k] = {"error": _err(e)}
        results["wheel_vs_jit"][lib] = wj
        wcases = per["wheel"].get("cases", {}) if isinstance(per["wheel"], dict) else {}
        for name, rec in wcases.items():
            if rec.get("expect_not_built"):
                results["untraced"][f"{lib}: {name}"] = {
                    "error_type": rec.get("error_type"), "error": rec.get("error"),
                    "error_mro": rec.get("error_mro"),
                    "as_expected": bool(rec.get("error_type") and "NotBuilt" in rec["error_type"]),
                    "ran_instead": "outputs" in rec}

    if not args.no_timing:
        prefix = f"{TMP_PREFIX}_timing"
        try:
            os.remove(prefix + ".json")
        except OSError:
            pass
        rounds, calls = (2, 2) if args.dry_cpu else (args.rounds, args.calls)
        cenv = dict(env)
        if args.dry_cpu:
            cenv["TRITON_INTERPRET"] = "1"
        cmd = [sys.executable, "-c", CHILD_CODE, HERE, "-", "timing", src_fi, src_la, prefix, dev,
               extra["fi"], extra["la"], ",".join(libs), str(rounds), str(calls)]
        remaining = max(15.0, t_start + args.budget - time.time())
        with open(prefix + ".log", "w") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=cenv)
            try:
                rc = p.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rc = "killed (timeout)"
        results["child_status"]["timing"] = rc
        try:
            with open(prefix + ".json") as f:
                results["timing"] = json.load(f)
        except Exception as e:
            results["timing"] = {"error": _err(e)}
        try:
            with open(prefix + ".log") as f:
                results["timing"]["log_tail"] = f.read()[-2000:]
        except Exception:
            pass

    results["elapsed_s"] = round(time.time() - t_start, 1)
    # ---------------- summary ----------------
    print("=" * 100)
    print(f"gpu_hunts50: device={dev}  elapsed={results['elapsed_s']}s  children={results['child_status']}")
    for lib in libs:
        per = results["correctness"][lib]
        print("-" * 100)
        for mode in ("wheel", "jit"):
            r = per.get(mode, {})
            extra_info = ""
            if mode == "wheel":
                extra_info = (f" triton_blocked={r.get('triton_blocked')} triton_loaded={r.get('triton_in_sys_modules')}"
                              f" source_modules={r.get('source_modules_loaded')}")
            print(f"[{lib}] {mode}: origin={r.get('origin')} import_errors={r.get('import_errors') or r.get('import_error') or r.get('error')}{extra_info}")
        wc = per.get("wheel", {}).get("cases", {})
        jc = per.get("jit", {}).get("cases", {})
        names = list(dict.fromkeys(list(wc) + list(jc)))
        print(f"{'case':58s} | {'wheel vs fp64 ref':34s} | {'jit vs fp64 ref':34s} | wheel vs jit")
        for name in names:
            wjd = results["wheel_vs_jit"].get(lib, {}).get(name)
            if wjd:
                if any("error" in v for v in wjd.values()):
                    wjs = "ERR " + "; ".join(v.get("error", "") for v in wjd.values() if "error" in v)[:60]
                elif all(v["bitwise_equal"] for v in wjd.values()):
                    wjs = "bitwise"
                else:
                    wjs = "DIFF rel=" + f"{max(v['rel_diff'] for v in wjd.values()):.3g}" + \
                          f" n={sum(v['n_diff_elems'] or 0 for v in wjd.values())}"
            else:
                wjs = "-"
            print(f"{name[:58]:58s} | {fmt_case(wc.get(name))[:34]:34s} | {fmt_case(jc.get(name))[:34]:34s} | {wjs}")
    if results["untraced"]:
        print("-" * 100)
        print("untraced on purpose (wheel):")
        for k, v in results["untraced"].items():
            print(f"  {k}: {'as expected' if v['as_expected'] else 'UNEXPECTED'}: "
                  f"{v.get('error') or ('ran: ' + str(v.get('ran_instead')))}")
    t = results.get("timing")
    if t and isinstance(t, dict):
        print("-" * 100)
        print("timing (ms per call: median [min-max]):")
        for op, r in (t.get("ops") or {}).items():
            parts = []
            for c in ("wheel", "jit", "torch"):
                x = r.get(c)
                if isinstance(x, dict) and "median_ms" in x:
                    parts.append(f"{c} {x['median_ms']:.4f} [{x['min_ms']:.4f}-{x['max_ms']:.4f}]")
                elif isinstance(x, dict):
                    parts.append(f"{c} ERR {x.get('error', '')[:80]}")
            print(f"  {op}: " + " | ".join(parts))
        for k in ("fi_error", "la_error", "error"):
            if k in t:
                print(f"  timing {k}: {t[k]}")
    _dump_json(args.json, results)
    print(f"JSON written to {args.json}")


if __name__ == "__main__":
    main()
