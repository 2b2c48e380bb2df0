"""forge-aot runtime: launches the binaries packaged in a wheel through the GPU driver API.

Shipped verbatim inside every generated package as ``<package>/_runtime``. It needs torch (tensors, streams)
and the GPU driver (``libcuda.so.1`` or ``libamdhip64.so``) only: never Triton, never forge-aot, never a
compiler, so every import here is relative. forge-aot imports this same package for its development mode and
its build-time checks, so the rules (table lookup, binary selection, constraints) are the same in the source
tree and in the wheel. One module per concern:

- ``lean``: ``import <package>`` (the exported ops, ``torch.ops.<package>``) and the simplest ops' first calls
  without any other runtime module (``LeanKernel``), handing over to the rest; what every path reads alike;
- ``errors``: the error hierarchy;      ``expressions``: the constraint language;
- ``basics``, ``host_values``, ``selection``, ``lean_kernel``, ``lean_launch``: what every path reads alike (the
  small ``triton`` of host code, the choice of a config's binary, ``Config``) and the lean handles;
- ``rules``: what every reading of the index shares (launch options, ``read_params``);
- ``cold``, ``cold_launch``, ``cold_binding``: plain kernels' first calls without the rest of the runtime
  (``ColdKernel``, promoted to ``Kernel``), what they launch with, and the host modules bound with them;
- ``exports``: the full runtime's exported ops (custom ops while tracing);
- ``host_triton``: ``triton`` in host code;      ``tables``: variants, specializations, configs, targets;
- ``host_language``: ``triton.language``'s element types and ``tl.constexpr`` values in host code (lazy);
- ``host_driver``: ``triton.runtime.driver`` and torch.library's Triton entry points in host code (lazy);
- ``compiled``: what ``kernel.warmup(...)`` returns (lazy);
- ``host_decorators``: ``triton.heuristics``, ``triton.Config`` and ``triton.autotune`` in host code (lazy);
- ``cuda``, ``cuda_ctypes`` (without the C extension, and for rare calls), ``hip``, ``drivers``: the driver
  libraries;      ``packing``: argument encodings;
- ``kernel``: kernel handles and call binding;      ``launch``: binary choice, loading, the launch;
- ``host_modules``: the full binding of the shipped host code;      ``entry``: the package entry point (lazy);
- ``host_exec``: running a shipped file of host code (both bindings, project modules) and the package's module index;
- ``local_imports``: the project modules shipped with the package, imported under the package's rules;
- ``custom_ops``: the ops' torch custom ops, defined on first need;
- ``dev_binding``: binding every host module at once (forge-aot's tracing, tuning and development mode);
- ``torch_ops``: what the ops' torch custom ops run (Meta implementation, autograd, backward routing), ``fake_env``;
- ``descriptors``: host-side tensor descriptors and their kernel parameters (lazy);
- ``fastpath``: the optional C launch path (``_fastlaunch.c``, compiled into wheels by ``forge-aot build``);
- ``bundle``: the bytecode bundle's reading and serving;      ``bundling``: what it holds, and writing it;
- ``names``: this package's names.

Names are loaded on first access (PEP 562, ``names``). This file is what every fresh process runs first, so it
holds nothing else: ``import <package>`` runs it and ``lean`` only; the bytecode bundle (``bundle``) is read when
the full runtime is first needed.
"""


def __getattr__(name: str) -> object:
    from .names import attribute

    return attribute(name)


def __dir__() -> list[str]:
    from .names import listing

    return listing()
