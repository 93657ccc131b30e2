"""The verbs of ``python -m scheduler`` (and the ``gpupack`` script): the parser, put together from one ``cmd_*.py``
per verb group (each adds its verbs and holds their work: parsing and printing only, the work handed to the module
that owns it), and the one place errors become exit statuses.

``--json`` means one thing on every verb: stdout holds one JSON document, the verb's answer, or, when it fails, an
error object ``{"error": "...", "code": N}`` whose ``code`` is also the exit status (2: the person's mistake, a bad
flag included; 130: interrupted; 1: the program's fault, its traceback on stderr as always)."""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from rich.console import Console

from scheduler.cli import (cmd_advise, cmd_data, cmd_estimate, cmd_machine, cmd_prefetch, cmd_runs, cmd_service,
                           cmd_submit)
from scheduler.core import openmp
from scheduler.core.errors import UserError


class _ArgError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser, self.message = parser, message


class _Parser(argparse.ArgumentParser):
    """argparse's, but a bad flag is raised to ``main`` (which says it as JSON under ``--json``), not printed."""

    def error(self, message: str):
        raise _ArgError(self, message)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("gpupack")
    except PackageNotFoundError:  # a checkout run without `pip install -e .`
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpupack", description="Pack training jobs onto GPU memory and run them on Ray.")
    parser.add_argument("--version", action="version", version=f"gpupack {version()}")
    parser.add_argument("--debug", action="store_true", help="print the traceback behind an error: line too (also "
                                                             "accepted after the verb)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for group in (cmd_submit, cmd_estimate, cmd_runs, cmd_data, cmd_machine, cmd_service, cmd_advise, cmd_prefetch):
        group.add_verbs(verbs)  # in this order: `gpupack --help` lists the verbs as it always has
    return parser


def _debug_flag(argv: list[str]) -> tuple[list[str], bool]:
    """``--debug`` anywhere before a ``--`` (after it, the words are a command's own), taken out of ``argv``."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = [a for a in argv[:end] if a != "--debug"]
    return head + argv[end:], len(head) < end


def _json_flag(argv: list[str]) -> bool:
    end = argv.index("--") if "--" in argv else len(argv)
    return "--json" in argv[:end]


def _fail(as_json: bool, message: str, code: int) -> int:
    """An error, said once: ``error: …`` on stderr, or under ``--json`` the error object on stdout."""
    if as_json:
        print(json.dumps({"error": message, "code": code}))
        sys.stdout.flush()
    else:
        print(message if code == 130 else f"error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    from scheduler.cli import common

    common.started = common.command_started(whole_process=argv is None)  # --budget bounds the whole command
    openmp.wait_passively()  # before any library or a local Ray starts (core.openmp says why)
    argv, debug = _debug_flag(list(sys.argv[1:] if argv is None else argv))
    as_json = _json_flag(argv)
    try:
        args = build_parser().parse_args(argv)
    except _ArgError as e:
        if as_json:
            return _fail(True, f"{e.parser.prog}: {e.message}", 2)
        e.parser.print_usage(sys.stderr)
        print(f"{e.parser.prog}: error: {e.message}", file=sys.stderr)
        return 2
    debug = debug or args.debug
    as_json = as_json and getattr(args, "json", False)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    try:
        return args.func(args, console)
    except BrokenPipeError:  # `... | head`
        sys.stderr.close()
        return 0
    except UserError as e:
        if debug:
            traceback.print_exc()
        return _fail(as_json, str(e), e.exit_status)
    except OSError as e:  # a file the person named or made unusable (read-only, full disk, gone): say which
        if e.filename is None or debug:
            if not as_json:
                raise
            traceback.print_exc()
            return _fail(True, f"{type(e).__name__}: {e}", 1)
        return _fail(as_json, f"{e.filename}: {e.strerror or e} (--debug shows where)", UserError.exit_status)
    except KeyboardInterrupt:
        return _fail(as_json, "interrupted", 130)
    except Exception as e:  # the program's fault: its traceback, and under --json still one JSON document
        if not as_json:
            raise
        traceback.print_exc()
        return _fail(True, f"{type(e).__name__}: {e}", 1)
