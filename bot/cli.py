"""``botd``: the command line (DESIGN.md §4.1). Exit codes: 0 ok, 1 failure, 2 bad config or usage."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from bot import __version__
from bot.config import BotdConfig, ConfigError
from bot.config_file import load_config
from bot.init_wizard import add_init_arguments
from bot.logs import configure_logging, open_log_file


def build_parser() -> argparse.ArgumentParser:
    # --config and --verbose are accepted before or after the subcommand (`botd run --config x.yaml`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, metavar="PATH",
                        help="config file (default: $BOTD_CONFIG, else ./botd.yaml, else ~/.botd/botd.yaml)")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="say which config and store are in use (botd chat: log to stderr, not a file)")
    parser = argparse.ArgumentParser(prog="botd", description="Chat-platform bot daemon.", parents=[common])
    parser.add_argument("--version", action="version", version=f"botd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, parents=[common])

    add_init_arguments(command("init", "set up botd: write ~/.botd/botd.yaml after testing the LLM and tokens"))
    command("run", "run the daemon until SIGTERM/SIGINT")
    command("chat", "talk to the bot on this terminal")
    command("doctor", "check config, Redis, the LLM endpoint and channel tokens")
    command("status", "running daemons, channels, sessions, queues and next cron fires").add_argument(
        "--json", action="store_true", help="one JSON object")

    cron = command("cron", "scheduled jobs").add_subparsers(dest="cron_command", required=True)
    add = cron.add_parser("add", help="add a job; prints its id", parents=[common])
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", metavar="ISO", help="ISO-8601 time, once; without an offset it is read in --tz (default: scheduler.timezone)")
    when.add_argument("--in", dest="in_", metavar="DURATION", help="delay such as 20m, once")
    when.add_argument("--every", metavar="DURATION", help="interval such as 1h")
    when.add_argument("--cron", metavar="EXPR", help='5-field crontab, e.g. "0 9 * * 1-5"')
    add.add_argument("--tz", metavar="ZONE", help="IANA timezone for --at and --cron")
    add.add_argument("--channel", required=True, metavar="telegram|slack")
    add.add_argument("--chat-id", required=True, metavar="ID")
    add.add_argument("--thread-id", metavar="ID")
    add.add_argument("--prompt", required=True, metavar="TEXT")
    add.add_argument("--allow", metavar="CATEGORIES", help="extra tool categories, e.g. write,admin")
    add.add_argument("--id", dest="job_id", metavar="NAME", help="job id (default: generated)")
    listing = cron.add_parser("list", help="list jobs", parents=[common])
    listing.add_argument("--json", action="store_true")
    cron.add_parser("rm", help="remove a job", parents=[common]).add_argument("id")
    run_now = cron.add_parser("run-now", help="run a job now on a running daemon (heartbeat: 'heartbeat')", parents=[common])
    run_now.add_argument("id")
    run_now.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                         help="wait up to SECONDS for the run's ledger entry and print it; exit 1 unless it ran ok")
    upcoming = cron.add_parser("next", help="print the next fire times of a job or of an inline schedule", parents=[common])
    upcoming.add_argument("id", nargs="?", help="a stored job (or give --cron, --every or --at)")
    upcoming.add_argument("--cron", help='5-field crontab, e.g. "0 9 * * 1-5"')
    upcoming.add_argument("--every", help="interval such as 1h, anchored at --after")
    upcoming.add_argument("--at", help="ISO-8601 time; without an offset it is read in --tz (default: scheduler.timezone)")
    upcoming.add_argument("--tz", help="IANA timezone for --cron, --at and an --after without offset")
    upcoming.add_argument("--after", help="list fires at or after this ISO-8601 time (default: now)")
    upcoming.add_argument("--count", type=int, default=5, help="how many fires (default 5)")
    upcoming.add_argument("--json", action="store_true", help="print a JSON list")

    sessions = command("sessions", "stored sessions").add_subparsers(dest="sessions_command", required=True)
    session_list = sessions.add_parser("list", help="sessions by last activity", parents=[common])
    session_list.add_argument("--limit", type=int, default=50, metavar="N")
    session_list.add_argument("--json", action="store_true", help="one JSON object a line")
    sessions.add_parser("show", help="one session", parents=[common]).add_argument("key")
    sessions.add_parser("reset", help="clear one session's history", parents=[common]).add_argument("key")

    command("trace", "show the trace of a run").add_argument("run_id")

    pairing = command("pairing", "DM pairing codes (dm_policy: pairing)").add_subparsers(
        dest="pairing_command", required=True)
    pairing.add_parser("list", help="pending codes and approved users", parents=[common]).add_argument(
        "--json", action="store_true")
    pairing.add_parser("approve", help="let the user of a code talk to the bot", parents=[common]).add_argument("code")
    pairing.add_parser("deny", help="drop a code; its user gets no new one for an hour", parents=[common]).add_argument(
        "code")
    revoke = pairing.add_parser("revoke", help="remove an approved user", parents=[common])
    revoke.add_argument("channel", choices=["telegram", "slack"])
    revoke.add_argument("user_id")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "init":  # writes the config the other commands read
        from bot.init_wizard import run_init

        try:
            return run_init(args)
        except KeyboardInterrupt:
            print("\nbotd init: cancelled, nothing written", file=sys.stderr)
            return 130
    try:
        cfg = load_config(getattr(args, "config", None))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        loop_factory = event_loop_factory(os.environ.get("BOTD_EVENT_LOOP", "auto"))
    except ValueError as exc:
        print(f"botd: {exc}", file=sys.stderr)
        return 2
    # One-shot commands print results, not the store's info logs (unless --verbose).
    quiet = args.command not in ("run", "chat") and not getattr(args, "verbose", False)
    level = "warning" if quiet and cfg.log.level in ("debug", "info") else cfg.log.level
    try:
        log_stream = _log_stream(args, cfg)
    except OSError as exc:
        print(f"botd: cannot write the log file ({exc}); use --verbose to log to stderr", file=sys.stderr)
        return 1
    configure_logging(level, cfg.log.format, log_stream)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            code = runner.run(_dispatch(args, cfg))
    except KeyboardInterrupt:
        code = 130
    if args.command == "chat" and argv is None:
        _leave_now(code, log_stream)
    return code


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``BOTD_EVENT_LOOP``: ``auto`` (uvloop when installed: about 15 % less CPU per message,
    bench/README.md), ``uvloop``, or ``asyncio`` (the standard loop). None: asyncio's default."""
    choice = choice.strip().lower() or "auto"
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ValueError(f"BOTD_EVENT_LOOP must be auto, uvloop or asyncio, got {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ValueError("BOTD_EVENT_LOOP=uvloop, but uvloop is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop


def _leave_now(code: int, log_stream: TextIO | None) -> None:
    """End ``botd chat`` as soon as it has shut down: the interpreter's teardown of the
    libraries it loaded would keep a person who pressed Ctrl-C waiting for seconds on a
    busy machine, and everything worth keeping is closed and flushed by now."""
    for stream in (sys.stdout, sys.stderr, log_stream):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)


def chat_log_path(cfg: BotdConfig) -> Path:
    return cfg.workspace / ".botd" / "logs" / "chat.log"


def _log_stream(args: argparse.Namespace, cfg: BotdConfig) -> TextIO | None:
    """``botd chat`` is a conversation on the terminal: its logs go to a file unless --verbose."""
    if args.command != "chat" or getattr(args, "verbose", False):
        return None
    return open_log_file(chat_log_path(cfg))


async def _dispatch(args: argparse.Namespace, cfg: BotdConfig) -> int:
    from bot.status import describe_setup, status
    from bot.store.errors import StoreConfigError, StoreUnavailable

    if getattr(args, "verbose", False):
        print(describe_setup(cfg), file=sys.stderr)
    if args.command == "status":  # before the heavy imports below: status answers fast
        return await status(cfg, as_json=args.json)

    from bot import cli_commands as commands
    from bot.http_server import ListenError
    from channels.base import ChannelStartError

    try:
        if args.command == "run":
            return await commands.run(cfg)
        if args.command == "chat":
            return await commands.chat(cfg, None if getattr(args, "verbose", False) else chat_log_path(cfg))
        if args.command == "doctor":
            from bot.doctor import doctor  # its endpoint probes bring httpx: not for the other commands

            return await doctor(cfg)
        if args.command == "cron":
            return await commands.cron(cfg, args)
        if args.command == "sessions":
            return await commands.sessions(cfg, args)
        if args.command == "pairing":
            return await commands.pairing(cfg, args)
        if args.command == "trace":
            return await commands.trace(cfg, args.run_id)
    except (StoreUnavailable, ListenError) as exc:
        print(f"botd: {exc}", file=sys.stderr)
        return 1
    except ChannelStartError as exc:
        print(f"botd: {exc}", file=sys.stderr)
        return exc.exit_code
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except StoreConfigError as exc:
        print(f"config error: redis: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        return _startup_failure(exc, debug=cfg.log.level.lower() == "debug")
    return 2


def _startup_failure(exc: Exception, *, debug: bool) -> int:
    """One line and exit code 1 for what stopped botd; the traceback only at log.level debug."""
    if debug:
        raise exc
    if isinstance(exc, OSError):  # the environment: a port in use, a path not writable
        print(f"botd: {exc}", file=sys.stderr)
    else:
        print(f"botd: {type(exc).__name__}: {exc} (set log.level: debug for the traceback)", file=sys.stderr)
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
