"""``botd doctor``: is everything botd needs reachable and accepted?"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from bot.config import BotdConfig
from bot.models import build_client
from bot.store.connection import open_redis

Check = tuple[str, bool, str]
TIMEOUT_S = 10.0


async def _guarded(name: str, probe: Callable[[], Awaitable[str]]) -> Check:
    try:
        async with asyncio.timeout(TIMEOUT_S):
            return (name, True, await probe())
    except TimeoutError:
        return (name, False, f"no answer within {TIMEOUT_S:g} s")
    except Exception as exc:
        return (name, False, f"{type(exc).__name__}: {exc}")


async def run_checks(cfg: BotdConfig) -> list[Check]:
    results: list[Check] = [("config", True, "loaded")]

    async def redis() -> str:
        handle = await open_redis(cfg.redis, cfg.workspace)
        try:
            await handle.client.ping()
            return f"{handle.url} answers" + (" (embedded)" if handle.embedded else "")
        finally:
            await handle.close()

    async def llm(model_id: str) -> str:
        model = build_client(cfg, model_id)
        try:
            models = await model.check()
        finally:
            await model.aclose()
        listed = "listed" if model_id in models else "not listed (may still work)"
        return f"endpoint answers; model {model_id} {listed}"

    results.append(await _guarded("redis", redis))
    results.append(await _guarded("llm", lambda: llm(cfg.llm.model)))
    for model_id in cfg.llm.models:  # the models a chat may switch to with /model
        if model_id != cfg.llm.model:
            results.append(await _guarded(f"llm {model_id}", functools.partial(llm, model_id)))
    if cfg.telegram.enabled:
        results.append(await _guarded("telegram", lambda: _telegram(cfg)))
    if cfg.slack.enabled:
        results.append(await _guarded("slack", lambda: _slack(cfg)))
    return results


async def _telegram(cfg: BotdConfig) -> str:
    from telegram import Bot

    token = cfg.telegram.token.get_secret_value() if cfg.telegram.token else ""
    base_url = cfg.telegram.api_base_url or "https://api.telegram.org/bot"
    async with Bot(token, base_url=base_url) as bot:
        me = await bot.get_me()
    return f"token accepted for @{me.username}"


async def _slack(cfg: BotdConfig) -> str:
    from slack_sdk.web.async_client import AsyncWebClient

    token = cfg.slack.bot_token.get_secret_value() if cfg.slack.bot_token else ""
    client = AsyncWebClient(token=token, base_url=cfg.slack.api_base_url or AsyncWebClient.BASE_URL)
    answer = await client.auth_test()
    return f"token accepted for {answer.get('user')} in {answer.get('team')}"
