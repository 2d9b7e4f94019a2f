"""The `booklens` command. Each command family registers itself on `app`."""

from __future__ import annotations

import os
import sys

import typer

from booklens.errors import BooklensError

app = typer.Typer(
    name="booklens",
    help="Summarize book-length text with LLMs and judge the summaries: coherence, faithfulness, QA.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Command modules register their commands on `app` when imported.
from booklens.cli import summarize as _summarize  # noqa: E402,F401


def main() -> None:
    """Entry point: user errors end in one line on stderr and a non-zero exit code."""
    try:
        app()
    except BooklensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted (completed LM calls are cached; rerun to resume)", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # a bug, not a user error: still one line unless asked for more
        if os.environ.get("BOOKLENS_DEBUG"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"error: internal error: {type(exc).__name__}: {first} (BOOKLENS_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        sys.exit(1)
