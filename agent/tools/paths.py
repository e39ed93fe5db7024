"""Which filesystem paths the file tools may touch.

A path from the model is expanded (``~``), made absolute against the workspace and
resolved with every symlink followed *before* it is compared with the roots, so a
link inside the workspace that points outside is judged by where it points.
Denied paths beat allowed ones, also when nested inside them. Both the resolved
and the purely lexical form of the path must pass, and the roots themselves are
compared in both forms, so a symlinked root cannot be used to sidestep a denial.
The roots' resolved forms are taken once (``ToolSettings.path_guard``), so a link
planted at a root later does not widen it. This guard judges a path; the file
tools then open exactly that path race-free (``safe_open``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from agent.tools.registry import ToolError, ToolSettings

MAX_PATH_CHARS = 4096  # PATH_MAX on Linux


class PathDeniedError(ToolError):
    """A path the file tools refuse; the message says why (for the model)."""


def _forms(path: Path) -> set[Path]:
    """The lexical and the symlink-resolved absolute forms of a configured root."""
    expanded = Path(os.path.abspath(os.path.expanduser(str(path))))
    return {expanded, Path(os.path.realpath(expanded))}


def _within(path: Path, roots: Iterable[Path]) -> Path | None:
    for root in roots:
        if path == root or path.is_relative_to(root):
            return root
    return None


class PathGuard:
    """Resolves model-supplied paths and refuses those outside the allowed roots."""

    def __init__(self, workspace: Path, allowed: Iterable[Path] = (), denied: Iterable[Path] = ()) -> None:
        self.workspace = Path(os.path.abspath(os.path.expanduser(str(workspace))))
        allowed = list(allowed) or [self.workspace]  # nothing configured: the workspace only
        self.allowed = sorted({form for root in allowed for form in _forms(root)})
        self.denied = sorted({form for root in denied for form in _forms(root)})

    @classmethod
    def from_settings(cls, settings: ToolSettings) -> PathGuard:
        return settings.path_guard

    def resolve(self, raw: str) -> Path:
        """The absolute, symlink-free path for ``raw``; raises ``PathDeniedError`` when not allowed."""
        if not isinstance(raw, str) or not raw.strip():
            raise PathDeniedError("Error: the path is empty.")
        if "\x00" in raw:
            raise PathDeniedError("Error: the path contains a NUL byte.")
        if len(raw) > MAX_PATH_CHARS:
            raise PathDeniedError(f"Error: the path is longer than {MAX_PATH_CHARS} characters.")
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            raise PathDeniedError("Error: the path is not valid UTF-8 text.") from None
        expanded = os.path.expanduser(raw)
        lexical = Path(os.path.normpath(os.path.join(self.workspace, expanded)))
        try:
            resolved = Path(os.path.realpath(lexical))
        except (OSError, ValueError) as exc:
            raise PathDeniedError(f"Error: cannot resolve {raw!r}: {exc}.") from None
        for form in (resolved, lexical):
            denied_root = _within(form, self.denied)
            if denied_root is not None:
                raise PathDeniedError(f"Error: access to {raw!r} is denied ({denied_root} is a denied path).")
        for form in (resolved, lexical):
            if _within(form, self.allowed) is None:
                roots = ", ".join(str(r) for r in self.allowed)
                raise PathDeniedError(
                    f"Error: {raw!r} resolves to {form}, which is outside the allowed paths ({roots})."
                )
        return resolved

    def check_resolved(self, path: Path) -> Path:
        """Re-check an already resolved path (after creating directories, say)."""
        return self.resolve(str(path))
