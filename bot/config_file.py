"""Where the config comes from (DESIGN.md §4.2): the file, then environment overrides.

Precedence, highest first: ``BOTD_<SECTION>__<KEY>`` variables, the plain names
(``OPENAI_API_KEY``, ``TELEGRAM_BOT_TOKEN`` …), the YAML file, the defaults. The values
are checked by the model in ``config.py``; a problem is one ConfigError line per key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bot.config import BotdConfig, ConfigError

# Plain environment names honoured besides BOTD_…__… (name -> (section, key)).
PLAIN_ENV: dict[str, tuple[str, str]] = {
    "OPENAI_API_KEY": ("llm", "api_key"),
    "OPENAI_BASE_URL": ("llm", "base_url"),
    "TELEGRAM_BOT_TOKEN": ("telegram", "token"),
    "SLACK_BOT_TOKEN": ("slack", "bot_token"),
    "SLACK_APP_TOKEN": ("slack", "app_token"),
    "SLACK_SIGNING_SECRET": ("slack", "signing_secret"),
    "REDIS_URL": ("redis", "url"),
}


HOME_DIR = Path("~/.botd")  # botd's own directory: the config `botd init` writes, the workspace


def home_config() -> Path:
    return (HOME_DIR / "botd.yaml").expanduser()


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """``--config``, else ``$BOTD_CONFIG``, else ``./botd.yaml``, else ``~/.botd/botd.yaml`` when present.

    The home file comes last so a project directory can carry its own config, and every
    command run anywhere else finds the same one (and so the same store).
    """
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("BOTD_CONFIG")
    if env:
        return Path(env).expanduser()
    for candidate in (Path("botd.yaml"), home_config()):
        if candidate.is_file():
            return candidate.absolute()
    return None


def load_config(path: str | os.PathLike[str] | None = None) -> BotdConfig:
    """Read the config; raises ConfigError naming the key on any bad value."""
    resolved = config_path(path)
    data: dict[str, Any] = {}
    if resolved is not None:
        try:
            loaded = yaml.safe_load(resolved.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {resolved}") from exc
        except IsADirectoryError as exc:
            raise ConfigError(f"config file {resolved} is a directory") from exc
        except PermissionError as exc:
            raise ConfigError(f"config file {resolved} is not readable by this user") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {resolved} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {resolved} must be a mapping of sections")
        data = loaded
        _anchor_relative_paths(data, resolved.absolute().parent)
    for env_name, (section, key) in PLAIN_ENV.items():
        value = os.environ.get(env_name)
        if value:
            sect = data.setdefault(section, {})
            if not isinstance(sect, dict):
                raise ConfigError(f"{section}: must be a mapping")
            sect[key] = value
    try:
        cfg = BotdConfig(**data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    cfg.source = resolved.absolute() if resolved is not None else None
    return cfg


# Paths in a config file are relative to the file, not to wherever a command happens to run.
_FILE_RELATIVE_PATHS = (("agent", "workspace"), ("security", "cli_tools_file"))


def _anchor_relative_paths(data: dict[str, Any], base: Path) -> None:
    for section, key in _FILE_RELATIVE_PATHS:
        sect = data.get(section)
        if not isinstance(sect, dict):
            continue
        value = sect.get(key)
        if isinstance(value, str) and value and not value.startswith("~") and not Path(value).is_absolute():
            sect[key] = str(base / value)


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem, each naming the dotted key (never echoing secret values)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if p not in ("function-after",)) or "(config)"
        msg = err["msg"].removeprefix("Value error, ")
        # A section-level check names its own key ("heartbeat.every: ..."): say it once.
        lines.append(f"config error: {msg}" if msg.startswith(f"{loc}.") else f"config error: {loc}: {msg}")
    return "\n".join(lines)
