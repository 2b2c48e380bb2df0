"""Errors the packaged runtime raises (one hierarchy, each naming what is wrong and what was built)."""

from __future__ import annotations


class ForgeRuntimeError(RuntimeError):
    """Base of the errors the packaged runtime raises."""


class UnsupportedDeviceError(ForgeRuntimeError):
    """The GPU is not one this package has binaries for (or the tensors are not on a GPU)."""


class UnsupportedDtypeError(ForgeRuntimeError, TypeError):
    """The arguments' dtype has no build in this package."""


class NotBuiltError(ForgeRuntimeError, ValueError):
    """A constexpr value or shape that no packaged binary covers."""


class DriverError(ForgeRuntimeError):
    """The GPU driver refused a call."""


class IntegrityError(ForgeRuntimeError):
    """A packaged binary does not match the sha256 recorded when the package was built: never launched."""
