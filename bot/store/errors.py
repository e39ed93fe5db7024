"""Errors of the store, phrased for the operator (never carrying a password)."""

from __future__ import annotations


class StoreError(Exception):
    """Base class for every error raised by ``bot.store``."""


class StoreConfigError(StoreError, ValueError):
    """The Redis settings cannot work (bad URL scheme, socket path too long …)."""


class StoreUnavailable(StoreError):
    """Redis could not be reached or the embedded server could not be started.

    ``url`` is the address with any password replaced by ``***``.
    """

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class LockTimeout(StoreError):
    """A lock or lease was not acquired within the allowed wait."""
