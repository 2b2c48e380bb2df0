"""In-tree PEP 517 backend of a forge-aot generated package: deterministic wheels and sdists, offline.

Same inputs, same bytes: entries sorted, timestamps fixed (SOURCE_DATE_EPOCH, else 1980-01-01), file modes
fixed, RECORD computed from the bytes written. It needs nothing beyond the standard library (and tomli on
Python < 3.11), so ``python -m build`` and ``pip install`` work with no network.
"""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import time
import zipfile

try:
    import tomllib
except ImportError:  # pragma: no cover - Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

_HERE = os.path.dirname(os.path.abspath(__file__))
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def _project() -> dict:
    with open(os.path.join(_HERE, "pyproject.toml"), "rb") as f:
        data = tomllib.load(f)
    tool = data["tool"]["forge-aot"]
    return {**data["project"], "package": tool["package"], "wheel-tag": tool.get("wheel-tag", "py3-none-any")}


def _dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _timestamp() -> tuple[int, int, int, int, int, int]:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        return _ZIP_EPOCH
    t = time.gmtime(max(int(epoch), 315532800))
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec)


def _metadata(p: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p.get('description', '')}", f"Requires-Python: {p.get('requires-python', '>=3.9')}"]
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    readme = os.path.join(_HERE, p.get("readme", "README.md"))
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _package_files(package: str) -> list[tuple[str, str]]:
    """(archive name, path on disk) of every package file, sorted; caches and temporaries left out."""
    out = []
    root = os.path.join(_HERE, package)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in filenames:
            if name.endswith((".pyc", ".tmp")) or ".tmp" in name:
                continue
            full = os.path.join(dirpath, name)
            out.append((os.path.relpath(full, _HERE).replace(os.sep, "/"), full))
    return sorted(out)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(path: str, entries: list[tuple[str, bytes]], dist_info: str) -> None:
    stamp = _timestamp()
    record = io.StringIO()
    rows = csv.writer(record, lineterminator="\n")  # RECORD is CSV: a name with a comma is quoted
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data, compresslevel=9)
            rows.writerow((name, _record_hash(data), len(data)))
        record_name = f"{dist_info}/RECORD"
        rows.writerow((record_name, "", ""))
        info = zipfile.ZipInfo(record_name, date_time=stamp)
        info.external_attr = 0o100644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, record.getvalue().encode(), compresslevel=9)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    p = _project()
    dist = _dist_name(p["name"])
    dist_info = f"{dist}-{p['version']}.dist-info"
    entries = [(name, _read(full)) for name, full in _package_files(p["package"])]
    build_info = os.path.join(_HERE, p["package"], "_forge", "build_info.json")
    # py3-none-any, or cp39-abi3-<platform> when the package carries the runtime's compiled C launch path; a
    # compressed tag set (manylinux_2_17_x86_64.manylinux2014_x86_64) is one Tag line per tag in WHEEL.
    tag = p["wheel-tag"]
    purelib = "true" if tag == "py3-none-any" else "false"
    python, abi, platforms = tag.split("-")
    tags = "".join(f"Tag: {py}-{ab}-{pl}\n" for py in python.split(".") for ab in abi.split(".")
                   for pl in platforms.split("."))
    meta = [
        (f"{dist_info}/METADATA", _metadata(p).encode()),
        (f"{dist_info}/WHEEL",
         f"Wheel-Version: 1.0\nGenerator: forge-aot\nRoot-Is-Purelib: {purelib}\n{tags}".encode()),
        (f"{dist_info}/top_level.txt", f"{p['package']}\n".encode()),
    ]
    if os.path.exists(build_info):
        # The manifest hash, Triton version, targets and every binary's sha256, as distribution metadata.
        meta.append((f"{dist_info}/forge-aot.json", _read(build_info)))
    filename = f"{dist}-{p['version']}-{tag}.whl"
    _write_wheel(os.path.join(wheel_directory, filename), entries + sorted(meta), dist_info)
    return filename


def _platform_free(name: str, data: bytes) -> bytes:
    """A file as the sdist carries it: without the compiled C launch path (which serves one CPU architecture; the
    sdist must build a wheel right for any machine, with no compiler), so its pyproject builds the pure wheel and its
    build info records no C launch path."""
    if name == "pyproject.toml":
        return re.sub(rb'(?m)^wheel-tag = "[^"]*"$', b'wheel-tag = "py3-none-any"', data)
    if name.endswith("/_forge/build_info.json"):  # written as forge-aot writes it (package._json_bytes)
        return (json.dumps({**json.loads(data), "c_launch": None}, indent=1, sort_keys=True) + "\n").encode()
    return data


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    p = _project()
    base = f"{_dist_name(p['name'])}-{p['version']}"
    extension = f"{p['package']}/_runtime/_fastlaunch.abi3.so"  # the package's own data files stay
    files = [(name, full) for name, full in _package_files(p["package"]) if name != extension]
    for extra in ("pyproject.toml", "_forge_build_backend.py", "README.md"):
        if os.path.exists(os.path.join(_HERE, extra)):
            files.append((extra, os.path.join(_HERE, extra)))
    pkg_info = _metadata(p).encode()
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in sorted([(n, _platform_free(n, _read(f))) for n, f in files] + [("PKG-INFO", pkg_info)]):
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data))
    filename = f"{base}.tar.gz"
    with open(os.path.join(sdist_directory, filename), "wb") as f, \
            gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return filename


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: dict | None = None) -> list[str]:
    return []
