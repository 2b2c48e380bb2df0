"""What planning costs. Tuning inputs are traced on the meta device without torch's Python meta kernels (which
import sympy and Dynamo): the shortcuts give what torch's own meta kernels give, and planning the repository's
manifest imports neither. Triton's version is read without importing Triton."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from forge_aot.trace import meta_random_factories  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _meta(*shape: int, dtype: object = None) -> object:
    return torch.empty(*shape, device="meta", dtype=dtype or torch.float32)


CALLS = {
    "randn sizes": lambda: torch.randn(7, 33, device="meta", dtype=torch.float16),
    "randn tuple": lambda: torch.randn((5, 3), device="meta"),
    "randn size kw requires_grad": lambda: torch.randn(size=(4,), device="meta", requires_grad=True),
    "rand": lambda: torch.rand(9, device="meta", dtype=torch.bfloat16),
    "randint high size": lambda: torch.randint(10, (3, 4), device="meta"),
    "randint low high size dtype": lambda: torch.randint(-5, 5, (6,), device="meta", dtype=torch.int32),
    "randn_like": lambda: torch.randn_like(_meta(3, 5)),
    "randn_like dtype": lambda: torch.randn_like(_meta(3, 5), dtype=torch.float16),
    "empty_like contiguous": lambda: torch.empty_like(_meta(2, 3, 4)),
    "empty_like transposed": lambda: torch.empty_like(_meta(6, 10).t()),
    "empty_like sliced": lambda: torch.empty_like(_meta(6, 10)[:, 1:]),
    "zeros_like": lambda: torch.zeros_like(_meta(4, 4, dtype=torch.int8)),
    "full_like": lambda: torch.full_like(_meta(3), 2.5),
    "randint_like": lambda: torch.randint_like(_meta(3, 2), 7),
    "arange int": lambda: torch.arange(10, device="meta"),
    "arange start end step": lambda: torch.arange(3, 20, 4, device="meta"),
    "arange float": lambda: torch.arange(0.0, 1.0, 0.3, device="meta"),
    "normal_": lambda: _meta(5, 5).normal_(),
    "uniform_": lambda: _meta(5).uniform_(-1, 1),
    "fp16 times int": lambda: _meta(4, 6, dtype=torch.float16) * 4,
    "int times float": lambda: _meta(4, dtype=torch.int32) * 0.5,
    "float plus fp16 tensor": lambda: _meta(4, 6) + _meta(4, 6, dtype=torch.float16),
    "broadcast add": lambda: _meta(4, 6) + _meta(6),
    "both broadcast": lambda: _meta(4, 1) + _meta(1, 6),
    "rsub": lambda: 1 - _meta(3, dtype=torch.bfloat16),
    "int true division": lambda: _meta(3, dtype=torch.int64) / 2,
    "int div by tensor": lambda: torch.div(_meta(3, dtype=torch.int16), _meta(3, dtype=torch.int16)),
    "neg": lambda: -_meta(2, 2, dtype=torch.float16),
    "abs": lambda: torch.abs(_meta(5, dtype=torch.int8)),
    "add alpha": lambda: torch.add(_meta(3), _meta(3), alpha=2),
    "mul_ in place": lambda: _meta(3, 3).mul_(2),
    "add_ broadcast in place": lambda: _meta(3, 3).add_(_meta(3)),
    "transposed times scalar": lambda: _meta(5, 8).t() * 2,
}


def _describe(t: object) -> tuple[object, ...]:
    return (tuple(t.shape), t.dtype, t.stride(), t.requires_grad, t.is_leaf, t.device.type)  # type: ignore[attr-defined]


def _leaf(*shape: int) -> object:
    return torch.empty(*shape, device="meta", requires_grad=True)


def _size1_transposed() -> object:
    return torch.empty(2, 1, 8, device="meta").transpose(0, 1)  # contiguous, yet strides (8, 8, 1)


CALLS.update({
    "requires_grad times scalar": lambda: _leaf(4) * 2,
    "requires_grad plus plain": lambda: _meta(4) + _leaf(4),
    "requires_grad under no_grad": lambda: _no_grad(lambda: _leaf(4) * 2),
    "in place on a leaf that requires grad": lambda: _leaf(3).mul_(2),
    "in place with an operand that requires grad": lambda: _meta(3).add_(_leaf(3)),
    "size-1 strides times tensor": lambda: _size1_transposed() * _meta(8),
    "empty_like of size-1 strides": lambda: torch.empty_like(_size1_transposed()),
    "arange float bounds int dtype": lambda: torch.arange(2.5, dtype=torch.int64, device="meta"),
    "arange requires_grad": lambda: torch.arange(0.0, 3.0, device="meta", requires_grad=True),
    "arange negative": lambda: torch.arange(-2, device="meta"),
    "arange backwards": lambda: torch.arange(10, 0, device="meta"),
    "arange step 0": lambda: torch.arange(0, 10, 0, device="meta"),
    "arange backwards step": lambda: torch.arange(10, 0, -3, device="meta"),
    "randn of integers": lambda: torch.randn(3, device="meta", dtype=torch.int32),
    "randn_like of integers": lambda: torch.randn_like(_meta(3, dtype=torch.int64)),
    "randint low above high": lambda: torch.randint(5, 2, (3,), device="meta"),
    "randint requires_grad": lambda: torch.randint(0, 5, (3,), device="meta", requires_grad=True),
    "normal_ of integers": lambda: _meta(3, dtype=torch.int32).normal_(),
    "normal_ negative std": lambda: _meta(3).normal_(0.0, -1.0),
    "uniform_ backwards": lambda: _meta(3).uniform_(1.0, -1.0),
    "exponential_": lambda: _meta(3).exponential_(),
    "negated booleans": lambda: -_meta(3, dtype=torch.bool),
    "subtracted booleans": lambda: _meta(3, dtype=torch.bool) - _meta(3, dtype=torch.bool),
    "int add float alpha": lambda: torch.add(_meta(3, dtype=torch.int32), _meta(3, dtype=torch.int32), alpha=0.5),
    "shapes that do not broadcast": lambda: _meta(3, 4) + _meta(5),
    "tensor rtruediv tensor": lambda: _meta(3, dtype=torch.int64).__rtruediv__(_meta(3, dtype=torch.float16)),
    "sparse layout": lambda: torch.randn(3, 3, device="meta", layout=torch.sparse_coo),
    "pinned": lambda: torch.randn(3, device="meta", pin_memory=True),
    "requires_grad chain then in place": lambda: (_leaf(4, 4) * 0.02).add_(1),
    "int in-place true division": lambda: torch.randint(0, 10, (3,), device="meta").__itruediv__(2),
    "int div_": lambda: _meta(3, dtype=torch.int64).div_(2),
    "abs of complex": lambda: torch.abs(_meta(3, dtype=torch.complex64)),
    "abs_ of complex": lambda: _meta(3, dtype=torch.complex64).abs_(),
    "randint beyond int64": lambda: torch.randint(0, 2 ** 70, (2,), device="meta"),
    "complex alpha": lambda: torch.add(_meta(3), _meta(3), alpha=1j),
    "arange to infinity": lambda: torch.arange(0, float("inf"), device="meta"),
})


def _no_grad(fn: object) -> object:
    with torch.no_grad():
        return fn()  # type: ignore[operator]


def _outcome(fn: object) -> object:
    try:
        return _describe(fn())  # type: ignore[operator]
    except Exception as exc:  # torch's refusal: the shortcuts must refuse alike
        return type(exc).__name__


@pytest.mark.parametrize("name", sorted(CALLS))
def test_meta_shortcuts_match_torch(name: str) -> None:
    """The same tensor (shape, dtype, strides, requires_grad), or the same refusal, with or without them."""
    with meta_random_factories():
        ours = _outcome(CALLS[name])
    assert ours == _outcome(CALLS[name])


def test_in_place_on_meta_returns_the_same_tensor() -> None:
    t = _meta(4)
    with meta_random_factories():
        assert t.normal_() is t
        assert t.mul_(3) is t


def test_planning_the_repository_imports_neither_sympy_nor_dynamo() -> None:
    """The plan's tracing of every tuning input on the meta device stays off torch's Python meta kernels (seconds
    of imports on a busy GPU host, paid by every forge-aot tune and build)."""
    code = ("import json, sys\nfrom forge_aot.manifest import load_manifest\nfrom forge_aot.plan import make_plan\n"
            "plan = make_plan(load_manifest('kernel_manifest.toml'), ['sm_90'])\n"
            "print(json.dumps({'entries': len(plan.entries), 'sympy': 'sympy' in sys.modules, "
            "'dynamo': 'torch._dynamo' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["entries"] > 0
    assert result == {"entries": result["entries"], "sympy": False, "dynamo": False}


def test_triton_version_is_read_without_importing_triton() -> None:
    """The parent of a tune or build never imports Triton for its version (the provenance it compares)."""
    code = ("import json, sys\nfrom forge_aot.compiler import triton_version\nv = triton_version()\n"
            "imported = 'triton' in sys.modules\nimport triton\n"
            "print(json.dumps([v, imported, triton.__version__, triton_version()]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    read, imported, real, again = json.loads(out.stdout.strip().splitlines()[-1])
    assert (read, imported, again) == (real, False, real)
