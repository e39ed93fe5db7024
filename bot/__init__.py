"""botd: the daemon, its CLI and its store."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("botd")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
