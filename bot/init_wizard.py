"""``botd init``: ask what botd needs, test it live, write a commented ``~/.botd/botd.yaml``.

Every answer is tested where it is given: the LLM endpoint with a one-token completion,
a Telegram token with ``getMe`` (showing the bot's @name), Slack tokens with
``auth.test`` and the app token's shape. ``--non-interactive`` takes every answer from a
flag (or the usual environment variable) for scripts and Docker; there a failed test
exits 1 and writes nothing. Secrets found only in the environment stay there: the file
gets the values that were typed or passed as flags. The file is written with mode 0600.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import tempfile
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import ValidationError

from bot.config import BotdConfig
from bot.config_file import format_validation_error, home_config

if TYPE_CHECKING:  # bot.probes imports httpx: only `botd init` needs it, not every command's parser
    from bot.probes import Probe

DM_POLICIES = ("pairing", "allowlist", "open")


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--non-interactive", action="store_true", help="take every answer from the flags below; ask nothing")
    add("--force", action="store_true", help="overwrite an existing config file")
    add("--skip-checks", action="store_true", help="do not test the LLM endpoint and tokens live")
    add("--workspace", metavar="PATH", default="~/.botd/workspace", help="agent workspace (default: %(default)s)")
    add("--llm-base-url", metavar="URL", help="OpenAI-compatible endpoint (default: OpenAI; $OPENAI_BASE_URL)")
    add("--llm-api-key", metavar="KEY", help="API key (default: $OPENAI_API_KEY, kept in the environment)")
    add("--llm-model", metavar="MODEL", default="gpt-4o-mini", help="model id (default: %(default)s)")
    add("--telegram-token", metavar="TOKEN", help="bot token from @BotFather (enables Telegram)")
    add("--slack-bot-token", metavar="XOXB", help="Bot User OAuth Token, xoxb-… (enables Slack)")
    add("--slack-app-token", metavar="XAPP", help="app-level token, xapp-… (Socket Mode)")
    add("--slack-mode", choices=["socket", "http"], default="socket", help="Slack connection (default: %(default)s)")
    add("--slack-signing-secret", metavar="SECRET", help="signing secret (HTTP mode)")
    add("--dm-policy", choices=DM_POLICIES, default="pairing",
        help="who may talk to the bot in private: pairing (approve each new user), allowlist, open")
    add("--allow-from", metavar="IDS", default="", help="comma-separated user ids allowed in DMs")


@dataclass
class Answers:
    workspace: str = "~/.botd/workspace"
    llm_base_url: str | None = None
    llm_api_key: str | None = None  # None: not written (from the environment, or keyless)
    llm_model: str = "gpt-4o-mini"
    telegram_token: str | None = None
    slack_bot_token: str | None = None
    slack_app_token: str | None = None
    slack_mode: str = "socket"
    slack_signing_secret: str | None = None
    dm_policy: str = "pairing"
    allow_from: list[str] = field(default_factory=list)


class InitError(Exception):
    """A test failed or an answer cannot work; the message says which and why."""


def _q(value: object) -> str:
    """A scalar as YAML (JSON strings are valid YAML and need no further escaping)."""
    return json.dumps(value, ensure_ascii=False)


def render_config(a: Answers) -> str:
    """The commented config file for these answers."""
    def opt(key: str, value: str | None, note: str) -> str:
        return f"  {key}: {_q(value)}" if value else f"  # {key}: null  # {note}"

    allow = _q(a.allow_from)
    return f"""# botd configuration, written by `botd init`. Every key: README.md, "Configuration".
# Environment variables override this file: BOTD_<SECTION>__<KEY>, and OPENAI_API_KEY,
# TELEGRAM_BOT_TOKEN, SLACK_BOT_TOKEN, SLACK_APP_TOKEN, SLACK_SIGNING_SECRET, REDIS_URL.
# This file holds secrets: keep it private (mode 0600).

agent:
  # IDENTITY.md, SOUL.md, MEMORY.md and HEARTBEAT.md live here; tools work here.
  workspace: {_q(a.workspace)}

llm:
{opt("base_url", a.llm_base_url, "null: OpenAI; any OpenAI-compatible /v1 URL")}
{opt("api_key", a.llm_api_key, "taken from OPENAI_API_KEY")}
  model: {_q(a.llm_model)}

redis:
  url: null      # null: a private Valkey under <workspace>/.botd/ (one host); else redis://…
  prefix: botd

telegram:
  enabled: {_q(a.telegram_token is not None)}
{opt("token", a.telegram_token, "from @BotFather, or TELEGRAM_BOT_TOKEN")}
  mode: polling  # polling | webhook
  # pairing: a stranger's DM gets a code, `botd pairing approve CODE` lets them in.
  # allowlist: only allow_from (user ids or @usernames). open: anyone.
  dm_policy: {a.dm_policy}
  allow_from: {allow}
  groups: []     # group ids the bot may answer in ("*": any); it needs a mention there

slack:
  enabled: {_q(a.slack_bot_token is not None)}
{opt("bot_token", a.slack_bot_token, "xoxb-…, or SLACK_BOT_TOKEN")}
{opt("app_token", a.slack_app_token, "xapp-… for Socket Mode, or SLACK_APP_TOKEN")}
{opt("signing_secret", a.slack_signing_secret, "HTTP mode only, or SLACK_SIGNING_SECRET")}
  mode: {a.slack_mode}   # socket | http
  dm_policy: {a.dm_policy}
  allow_from: {allow}
  channels: []   # channel ids the bot may answer in ("*": any); it needs a mention there

http:
  host: 127.0.0.1
  port: 8080     # /healthz /readyz /metrics and the webhooks
"""


def check_rendered(text: str) -> None:
    """The file must load as a config (catches a broken template or answer before writing)."""
    try:
        BotdConfig(**(yaml.safe_load(text) or {}))
    except ValidationError as exc:
        raise InitError(format_validation_error(exc)) from None


def write_private(path: Path, text: str) -> None:
    """Write atomically with mode 0600 (the directory 0700 when created)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".botd-init-", suffix=".yaml")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- tests of the answers ----------------------------------------------------------------


async def check_llm(a: Answers) -> Probe:
    from bot.probes import Probe, probe_llm

    key = a.llm_api_key or os.environ.get("OPENAI_API_KEY") or None
    if key is None and a.llm_base_url is None:
        return Probe(False, "no API key for OpenAI", "pass --llm-api-key, set OPENAI_API_KEY, or --llm-base-url")
    return await probe_llm(a.llm_base_url, key, a.llm_model)


def _telegram(a: Answers) -> Awaitable[Probe]:
    from bot.probes import check_telegram

    return check_telegram(a.telegram_token or "", os.environ.get("BOTD_TELEGRAM__API_BASE_URL"))


async def _slack(a: Answers) -> Probe:
    from bot.probes import Probe, check_slack

    if a.slack_mode == "http" and not a.slack_signing_secret:
        return Probe(False, "slack.signing_secret is not set (HTTP mode needs it)",
                     "copy it from Basic Information → App Credentials")
    probes = await check_slack(a.slack_bot_token, a.slack_app_token, os.environ.get("BOTD_SLACK__API_BASE_URL"),
                               socket_mode=a.slack_mode == "socket")
    return next((p for p in probes if not p.ok), probes[0])


def _answers_from_flags(args: argparse.Namespace) -> Answers:
    return Answers(
        workspace=args.workspace,
        llm_base_url=args.llm_base_url or None,
        llm_api_key=args.llm_api_key or None,
        llm_model=args.llm_model,
        telegram_token=args.telegram_token or None,
        slack_bot_token=args.slack_bot_token or None,
        slack_app_token=args.slack_app_token or None,
        slack_mode=args.slack_mode,
        slack_signing_secret=args.slack_signing_secret or None,
        dm_policy=args.dm_policy,
        allow_from=[s.strip() for s in args.allow_from.split(",") if s.strip()],
    )


async def _non_interactive(args: argparse.Namespace) -> Answers:
    a = _answers_from_flags(args)
    if args.skip_checks:
        return a
    checks: list[tuple[str, Probe]] = [("llm", await check_llm(a))]
    if a.telegram_token:
        checks.append(("telegram", await _telegram(a)))
    if a.slack_bot_token:
        checks.append(("slack", await _slack(a)))
    for name, probe in checks:
        print(f"{'ok  ' if probe.ok else 'FAIL'}  {name}: {probe.detail}")
    failed = [(n, p) for n, p in checks if not p.ok]
    if failed:
        raise InitError("; ".join(f"{n}: {p.fix}" for n, p in failed if p.fix) or "a check failed")
    return a


# ---- the conversation --------------------------------------------------------------------


def ask(question: str, default: str | None = None, *, secret: bool = False) -> str:
    shown = f" [{default}]" if default and not secret else ""
    # Hidden input needs a terminal; piped answers (scripts, tests) are read as lines.
    reader = getpass.getpass if secret and sys.stdin.isatty() else input
    answer = reader(f"{question}{shown}: ").strip()
    return answer or (default or "")


def yes(question: str, default: bool) -> bool:
    answer = input(f"{question} [{'Y/n' if default else 'y/N'}]: ").strip().lower()
    return default if not answer else answer.startswith("y")


def _report(probe: Probe) -> bool:
    print(f"  {'✓' if probe.ok else '✗'} {probe.detail}")
    if not probe.ok and probe.fix:
        print(f"    fix: {probe.fix}")
    return probe.ok


async def _interactive(args: argparse.Namespace) -> Answers:
    a = _answers_from_flags(args)
    print("botd init: a few questions, each tested on the spot. Ctrl-C quits without writing.\n")
    print("1. The language model (any OpenAI-compatible endpoint).")
    while True:
        a.llm_base_url = ask("   Base URL (empty: OpenAI)", a.llm_base_url or os.environ.get("OPENAI_BASE_URL")) or None
        env_key = " (empty: use $OPENAI_API_KEY)" if os.environ.get("OPENAI_API_KEY") else ""
        a.llm_api_key = ask(f"   API key{env_key}", secret=True) or a.llm_api_key
        a.llm_model = ask("   Model", a.llm_model)
        if args.skip_checks or _report(await check_llm(a)) or not yes("   Try again?", True):
            break
    print("\n2. Telegram (create a bot with @BotFather: /newbot).")
    if yes("   Connect Telegram?", True):
        while True:
            a.telegram_token = ask("   Bot token", secret=True) or a.telegram_token
            if not a.telegram_token:
                break
            if args.skip_checks or _report(await _telegram(a)) or not yes("   Try again?", True):
                break
    else:
        a.telegram_token = None
    print("\n3. Slack (an app from deploy/slack-app-manifest.yaml).")
    if yes("   Connect Slack?", a.slack_bot_token is not None):
        a.slack_mode = "http" if ask("   Mode, socket or http", a.slack_mode) == "http" else "socket"
        while True:
            a.slack_bot_token = ask("   Bot User OAuth Token (xoxb-…)", secret=True) or a.slack_bot_token
            if a.slack_mode == "socket":
                a.slack_app_token = ask("   App-level token (xapp-…)", secret=True) or a.slack_app_token
            else:
                a.slack_signing_secret = ask("   Signing secret", secret=True) or a.slack_signing_secret
            if args.skip_checks or _report(await _slack(a)) or not yes("   Try again?", True):
                break
    else:
        a.slack_bot_token = a.slack_app_token = a.slack_signing_secret = None
    print("\n4. Who may talk to the bot in private messages?")
    print("   pairing   - a new user gets a code; you approve it with `botd pairing approve CODE` (default)")
    print("   allowlist - only the user ids you list")
    print("   open      - anyone who finds the bot")
    policy = ask("   DM access", a.dm_policy)
    a.dm_policy = policy if policy in DM_POLICIES else "pairing"
    if a.dm_policy == "allowlist":
        ids = ask("   Your user id(s), comma-separated (README: finding your user id)", ",".join(a.allow_from))
        a.allow_from = [s.strip() for s in ids.split(",") if s.strip()]
    return a


def _next_steps(path: Path, a: Answers, explicit: bool) -> str:
    config = f" --config {path}" if explicit else ""
    lines = [f"Wrote {path} (mode 0600).", "", f"Next: botd run{config}"]
    lines.append(f"      (or try it here first: botd chat{config}; check everything: botd doctor{config})")
    if a.dm_policy == "pairing" and (a.telegram_token or a.slack_bot_token):
        lines.append(f"Then message the bot: it answers with a code; approve it with botd pairing approve CODE{config}")
    return "\n".join(lines)


def run_init(args: argparse.Namespace) -> int:
    """The whole command; exit 0 written, 1 a failed test or an existing file, 130 Ctrl-C."""
    import asyncio

    explicit = getattr(args, "config", None)
    path = Path(explicit).expanduser() if explicit else home_config()
    interactive = not args.non_interactive
    overwrite = args.force or (
        interactive and sys.stdin.isatty() and path.exists() and yes(f"{path} exists. Overwrite it?", False)
    )
    if path.exists() and not overwrite:
        print(f"botd init: {path} exists; pass --force to overwrite it", file=sys.stderr)
        return 1
    try:
        answers = asyncio.run(_interactive(args) if interactive else _non_interactive(args))
        text = render_config(answers)
        check_rendered(text)
    except InitError as exc:
        print(f"botd init: nothing written: {exc}", file=sys.stderr)
        return 1
    except EOFError:
        print("\nbotd init: input ended; nothing written (use --non-interactive with flags)", file=sys.stderr)
        return 1
    write_private(path, text)
    Path(answers.workspace).expanduser().mkdir(mode=0o700, parents=True, exist_ok=True)
    print(_next_steps(path, answers, bool(explicit)))
    return 0
