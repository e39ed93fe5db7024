"""The environment a tool's subprocess gets: the allowlist plus the tool's own, nothing else.

The daemon's environment holds the LLM key and the chat tokens; a subprocess
started for the model must never see them. So the environment is built up from
nothing: the allowlisted names copied from the daemon's environment (when set),
then the variables the tool itself declares.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping


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
