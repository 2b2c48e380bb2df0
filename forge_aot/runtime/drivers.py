"""The process's GPU driver, picked from torch's build (ROCm or CUDA) and loaded once."""

from __future__ import annotations

import threading
from typing import Any

_driver: Any = None
_driver_lock = threading.Lock()


def driver() -> Any:
    """The process's driver, picked from torch's build (ROCm or CUDA) and loaded once."""
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                import torch

                if getattr(torch.version, "hip", None):
                    from .hip import _HipDriver

                    _driver = _HipDriver()
                else:
                    from .cuda import open_driver

                    _driver = open_driver()
    return _driver
