"""The ``gpupack`` command: one argparse tree, one module per command group.

Each command group lives in its own ``gpupack/cli_<group>.py`` module exposing
``register(subparsers)``; the handler it installs returns the process exit code.
Exit codes across the tool: 0 = yes/success, 1 = no, 2 = bad input.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpupack import __version__
from kube.inputfile import check_regular_file

if TYPE_CHECKING:
    from sharing.usage.trace import UsageTrace

# Command-group modules, in the order they appear in ``gpupack --help``.
COMMAND_MODULES: tuple[str, ...] = (
    "gpupack.cli_mig",
    "gpupack.cli_simulate",
    "gpupack.cli_replay",
    "gpupack.cli_dev",
    "gpupack.cli_webhook",
    "gpupack.cli_agent",
    "gpupack.cli_draplugin",
    "gpupack.cli_controller",
    "gpupack.cli_demo",
)

EXIT_OK = 0
EXIT_NO = 1
EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Bad input from the user: printed as ``gpupack: error: ...`` with exit code 2."""


def finite_float(text: str) -> float:
    """argparse type: a finite number (NaN passes every range check and then never ends a wait)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number above zero."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number, zero or more."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def describe_input_error(exc: OSError | UnicodeDecodeError) -> str:
    """One line for a file that cannot be used as input or output."""
    if isinstance(exc, UnicodeDecodeError):
        return f"input is not UTF-8 text ({exc.reason} at byte {exc.start})"
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def check_trace_files(*paths: str | Path) -> None:
    """Refuse a trace that is not a regular file (a FIFO, /dev/zero), in one line.

    Traces are read as a stream, a row at a time, so they have no size limit
    (kube.inputfile.read_text bounds the inputs that are read whole); a device or a FIFO
    would still never end or never start."""
    for path in paths:
        try:
            check_regular_file(path)
        except FileNotFoundError:
            continue  # the trace reader names a missing file itself, with the run's other trace errors
        except OSError as exc:
            raise UsageError(describe_input_error(exc)) from None


def load_usage_trace(folder: Path) -> UsageTrace:
    """The GenTD26 usage trace in ``folder`` (``sharing.usage.trace``, the one reader), for every command that
    plays or replays one; the files are checked as regular files first (no FIFO, no device). ``UsageError``
    naming the folder or file and the problem."""
    from sharing.usage.trace import DUTY_FILE, MEMORY_FILE, UsageTraceError, parse_usage

    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder (a usage trace folder holds {DUTY_FILE} and {MEMORY_FILE})")
    duty, memory = folder / DUTY_FILE, folder / MEMORY_FILE
    for path in (duty, memory):
        if not path.is_file():
            raise UsageError(f"{path}: no such file (a usage trace folder holds {DUTY_FILE} and {MEMORY_FILE})")
    check_trace_files(duty, memory)
    try:
        with duty.open(encoding="utf-8", newline="") as d, memory.open(encoding="utf-8", newline="") as m:
            return parse_usage(d, m, duty_source=str(duty), memory_source=str(memory))
    except UsageTraceError as exc:
        raise UsageError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{folder}: usage trace unreadable: {exc}") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpupack",
        description=(
            "Fractional NVIDIA GPUs for Kubernetes. Pods ask for part of a GPU "
            "(gpupack.io/gpu-milli, gpupack.io/gpu-memory); gpupack turns that into "
            "MIG slices, MPS shares or time-sliced GPUs and packs them densely."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gpupack {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module_name in COMMAND_MODULES:
        # Every group ships with the package: a group that fails to import is a broken
        # install, said loudly, never a command that silently vanishes from --help.
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_BAD_INPUT if args.command is None and argv else EXIT_OK
    try:
        code: int = handler(args)
    except UsageError as exc:
        print(f"gpupack: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("gpupack: interrupted", file=sys.stderr)
        return 130
    except (OSError, UnicodeDecodeError) as exc:
        # A file that is missing, unreadable, binary or in the way: the user's input, not a bug.
        print(f"gpupack: error: {describe_input_error(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback; the traceback on request
        if os.environ.get("GPUPACK_DEBUG"):
            traceback.print_exc()
        print(f"gpupack: internal error: {type(exc).__name__}: {exc} (set GPUPACK_DEBUG=1 to see where)",
              file=sys.stderr)
        return EXIT_NO
    return code


if __name__ == "__main__":
    sys.exit(main())
