"""The ``callbridge`` command line.

Subcommands:
    serve --config PATH          run the daemon (exit statuses: bridge/io/startup.py)
    check-config PATH            validate a config: exit 0 with a summary, or 2 with every error
    tts-server [--listen H:P]    the local reference TTS server (every provider protocol)
    call TARGET [options]        a test caller (SIP UAC or media-stream carrier side)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from bridge import __version__
from bridge.io.startup import EXIT_CONFIG

# bridge.config is imported where a command needs it: the config reader builds the
# engines' settings (barge-in policy, provider options), which pulls in their modules
# and dependencies, and `callbridge --version` needs none of that.


def _cmd_check_config(args: argparse.Namespace) -> int:
    from bridge.config import ConfigError, load_config

    try:
        cfg = load_config(args.path)
    except ConfigError as e:
        for line in e.errors:
            print(f"error: {line}", file=sys.stderr)
        print(f"{args.path}: {len(e.errors)} error(s)", file=sys.stderr)
        return EXIT_CONFIG
    print(cfg.summary())
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from bridge.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        for line in e.errors:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_CONFIG
    from bridge.io.daemon import run_daemon

    return run_daemon(cfg)


def _cmd_tts_server(args: argparse.Namespace) -> int:
    from bridge.config import parse_cpu_list
    from bridge.io.ttsd_server import SynthLimits, default_workers, run_tts_server

    keys = list(args.api_key or ())
    if args.api_key_env:
        key = os.environ.get(args.api_key_env, "")
        if not key:
            print(f"error: --api-key-env: ${args.api_key_env} is not set", file=sys.stderr)
            return EXIT_CONFIG
        keys.append(key)
    try:
        cpus = parse_cpu_list(args.cpus)
        if cpus:  # CPUs of its own (the daemon's are others): a worker on each
            os.sched_setaffinity(0, cpus)
        workers = args.workers or (len(cpus) if cpus else default_workers())
        limits = SynthLimits(workers, args.queue, args.max_wait_s)
    except (ValueError, OSError) as e:
        print(f"error: tts-server: {e}", file=sys.stderr)
        return EXIT_CONFIG
    return run_tts_server(
        listen=args.listen,
        engine=args.engine,
        api_keys=tuple(keys),
        port_file=args.port_file,
        exit_with_stdin=args.exit_with_stdin,
        limits=limits,
        nice=args.nice,
        cpus=cpus,
        unix_path=args.unix_socket or "",
        remove_socket_dir=args.remove_socket_dir,
    )


def _cmd_call(args: argparse.Namespace) -> int:
    from bridge.io.caller import run_caller

    return run_caller(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="callbridge", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"callbridge {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run the daemon")
    s.add_argument("--config", required=True, help="path to callbridge.toml")
    s.set_defaults(func=_cmd_serve)

    c = sub.add_parser("check-config", help="validate a config file")
    c.add_argument("path")
    c.set_defaults(func=_cmd_check_config)

    t = sub.add_parser("tts-server", help="run the local reference TTS server")
    t.add_argument("--listen", default="127.0.0.1:8765", help="HOST:PORT (port 0: any free port)")
    t.add_argument("--engine", choices=("piper", "tone"), default="piper")
    t.add_argument("--api-key", action="append", help="accepted key (repeatable; none: any)")
    t.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="also accept the key in this environment variable (kept off the command line)",
    )
    t.add_argument(
        "--workers",
        type=int,
        default=0,
        help="synthesis workers, renderings at once (default 0: one per --cpus CPU, else the "
        "cores less one, at least 1)",
    )
    t.add_argument(
        "--queue",
        type=int,
        default=1,
        help="renderings in progress beyond one per worker; one more is refused (default 1)",
    )
    t.add_argument(
        "--max-wait-s",
        type=float,
        default=1.0,
        help="refuse a rendering still waiting for a worker after this long (default 1)",
    )
    t.add_argument(
        "--nice", type=int, default=0, help="lower this process's CPU priority by N at start"
    )
    t.add_argument("--cpus", default="", help='run on these CPUs only ("1", "0,2-3")')
    t.add_argument(
        "--unix-socket", metavar="PATH", help="listen on this Unix socket instead of --listen"
    )
    t.add_argument(
        "--remove-socket-dir",
        action="store_true",
        help="when standard input ends (--exit-with-stdin), also remove --unix-socket's "
        "directory if empty (one its parent made for it)",
    )
    t.add_argument(
        "--port-file", help="write the bound port (or --unix-socket's path) here once listening"
    )
    t.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="also stop when standard input ends (a parent holding a pipe there has gone)",
    )
    t.set_defaults(func=_cmd_tts_server)

    k = sub.add_parser("call", help="place a test call against a deployment")
    k.add_argument("target", help="sip:USER@HOST[:PORT] or ws://HOST:PORT/twilio")
    k.add_argument("--dtmf", action="append", default=[], help="DIGITS[@S] (repeatable)")
    k.add_argument("--speak", action="append", default=[], help="WAV[@S] (repeatable)")
    k.add_argument("--record", help="write what the caller heard to this WAV")
    k.add_argument("--duration", type=float, default=10.0, help="seconds before hanging up")
    k.add_argument("--json", action="store_true", help="print the report as JSON")
    k.add_argument(
        "--codecs",
        default="",
        help="SIP: the offer's codecs, e.g. OPUS,G722,PCMU (default PCMU,PCMA)",
    )
    k.add_argument("--route", help="media streams: customParameters.route of the start message")
    k.set_defaults(func=_cmd_call)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
