"""Command line: ``python -m specdec_edu <command>`` (also installed as ``specdec-edu``).

Commands:
    demo    watch speculative decoding on the embedded model pair, with a speed summary
    bench   measure ours against target-only and Hugging Face assisted generation (JSON, plot)
    gpu-report  what the course will see on this device (a Colab GPU): dtype, path, cold start, c, speedups

Each command lives in its own module, which provides ``add_arguments(parser)`` and
``main(args) -> int``; adding a command is one entry in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: command name -> (module inside specdec_edu, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("commands.demo", "speculative vs target-only decoding on the embedded pair, with marked output"),
    "bench": ("commands.bench", "side-by-side benchmark: target-only, ours, HF assisted generation, prompt lookup"),
    "gpu-report": ("commands.gpu_report", "what the course will see on this device: dtype, path, cold start, steps, c, "
                   "speedups"),
}


def _command_module(name: str):
    return importlib.import_module(f"specdec_edu.{COMMANDS[name][0]}")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per entry of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="python -m specdec_edu",
        description="specdec-edu: a course on speculative decoding.")
    parser.add_argument("--traceback", action="store_true",
                        help="on an error, show the full traceback (default: one line that names the fix)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    parser.command_parsers = {}  # name -> its subparser: an unknown flag is reported with the command's own usage
    for name, (_, help_text) in COMMANDS.items():
        sub = parser.command_parsers[name] = subparsers.add_parser(name, help=help_text, description=help_text)
        _command_module(name).add_arguments(sub)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, except that a flag the chosen command does not have is reported with that command's
    usage (argparse reports it with the top-level usage, which lists no command's flags): ``demo --pair smollm2``
    then shows demo's flags. ``--traceback`` after the command is told where it goes."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        hint = ""
        if "--traceback" in unknown:
            hint = f" (--traceback goes before the command: python -m specdec_edu --traceback {args.command} ...)"
        parser.command_parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the exit status."""
    from .models.embedded import HubUnavailableError
    from .models.weights import EmbeddedModelError

    args = parse(build_parser(), argv)
    try:
        return _command_module(args.command).main(args)
    # a bad setting (SPECDEC_EDU_*), no Hub, an embedded model that cannot be fetched or found: the message names the fix
    except (ValueError, HubUnavailableError, EmbeddedModelError) as exc:
        if args.traceback:
            raise
        print(f"error: {exc}\n(python -m specdec_edu --traceback {args.command} ... shows where it was raised)",
              file=sys.stderr)
        return 2
    except SystemExit as exc:  # a command's own refusal of its flags (SystemExit("...")): the same one error: line
        if not isinstance(exc.code, str):
            raise
        print(f"error: {exc.code}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
