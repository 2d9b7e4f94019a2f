"""Evidence from a book: the one list of evidence modes, where indexes live, and the indexes.

The modes (what a verifier or a QA program is shown for a claim or question):

- ``none``: nothing; the model answers from what it knows;
- ``given``: the evidence that comes with the data (FABLES' annotator quotes, NovelQA's);
- ``bm25``, ``dense``, ``hybrid``: the top-k passages of the book by BM25, by embedding
  similarity, or by both fused;
- ``book``: the book itself, as much of it as the model's window holds: the whole book when it
  fits, otherwise windows of neighbouring passages grown around the best-ranked ones, in book
  order. With an 8K window that is retrieval of about 6K tokens, not the whole of a novel.

Index files of a book are kept under `index_dir(cache_dir)`, keyed by the text's hash, so
every command that needs a book's index builds it once. This module is light to import (the
command line reads its lists for `--help`); `BookIndex` and friends load on first use from
`booklens.retrieval.index`.
"""

from __future__ import annotations

import importlib
import re
import unicodedata
from pathlib import Path
from typing import Any

from booklens.vocabulary import CHARACTER_WORD_SCRIPTS

EVIDENCE_MODES = ("none", "given", "bm25", "dense", "hybrid", "book")
# Modes that read the book itself (the others work from the claim alone or evidence that comes with it).
BOOK_MODES = ("bm25", "dense", "hybrid", "book")
# Modes that rank passages and show the top k.
SEARCH_MODES = ("bm25", "dense", "hybrid")
PASSAGE_MODES = SEARCH_MODES
# Modes that need the embedding index.
DENSE_MODES = ("dense", "hybrid", "book")
# Modes a run on a book takes (`run`, `check`, a sweep's judge): `given` needs quotes that come with
# each claim, which a book run has none of.
RUN_MODES = tuple(m for m in EVIDENCE_MODES if m != "given")
# Modes whose evidence per claim is bounded by a token budget (`--budget-tokens`), not by k passages.
BUDGET_MODES = ("book", "given")

# How much of the book a claim or question is shown by default (passages of at most
# DEFAULT_PASSAGE_TOKENS cl100k tokens, the top DEFAULT_K of them), and the least a command takes:
# a shorter passage is a fragment of a sentence, a smaller `book`-mode budget not one passage.
DEFAULT_K = 5
DEFAULT_PASSAGE_TOKENS = 256
MIN_PASSAGE_TOKENS = 32
MIN_BUDGET_TOKENS = 64

# How `book` mode ranks the passages it grows its windows around when the book does not fit:
# `verify`, `check` and `run` fuse BM25 and embeddings; `qa` ranks by BM25 unless --rank-mode
# says otherwise (its question-and-options query, and NovelQA's figures, were measured so).
BOOK_RANK_MODE = "hybrid"
QA_BOOK_RANK_MODE = "bm25"

EVIDENCE_HELP = {
    "none": "no evidence: the model's own knowledge",
    "given": "the evidence quotes that come with the data",
    "bm25": "the top-k passages by BM25",
    "dense": "the top-k passages by embedding similarity (all-MiniLM-L6-v2)",
    "hybrid": "the top-k passages by BM25 and embeddings fused (reciprocal rank)",
    "book": "the whole book when it fits the window, else as much of it as fits around the best passages",
}


def retrieval_settings(k: int | None = None, passage_tokens: int | None = None) -> tuple[int, int]:
    """The k and passage size a run uses: those given, else the defaults. Options and arguments hold
    None until given, so that `check_evidence_options` can tell a default given out loud from none."""
    return (DEFAULT_K if k is None else k, DEFAULT_PASSAGE_TOKENS if passage_tokens is None else passage_tokens)


def check_evidence_options(mode: str, *, k: int | None = None, budget_tokens: int | None = None,
                           passage_tokens: int | None = None, rank_mode: str | None = None,
                           book_takes_k: bool = False, given_cuts_passages: bool = True,
                           has_book: bool = True, has_given: bool = True, as_keys: bool | str | None = None) -> None:
    """A one-line `BooklensError` for a retrieval setting the evidence mode never uses, which the
    record would otherwise list as if it had applied. None is a setting not given; any value given is
    refused where it does not apply, the default value too (the record has it null all the same).

    What differs for `qa`: its `book` mode takes `k` too (`book_takes_k`: the passages its windows
    grow around) ranked by `rank_mode`, and its `given` evidence is NovelQA's, cut from no passage
    (`given_cuts_passages=False`). Given quotes are placed in the book's passages only when there is
    a book (`has_book`). `has_given`: whether the command offers the given mode at all (`check` and
    book runs do not: the error names only the modes it has). `as_keys`: how the error names the
    settings (`setting_name`; by default as the caller spelled them: options in a command, keywords
    from Python)."""
    from booklens.errors import BooklensError, setting_name

    def name(option: str) -> str:
        return setting_name(option, as_keys)

    k_modes = BOOK_MODES if book_takes_k else PASSAGE_MODES
    if k is not None and mode not in k_modes:
        raise BooklensError(f"{name('--k')} is how many passages {'/'.join(k_modes)} "
                            f"{'start from' if book_takes_k else 'retrieve'}; evidence {mode} retrieves none")
    if budget_tokens is not None and mode not in BUDGET_MODES:
        modes = "book and given modes" if has_given else "book mode"
        raise BooklensError(f"{name('--budget-tokens')} bounds the evidence of the {modes}; evidence {mode} would "
                            "not apply it")
    cut_modes = BOOK_MODES + (("given",) if given_cuts_passages else ())
    if passage_tokens is not None and mode not in cut_modes:
        raise BooklensError(f"{name('--passage-tokens')} sizes the passages cut from the book; evidence {mode} "
                            "cuts none")
    if passage_tokens is not None and mode == "given" and not has_book:
        raise BooklensError(f"{name('--passage-tokens')} sizes the passages cut from the book; evidence given "
                            "without the book cuts none")
    if rank_mode is not None and mode != "book":
        raise BooklensError(f"{name('--rank-mode')} ranks the passages {name('--evidence')} book grows its windows "
                            f"around; evidence {mode} " + ("ranks by its own name" if mode in SEARCH_MODES
                                                           else "ranks none"))


# What counts as a word when texts are matched word for word (BM25 terms, quote overlap). Scripts
# written without spaces between words (Han, kana): each character is a word, as a run of them is
# a whole clause. Every other script: runs of letters and digits, accented ones included.
_UNSPACED = CHARACTER_WORD_SCRIPTS
_WORD = re.compile(rf"[{_UNSPACED}]|[^\W_{_UNSPACED}]+")
# Invisible marks that sit inside a word without ending it: the soft hyphen (where a line may break,
# common in EPUBs), the word joiner and the zero-width no-break space. Matching drops them.
IN_WORD_MARKS = "\u00ad\u2060\ufeff"
_DROP_IN_WORD_MARKS = dict.fromkeys(map(ord, IN_WORD_MARKS))


def words(text: str) -> list[str]:
    """The words of `text`, lowercased, in order (see `_WORD`), without `IN_WORD_MARKS`. Text is
    compared in NFKC form: a combining accent is no letter, so 'é' written as 'e' and an accent would
    split its word, and a ligature ('\ufb01') or a full-width letter is the same word as its plain letters.
    Lowercased after: the form makes capitals of some letters ('\u210c' is 'H')."""
    return _WORD.findall(unicodedata.normalize("NFKC", text.translate(_DROP_IN_WORD_MARKS)).lower())


def evidence_help(modes: tuple[str, ...] = EVIDENCE_MODES) -> str:
    """One line for a command's --evidence help: each mode and what it shows."""
    return "; ".join(f"{m}: {EVIDENCE_HELP[m]}" for m in modes) + "."


def index_dir(cache_dir: str | Path | None = None) -> Path:
    """Where book indexes are kept: `<cache>/indexes` (the default cache unless one is given)."""
    from booklens.lm.cache import cache_folder

    return cache_folder(cache_dir) / "indexes"


_LAZY = ("BookIndex", "Passage", "QuoteLocator", "locate_quote", "make_passages", "format_passages", "embed",
         "embedding_model", "bm25_tokens", "collapse_whitespace", "index_key", "EMBEDDING_MODEL",
         "DENSE_WINDOW_TOKENS", "RRF_K", "INDEX_VERSION", "TOKENIZER_ID")


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'booklens.retrieval' has no attribute {name!r}")
    value = getattr(importlib.import_module("booklens.retrieval.index"), name)
    globals()[name] = value
    return value
