"""The runtime's optional C launch path (``runtime/_fastlaunch.c``), compiled for a wheel at build time.

The extension uses CPython's limited API (``Py_LIMITED_API`` 0x03090000), so one ``_fastlaunch.abi3.so`` serves
every CPython >= 3.9 of one CPU architecture, and no CUDA or torch headers: it needs a C compiler and Python.h on
the build machine only. Compiled reproducibly (no build id, no debug info, symbols stripped, relative paths in a
scratch directory): the same compiler and source give the same bytes. When anything is missing the native build
goes on without it: the wheel stays pure Python (``py3-none-any``) and launches through ctypes.

The wheel's platform tag is read from the compiled file itself (``read_elf``): its machine, the libraries it
needs and the newest glibc symbol version it asks for. A file that needs only glibc (≤ 2.17 here) is
``manylinux_2_17_<arch>.manylinux2014_<arch>`` (PEP 600; what PyPI accepts and pip on any glibc ≥ 2.17 Linux
installs), one that needs a newer glibc ``manylinux_2_<minor>_<arch>``, anything else ``linux_<arch>``.
Other architectures than the build machine's (``project.wheel-platforms``, e.g. ``aarch64`` for Grace Hopper
servers) are compiled with a cross compiler (``compiler_for``); those files cannot be loaded here, so their
check is the ELF reading alone.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shlex
import shutil
import struct
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


_ELF_MACHINES = {62: "x86_64", 183: "aarch64", 3: "i686", 21: "ppc64le", 22: "s390x", 243: "riscv64"}
_MANYLINUX_LIBS = frozenset({"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                             "libgcc_s.so.1"})
"""Libraries every manylinux policy lets a wheel's extension need from the system (PEP 599's list, the part a C
file without C++ can touch)."""
_GLIBC_ABI_VERSIONS = {"GLIBC_ABI_DT_RELR": (2, 36)}
"""glibc's named ABI versions and the release that brought each (``-z pack-relative-relocs`` asks for DT_RELR)."""
_MANYLINUX_FLOOR = 17
"""manylinux_2_17 (manylinux2014): the oldest policy pip still installs on both architectures here."""


def native_arch() -> str:
    """The build machine's CPU architecture, as wheel platform tags spell it (``platform_tag``'s, on Linux)."""
    tag = platform_tag()
    return tag.removeprefix("linux_") if tag.startswith("linux_") else platform.machine().lower()


@dataclass(frozen=True)
class ElfInfo:
    """What a shared object says about where it can load."""

    machine: str
    """CPU architecture (``x86_64``, ``aarch64``), or ``em<number>`` for one this table does not name."""
    needed: tuple[str, ...]
    """Its ``DT_NEEDED`` libraries."""
    versions: tuple[str, ...]
    """The symbol versions it needs (``GLIBC_2.14``...), from ``.gnu.version_r``."""

    def glibc(self) -> tuple[int, int] | None:
        """The newest glibc version it needs ((2, 0) where it asks for none); None for a ``GLIBC_*`` version this
        cannot place (``GLIBC_PRIVATE``: no manylinux policy allows it)."""
        found = []
        for v in self.versions:
            if not v.startswith("GLIBC_"):
                continue
            m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", v)
            if m:
                found.append((int(m.group(1)), int(m.group(2))))
            elif v in _GLIBC_ABI_VERSIONS:
                found.append(_GLIBC_ABI_VERSIONS[v])
            else:
                return None
        return max(found, default=(2, 0))


def read_elf(data: bytes) -> ElfInfo:
    """Read a 64-bit little-endian ELF shared object's machine, needed libraries and needed symbol versions
    (the parts of ``readelf -d -V`` a wheel tag depends on). Raises ValueError for anything else."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (machine,) = struct.unpack_from("<H", data, 18)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(section: int, offset: int) -> str:
        start = sections[section][4] + offset
        return data[start:data.index(b"\0", start)].decode()

    if not any(section[1] == 6 for section in sections):
        raise ValueError("no dynamic section: not a shared object this reader can check")
    needed: list[str] = []
    versions: list[str] = []
    for _name, kind, _flags, _addr, offset, size, link, info, _align, entsize in sections:
        if kind == 6:  # SHT_DYNAMIC: (tag, value) pairs; DT_NEEDED (1) names a library in the linked strings
            for pos in range(offset, offset + size, entsize or 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == 1:
                    needed.append(string(link, value))
        elif kind == 0x6FFFFFFE:  # SHT_GNU_verneed: `info` Verneed entries, each with its Vernaux list
            pos = offset
            for _ in range(info):
                _version, count, _file, aux, following = struct.unpack_from("<HHIII", data, pos)
                at = pos + aux
                for _ in range(count):
                    _hash, _vflags, _other, name, next_aux = struct.unpack_from("<IHHII", data, at)
                    versions.append(string(link, name))
                    at += next_aux
                pos += following
    return ElfInfo(_ELF_MACHINES.get(machine, f"em{machine}"), tuple(needed), tuple(sorted(set(versions))))


def wheel_platform(info: ElfInfo) -> str:
    """The wheel platform tag an extension with this ELF information earns (see the module's docstring)."""
    arch = info.machine
    foreign = [lib for lib in info.needed if lib not in _MANYLINUX_LIBS]
    other = [v for v in info.versions if not v.startswith(("GLIBC_", "GCC_"))]
    glibc = info.glibc()
    if foreign or other or glibc is None or glibc[0] != 2:
        return f"linux_{arch}"
    minor = max(glibc[1], _MANYLINUX_FLOOR)
    tag = f"manylinux_2_{minor}_{arch}"
    return f"{tag}.manylinux2014_{arch}" if minor == 17 else tag


def source_text() -> bytes:
    return resources.files("forge_aot.runtime").joinpath(SOURCE).read_bytes()


def compiler_for(arch: str) -> list[str] | None:
    """The C compiler command for ``arch``: the build machine's own (``compiler()``) for its architecture; for
    another, ``$CC_<ARCH>`` (``CC_AARCH64="aarch64-linux-gnu-gcc"``), else zig's (``pip install ziglang``: a
    cross compiler from PyPI, pinned to glibc 2.17), else ``<arch>-linux-gnu-gcc`` on PATH."""
    if arch == native_arch():
        return compiler()
    if os.environ.get(f"CC_{arch.upper()}"):
        return shlex.split(os.environ[f"CC_{arch.upper()}"])
    if importlib.util.find_spec("ziglang") is not None:
        return [sys.executable, "-m", "ziglang", "cc", "-target", f"{arch}-linux-gnu.2.17"]
    found = shutil.which(f"{arch}-linux-gnu-gcc")
    return [found] if found else None


def _multiarch_config(include: str, arch: str, scratch: Path) -> list[str]:
    """Compiler flags that let a cross compile read a Debian/Ubuntu system Python's headers: their ``pyconfig.h``
    only dispatches to ``<triplet>/python3.X/pyconfig.h`` of the architecture being compiled, which the build machine
    lacks for another one. The build machine's own is given under the target's triplet: the limited API reads
    nothing from it that differs between two 64-bit little-endian Linux machines (sizes, endianness), as the
    aarch64 build from a self-contained Python's headers, checked under qemu, shows. Empty where the headers are
    self-contained (pyenv, python.org, uv, the official Docker images)."""
    dispatcher = Path(include, "pyconfig.h")
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    try:
        text = dispatcher.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = re.search(rf"#\s*include <({re.escape(multiarch)}/([^>/]+)/pyconfig\.h)>", text) if multiarch else None
    native = Path(include).parent / found.group(1) if found else None
    if native is None or not native.is_file():
        return []
    shim = scratch / "multiarch" / f"{arch}-linux-gnu" / found.group(2) / "pyconfig.h"  # type: ignore[union-attr]
    shim.parent.mkdir(parents=True)
    shim.write_bytes(native.read_bytes())
    return ["-I", "multiarch"]


def build_extension(dest_dir: Path, arch: str | None = None) -> Extension:
    """Compile ``_fastlaunch.c`` for ``arch`` (default: this machine's) into ``dest_dir``; never raises for a
    missing compiler or a failed compile (``Extension.path`` is then None and ``note`` says why)."""
    pure = "py3-none-any"
    arch = arch or native_arch()
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return Extension(None, pure, f"C launch path not built ({DISABLE_ENV} is set): the wheel is pure Python")
    if not sys.platform.startswith("linux"):
        return Extension(None, pure, f"C launch path not built on {sys.platform} (Linux only): pure Python wheel")
    include = sysconfig.get_paths().get("include") or ""
    if not os.path.exists(os.path.join(include, "Python.h")):
        return Extension(None, pure, f"C launch path not built: no Python.h in {include!r} (install the Python "
                                     "development headers): the wheel is pure Python")
    cc = compiler_for(arch)
    if cc is None:
        how = ("cc, gcc, clang or $CC" if arch == native_arch()
               else f"$CC_{arch.upper()}, zig from `pip install ziglang`, or {arch}-linux-gnu-gcc")
        return Extension(None, pure, f"C launch path not built for {arch}: no C compiler ({how}) found: the "
                                     "wheel is pure Python")
    with tempfile.TemporaryDirectory() as tmp:
        # Relative names in a scratch directory: no path of this machine ends up in the binary.
        Path(tmp, SOURCE).write_bytes(source_text())
        extra = [] if arch == native_arch() else _multiarch_config(include, arch, Path(tmp))
        cmd = [*cc, *FLAGS, *extra, "-I", include, "-o", FILENAME, SOURCE]
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Extension(None, pure, f"C launch path not built: {shlex.join(cmd)}: {exc}: pure Python wheel")
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            return Extension(None, pure, f"C launch path not built: {shlex.join(cmd)} failed:\n  "
                                         + "\n  ".join(tail) + "\nthe wheel is pure Python")
        built = Path(tmp, FILENAME).read_bytes()
        info: ElfInfo | None
        try:
            info = read_elf(built)
        except (ValueError, struct.error, IndexError) as exc:
            if arch != native_arch():
                return Extension(None, pure, f"C launch path not built: {shlex.join(cmd)} wrote no ELF file this "
                                             f"reader can check ({exc}): the wheel is pure Python")
            info = None  # a 32-bit or big-endian machine's own build: its load check below decides, linux_ tag
        if info is not None and info.machine != arch:
            return Extension(None, pure, f"C launch path not built: {shlex.join(cmd)} compiled for {info.machine}, "
                                         f"not {arch}: the wheel is pure Python")
        if arch == native_arch():
            # It must load into this machine's Python (it is abi3: the same binary loads into 3.9 and later).
            probe = ("import importlib.machinery as m, importlib.util as u; "
                     f"s = u.spec_from_file_location('_fastlaunch', {FILENAME!r}, loader=m.ExtensionFileLoader("
                     f"'_fastlaunch', {FILENAME!r})); mod = u.module_from_spec(s); assert mod.ABI == {ABI}")
            check = subprocess.run([sys.executable, "-c", probe], cwd=tmp, capture_output=True, text=True,
                                   timeout=120)
            if check.returncode != 0:
                return Extension(None, pure, "C launch path not built: the compiled extension does not load:\n  "
                                             + check.stderr.strip()[-500:] + "\nthe wheel is pure Python")
        dest_dir.mkdir(parents=True, exist_ok=True)
        target = dest_dir / FILENAME
        target.write_bytes(built)
    tag = f"cp39-abi3-{wheel_platform(info) if info is not None else platform_tag()}"
    loaded = "" if arch == native_arch() else f" (cross-compiled: not loaded on this {native_arch()} machine)"
    return Extension(target, tag, f"C launch path built for {arch} with {' '.join(cc[:4])}{loaded}: {tag}")
