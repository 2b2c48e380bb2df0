"""Errors the packaged runtime raises (one hierarchy, each naming what is wrong and what was built)."""

from __future__ import annotations

from typing import Any


class ForgeRuntimeError(RuntimeError):
    """Base of the errors the packaged runtime raises."""


class UnsupportedDeviceError(ForgeRuntimeError):
    """The GPU is not one this package has binaries for (or the tensors are not on a GPU)."""

    @classmethod
    def no_binary(cls, function: str, device: str, arch: str, built: list[str], only: str | None,
                  missed: str | None = None, reason: str = "") -> UnsupportedDeviceError:
        """No build of a kernel for this device: its target was not built (``only``: the kernel's own targets
        key, else the project's), or it is an optional target where this build did not compile (``missed``)."""
        advice = f"It did not compile for {missed}: {reason}" if missed else \
            f"Rebuild with this device's target added to {only or 'project.targets'} in kernel_manifest.toml."
        return cls(f"{function}(): this package has no binaries for {device} ({arch}); "
                   f"{'this build of it' if missed else 'this kernel' if only else 'it'} was built for "
                   f"{', '.join(built) or 'no target'}. {advice}")


class UnsupportedDtypeError(ForgeRuntimeError, TypeError):
    """The arguments' dtype has no build in this package."""


class NotBuiltError(ForgeRuntimeError, ValueError):
    """A constexpr value or shape that no packaged binary covers."""

    @classmethod
    def no_binary(cls, kernel: Any, binaries: dict[str, Any], heur: tuple[Any, ...], spec: str) -> NotBuiltError:
        """No binary of a config serves a call (``tables.choose_binary``): its heuristics' values were not built, or
        an argument is what no binary with those values takes there (None, an integer, a tensor descriptor)."""
        from .tables import spec_fits

        names = kernel.heuristic_names
        same = [b["spec"] for b in binaries.values() if tuple(b.get("heur", {}).get(n) for n in names) == heur]
        for s, (pos, is_ptr) in enumerate(kernel.spec_slots if same else ()):
            if not any(spec_fits(b[s], spec[s]) for b in same):
                kinds = {"N": "None", "T": "a tensor descriptor", "i": "an integer", "d": "an integer",
                         "o": "an integer"}
                given = kinds.get(spec[s], "a tensor" if is_ptr else "a value")
                built = " or ".join(sorted({kinds.get(b[s], "a tensor" if is_ptr else "a value") for b in same}))
                return cls(f"{kernel.function}(): argument '{kernel.runtime_names[pos]}' is {given}, and this "
                           f"build's binaries take {built} there (Triton's JIT would compile the call anew: pass "
                           "such a value in the examples to build it)")
        built_heur = sorted({tuple(b.get("heur", {}).get(n) for n in names) for b in binaries.values()}, key=repr)
        return cls(f"{kernel.function}(): heuristics gave {dict(zip(names, heur))}, which was not built for this "
                   f"config; built: {[dict(zip(names, h)) for h in built_heur]}")


class DriverError(ForgeRuntimeError):
    """The GPU driver refused a call."""


class IntegrityError(ForgeRuntimeError):
    """A packaged binary does not match the sha256 recorded when the package was built: never launched."""


def listing(values: Any) -> str:
    """Values for a message, each once, in order: numbers by value (37 before 100), the rest by their repr."""
    def key(v: Any) -> tuple[int, float, str]:
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        return (0, v, "") if number else (1, 0.0, repr(v))

    return "[" + ", ".join(repr(v) for v in sorted(set(values), key=key)) + "]"
