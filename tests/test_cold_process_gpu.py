"""A fresh process's first call through the wheel imports no Triton and starts no compiler process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

NO_TRITON = textwrap.dedent("""
    import importlib.util, json, os, subprocess, sys, tempfile, time

    # Emulate an environment without Triton: the site-packages directories are replaced by a directory of
    # links to everything in them except triton, so `import triton` fails as if it were not installed.
    shadow = tempfile.mkdtemp()
    site_dirs = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    for d in site_dirs:
        for entry in os.listdir(d):
            if entry.split("-")[0].split(".")[0] == "triton" or os.path.exists(os.path.join(shadow, entry)):
                continue
            os.symlink(os.path.join(d, entry), os.path.join(shadow, entry))
    sys.path[:] = [p for p in sys.path if p not in site_dirs] + [shadow]
    assert importlib.util.find_spec("triton") is None

    spawned = []
    real_popen_init = subprocess.Popen.__init__
    def popen_init(self, *a, **k):
        spawned.append(repr(a[0] if a else k.get("args")))
        real_popen_init(self, *a, **k)
    subprocess.Popen.__init__ = popen_init
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "system"):
        if hasattr(os, name):
            real = getattr(os, name)
            def wrapper(*a, _real=real, _name=name, **k):
                spawned.append(_name)
                return _real(*a, **k)
            setattr(os, name, wrapper)
""")
"""A child process's prelude: Triton unimportable, and every child process or exec it starts recorded in
``spawned``."""

CHILD = NO_TRITON + textwrap.dedent("""
    t0 = time.perf_counter()
    import torch
    import forge_kernels
    t_import = time.perf_counter()
    a = torch.randn(1000, 1000, device="cuda", dtype=torch.float16)
    b = torch.randn(1000, 1000, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    c = forge_kernels.matmul(a, b)
    y = forge_kernels.softmax(c.float())
    z = forge_kernels.vector_add(a, b)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    err = ((c.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm()).item()
    print(json.dumps({"triton_modules": sorted(m for m in sys.modules if m.split(".")[0] == "triton"),
                      "forge_aot_modules": sorted(m for m in sys.modules if m.split(".")[0] == "forge_aot"),
                      "package": forge_kernels.__file__, "spawned": spawned, "rel_err": err,
                      "first_calls_s": t2 - t1, "import_s": t_import - t0}))
""")


@pytest.mark.gpu
def test_fresh_process_first_call_needs_no_triton_and_no_compiler(packaged) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/nonexistent", "HOME": "/tmp"} | {k: v for k, v in __import__("os").environ
                                                                            .items() if k.startswith(("CUDA", "LD_"))})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["triton_modules"] == [] and result["forge_aot_modules"] == []
    assert result["spawned"] == [], result["spawned"]
    assert result["rel_err"] < 2e-3
    # Three first calls, module loads included: milliseconds, not the seconds a JIT compile takes.
    assert result["first_calls_s"] < 0.5, result
