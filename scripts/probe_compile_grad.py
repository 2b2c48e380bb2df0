"""What Dynamo makes of each term of ``runtime.exports.without_grad`` on this host's torch (session 47's open question).

On the H200 hosts' torch 2.11, a compiled call of an op with no backward in the manifest took the custom op although
its input needed gradients (no gradient came back; ``benchmarks/results/session47/r5/probes.txt``), while torch 2.13
on the CPU machine broke the graph as meant. Session 48 ran this there: 2.11's Dynamo folds ``is_exporting()`` to
True in any trace, torch.compile's included (pytorch#176347; 2.13 reads the flag torch.export sets), so
``without_grad`` now reads that flag, ``torch.compiler._is_exporting_flag``, itself. This prints each term as traced
under ``torch.compile`` and under strict and non-strict ``torch.export``.

    python scripts/probe_compile_grad.py      (a CUDA or CPU torch; no wheel needed)
"""

from __future__ import annotations

import json

import torch


def terms(x: torch.Tensor) -> torch.Tensor:
    bits = [torch.compiler.is_exporting(), torch.compiler.is_compiling(), torch.is_grad_enabled(),
            x.requires_grad, any(isinstance(a, torch.Tensor) and a.requires_grad for a in (x,)),
            bool(getattr(torch.compiler, "_is_exporting_flag", False))]
    return x + sum(float(b) * 10 ** i for i, b in enumerate(bits))


def decode(value: float) -> dict[str, bool]:
    names = ["is_exporting", "is_compiling", "is_grad_enabled", "requires_grad", "any(requires_grad)",
             "_is_exporting_flag"]
    digits = str(round(value)).rjust(len(names), "0")[::-1]
    return {n: d == "1" for n, d in zip(names, digits)}


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.zeros(1, device=device, requires_grad=True)
    out: dict[str, object] = {"torch": torch.__version__, "eager": decode(terms(x).item())}
    for fullgraph in (True, False):
        torch._dynamo.reset()
        compiled = torch.compile(terms, backend="aot_eager", fullgraph=fullgraph)
        out[f"compile(fullgraph={fullgraph})"] = decode(compiled(x).item())

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return terms(x)

    for strict in (True, False):
        try:
            ep = torch.export.export(M(), (x,), strict=strict)
            out[f"export(strict={strict})"] = decode(ep.module()(x).item())
        except Exception as exc:  # (an export that refuses says so)
            out[f"export(strict={strict})"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
