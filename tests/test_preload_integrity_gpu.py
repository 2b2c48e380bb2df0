"""preload() before CUDA-graph capture, and binaries checked against their recorded sha256 when loaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.gpu
def test_preload_then_graph_capture_replays_like_eager(packaged) -> None:
    import torch

    backend_loaded = packaged.preload()
    assert backend_loaded > 0
    x = torch.randn(300, 1000, device="cuda")
    a = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 384, device="cuda", dtype=torch.float16)
    # on Hopper this one takes the persistent TMA kernel, whose descriptor scratch is allocated in the capture
    big = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    eager = (packaged.softmax(x), packaged.matmul(a, b), packaged.vector_add(x, x), packaged.matmul(big, big))
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the side stream, as torch's docs ask
        packaged.softmax(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = (packaged.softmax(x), packaged.matmul(a, b), packaged.vector_add(x, x), packaged.matmul(big, big))
    # nothing was loaded during the capture: preload had loaded every binary this GPU runs
    assert packaged.preload() == backend_loaded
    x.copy_(torch.randn_like(x))
    a.copy_(torch.randn_like(a))
    big.copy_(torch.randn_like(big))
    graph.replay()
    torch.cuda.synchronize()
    fresh = (packaged.softmax(x), packaged.matmul(a, b), packaged.vector_add(x, x), packaged.matmul(big, big))
    for got, want in zip(captured, fresh):
        assert torch.equal(got, want)
    assert not torch.equal(captured[0], eager[0])  # the replay computed on the new inputs


CHILD = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import forge_kernels
x = torch.randn(4096, device="cuda")
try:
    forge_kernels.vector_add(x, x)
    torch.cuda.synchronize()
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


@pytest.mark.gpu
def test_tampered_binary_is_never_launched(packaged, tmp_path: Path) -> None:
    copy = tmp_path / "site"
    shutil.copytree(Path(packaged.__file__).parent, copy / "forge_kernels")
    tampered = sorted((copy / "forge_kernels" / "_forge" / "bin" / "add").rglob("*.cubin"))
    assert tampered
    for path in tampered:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    out = subprocess.run([sys.executable, "-c", CHILD, str(copy)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    error = json.loads(out.stdout.strip().splitlines()[-1])["error"]
    assert error.startswith("IntegrityError") and "_forge/bin/add/" in error and "not launched" in error
