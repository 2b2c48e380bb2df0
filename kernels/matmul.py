"""C = A @ B with fp32 accumulation (tiled, grouped launch order for L2 reuse).

The inner dimensions are contiguous (unit stride) by construction: the host op makes them so, which lets
the compiler vectorise along K and N without specializing a runtime stride equal to 1.

Two kernels: ``matmul_kernel`` (one program per output tile, pointer loads; every GPU and shape) and, on Hopper
for large problems whose rows TMA can address, ``matmul_tma_kernel`` (Triton's persistent tutorial kernel: one
program per SM walking the tiles, tensor descriptors built in the kernel, so their 128-byte records live in
global scratch that the host hands over through ``triton.set_allocator``).
"""

import contextlib

import torch
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None].to(tl.int64) * stride_am + offs_k[None, :])
    b_ptrs = b_ptr + (offs_k[:, None].to(tl.int64) * stride_bk + offs_bn[None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None].to(tl.int64) * stride_cm + offs_cn[None, :]
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


@triton.jit
def matmul_tma_kernel(a_ptr, b_ptr, c_ptr, M, N, K, num_sms,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    num_pid_in_group = GROUP_M * num_pid_n
    for tile_id in tl.range(start_pid, num_tiles, num_sms, flatten=True):
        group_id = tile_id // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile_id % group_size_m)
        pid_n = (tile_id % num_pid_in_group) // group_size_m
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))


_SMS: dict[int, tuple[tuple[int, int], int]] = {}


def _device_sms(device: torch.device) -> tuple[tuple[int, int], int]:
    """(compute capability, SM count) of a CUDA device, read once per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _SMS.get(index)
    if found is None:
        props = torch.cuda.get_device_properties(index)
        found = _SMS[index] = ((props.major, props.minor), props.multi_processor_count)
    return found


def _scratch(size: int, alignment: int, stream):
    """Global scratch for the kernel's tensor descriptors, on the current GPU (the launch runs under the operands'
    device): one stateless allocator, so threads on different GPUs can share it."""
    return torch.empty(size, device=torch.cuda.current_device(), dtype=torch.int8)


def _matmul_tma(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The persistent TMA kernel on contiguous A (M×K) and B (K×N) whose K and N are multiples of 8 (TMA needs
    16-byte aligned rows) and whose data are 16-byte aligned (also the tuning op of ``matmul_tma_kernel``)."""
    num_sms = _device_sms(a.device)[1] if a.is_cuda else 132  # traced on the meta device at build time
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    triton.set_allocator(_scratch)

    def grid(meta):
        return (min(num_sms, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)

    switch = a.is_cuda and a.device.index != torch.cuda.current_device()  # the scratch goes to the operands' GPU
    with torch.cuda.device(a.device) if switch else contextlib.nullcontext():
        matmul_tma_kernel[grid](a, b, c, M, N, K, num_sms)
    return c


TMA_MIN_DIM = 1024
"""The persistent TMA kernel takes problems with M, N and K at least this large, ..."""
TMA_MIN_DIM_UNALIGNED = 512
"""... or this large where K or N is not a multiple of 16: the tiled kernel's loads need rows of 16-element
multiples to vectorize, TMA's do not. Measured on the H100 under the JIT (scripts/probe_matmul_tma.py --wide and
a review's probe): 1000³ 12 against 30 – 35 µs for the tiled kernel's best, 520×536×552 6.9 against 14.1 µs;
but aligned 512³ 5.8 against 3.4 µs and 768³ 7.3 against 5.2 µs, where the tiled kernel stays."""


def _takes_tma(a: torch.Tensor, b: torch.Tensor) -> bool:
    """An NVIDIA Hopper GPU (sm_90: ROCm reports gfx9 devices as major 9 too), a problem of at least
    ``TMA_MIN_DIM`` in every dimension (``TMA_MIN_DIM_UNALIGNED`` where K or N is not a multiple of 16), rows
    TMA can address (16-byte aligned)."""
    M, K = a.shape
    N = b.shape[1]
    least = TMA_MIN_DIM_UNALIGNED if K % 16 or N % 16 else TMA_MIN_DIM
    if not a.is_cuda or torch.version.hip or min(M, N, K) < least or K % 8 or N % 8:
        return False
    if not (a.is_contiguous() and b.is_contiguous()) or a.data_ptr() % 16 or b.data_ptr() % 16:
        return False
    return _device_sms(a.device)[0] == (9, 0)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D fp16/bf16 tensors; the result has their dtype."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: incompatible shapes {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise ValueError(f"matmul: dtypes differ: {a.dtype} and {b.dtype}")
    if a.stride(1) != 1:
        a = a.contiguous()
    if b.stride(1) != 1:
        b = b.contiguous()
    if _takes_tma(a, b):
        return _matmul_tma(a, b)
    return _matmul_tiled(a, b)


def _matmul_tiled(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The tiled kernel on A (M×K) and B (K×N) with unit inner strides (also the tuning op of
    ``matmul_kernel``, whose large rows serve the GPUs without the TMA path)."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    return c


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.double() @ b.double()


def tune_inputs(key, variant, device):
    """Random A (M×K) and B (K×N) (forge-aot tune; left out of the wheel)."""
    a = torch.randn(key["M"], key["K"], device=device, dtype=variant["T"])
    b = torch.randn(key["K"], key["N"], device=device, dtype=variant["T"])
    return (a, b)
