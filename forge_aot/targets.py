"""GPU targets forge-aot can compile for: the name used in manifests → Triton's GPUTarget fields."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class GpuModel:
    """A GPU the build's tracing can stand for (``project.trace-gpus``): what host code may read of it."""

    target: str
    """Its target (``sm_90``)."""
    name: str
    """What ``torch.cuda.get_device_name()`` says."""
    multiprocessors: int
    sm_clock_khz: int
    mem_clock_khz: int
    mem_bus_bits: int
    memory_gib: int
    l2_mib: int
    threads_per_multiprocessor: int


def _m(target: str, name: str, sms: int, sm: int, mem: int, bus: int, gib: int, l2: int, threads: int) -> GpuModel:
    return GpuModel(target, name, sms, sm, mem, bus, gib, l2, threads)


GPU_MODELS: dict[str, GpuModel] = {
    "T4": _m("sm_75", "Tesla T4", 40, 1590000, 5001000, 256, 15, 4, 1024),
    "A100-SXM": _m("sm_80", "NVIDIA A100-SXM4-80GB", 108, 1410000, 1593000, 5120, 79, 40, 2048),
    "A100-PCIe": _m("sm_80", "NVIDIA A100-PCIE-40GB", 108, 1410000, 1215000, 5120, 39, 40, 2048),
    "A30": _m("sm_80", "NVIDIA A30", 56, 1440000, 1215000, 3072, 23, 24, 2048),
    "A10": _m("sm_86", "NVIDIA A10", 72, 1695000, 6251000, 384, 22, 6, 1536),
    "A10G": _m("sm_86", "NVIDIA A10G", 80, 1710000, 6251000, 384, 22, 6, 1536),
    "RTX-3090": _m("sm_86", "NVIDIA GeForce RTX 3090", 82, 1695000, 9751000, 384, 23, 6, 1536),
    "Orin": _m("sm_87", "Orin", 16, 1300000, 3200000, 256, 61, 4, 1536),
    "L4": _m("sm_89", "NVIDIA L4", 58, 2040000, 6251000, 192, 22, 48, 1536),
    "L40S": _m("sm_89", "NVIDIA L40S", 142, 2520000, 9001000, 384, 44, 96, 1536),
    "RTX-4090": _m("sm_89", "NVIDIA GeForce RTX 4090", 128, 2520000, 10501000, 384, 23, 72, 1536),
    "H100-SXM": _m("sm_90", "NVIDIA H100 80GB HBM3", 132, 1980000, 2619000, 5120, 79, 50, 2048),
    "H100-PCIe": _m("sm_90", "NVIDIA H100 PCIe", 114, 1755000, 1593000, 5120, 79, 50, 2048),
    "H200": _m("sm_90", "NVIDIA H200", 132, 1980000, 3201000, 6144, 139, 60, 2048),
    "H20": _m("sm_90", "NVIDIA H20", 78, 1980000, 2619000, 6144, 95, 60, 2048),
    "B200": _m("sm_100", "NVIDIA B200", 148, 1965000, 4000000, 8192, 178, 126, 2048),
    "RTX-5090": _m("sm_120", "NVIDIA GeForce RTX 5090", 170, 2407000, 14001000, 512, 31, 96, 1536),
    "MI250X": _m("gfx90a", "AMD Instinct MI250X", 110, 1700000, 1600000, 4096, 64, 8, 2048),
    "MI300X": _m("gfx942", "AMD Instinct MI300X", 304, 2100000, 1300000, 8192, 191, 4, 2048),
    "MI300A": _m("gfx942", "AMD Instinct MI300A", 228, 2100000, 1300000, 8192, 127, 4, 2048),
    "MI355X": _m("gfx950", "AMD Instinct MI355X", 256, 2400000, 2000000, 8192, 287, 4, 2048),
    "RX-7900XTX": _m("gfx1100", "AMD Radeon RX 7900 XTX", 96, 2500000, 1250000, 384, 23, 6, 2048),
    "RX-9070XT": _m("gfx1201", "AMD Radeon RX 9070 XT", 64, 2970000, 1258000, 256, 15, 8, 2048),
}
"""The GPUs the build's tracing can stand for (public specifications; ``project.trace-gpus`` names them)."""

DEFAULT_GPU: dict[str, str] = {"sm_75": "T4", "sm_80": "A100-SXM", "sm_86": "A10", "sm_87": "Orin", "sm_89": "L4",
                               "sm_90": "H100-SXM", "sm_100": "B200", "sm_120": "RTX-5090", "gfx90a": "MI250X",
                               "gfx942": "MI300X", "gfx950": "MI355X", "gfx1100": "RX-7900XTX",
                               "gfx1201": "RX-9070XT"}
"""The GPU each target's tracing stands for where ``project.trace-gpus`` names none of its target."""


def trace_gpus(targets: list[str], listed: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(target, GPU model) pairs the build traces host code that asks about the device as: the listed models of
    each target, else its default."""
    out = []
    for t in targets:
        mine = [g for g in listed if GPU_MODELS[g].target == t]
        out += [(t, g) for g in (mine or [DEFAULT_GPU[t]])]
    return out


def representative_device(target: str, model: str | None = None) -> tuple[str, dict[str, int | str]]:
    """The GPU the build's tracing stands for when host code asks about the device (Triton's
    ``driver.active.utils.get_device_properties`` and ``get_current_target``, torch's ``torch.cuda.get_device_*``):
    its name and the properties Triton would report, with Triton's keys. Such answers only decide which binaries
    the build makes (a value the host code turns into a constexpr or a launch option); a wheel reads the real
    device's at run time. ``model``: a name in GPU_MODELS (default: the target's DEFAULT_GPU)."""
    info = TARGETS[target]
    g = GPU_MODELS[model or DEFAULT_GPU[target]]
    props: dict[str, int | str] = {"max_shared_mem": info.max_shared, "max_num_regs": 65536,
                                   "multiprocessor_count": g.multiprocessors, "warpSize": info.warp_size,
                                   "sm_clock_rate": g.sm_clock_khz, "mem_clock_rate": g.mem_clock_khz,
                                   "mem_bus_width": g.mem_bus_bits}
    if info.backend == "hip":
        props.update(arch=str(info.arch), max_threads_per_sm=g.threads_per_multiprocessor)
    return g.name, props


class RepresentativeProperties:
    """``torch.cuda.get_device_properties(...)`` of a target's representative GPU, while the build traces: the
    fields host code reads to size grids or pick variants (others raise, naming these)."""

    def __init__(self, target: str, model: str | None = None) -> None:
        info = TARGETS[target]
        g = GPU_MODELS[model or DEFAULT_GPU[target]]
        cuda = info.backend == "cuda"
        self.name = g.name
        code = str(info.arch)[3:]  # gfx942 -> (9, 4), gfx90a -> (9, 0), gfx1100 -> (11, 0)
        self.major, self.minor = (int(info.arch) // 10, int(info.arch) % 10) if cuda else (int(code[:-2]),
                                                                                           int(code[-2], 16))
        self.multi_processor_count = g.multiprocessors
        self.total_memory = g.memory_gib << 30
        self.L2_cache_size = g.l2_mib << 20
        self.regs_per_multiprocessor = 65536
        self.max_threads_per_multi_processor = g.threads_per_multiprocessor
        self.warp_size = info.warp_size
        self.shared_memory_per_block = 49152 if cuda else 65536
        self.shared_memory_per_block_optin = info.max_shared
        self.shared_memory_per_multiprocessor = info.max_shared + (1024 if cuda else 0)
        self.gcnArchName = "" if cuda else str(info.arch)
        self.is_integrated = int(target == "sm_87")
        self.is_multi_gpu_board = 0

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the build's stand-in device properties have {', '.join(sorted(vars(self)))}, not "
                             f"{name}")

    def __repr__(self) -> str:
        return f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, " \
               f"multi_processor_count={self.multi_processor_count}) [forge-aot build stand-in]"


TORCH_DEVICE_QUERIES = ("get_device_capability", "get_device_properties", "get_device_name", "current_device",
                        "device_count", "is_available")
"""The ``torch.cuda`` functions the build answers as a target's representative GPU while it traces host code."""


STAND_IN_VERSIONS = {"cuda": "12.8", "hip": "6.4.0"}
"""``torch.version.cuda`` / ``hip`` while the build traces for a backend the machine's torch was not built for."""


@contextlib.contextmanager
def torch_answers_as(target: str, model: str | None = None) -> Iterator[None]:
    """``torch.cuda``'s device queries (``TORCH_DEVICE_QUERIES``) answer as the target's representative GPU: host
    code that reads the capability, the SM count or the name at import or per call (``is_hopper =
    torch.cuda.get_device_capability()[0] >= 9``) traces on a machine without a GPU, per target.

    ``is_available()`` answers True and ``torch.version.cuda`` / ``torch.version.hip`` say the target's backend, as
    on the GPU the wheel serves: libraries gate their device queries on them (SGLang's ``is_cuda()`` is
    ``is_available() and torch.version.cuda``, its prefill attention picks ``BLOCK = 128`` on sm_80 and newer
    behind it; Unsloth refuses to import without an accelerator; Triton's own ``CudaDriver.is_active()``, which
    vLLM's ``triton_utils`` counts, reads both), and answering as a machine without a GPU built another branch's
    variants, silently. The trace's tensors stay on the meta device or the CPU."""
    import torch

    props = RepresentativeProperties(target, model)
    stand_ins: dict[str, Any] = {"get_device_capability": lambda device=None: (props.major, props.minor),
                 "get_device_properties": lambda device=None: props,
                 "get_device_name": lambda device=None: props.name,
                 "current_device": lambda: 0, "device_count": lambda: 1}
    # ``with torch.cuda.device(x.device):`` around a launch (flash-attn's rotary, every FlagGems op): the trace's
    # tensors are on the meta device or the CPU, whatever they answer (``ongpu.tensors_on_gpu``), so there is no
    # device to switch to, also on a machine with a GPU. Classes, as torch's are: ``torch.cuda.device.__init__``
    # itself asks ``isinstance(device, torch.cuda.device)``.
    # the machine's own answer, also inside another target's stand-ins (a nested trace)
    real_is_available = getattr(torch.cuda.is_available, "real", torch.cuda.is_available)

    def is_available() -> bool:
        return True

    is_available.real = real_is_available  # type: ignore[attr-defined]
    stand_ins["is_available"] = is_available
    stand_ins["device"] = stand_ins["device_of"] = _NoDeviceSwitch
    raw_stream: dict[str, Any] = {}
    if not real_is_available():
        # FlagGems' random ops read the Philox seed and offset from torch.cuda.default_generators[device]
        # (``get_state()`` viewed as two int64) and advance it: torch without CUDA has none
        stand_ins["default_generators"] = (_TraceGenerator(),)
        # What host code does around its launches on the GPU it answers as, nothing on a machine without one:
        # choosing the tensors' device (vLLM's LoRA ops), waiting for it, its streams (Unsloth's kernels/utils.py
        # reads every device's raw stream at import, torch._C's own function included).
        # (Each its own function: torch._dynamo's trace rules, built on first use, refuse one object under two
        # names of different rules.)
        stand_ins.update(set_device=lambda device: None, synchronize=lambda device=None: None,
                         current_stream=_TraceStream, default_stream=_TraceStream, stream=_TraceStreamContext)
        if not hasattr(torch._C, "_cuda_getCurrentRawStream"):
            raw_stream["_cuda_getCurrentRawStream"] = lambda device=None: 0
    # Host code's own torch.compile'd helpers (Cut Cross-Entropy's sort_logit_avg) run eagerly while the build traces:
    # the trace's tensors only answer as the GPU's (compiling for it needs it: dynamo saves its RNG state first), and
    # with dynamo merely disabled a fullgraph compile refuses to run at all.
    compile_eager = _compile_eager()
    saved = {name: getattr(torch.cuda, name) for name in stand_ins}
    versions = {"cuda": torch.version.cuda, "hip": torch.version.hip}
    rules = sys.modules.get("torch._dynamo.trace_rules")
    rules_built = rules is not None and rules.get_torch_obj_rule_map.cache_info().currsize > 0
    try:
        compile_eager.__enter__()
        for name, fn in stand_ins.items():
            setattr(torch.cuda, name, fn)
        for name, fn in raw_stream.items():
            setattr(torch._C, name, fn)
        hip = TARGETS[target].backend == "hip"
        torch.version.cuda = None if hip else (versions["cuda"] or STAND_IN_VERSIONS["cuda"])
        torch.version.hip = (versions["hip"] or STAND_IN_VERSIONS["hip"]) if hip else None
        _forget_torch_has_triton()  # asked again here, torch's ``has_triton()`` answers as on that GPU (torchao)
        yield
    finally:
        _forget_torch_has_triton()  # (and as this machine outside)
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
        for name in raw_stream:
            delattr(torch._C, name)
        torch.version.cuda, torch.version.hip = versions["cuda"], versions["hip"]
        rules = sys.modules.get("torch._dynamo.trace_rules")
        if rules is not None and not rules_built:  # built while torch.cuda held the stand-ins: again from torch's own
            rules.get_torch_obj_rule_map.cache_clear()
        compile_eager.__exit__(None, None, None)


def _forget_torch_has_triton() -> None:
    """Clear the answer ``torch.utils._triton.has_triton`` keeps for the process (``functools.cache``), where torch
    has that module loaded: it asks the device, so a CPU machine's False would stand while host code traces as a GPU
    (a library that launches only ``if has_triton():`` traced its fallback)."""
    has_triton = getattr(sys.modules.get("torch.utils._triton"), "has_triton", None)
    if hasattr(has_triton, "cache_clear"):
        has_triton.cache_clear()


@contextlib.contextmanager
def _compile_eager() -> Iterator[None]:
    """``torch.compile`` gives the function back as it is (as a decorator too), as it was after."""
    import torch

    real = torch.compile

    def compile(model: Any = None, **options: Any) -> Any:  # torch.compile's stand-in
        return (lambda fn: fn) if model is None else model

    torch.compile = compile  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = real


class _TraceStream:
    """``torch.cuda.current_stream()`` / ``default_stream()`` while the build traces without a GPU: the null stream
    of the one device it answers as (``cuda_stream`` 0), whose waits return at once."""

    cuda_stream = 0

    def __init__(self, device: Any = None) -> None:
        import torch

        self.device = torch.device("cuda", 0)

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> None:
        return None


class _TraceStreamContext:
    """``with torch.cuda.stream(s):`` while the build traces without a GPU: switches nothing."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream

    def __enter__(self) -> Any:
        return self.stream

    def __exit__(self, *exc: Any) -> bool:
        return False


class _TraceGenerator:
    """``torch.cuda.default_generators[i]`` while the build traces without a GPU: a CUDA generator's Philox state
    as ``get_state()`` gives it (seed and offset, two int64 in 16 bytes), from CUDA's default seed."""

    def __init__(self, seed: int = 67280421310721) -> None:
        import torch

        self.device = torch.device("cuda", 0)
        self._state = torch.tensor([seed, 0], dtype=torch.int64).view(torch.uint8)

    def get_state(self) -> Any:
        return self._state.clone()

    def set_state(self, state: Any) -> None:
        self._state = state.clone()

    def initial_seed(self) -> int:
        import torch

        return int(self._state.view(torch.int64)[0])

    def manual_seed(self, seed: int) -> _TraceGenerator:
        self.__init__(seed)  # type: ignore[misc]
        return self


class _NoDeviceSwitch:
    """``torch.cuda.device(...)`` / ``device_of(...)`` while the build traces: switches nothing. Its ``idx`` is the
    index asked for, as torch's (Unsloth keys a table of streams by ``torch.cuda.device(i).idx``): an integer, a
    device's index (0, the one device the trace answers as, for ``"cuda"``), a tensor's, -1 for None or the CPU."""

    def __init__(self, device: Any = None) -> None:
        self.idx = _device_index(device)

    def __enter__(self) -> _NoDeviceSwitch:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def _device_index(device: Any) -> int:
    import torch

    if device is None or isinstance(device, bool):
        return -1
    if isinstance(device, int):
        return device
    if isinstance(device, torch.Tensor):
        return device.get_device()
    try:
        where = torch.device(device)
    except (TypeError, RuntimeError):
        return -1
    return -1 if where.type == "cpu" else (where.index if where.index is not None else 0)
