"""The runtime's optional C launch path (``runtime/_fastlaunch.c``), compiled for a wheel at build time.

The extension uses CPython's limited API (``Py_LIMITED_API`` 0x03090000), so one ``_fastlaunch.abi3.so`` serves
every CPython >= 3.9 on the build machine's platform, and no CUDA or torch headers: it needs a C compiler and
Python.h on the build machine only. Compiled reproducibly (no build id, no debug info, symbols stripped, relative
paths in a scratch directory): the same compiler and source give the same bytes. When anything is missing the
build goes on without it: the wheel stays pure Python (``py3-none-any``) and launches through ctypes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .runtime.fastpath import ABI

SOURCE = "_fastlaunch.c"
FILENAME = "_fastlaunch.abi3.so"
DISABLE_ENV = "FORGE_AOT_NO_C_LAUNCH"
"""Set to 1 at build time for a pure-Python wheel (for example when it is installed on another CPU
architecture than the build machine's, or on a free-threaded Python, which cannot load abi3 extensions)."""
FLAGS = ["-O2", "-std=c11", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-g0",
         "-Wl,--build-id=none", "-s"]


@dataclass(frozen=True)
class Extension:
    """The outcome: the compiled file (None when not built), the wheel tag it implies, and why."""

    path: Path | None
    tag: str
    note: str


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC``, else the first of cc, gcc, clang on PATH."""
    if os.environ.get("CC"):
        return shlex.split(os.environ["CC"])
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def platform_tag() -> str:
    """The wheel platform tag of this machine (``linux_x86_64``, ``linux_aarch64``)."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def source_text() -> bytes:
    return resources.files("forge_aot.runtime").joinpath(SOURCE).read_bytes()


def build_extension(dest_dir: Path) -> Extension:
    """Compile ``_fastlaunch.c`` into ``dest_dir``; never raises for a missing compiler or a failed compile."""
    pure = "py3-none-any"
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return Extension(None, pure, f"C launch path not built ({DISABLE_ENV} is set): the wheel is pure Python")
    if not sys.platform.startswith("linux"):
        return Extension(None, pure, f"C launch path not built on {sys.platform} (Linux only): pure Python wheel")
    include = sysconfig.get_paths().get("include") or ""
    if not os.path.exists(os.path.join(include, "Python.h")):
        return Extension(None, pure, f"C launch path not built: no Python.h in {include!r} (install the Python "
                                     "development headers): the wheel is pure Python")
    cc = compiler()
    if cc is None:
        return Extension(None, pure, "C launch path not built: no C compiler (cc, gcc, clang or $CC) found: the "
                                     "wheel is pure Python")
    with tempfile.TemporaryDirectory() as tmp:
        # Relative names in a scratch directory: no path of this machine ends up in the binary.
        Path(tmp, SOURCE).write_bytes(source_text())
        cmd = [*cc, *FLAGS, "-I", include, "-o", FILENAME, SOURCE]
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Extension(None, pure, f"C launch path not built: {shlex.join(cmd)}: {exc}: pure Python wheel")
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            return Extension(None, pure, f"C launch path not built: {shlex.join(cmd)} failed:\n  "
                                         + "\n  ".join(tail) + "\nthe wheel is pure Python")
        # It must load into this machine's Python (it is abi3: the same binary loads into 3.9 and later).
        probe = ("import importlib.machinery as m, importlib.util as u; "
                 f"s = u.spec_from_file_location('_fastlaunch', {FILENAME!r}, loader=m.ExtensionFileLoader("
                 f"'_fastlaunch', {FILENAME!r})); mod = u.module_from_spec(s); assert mod.ABI == {ABI}")
        check = subprocess.run([sys.executable, "-c", probe], cwd=tmp, capture_output=True, text=True, timeout=120)
        if check.returncode != 0:
            return Extension(None, pure, "C launch path not built: the compiled extension does not load:\n  "
                                         + check.stderr.strip()[-500:] + "\nthe wheel is pure Python")
        dest_dir.mkdir(parents=True, exist_ok=True)
        target = dest_dir / FILENAME
        shutil.copyfile(Path(tmp, FILENAME), target)
    return Extension(target, f"cp39-abi3-{platform_tag()}", f"C launch path built with {cc[0]}")
