"""What the benchmark scripts share on their command lines: argument types that turn a bad value
into argparse's usage line and exit code 2, and `run`, which ends an error booklens raises (a
missing data file, an unknown model, a chunk size too small) in one `error:` line and exit code 1
instead of a traceback.

Only the standard library is imported here, so `--help` and argument errors stay instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def nonnegative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 0")
    return value


def nonnegative_float(text: str) -> float:
    return _float(text, 0.0, "at least 0")


def positive_float(text: str) -> float:
    return _float(text, None, "above 0")


def positive_ints(text: str) -> list[int]:
    """A comma-separated list of whole numbers of at least 1, such as '1000,6000'."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r} holds no number (give them comma-separated, such as 1,4)")
    return [positive_int(item) for item in items]


def names_from(choices: Iterable[str]) -> Callable[[str], list[str]]:
    """A type for a comma-separated list of names from `choices` ('all' for every one of them)."""
    known = list(choices)

    def parse(text: str) -> list[str]:
        if text.strip() == "all":
            return list(known)
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in known]
        if unknown or not items:
            raise argparse.ArgumentTypeError(
                f"unknown name{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown)) or repr(text)}: "
                f"use names from {', '.join(known)} (comma-separated), or all")
        return items

    parse.__name__ = "names"  # argparse names the type in its messages
    return parse


def run(main: Callable[[], int | None]) -> None:
    """Run a script's `main` and exit with its code; a booklens error ends in one line on stderr."""
    try:
        code = main()
    except Exception as exc:
        from booklens.errors import BooklensError

        if not isinstance(exc, BooklensError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    sys.exit(code or 0)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _float(text: str, least: float | None, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    ok = value >= least if least is not None else value > 0
    if not ok or value == float("inf"):  # nan fails both comparisons
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number {what}")
    return value
