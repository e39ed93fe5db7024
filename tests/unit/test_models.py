"""``llm.models``: validation, what each model inherits from ``llm``, its price, its client."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.llm import LLMClient
from bot.config import BotdConfig, ConfigError
from bot.config_file import load_config
from bot.models import ModelCatalog, build_client, check_models


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("BOTD_") or name in {"OPENAI_API_KEY", "OPENAI_BASE_URL"}:
            monkeypatch.delenv(name, raising=False)


def config(tmp_path: Path, text: str) -> BotdConfig:
    path = tmp_path / "botd.yaml"
    path.write_text(text)
    return load_config(path)


def test_listed_models_inherit_what_they_leave_out(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        "llm:\n"
        "  model: small\n  base_url: http://127.0.0.1:9/v1\n  context_window: 16000\n"
        "  price: {prompt_per_mtok: 0.15, completion_per_mtok: 0.6}\n"
        "  models:\n"
        "    big: {context_window: 200000, max_output_tokens: 8192,\n"
        "          price: {prompt_per_mtok: 3, completion_per_mtok: 15}}\n"
        "    other-host: {base_url: http://127.0.0.1:10/v1, api_key: other-key}\n"
        "    plain:\n",
    )
    catalog = ModelCatalog(cfg, build_client(cfg, "small"))
    assert catalog.ids() == ["small", "big", "other-host", "plain"]
    small, big, plain = catalog.profile("small"), catalog.profile("big"), catalog.profile("plain")
    assert small is not None and big is not None and plain is not None
    assert (small.context_window, small.max_output_tokens) == (16000, 4096)
    assert (big.context_window, big.max_output_tokens) == (200000, 8192)
    assert (plain.context_window, plain.base_url) == (16000, "http://127.0.0.1:9/v1")
    assert small.cost(1_000_000, 1_000_000) == pytest.approx(0.75)
    assert big.cost(2000, 1000) == pytest.approx((2000 * 3 + 1000 * 15) / 1e6)
    assert plain.cost(1000, 1000) is None
    assert catalog.profile("unknown") is None and catalog.profile(None) is None


def test_each_model_gets_its_own_client_with_its_id_endpoint_and_cap(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        "llm:\n  model: small\n  base_url: http://127.0.0.1:9/v1\n"
        "  models: {big: {max_output_tokens: 8192, base_url: 'http://127.0.0.1:10/v1'}}\n",
    )
    default = build_client(cfg, "small")
    catalog = ModelCatalog(cfg, default)
    big = catalog.client("big")
    assert catalog.client("small") is default
    assert isinstance(big, LLMClient) and catalog.client("big") is big
    assert big.model == "big" and big.max_output_tokens == 8192
    assert str(big._client.base_url).startswith("http://127.0.0.1:10/v1")
    with pytest.raises(KeyError):
        catalog.client("unknown")


def test_a_model_without_key_or_endpoint_names_its_key(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        "llm:\n  model: small\n  base_url: http://127.0.0.1:9/v1\n"
        "  models: {}\n",
    )
    cfg.llm.base_url = None
    with pytest.raises(ConfigError, match="llm.api_key"):
        build_client(cfg, "small")
    cfg = config(tmp_path, "llm:\n  api_key: k\n  models: {gpt-4o: {}}\n")
    cfg.llm.api_key = None
    with pytest.raises(ConfigError, match=r"llm\.models\.gpt-4o\.api_key"):
        check_models(cfg)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("llm: {models: {'has space': {}}}", "llm.models"),
        ("llm: {model: ''}", "llm.model"),
        ("llm: {models: {m: {context_window: 10}}}", "llm.models.m.context_window"),
        ("llm: {models: {m: {price: {prompt_per_mtok: -1}}}}", "llm.models.m.price.prompt_per_mtok"),
        ("llm: {models: {m: {colour: red}}}", "llm.models.m.colour"),
    ],
)
def test_bad_model_entries_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config(tmp_path, text + "\n")
