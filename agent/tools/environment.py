"""The environment a tool's subprocess gets: the allowlist plus the tool's own, nothing else.

The daemon's environment holds the LLM key and the chat tokens; a subprocess
started for the model must never see them. So the environment is built up from
nothing: the allowlisted names copied from the daemon's environment (when set),
then the variables the tool itself declares.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def subprocess_env(
    allowlist: Iterable[str],
    declared: Mapping[str, str] | None = None,
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Allowlisted variables from ``source`` (default ``os.environ``), then ``declared`` on top."""
    origin = os.environ if source is None else source
    env = {name: origin[name] for name in allowlist if name in origin}
    if declared:
        env.update(declared)
    return env


def expand_env_refs(value: str, environ: Mapping[str, str]) -> str:
    """``value`` with every ``${VAR}`` taken from ``environ``, explicitly and nothing else.

    Raises ``ValueError`` naming the problem (an unset variable, a malformed reference,
    a NUL byte) and never the value, which may be a secret.
    """

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ValueError(f"environment variable {name} is not set")
        return environ[name]

    resolved = _ENV_REFERENCE.sub(substitute, value)
    if "${" in _ENV_REFERENCE.sub("", value):
        raise ValueError("malformed ${VAR} reference")
    if "\x00" in resolved:
        raise ValueError("the value contains a NUL byte")
    return resolved
