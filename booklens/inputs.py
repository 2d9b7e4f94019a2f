"""Files users hand booklens, read and checked: summaries (a text file, a `booklens summarize`
record, JSON with a 'summary' string, or a map of book -> summary) and claims. Anything wrong is
a one-line `BooklensError` naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

from booklens.errors import BooklensError
from booklens.records import read_json_file
from booklens.text import has_words


def claim_key(claim: str) -> str:
    """What makes two claims one: the same words, whatever their case, spacing or closing stop
    ("Anna sails." repeats "anna  sails")."""
    return " ".join(claim.lower().rstrip(".!;").split())


def as_path(value: Any, what: str, hint: Optional[str] = None) -> Path:
    """A path a library caller handed over (a `Path` or a string), or a one-line error naming `what`
    (and `hint`, in brackets, for the slip it is likely to be)."""
    if isinstance(value, str) and ("\n" in value or "\r" in value):  # a text handed over where its file goes
        raise BooklensError(f"{what} must be a path, not text (a string of {len(value)} characters over "
                            f"{len(value.splitlines())} lines)" + (f" ({hint})" if hint else ""))
    if isinstance(value, str) and value.strip():
        return Path(value)
    if isinstance(value, Path):
        return value
    shown = repr(value)
    if len(shown) > 60:  # a whole list or record handed over: its kind says enough
        shown = f"a {type(value).__name__}"
    raise BooklensError(f"{what} must be a path, not {shown}" + (f" ({hint})" if hint else ""))


def book_text(value: Any, what: str = "the book text") -> str:
    """A book's text a library caller handed over, or a one-line error: a path there (the usual
    slip: the file rather than its text) would be indexed or summarized as a short string, and a
    text without words would leave nothing to summarize, retrieve or check a claim against."""
    if isinstance(value, str):
        if wordless(value):
            raise BooklensError(f"{what} {wordless(value)}")
        return value
    hint = ": read the book with booklens.text.read_book(path)" if isinstance(value, Path) else ""
    raise BooklensError(f"{what} must be text, not {type(value).__name__}{hint}")


def wordless(text: str) -> Optional[str]:
    """Why `text` is no summary to judge, or None: empty, or without a single letter or digit
    ('...', zero-width spaces). Judged, such a summary would score 100 and all faithful, having
    nothing in it to confuse or to be false."""
    if not text.strip():
        return "is empty"
    if not has_words(text):
        return "has no words (only punctuation, symbols or invisible characters)"
    return None


def summary_text(summary: Any) -> str:
    """The summary a program was handed, without the whitespace around it, or the one-line error:
    a list of sentences passed as the summary would otherwise be judged as if it were text, or
    fail deep inside the program. Trimmed here, where every judge takes its summary, so that a
    summary read from a text file (trimmed), a record or a map (as written) is one prompt and one
    cached call."""
    if summary is None or (isinstance(summary, str) and not summary.strip()):
        raise BooklensError("the summary is empty")
    if not isinstance(summary, str):
        raise BooklensError(f"the summary must be text, not {type(summary).__name__}")
    return summary.strip()


def summary_map(data: Any, what: str) -> dict[str, str]:
    """book -> summary text from a JSON map whose values are strings or objects with a "summary"."""
    if not isinstance(data, Mapping) or not data:
        raise BooklensError(f"{what} must be a summarize output or a non-empty JSON object mapping book names to "
                            "summaries")
    out = {}
    for book, value in data.items():
        if isinstance(value, Mapping):
            value = value.get("summary")
        if not isinstance(value, str):
            raise BooklensError(f"{what}: the summary of {book!r} must be a string (or an object with a "
                                "'summary' string)")
        if wordless(value):
            raise BooklensError(f"{what}: the summary of {book!r} {wordless(value)}")
        out[str(book)] = value
    return out


def load_summaries(path: Path, elsewhere: Optional[Path] = None
                   ) -> tuple[dict[str, str], Optional[tuple[Path, str]], bool]:
    """The summaries to score (name -> text), the book a single summary names if that file is
    there (its path, and its text as it was summarized: `recorded_book`, which also tries the file
    `elsewhere`), and whether the file was a map of several summaries.

    A JSON object with a "summary" string is one summary (its other keys, such as "book" or a
    model name, are about it), as every other command reads it, not a map with a book called
    "summary" whose other values would be judged as summaries too."""
    from booklens.text import read_text_file

    if path.suffix.lower() == ".json":
        data = read_json_file(path, "summary file")
        kind = data.get("kind") if isinstance(data, Mapping) else None
        single = isinstance(data, Mapping) and isinstance(data.get("summary"), str) and not (
            isinstance(kind, str) and kind.startswith("booklens."))  # another record: named below
        if kind == "booklens.summary" or single:
            text = data.get("summary")
            if not isinstance(text, str) or not text.strip():
                raise BooklensError(f"summary file has an empty summary: {path}")
            if wordless(text):
                raise BooklensError(f"the summary in {path} {wordless(text)}")
            book = data.get("book")
            name = Path(book).name if isinstance(book, str) and book else path.stem
            config = data.get("config") if isinstance(data.get("config"), Mapping) else {}
            recorded = recorded_book(book, path, data.get("book_sha256"), bool(config.get("drop_matter")), elsewhere)
            return {name: text}, recorded, False
        if isinstance(data, Mapping) and "summary" in data and not isinstance(data["summary"], (str, Mapping)):
            # One summary whose text is missing, not a map with a book called "summary"; a map's
            # entry is a string or an object.
            got = {type(None): "null", bool: "true or false", int: "a number", float: "a number",
                   list: "a list"}.get(type(data["summary"]), type(data["summary"]).__name__)
            raise BooklensError(f"summary file {path}: its 'summary' must be a string, not {got}")
        if isinstance(kind, str) and kind.startswith("booklens."):
            raise BooklensError(f"summary file {path} is a {kind} record, not a summary: give a `booklens summarize` "
                                "output, a text file or a JSON map of book -> summary")
        return summary_map(data, f"summary file {path}"), None, True
    text = read_text_file(path, "summary file")
    if not text.strip():
        raise BooklensError(f"summary file is empty: {path}")
    if wordless(text):
        raise BooklensError(f"the summary in {path} {wordless(text)}")
    return {path.name: text.strip()}, None, False


def recorded_book(book: Any, record_path: Path, sha256: Any = None, drop_matter: bool = False,
                  elsewhere: Optional[Path] = None) -> Optional[tuple[Path, str]]:
    """The book file a summary record names and its text as the record's summarizer read it
    (`drop_matter` as recorded), or None when it is not there. A relative name is looked up where
    the command runs, then beside the record. Where the record holds the digest of the text it
    summarized, only a file whose text has that digest counts: another file of the same name is
    not that book, and the file `elsewhere` is the book when its text has that digest."""
    if not isinstance(book, str) or not book:
        return None
    from booklens.text import read_book

    named = Path(book)
    candidates = [named] if named.is_absolute() else [named, record_path.parent / named]
    # A relative name is relative to where summarize ran, which may be neither here nor beside the
    # record: the digest still tells whether `elsewhere` (a file -o would replace) is the book.
    if elsewhere is not None and isinstance(sha256, str) and sha256:
        candidates.append(elsewhere)
    for candidate in candidates:
        try:
            if not candidate.is_file():
                continue
            text = read_book(candidate, drop_matter=drop_matter)
            if isinstance(sha256, str) and sha256:
                import hashlib

                if hashlib.sha256(text.encode("utf-8")).hexdigest() != sha256:
                    continue
        except (OSError, BooklensError):
            continue
        return candidate, text
    return None


def read_given_summary(path: Path):
    """A summary file given to judge: a `booklens summarize` record (kept whole, merge tree
    included), or the text of a text file / a JSON file with a 'summary' string."""
    from booklens.records import Summary
    from booklens.reports import _validate, check_format

    if path.suffix.lower() == ".json":
        data = read_json_file(path, "summary file")
        if isinstance(data, dict) and data.get("kind") == "booklens.summary" and "config" in data:
            check_format(data, path, "summary record", "booklens.summary")
            record = _validate(Summary, data, path, "summary record")
            if wordless(record.summary):
                raise BooklensError(f"the summary {wordless(record.summary)}: {path}")
            return record
    return read_summary_text(path)


def read_summary_text(path: Path) -> str:
    """A summary from a text file, a `booklens summarize` result, or JSON with a 'summary' string."""
    from booklens.text import read_text_file

    if path.suffix.lower() == ".json":
        data = read_json_file(path, "summary file")
        text = data.get("summary") if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise BooklensError(f"summary file {path} has no 'summary' string")
    else:
        if path.exists() and path.is_file() and path.stat().st_size == 0:
            raise BooklensError(f"the summary is empty: {path}")
        text = read_text_file(path, "summary file")
    if wordless(text):
        raise BooklensError(f"the summary {wordless(text)}: {path}")
    return text.strip()


def _evidence_texts(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise BooklensError(f"{where}: 'evidence' must be a list of quotes")
    out = []
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Mapping) and isinstance(item.get("text"), str):
            out.append(item["text"])  # evidence of an earlier booklens result
        else:
            raise BooklensError(f"{where}: 'evidence' must be a list of quotes (strings)")
    return out


def of_other_text(recorded: Any, book: Path, book_text: str) -> bool:
    """Whether `recorded`, the digest of the book text a booklens record was made from, is of
    another text than `book`'s: not of `book_text`, nor of the book read with front and back matter
    dropped (as a run or a summary may have read it). A record without a digest says nothing."""
    from booklens.pipeline import sha256_text
    from booklens.text import read_book

    if not isinstance(recorded, str) or not recorded or recorded == sha256_text(book_text):
        return False
    return recorded != sha256_text(read_book(book, drop_matter=True))  # read again only when it may matter


def other_text_warning(summary: Any, book: Any) -> str:
    """The warning for a summary record of another text than its book (`run --summary`, `check`):
    another edition of the book may be what the user means, so it is said and the command goes on."""
    return f"warning: {summary} summarizes a different text than {book} (its book digest differs)"


def check_claims_book(path: Path, book: Path, book_text: str) -> None:
    """A one-line error when the claims file `path` is a booklens faithfulness report (`check`,
    `verify`, a run's) of another book than `book` (`of_other_text`): its claims, and evidence, are
    about that book, and every verdict against this one would be a paid call that measures nothing."""
    data = read_json_file(path, "claims file")
    if not (isinstance(data, Mapping) and data.get("kind") == "booklens.faithfulness"
            and of_other_text(data.get("book_sha256"), book, book_text)):
        return
    named = f" ({data['book']})" if isinstance(data.get("book"), str) and data["book"] else ""
    raise BooklensError(f"claims file {path} holds the claims of another book{named}, not of {book}: pass the "
                        "book they were made for")


def summary_of_other_text(path: Path, book: Path, book_text: str) -> bool:
    """Whether the summary file `path` is a `booklens summarize` record of another text than
    `book`'s (`of_other_text`); a text file or a bare 'summary' string names no book."""
    if path.suffix.lower() != ".json":
        return False
    data = read_json_file(path, "summary file")
    return isinstance(data, Mapping) and data.get("kind") == "booklens.summary" and \
        of_other_text(data.get("book_sha256"), book, book_text)


def read_claims(path: Path) -> tuple[list[str], Optional[list[Optional[list[str]]]]]:
    """Claims (and evidence quotes where given) from a claims file.

    Accepted: a list of claim strings or of objects {"claim": str, "evidence": [str, ...]}, or an
    object with such a list under "claims" (what `booklens claims` and `booklens verify` write)."""
    data = read_json_file(path, "claims file")
    items = data.get("claims") if isinstance(data, Mapping) else data
    shape = ("expected a list of claims (strings or objects with a 'claim' string), "
             "or an object with such a list under 'claims'")
    if not isinstance(items, list):
        raise BooklensError(f"claims file {path}: {shape}")
    if not items:
        raise BooklensError(f"claims file {path} has no claims")
    claims: list[str] = []
    evidence: list[Optional[list[str]]] = []
    first: dict[str, int] = {}  # claim key -> the number of its first occurrence
    for n, item in enumerate(items, 1):  # counted from 1, as the library's checks of claims count them
        where = f"claims file {path}, claim {n}"
        if isinstance(item, str):
            claims.append(item)
            evidence.append(None)
        elif isinstance(item, Mapping) and isinstance(item.get("claim"), str):
            claims.append(item["claim"])
            evidence.append(_evidence_texts(item["evidence"], where) if "evidence" in item else None)
        else:
            raise BooklensError(f"claims file {path}: {shape} (claim {n} is {type(item).__name__})")
        if wordless(claims[-1]):  # a claim with nothing in it to be false would be judged faithful
            raise BooklensError(f"{where} {wordless(claims[-1])}")
        # verified twice, it would count twice in the label shares
        seen = first.setdefault(claim_key(claims[-1]), n)
        if seen != n:
            raise BooklensError(f"{where} repeats claim {seen}: each claim counts once in the shares, so remove it")
    return claims, (evidence if any(e is not None for e in evidence) else None)
