"""``botd``: the command line (DESIGN.md §4.1). Exit codes: 0 ok, 1 failure, 2 bad config or usage."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from bot.config import BotdConfig, ConfigError, load_config
from bot.logs import configure_logging


def build_parser() -> argparse.ArgumentParser:
    # --config is accepted before or after the subcommand (`botd run --config x.yaml`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="config file (default: $BOTD_CONFIG, else ./botd.yaml)")
    parser = argparse.ArgumentParser(prog="botd", description="Chat-platform bot daemon.", parents=[common])
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, parents=[common])

    command("run", "run the daemon until SIGTERM/SIGINT")
    command("chat", "talk to the bot on this terminal")
    command("doctor", "check config, Redis, the LLM endpoint and channel tokens")

    cron = command("cron", "scheduled jobs").add_subparsers(dest="cron_command", required=True)
    add = cron.add_parser("add", help="add a job; prints its id", parents=[common])
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", help="ISO-8601 time, once")
    when.add_argument("--in", dest="in_", help="delay such as 20m, once")
    when.add_argument("--every", help="interval such as 1h")
    when.add_argument("--cron", help='5-field crontab, e.g. "0 9 * * 1-5"')
    add.add_argument("--tz", help="IANA timezone for --at and --cron")
    add.add_argument("--channel", required=True, choices=["telegram", "slack", "console"])
    add.add_argument("--chat-id", required=True)
    add.add_argument("--thread-id")
    add.add_argument("--prompt", required=True)
    add.add_argument("--allow", help="extra tool categories, e.g. write,admin")
    add.add_argument("--id", dest="job_id", help="job id (default: generated)")
    listing = cron.add_parser("list", help="list jobs", parents=[common])
    listing.add_argument("--json", action="store_true")
    cron.add_parser("rm", help="remove a job", parents=[common]).add_argument("id")
    run_now = cron.add_parser("run-now", help="run a job now on a running daemon (heartbeat: 'heartbeat')", parents=[common])
    run_now.add_argument("id")
    run_now.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                         help="wait up to SECONDS for the run's ledger entry and print it")

    sessions = command("sessions", "stored sessions").add_subparsers(dest="sessions_command", required=True)
    sessions.add_parser("list", help="sessions by last activity", parents=[common]).add_argument("--limit", type=int, default=50)
    sessions.add_parser("show", help="one session", parents=[common]).add_argument("key")
    sessions.add_parser("reset", help="clear one session's history", parents=[common]).add_argument("key")

    command("trace", "show the trace of a run").add_argument("run_id")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(getattr(args, "config", None))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_logging(cfg.log.level, cfg.log.format)
    try:
        return asyncio.run(_dispatch(args, cfg))
    except KeyboardInterrupt:
        return 130


async def _dispatch(args: argparse.Namespace, cfg: BotdConfig) -> int:
    from bot import cli_commands as commands
    from bot.store.errors import StoreUnavailable

    try:
        if args.command == "run":
            return await commands.run(cfg)
        if args.command == "chat":
            return await commands.chat(cfg)
        if args.command == "doctor":
            return await commands.doctor(cfg)
        if args.command == "cron":
            return await commands.cron(cfg, args)
        if args.command == "sessions":
            return await commands.sessions(cfg, args)
        if args.command == "trace":
            return await commands.trace(cfg, args.run_id)
    except StoreUnavailable as exc:
        print(f"botd: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except Exception as exc:
        return _startup_failure(exc, debug=cfg.log.level.lower() == "debug")
    return 2


def _startup_failure(exc: Exception, *, debug: bool) -> int:
    """One line and an exit code for what stopped botd; the traceback only at log.level debug."""
    from channels.slack.adapter import SlackStartError
    from channels.telegram.adapter import TelegramStartError

    if isinstance(exc, TelegramStartError | SlackStartError):
        print(f"botd: {exc}", file=sys.stderr)
        return exc.exit_code
    if debug:
        raise exc
    if isinstance(exc, OSError):  # the environment: a port in use, a path not writable
        print(f"botd: {exc}", file=sys.stderr)
    else:
        print(f"botd: {type(exc).__name__}: {exc} (set log.level: debug for the traceback)", file=sys.stderr)
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
