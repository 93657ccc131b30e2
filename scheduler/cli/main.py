"""The verbs of ``python -m scheduler`` (and the ``gpupack`` script): the parser, put together from one ``cmd_*.py``
per verb group (each adds its verbs and holds their work: parsing and printing only, the work handed to the module
that owns it), and the one place errors become exit statuses."""

from __future__ import annotations

import argparse
import sys
import traceback

from rich.console import Console

from scheduler.cli import cmd_advise, cmd_data, cmd_estimate, cmd_machine, cmd_runs, cmd_service, cmd_submit
from scheduler.core.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupack", description="Pack training jobs onto GPU memory and run them on Ray.")
    parser.add_argument("--debug", action="store_true", help="print the traceback behind an error: line too (also "
                                                             "accepted after the verb)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for group in (cmd_submit, cmd_estimate, cmd_runs, cmd_data, cmd_machine, cmd_service, cmd_advise):
        group.add_verbs(verbs)  # in this order: `gpupack --help` lists the verbs as it always has
    return parser


def _debug_flag(argv: list[str]) -> tuple[list[str], bool]:
    """``--debug`` anywhere before a ``--`` (after it, the words are a command's own), taken out of ``argv``."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = [a for a in argv[:end] if a != "--debug"]
    return head + argv[end:], len(head) < end


def main(argv: list[str] | None = None) -> int:
    argv, debug = _debug_flag(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    debug = debug or args.debug
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    try:
        return args.func(args, console)
    except BrokenPipeError:  # `... | head`
        sys.stderr.close()
        return 0
    except UserError as e:
        if debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    except OSError as e:  # a file the person named or made unusable (read-only, full disk, gone): say which
        if e.filename is None or debug:
            raise
        print(f"error: {e.filename}: {e.strerror or e} (--debug shows where)", file=sys.stderr)
        return UserError.exit_status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
