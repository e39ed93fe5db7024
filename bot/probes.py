"""Live checks of what botd talks to (LLM endpoint, Telegram, Slack) and token shapes.

``botd doctor`` and ``botd init`` share them. Each answers a :class:`Probe`: one line for
the operator (the URL asked and why it failed, never a raw exception or a secret) and,
on failure, one line saying how to fix it.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

OPENAI_BASE_URL = "https://api.openai.com/v1"
TELEGRAM_BASE_URL = "https://api.telegram.org/bot"
SLACK_BASE_URL = "https://slack.com/api/"
TIMEOUT_S = 10.0

# BotFather's tokens: the bot's numeric id, a colon, 35 characters of URL-safe base64.
TELEGRAM_TOKEN = re.compile(r"^\d{3,20}:[A-Za-z0-9_-]{35}$")


@dataclass(frozen=True)
class Probe:
    ok: bool
    detail: str
    fix: str = ""


# ---- token shapes ----------------------------------------------------------------------


def telegram_token_problem(token: str) -> Probe | None:
    """None when the token has BotFather's shape, else what is wrong (without echoing it)."""
    if TELEGRAM_TOKEN.fullmatch(token.strip()):
        return None
    return Probe(False, "telegram.token does not look like a bot token (<digits>:<35 characters>)",
                 "copy the whole token @BotFather gave you (send it /token to see it again)")


# (config key, prefix, what it is, where Slack shows it) of each Slack token.
_SLACK_BOT = ("slack.bot_token", "xoxb-", "a bot token", "the Bot User OAuth Token (xoxb-…) from OAuth & Permissions")
_SLACK_APP = ("slack.app_token", "xapp-", "an app-level token",
              "an app-level token (xapp-…, scope connections:write) from Basic Information → App-Level Tokens")


def _slack_token_shape(value: str, this: tuple[str, str, str, str], other: tuple[str, str, str, str]) -> Probe | None:
    key, prefix, _, source = this
    if not value:
        return Probe(False, f"{key} is not set", f"set it to {source}")
    if value.startswith(other[1]):
        return Probe(False, f"{key} is {other[2]} ({other[1]}…), not {this[2]}", f"use {source}")
    if not value.startswith(prefix):
        return Probe(False, f"{key} does not start with {prefix}", f"use {source}")
    return None


def slack_token_problems(bot_token: str | None, app_token: str | None, *, socket_mode: bool) -> list[Probe]:
    """Missing, swapped or misshapen Slack tokens (bot: ``xoxb-``; Socket Mode app: ``xapp-``)."""
    bot = (bot_token or "").strip()
    app = (app_token or "").strip()
    if bot.startswith("xapp-") and app.startswith("xoxb-"):
        return [Probe(False, "slack.bot_token and slack.app_token are swapped (bot xoxb-…, app xapp-…)",
                      "exchange the two values")]
    found = [_slack_token_shape(bot, _SLACK_BOT, _SLACK_APP)]
    if socket_mode:
        found.append(_slack_token_shape(app, _SLACK_APP, _SLACK_BOT))
    return [p for p in found if p is not None]


# ---- live checks -----------------------------------------------------------------------


async def probe_llm(base_url: str | None, api_key: str | None, model: str, *, timeout_s: float = TIMEOUT_S) -> Probe:
    """Does the endpoint answer for ``model``? ``GET /models`` first, else a one-token completion.

    Many OpenAI-compatible servers have no ``/models``, and some list only part of what they
    serve, so a missing or unlisted model is confirmed with the smallest real request.
    """
    base = (base_url or OPENAI_BASE_URL).rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as http:
        url = f"{base}/models"
        try:
            resp = await http.get(url)
        except httpx.HTTPError as exc:
            return _unreachable(url, exc, "check llm.base_url and that the server is running")
        if resp.status_code in (401, 403):
            return _key_rejected(url, resp)
        if resp.status_code == 200 and model in _model_ids(resp):
            return Probe(True, f"{base} answers and lists model {model}")
        listing = "does not list it" if resp.status_code == 200 else f"GET /models: HTTP {resp.status_code}"
        return await _one_token(http, base, model, listing)


async def _one_token(http: httpx.AsyncClient, base: str, model: str, listing: str) -> Probe:
    url = f"{base}/chat/completions"
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1}
    try:
        resp = await http.post(url, json=body)
        if resp.status_code == 400 and "max_completion_tokens" in resp.text:
            # Newer OpenAI models refuse max_tokens and ask for max_completion_tokens.
            body["max_completion_tokens"] = body.pop("max_tokens")
            resp = await http.post(url, json=body)
    except httpx.HTTPError as exc:
        return _unreachable(url, exc, "check llm.base_url and that the server is running")
    if resp.status_code == 200:
        return Probe(True, f"{base} answered a one-token completion with model {model} ({listing})")
    if resp.status_code in (401, 403):
        return _key_rejected(url, resp)
    if resp.status_code == 404:
        return Probe(False, f"POST {url}: HTTP 404 for model {model}: {_error_message(resp)}",
                     "set llm.model to a model this endpoint serves, or fix llm.base_url (usually ends in /v1)")
    return Probe(False, f"POST {url}: HTTP {resp.status_code}: {_error_message(resp)}",
                 "check llm.base_url, llm.model and the server's logs")


async def probe_telegram(token: str, api_base_url: str | None, *, timeout_s: float = TIMEOUT_S) -> Probe:
    """``getMe`` with the token; ok names the bot (@username)."""
    base = api_base_url or TELEGRAM_BASE_URL
    shown = _origin(base)  # the token is part of the path: never show it
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        try:
            resp = await http.get(f"{base}{token}/getMe")
        except httpx.HTTPError as exc:
            failed = _unreachable(f"{shown} (getMe)", exc, "check the network, or telegram.api_base_url")
            return Probe(False, failed.detail.replace(token, "<token>") if token else failed.detail, failed.fix)
    data = _json(resp)
    if resp.status_code in (401, 404):
        return Probe(False, f"{shown} rejected the token (getMe: HTTP {resp.status_code})",
                     "copy the token from @BotFather again (send it /token), or revoke and create a new one")
    result = data.get("result") if data.get("ok") else None
    if resp.status_code != 200 or not isinstance(result, dict):
        return Probe(False, f"{shown} getMe: HTTP {resp.status_code}: {data.get('description', 'no answer')}",
                     "try again later; check telegram.api_base_url if you set it")
    return Probe(True, f"token accepted for @{result.get('username')} ({result.get('first_name', '')})")


async def probe_slack(bot_token: str, api_base_url: str | None, *, timeout_s: float = TIMEOUT_S) -> Probe:
    """``auth.test`` with the bot token; ok names the bot user and the workspace."""
    base = api_base_url or SLACK_BASE_URL
    if not base.endswith("/"):
        base += "/"
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        try:
            resp = await http.post(f"{base}auth.test", headers={"Authorization": f"Bearer {bot_token}"})
        except httpx.HTTPError as exc:
            return _unreachable(f"{base}auth.test", exc, "check the network, or slack.api_base_url")
    data = _json(resp)
    if resp.status_code == 200 and data.get("ok"):
        return Probe(True, f"token accepted for {data.get('user')} in {data.get('team')}")
    error = data.get("error") or f"HTTP {resp.status_code}"
    fix = ("copy the Bot User OAuth Token (xoxb-…) again from OAuth & Permissions; reinstall the app "
           "if it was revoked") if error in {"invalid_auth", "not_authed", "token_revoked", "account_inactive"} \
        else "check slack.api_base_url and Slack's status page"
    return Probe(False, f"{base}auth.test: {error}", fix)


async def check_telegram(token: str, api_base_url: str | None) -> Probe:
    """The token's shape, then ``getMe`` (a malformed token is never sent anywhere)."""
    return telegram_token_problem(token) or await probe_telegram(token, api_base_url)


async def check_slack(bot_token: str | None, app_token: str | None, api_base_url: str | None, *,
                      socket_mode: bool) -> list[Probe]:
    """Every token problem; when there is none, ``auth.test`` with the bot token."""
    problems = slack_token_problems(bot_token, app_token, socket_mode=socket_mode)
    return problems or [await probe_slack(bot_token or "", api_base_url)]


# ---- wording ---------------------------------------------------------------------------


def _unreachable(url: str, exc: httpx.HTTPError, fix: str) -> Probe:
    return Probe(False, f"cannot reach {url}: {describe_http_error(exc)}", fix)


def _key_rejected(url: str, resp: httpx.Response) -> Probe:
    return Probe(False, f"{url}: HTTP {resp.status_code}, the API key was refused: {_error_message(resp)}",
                 "set llm.api_key (or OPENAI_API_KEY) to a key this endpoint accepts")


def describe_http_error(exc: httpx.HTTPError) -> str:
    """A transport failure in words ("connection refused"), not an exception repr."""
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    text = str(exc) or type(exc).__name__
    lowered = " ".join([text, *(str(e) for e in _causes(exc))]).lower()
    if any(isinstance(e, ConnectionRefusedError) for e in _causes(exc)):
        return "connection refused (nothing listens there)"
    if any(isinstance(e, socket.gaierror) for e in _causes(exc)):
        return "host name not found"
    if "refused" in lowered:
        return "connection refused (nothing listens there)"
    if any(s in lowered for s in ("name or service not known", "nodename nor servname", "errno -2", "errno -3",
                                  "temporary failure in name resolution", "getaddrinfo")):
        return "host name not found"
    if "certificate" in lowered or "ssl" in lowered:
        return "TLS handshake failed (certificate or protocol problem)"
    if isinstance(exc, httpx.UnsupportedProtocol):
        return "not an http:// or https:// URL"
    text = re.sub(r"^\[Errno -?\d+\]\s*", "", text.splitlines()[0])
    return text[:200]


def _causes(exc: BaseException) -> list[BaseException]:
    """The exceptions behind ``exc`` (httpx wraps the socket error, sometimes twice)."""
    seen: list[BaseException] = []
    current = exc.__cause__ or exc.__context__
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        inner = getattr(current, "exceptions", None)  # an ExceptionGroup from happy eyeballs
        if inner:
            seen.extend(e for e in inner if isinstance(e, BaseException))
        current = current.__cause__ or current.__context__
    return seen


def _error_message(resp: httpx.Response) -> str:
    data = _json(resp)
    error = data.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:200]
    if isinstance(error, str):
        return error[:200]
    text = " ".join(resp.text.split())
    return text[:200] or "empty body"


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _model_ids(resp: httpx.Response) -> set[str]:
    data = _json(resp).get("data")
    if not isinstance(data, list):
        return set()
    return {str(m.get("id")) for m in data if isinstance(m, dict)}


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else "the Telegram API"
