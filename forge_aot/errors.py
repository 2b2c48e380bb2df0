"""One error hierarchy for the library; the CLI turns it into messages and exit codes."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ForgeError(Exception):
    """Base of every error forge-aot reports to a user (never a traceback for these)."""

    exit_code = 1


class ManifestError(ForgeError):
    """The manifest is unreadable or invalid. Carries the file, the TOML key path and a close match."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, key_path: str = "",
                 suggestion: str | None = None) -> None:
        self.message = message
        self.file = file
        self.key_path = key_path
        self.suggestion = suggestion
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ": ".join(p for p in (self.file, self.key_path) if p)
        text = f"{where}: {self.message}" if where else self.message
        if self.suggestion:
            text += f" (did you mean '{self.suggestion}'?)"
        return text


class SourceError(ForgeError):
    """A kernel source file cannot be split into kernels and host code, or does not match the manifest."""

    exit_code = 2


class CompileError(ForgeError):
    """No binary could be produced for an entry: names the kernel, variant, target and every failed config."""

    def __init__(self, kernel: str, variant: str, target: str, failures: list[str]) -> None:
        self.kernel, self.variant, self.target, self.failures = kernel, variant, target, failures
        detail = "\n".join(f"  - {f}" for f in failures) or "  (no candidate config)"
        super().__init__(f"kernel '{kernel}' [{variant}] for {target}: no config compiled\n{detail}")


class PackageError(ForgeError):
    """The wheel could not be generated or read."""


def close_match(word: str, choices: Iterable[str]) -> str | None:
    """The accepted word closest to a misspelt one, if any is close enough."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None
