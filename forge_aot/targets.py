"""GPU targets forge-aot can compile for: the name used in manifests → Triton's GPUTarget fields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetInfo:
    """What the compiler and the packager need to know about one target."""

    name: str
    """Manifest name, e.g. ``sm_90`` or ``gfx942``."""
    backend: str
    """Triton backend: ``cuda`` or ``hip``."""
    arch: int | str
    """``GPUTarget.arch``: compute capability as an int (90) for CUDA, the gfx name for HIP."""
    warp_size: int
    """Threads per warp (wavefront): 32 on NVIDIA and RDNA, 64 on CDNA."""
    max_shared: int
    """Largest shared memory (LDS) one block may use on this target, in bytes (opt-in maximum)."""

    @property
    def binary_ext(self) -> str:
        return "cubin" if self.backend == "cuda" else "hsaco"

    @property
    def arch_specific(self) -> bool:
        """Triton compiles sm_90 and newer as ``sm_XYa``: such a cubin runs on that exact GPU only."""
        return self.backend == "cuda" and int(self.arch) >= 90


_KB = 1024
TARGETS: dict[str, TargetInfo] = {
    t.name: t
    for t in (
        TargetInfo("sm_75", "cuda", 75, 32, 64 * _KB),
        TargetInfo("sm_80", "cuda", 80, 32, 163 * _KB),
        TargetInfo("sm_86", "cuda", 86, 32, 99 * _KB),
        TargetInfo("sm_87", "cuda", 87, 32, 163 * _KB),
        TargetInfo("sm_89", "cuda", 89, 32, 99 * _KB),
        TargetInfo("sm_90", "cuda", 90, 32, 227 * _KB),
        TargetInfo("sm_100", "cuda", 100, 32, 227 * _KB),
        TargetInfo("sm_120", "cuda", 120, 32, 99 * _KB),
        TargetInfo("gfx90a", "hip", "gfx90a", 64, 64 * _KB),
        TargetInfo("gfx942", "hip", "gfx942", 64, 64 * _KB),
        TargetInfo("gfx950", "hip", "gfx950", 64, 160 * _KB),
        TargetInfo("gfx1100", "hip", "gfx1100", 32, 64 * _KB),
        TargetInfo("gfx1201", "hip", "gfx1201", 32, 64 * _KB),
    )
}
