"""How host code runs in a custom op's Meta implementation (``torch_ops.fake_call``): on the meta tensors torch
hands it, ``with torch.cuda.device(x.device):`` switches nothing; under torch's FakeTensorMode (torch.compile,
torch.export), on fake GPU tensors, it runs as a registered fake implementation would. Loaded with ``torch_ops``."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

_SWITCH = threading.Lock()
_SWITCH_USERS: list[Any] = [0, None, None]  # threads inside, torch's own cuda.device and get_device_properties


@contextlib.contextmanager
def meta_switches_nothing() -> Any:
    """``with torch.cuda.device(x.device):`` around a launch (every FlagGems op) on the meta tensors a Meta
    implementation is given: no device to switch to, so nothing switches (torch refuses a meta device; mamba's
    ``x.device.index`` is None there). ``torch.cuda.get_device_properties(x.device)`` there answers for the current
    GPU (mamba's backward sizes its scratch by the SM count; no output depends on it). While any thread runs one,
    both are wrappers that do only that and are otherwise torch's own."""
    import torch

    with _SWITCH:
        if _SWITCH_USERS[0] == 0:
            real = _SWITCH_USERS[1] = torch.cuda.device
            props = _SWITCH_USERS[2] = torch.cuda.get_device_properties
            if isinstance(real, type):
                class device(real):  # type: ignore[valid-type, misc]
                    def __init__(self, device: Any) -> None:
                        if isinstance(device, real):  # torch.cuda.device_of(x) (FlagAttention): its index
                            device = device.idx
                        if device is None or device == -1 or getattr(device, "type", device) == "meta":
                            self.idx, self.prev_idx = -1, -1  # torch's "no device": enter and exit switch nothing
                        else:
                            super().__init__(device)
            else:  # already replaced by a function (the build's trace answers as a GPU it has not got)
                def device(device: Any) -> Any:
                    meta = device is None or getattr(device, "type", device) == "meta" \
                        or getattr(device, "idx", None) == -1  # (device_of a meta tensor)
                    return contextlib.nullcontext() if meta else real(device)

            def get_device_properties(device: Any = None) -> Any:
                return props(None if getattr(device, "type", device) == "meta" else device)

            torch.cuda.device, torch.cuda.get_device_properties = device, get_device_properties
        _SWITCH_USERS[0] += 1
    try:
        yield
    finally:
        with _SWITCH:
            _SWITCH_USERS[0] -= 1
            if _SWITCH_USERS[0] == 0:
                torch.cuda.device, torch.cuda.get_device_properties = _SWITCH_USERS[1], _SWITCH_USERS[2]


@contextlib.contextmanager
def as_fake_implementation(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Where torch.compile or torch.export run this Meta implementation (their FakeTensorMode calls it on its fake
    GPU tensors, which say ``meta`` there), the host code runs as a ``register_fake`` implementation would (at no
    registration cost at import): the tensors say the GPU they stand for (``assert x.is_cuda``, bitsandbytes;
    ``if x.device.type == "cuda":``, Liger) and what it allocates on their device are fake tensors of that device.
    Meta tensors passed directly, and fake CPU tensors, stay as they are. Yields whether it took effect."""
    given = [a for v in (*args, *kwargs.values()) for a in (v if isinstance(v, (list, tuple)) else (v,))]  # Tensor[]
    mode = next((t.fake_mode for t in given if getattr(t, "fake_mode", None) is not None
                 and getattr(t, "fake_device", None) is not None and t.fake_device.type != "cpu"), None)
    if mode is None or not getattr(mode, "in_kernel_invocation", False):
        yield False
        return
    import torch

    C = torch._C
    # undo what the mode's kernel invocation set: the meta dispatch key and torch dispatch (Python keys) excluded
    mode.in_kernel_invocation = False
    try:
        with C._PreserveDispatchKeyGuard():
            C._set_meta_in_tls_dispatch_include(False)
            for key in (C.DispatchKey.Python, C.DispatchKey.PythonTLSSnapshot):
                C._dispatch_tls_set_dispatch_key_excluded(key, False)
            with mode:
                yield True
    finally:
        mode.in_kernel_invocation = True
