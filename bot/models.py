"""The configured models (``llm.model`` and ``llm.models``) and a client for each.

A session may switch to any configured model (``/model``); a run then uses that
model's id, endpoint, key, output cap and context window. Each entry of ``llm.models``
falls back to the ``llm`` section for what it leaves out, so listing a model id alone
is enough when it lives on the same endpoint. Clients are built on first use, one per
model, and closed with the daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.llm import LLMClient
from agent.llm_types import ChatModel
from bot.config import BotdConfig, ConfigError, PriceConfig
from bot.logs import register_secret
from bot.store.sessions import SessionStore


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """One model as a run sees it."""

    id: str
    context_window: int
    max_output_tokens: int
    base_url: str | None
    price: PriceConfig | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """What these tokens cost under the model's price, None when it has none."""
        if self.price is None:
            return None
        return (prompt_tokens * self.price.prompt_per_mtok + completion_tokens * self.price.completion_per_mtok) / 1e6


ClientFactory = Callable[[BotdConfig, str], ChatModel]


def model_api_key(cfg: BotdConfig, model_id: str) -> str | None:
    """The key of ``model_id`` (its own, else ``llm.api_key``); None for a keyless endpoint.
    Without a key or an endpoint: ConfigError naming the key."""
    entry = cfg.llm.models.get(model_id)
    secret = entry.api_key if entry is not None and entry.api_key is not None else cfg.llm.api_key
    key = secret.get_secret_value() if secret else None
    if key is None and model_profile(cfg, model_id).base_url is None:
        where = f"llm.models.{model_id}.api_key" if model_id != cfg.llm.model else "llm.api_key"
        raise ConfigError(f"config error: {where}: required when no base_url is set (or set OPENAI_API_KEY)")
    return key


def check_models(cfg: BotdConfig) -> None:
    """Every model a chat may switch to can be reached with a key or a keyless endpoint."""
    for model_id in cfg.llm.models:
        model_api_key(cfg, model_id)


def build_client(cfg: BotdConfig, model_id: str) -> LLMClient:
    """The OpenAI-compatible client of ``model_id`` (ConfigError naming the key when it cannot be built)."""
    key = model_api_key(cfg, model_id)
    base_url = model_profile(cfg, model_id).base_url
    register_secret(key)
    return LLMClient(
        model=model_id,
        base_url=base_url,
        api_key=key,
        max_output_tokens=model_profile(cfg, model_id).max_output_tokens,
        request_timeout_s=cfg.llm.request_timeout_s,
        max_retries=cfg.llm.max_retries,
    )


def model_profile(cfg: BotdConfig, model_id: str) -> ModelProfile:
    """``model_id`` with what its ``llm.models`` entry leaves out taken from the ``llm`` section."""
    llm = cfg.llm
    entry = llm.models.get(model_id)
    price = entry.price if entry is not None and entry.price is not None else None
    if price is None and model_id == llm.model:
        price = llm.price
    return ModelProfile(
        id=model_id,
        context_window=(entry.context_window if entry and entry.context_window else llm.context_window),
        max_output_tokens=(entry.max_output_tokens if entry and entry.max_output_tokens else llm.max_output_tokens),
        base_url=entry.base_url if entry is not None and entry.base_url else llm.base_url,
        price=price,
    )


class ModelCatalog:
    """Profiles and clients of every configured model; ``default`` is ``llm.model``."""

    def __init__(self, cfg: BotdConfig, default_client: ChatModel, factory: ClientFactory = build_client) -> None:
        self.cfg = cfg
        self._factory = factory
        self._profiles = {cfg.llm.model: model_profile(cfg, cfg.llm.model)}
        for model_id in cfg.llm.models:
            self._profiles.setdefault(model_id, model_profile(cfg, model_id))
        self._clients: dict[str, ChatModel] = {cfg.llm.model: default_client}
        self._built: list[ChatModel] = []

    @property
    def default(self) -> ModelProfile:
        return self._profiles[self.cfg.llm.model]

    def ids(self) -> list[str]:
        """The default first, then ``llm.models`` in config order."""
        return list(self._profiles)

    def profile(self, model_id: str | None) -> ModelProfile | None:
        return self._profiles.get(model_id or "")

    def client(self, model_id: str) -> ChatModel:
        """The client of a configured model, built on first use."""
        client = self._clients.get(model_id)
        if client is None:
            if model_id not in self._profiles:
                raise KeyError(model_id)
            client = self._clients[model_id] = self._factory(self.cfg, model_id)
            self._built.append(client)
        return client

    async def for_session(self, sessions: SessionStore, session_key: str) -> ModelProfile:
        """The session's chosen model, or the default when it chose none (or one no longer configured)."""
        return self.profile(await sessions.model(session_key)) or self.default

    async def aclose(self) -> None:
        """Close the clients built here (the default one belongs to whoever passed it in)."""
        for client in self._built:
            await client.aclose()
        self._built.clear()
