"""Host code extraction: kernel lines blanked, line numbers kept, Triton use in host code refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge_aot.errors import SourceError
from forge_aot.sourcesplit import parse_source
from tests.conftest import REPO


def test_host_code_keeps_line_numbers_and_drops_kernels() -> None:
    path = REPO / "kernels" / "matmul.py"
    src = parse_source(path)
    original = path.read_text().splitlines()
    host = src.host_source.splitlines()
    assert len(host) == len(original)
    assert "matmul_kernel" in src.kernels and "@triton.jit" not in src.host_source
    assert "import triton" not in src.host_source
    line = next(i for i, text in enumerate(original) if text.startswith("def matmul("))
    assert host[line] == original[line]
    assert src.kernel_refs["matmul"] == {"matmul_kernel"}
    params = [(p.name, p.constexpr) for p in src.kernels["matmul_kernel"]]
    assert params[0] == ("a_ptr", False) and params[-1] == ("GROUP_M", True)


@pytest.mark.parametrize(("body", "message"), [
    ("def op(x):\n    return triton.language.float32\n", "triton.language"),
    ("def op(x):\n    import triton\n    return x\n", "imports Triton"),
    ("DTYPE = tl.float16\n\ndef op(x):\n    return DTYPE\n", "defined with Triton"),
])
def test_host_code_may_not_need_triton(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "k.py"
    f.write_text("import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x):\n    pass\n\n" + body)
    with pytest.raises(SourceError, match=message):
        parse_source(f)


def test_autotune_decorator_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "k.py"
    f.write_text("import triton\n\n@triton.autotune(configs=[], key=[])\n@triton.jit\ndef k(x):\n    pass\n")
    with pytest.raises(SourceError, match="forge-aot tunes from the manifest"):
        parse_source(f)
