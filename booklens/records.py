"""Pydantic records of everything booklens reads and writes. Files on disk are JSON."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from glob import escape as glob_escape
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Optional, get_args

from pydantic import BaseModel, Field

from booklens.errors import BooklensError
from booklens.vocabulary import (DEFAULT_MAX_REGENERATIONS, ClaimLabel, EvidenceSource, FablesLabel, MergeContextName,
                                 SummaryMethod)

FORMAT_VERSION = 1
PARTIAL_WRITE_SUFFIX = ".tmp"  # atomic writes go to a hidden `.NAME.XXXX.tmp`, then replace NAME


def write_atomically(path: str | Path, write: Callable[[str], None], *, shared: bool = True) -> None:
    """Write `path` through `write(temporary_path)`: into a hidden `.NAME.XXXX.tmp` beside it, which
    then replaces it, so readers see the old file or the complete new one, never a part. An error or
    an interrupt removes the temporary file. The file gets the usual mode (0666 less the umask, as
    `open` gives): records and reports on a shared file system are read by other users and nodes.
    `shared=False` keeps it private (0600). OSError propagates.

    A link is followed: the file it names is replaced and the link kept. A device or a pipe
    (`-o /dev/null`, `-o /dev/stdout`) has nothing to replace: the result is written into it."""
    path = Path(path)
    try:
        kind = os.stat(path).st_mode  # through links
    except OSError:
        kind = None
    if kind is not None and not stat.S_ISREG(kind) and not stat.S_ISDIR(kind):
        _write_into(path, write)
        return
    if kind is not None and path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temporary(path, 0o666 if shared else 0o600)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:  # an error or an interrupt: no half-written file left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_into(path: Path, write: Callable[[str], None]) -> None:
    """`write` to a temporary file, then its bytes into the special file `path`."""
    import shutil
    import tempfile

    handle, tmp = tempfile.mkstemp(suffix=PARTIAL_WRITE_SUFFIX)
    os.close(handle)
    try:
        write(tmp)
        with open(tmp, "rb") as source, open(path, "wb") as target:
            shutil.copyfileobj(source, target)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def written_by_booklens(path: str | Path) -> bool:
    """Whether `path` is a file booklens writes (a record, a compiled artifact, a report page), which
    a command may replace where it must not replace somebody's data."""
    from booklens.reports import CSP, GENERATOR, h

    path = Path(path)
    try:
        if path.suffix.lower() in (".html", ".htm"):
            with open(path, "rb") as f:
                head = f.read(4096)
            # Pages of earlier versions carry no generator line, but the same policy line.
            return any(mark.encode() in head for mark in (f'<meta name="generator" content="{GENERATOR}">',
                                                          f'<meta http-equiv="Content-Security-Policy" '
                                                          f'content="{h(CSP)}">'))
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            meta = data.get("metadata") if isinstance(data, dict) else None
            return isinstance(data, dict) and (str(data.get("kind", "")).startswith("booklens")
                                               or isinstance(meta, dict) and "booklens" in meta)
    except (OSError, ValueError):
        return False
    return False


def _create_temporary(path: Path, mode: int) -> str:
    """A new, empty `.NAME.XXXX.tmp` beside `path`, created with `mode` less the umask. Unlike
    mkstemp (always 0600) the kernel applies the umask, and no thread has to change the
    process-wide umask to read it."""
    import secrets

    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}{PARTIAL_WRITE_SUFFIX}")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
            return tmp
        except FileExistsError:  # another writer drew the same name
            continue


def path_refused(path: str | Path, exc: OSError, doing: str = "use") -> BooklensError:
    """The one-line error for a path the system refuses to look at: a symbolic link loop, a name
    too long, a folder on the way that may not be searched. `doing`: what the command would do
    with it ("use", "write")."""
    shown = os.fsdecode(path)
    if len(shown) > 1000:  # no path a user typed, but a text handed over as one: its start says which
        shown = f"{shown[:60]}... (a name of {len(shown)} characters)"
    return BooklensError(f"cannot {doing} {shown}: {exc.strerror or os.strerror(exc.errno)}")


def present(path: str | Path, doing: str = "use") -> bool:
    """Whether anything is at a path a user gave: False only when nothing is, and `path_refused`
    when the system refuses to look. Path.exists() answers False for a symbolic link loop too,
    which was then reported as a missing file, or passed an output check and failed the write."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except ValueError:  # a NUL in the name: no file can have it
        return False
    except OSError as exc:
        raise path_refused(path, exc, doing) from None
    return True


def nearest_existing_folder(path: str | Path) -> Path:
    """The nearest folder above `path` that exists (it may be a file, where a folder should be):
    where writing `path` would make its missing folders from."""
    folder = Path(path).absolute().parent
    while not present(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def json_text(payload: Any) -> str:
    """The JSON text of a record (a model or plain data) as booklens writes and prints it."""
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(mode="json")
    text = json.dumps(payload, indent=2, ensure_ascii=False, default=str)
    # A file name that is not UTF-8 holds its bytes as lone surrogates, which UTF-8 cannot encode:
    # written as `\udce9`, each is the JSON escape of the same character, so the name reads back whole.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def save_json(path: str | Path, payload: Any) -> None:
    """Write JSON atomically (`write_atomically`); a one-line `BooklensError` when it cannot."""
    path = Path(path)
    text = json_text(payload)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.write("\n")

    try:
        write_atomically(path, write)
    except OSError as exc:
        raise BooklensError(f"cannot write {path}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def directory_lock(folder: str | Path, busy: str) -> Iterator[None]:
    """Held while a command writes the existing directory `folder`: a second command into it at once
    is the one-line error `busy`. The lock is taken on the directory itself, so nothing is left in
    it; where the platform or the file system takes no such lock, the command goes on without one."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows)
        fcntl = None
    handle = None
    if fcntl is not None:
        with contextlib.suppress(OSError):
            handle = os.open(folder, os.O_RDONLY)
    try:
        if handle is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the handle closes
            except BlockingIOError:
                raise BooklensError(busy) from None
            except OSError:  # a file system without locks
                pass
        yield
    finally:
        if handle is not None:
            os.close(handle)


@contextlib.contextmanager
def file_lock(lock_file: str | Path) -> Iterator[bool]:
    """Held while a process reads and rewrites files that other processes (or threads) may rewrite
    too: a second holder waits until the first lets go. The lock is taken on the empty file
    `lock_file`, made if missing. Yields whether it was taken: where the file cannot be made (a
    read-only folder) or the platform or file system takes no lock, the caller goes on without one."""
    handle = None
    try:
        import fcntl

        handle = open(lock_file, "a")
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the handle closes
    except (OSError, ImportError):  # ImportError: no flock (Windows)
        if handle is not None:
            handle.close()
            handle = None
    try:
        yield handle is not None
    finally:
        if handle is not None:
            handle.close()


def remove_partial_writes(folder: str | Path, names: Iterable[str]) -> int:
    """Delete what atomic writes of the files `names` into `folder` left when their process was
    killed mid-write (a hidden `.NAME.XXXX.tmp` each); returns how many."""
    removed = 0
    for name in names:
        for leftover in Path(folder).glob(f".{glob_escape(name)}.*{PARTIAL_WRITE_SUFFIX}"):
            with contextlib.suppress(OSError):
                leftover.unlink()
                removed += 1
    return removed


def meant_file(path: Path) -> Optional[Path]:
    """The file beside a missing `path` that its name most likely meant: the same name in another case,
    the same name with another suffix or none ('pride' for pride.txt), or a name one typo away; None
    when nothing is that close."""
    import difflib

    try:
        names = sorted(entry.name for entry in os.scandir(path.parent) if entry.is_file())
    except OSError:
        return None
    wanted = path.name.lower()
    stem = (path.stem if path.suffix else path.name).lower()
    for same in ([n for n in names if n.lower() == wanted],
                 [n for n in names if Path(n).stem.lower() == stem]):
        if same:
            return path.parent / same[0]
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.8)
    return path.parent / close[0] if close else None


def not_found(what: str, path: Path) -> BooklensError:
    """'WHAT not found: PATH', naming the file beside it that was likely meant."""
    meant = meant_file(path)
    return BooklensError(f"{what} not found: {path}" + (f" (did you mean {meant}?)" if meant else ""))


def read_file_bytes(path: str | Path, what: str) -> bytes:
    """The bytes of a file a user gave, or a one-line `BooklensError` that names it as `what`.
    Every reader of a user's file starts here, books and data files alike."""
    path = Path(path)
    if not present(path):
        raise not_found(what, path)
    if path.is_dir():
        raise BooklensError(f"{what} is a directory, not a file: {path}")
    if not path.is_file():  # /dev/zero would be read until memory runs out, a pipe until its writer closes
        raise BooklensError(f"{what} is a device or a pipe, not a file: {path}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BooklensError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_text_file(path: str | Path, what: str) -> str:
    """The text of a data file a user gave (JSON, YAML): UTF-8, a byte-order mark allowed, as JSON
    requires. Books and summaries, which may come in other encodings, are read by
    `booklens.text.read_text_file`."""
    try:
        return read_file_bytes(path, what).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BooklensError(f"{what} is not UTF-8 text: {path}") from None


def read_json_file(path: str | Path, what: str) -> Any:
    """A JSON file a user gave, or a one-line `BooklensError` saying what is wrong with it."""
    return parse_json(read_text_file(path, what), path, what)


def parse_json(text: str, path: str | Path, what: str) -> Any:
    """The JSON `text` of the file `path` (a user's `what`), or a one-line `BooklensError`: not JSON,
    nested too deeply, or a key given twice in one object, of which JSON would keep the last value
    and drop the other unseen (a question, a book's summary, a claim), or blank: JSON's own message
    for that ("line 2: Expecting value" for a lone newline) does not say the file holds nothing."""
    if not text.strip():
        raise BooklensError(f"{what} is empty ({path})")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        where = f" column {exc.colno}" if exc.msg.endswith(" at") else ""  # 'Unterminated string starting at'
        raise BooklensError(f"{what} is not valid JSON ({path}: line {exc.lineno}: {exc.msg}{where})") from None
    except _KeyTwice as exc:
        key = exc.args[0]
        line = _line_of_second(text, key)
        where = f"{path}: line {line}" if line else str(path)
        raise BooklensError(f"{what} is malformed: the key {key!r} appears twice in one object ({where}); JSON "
                            "keeps only the last") from None
    except RecursionError:  # Python's parser has a depth limit; no booklens file comes near it
        raise BooklensError(f"{what} is nested too deeply to be read ({path})") from None


class _KeyTwice(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _KeyTwice(key)
        seen[key] = value
    return seen


# A JSON string (and the colon after it, when it is an object's key), or a bracket.
_JSON_TOKEN = re.compile(r'("(?:[^"\\]|\\.)*")(\s*:)?|[{}\[\]]')


def _line_of_second(text: str, key: str) -> Optional[int]:
    """The line on which `key` comes a second time in one object of `text`. The parser's hook sees
    no positions, and only this error path pays for a second pass."""
    objects: list[Optional[set[str]]] = []  # the keys of each open object; None for an array
    for match in _JSON_TOKEN.finditer(text):
        token = match.group(0)
        if token in ("{", "["):
            objects.append(set() if token == "{" else None)
        elif token in ("}", "]"):
            if objects:
                objects.pop()
        elif match.group(2) and objects and objects[-1] is not None:
            name = json.loads(match.group(1))
            if name == key and name in objects[-1]:
                return text.count("\n", 0, match.start()) + 1
            objects[-1].add(name)
    return None


# ---------------------------------------------------------------------------
# Text


class Chunk(BaseModel):
    """A piece of the book: `text == book[start:end]`; chunks tile the book in order, but for
    stretches with no word that fill whole chunks (`booklens.text.chunk_text`)."""

    index: int
    start: int
    end: int
    tokens: int
    text: str
    # True when one sentence was longer than the limit and had to be cut inside.
    split_sentence: bool = False


# ---------------------------------------------------------------------------
# Judges: who judged, and how well that judge agrees with humans


class JudgeInfo(BaseModel):
    """The judge behind a record's judgments: its program, its demos, its LM and its measured
    agreement with human annotators (`calibration`, None when never measured for this LM and
    program). `warning` names the figure when there is no calibration or the agreement is low."""

    task: Literal["coherence", "verification"]
    mode: str = Field(description="per-sentence or batched (coherence); four-way or binary (verification)")
    program: str = Field(description="'default' (the few-shot program shipped with booklens), 'zero-shot', "
                                     "or the artifact file given with --program")
    program_sha256: str = Field(description="of the program's prompts and demos (what its calibration is keyed by)")
    demos: int = Field(description="labelled examples the program shows the model")
    lm: str
    api_base: Optional[str] = Field(default=None, description="the server the LM was reached at (--api-base), "
                                                              "which its calibration is keyed by too")
    compiled_with: Optional[str] = Field(default=None, description="the LM whose answers chose the artifact's demos "
                                                                   "or instructions, when an LM chose them")
    calibration: Optional[dict[str, Any]] = None
    warning: Optional[str] = None
    evidence: Optional[str] = Field(default=None, description="verification: the evidence mode the verdicts were "
                                                              "made with (the calibration's is 'given')")
    context_window: Optional[int] = Field(default=None, description="the window the judge's prompts were planned "
                                                                    "for when one was set (its calibration is keyed "
                                                                    "by it too); None: the model's own")
    demos_shown: Optional[int] = Field(default=None, description="verification: the first demos its prompts showed "
                                                                "when its context window held no more beside the "
                                                                "evidence asked for; None: all `demos`")
    demos_note: Optional[str] = Field(default=None, description="the line that says so (with `demos_shown`)")


# ---------------------------------------------------------------------------
# Summaries


class SummaryNode(BaseModel):
    """One LM-written summary: a chunk summary, a merge, an update or a compression."""

    id: str
    level: int = Field(description="1 = summaries of chunks; higher = merges (hier); step number (inc)")
    kind: Literal["chunk", "merge", "update", "compress", "clean"]
    text: str
    tokens: int
    budget: Optional[int] = Field(default=None, description="the tokens it was allowed (G_l for hier)")
    children: list[str] = Field(default_factory=list, description="ids of the chunks or nodes it was made from")
    chunks: list[int] = Field(default_factory=list, description="indices of the book chunks it covers")
    used_context: bool = False
    context: Optional[str] = Field(default=None, description="id of the summary a merge received as context")
    attempts: int = 1
    over_budget: bool = Field(default=False, description="its text is longer than its budget (kept whole: a trimmed "
                                                         "text is within it and says so with truncated)")
    truncated: bool = Field(default=False, description="trimmed to whole sentences within the budget")
    cut_off: bool = Field(default=False, description="the model's answer stopped at the token cap")
    fallback: bool = Field(default=False, description="no answer had words in it, so booklens kept its input: "
                                                      "a compression keeps its input (the update, or the compression "
                                                      "it compresses again) trimmed to the room it has, "
                                                      "artifact removal keeps the summary as it was (which it "
                                                      "also does when its rewrite was not a cleanup: see "
                                                      "dropped_rewrite_tokens)")
    filtered: bool = Field(default=False, description="the provider's content filter stopped every answer, so "
                                                      "booklens kept its input (with fallback)")
    dropped_rewrite_tokens: Optional[int] = Field(
        default=None, description="artifact removal: the length of a rewrite that ran longer than the summary, "
                                  "was left unfinished (cut_off) or kept under half of the summary's words, so "
                                  "the summary was kept as it was")


class SummaryConfig(BaseModel):
    method: SummaryMethod
    chunk_size: int
    context_window: int
    max_summary_tokens: int
    level_budgets: list[int] = Field(default_factory=list)
    max_regenerations: int = DEFAULT_MAX_REGENERATIONS
    generation_slack: Optional[float] = Field(
        default=None, description="generation cap per budget (None in files written before the setting: 1.5)")
    generation_allowance: Optional[int] = Field(
        default=None, description="tokens the cap adds to G x slack (None in files written before the setting: 64)")
    remove_artifacts: bool = False
    drop_matter: bool = False
    concurrency: int = 1
    program: Optional[str] = None
    merge_context: Optional[MergeContextName] = Field(
        default=None, description="hier: what a merge sees as context (None in files written before the option)")
    words_per_token: Optional[float] = Field(
        default=None, description="words asked for per token of budget (None: written before the option, 0.75)")


class Summary(BaseModel):
    format_version: int = FORMAT_VERSION
    kind: Literal["booklens.summary"] = "booklens.summary"
    book: Optional[str] = Field(None, description="the book's path; None when its text was handed over")
    book_sha256: str
    book_tokens: int
    summary: str
    method: SummaryMethod
    config: SummaryConfig
    chunks: list[dict[str, Any]] = Field(default_factory=list, description="index, start, end, tokens of each chunk")
    nodes: list[SummaryNode] = Field(default_factory=list)
    lm: str
    usage: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)


# ---------------------------------------------------------------------------
# Faithfulness (FABLES): claims and their verification against the book


class ClaimSet(BaseModel):
    """Atomic claims decomposed from a summary."""

    format_version: int = FORMAT_VERSION
    kind: Literal["booklens.claims"] = "booklens.claims"
    summary: str
    claims: list[str]
    attempts: int = 1
    error: Optional[str] = Field(default=None, description="why no claims came back (then `claims` is empty)")
    lm: str = ""
    usage: dict[str, Any] = Field(default_factory=dict)


class Evidence(BaseModel):
    """One passage shown to the verifier, numbered from 1 as in the prompt. `start`/`end` are
    character offsets into the book text (`book[start:end] == text`), None when the evidence came
    with the data and could not be found in the book."""

    number: int
    text: str
    source: EvidenceSource
    passage: Optional[int] = Field(default=None, description="index of the book passage it is (or overlaps first)")
    start: Optional[int] = None
    end: Optional[int] = None
    score: Optional[float] = None
    supports: bool = False
    refutes: bool = False


class ClaimVerdict(BaseModel):
    """The verification of one claim. `label` is None when the verifier failed (see `error`)."""

    index: int
    claim: str
    label: Optional[ClaimLabel] = None
    fables_label: Optional[FablesLabel] = None
    model_label: Optional[ClaimLabel] = Field(
        default=None, description="the model's own label when the verdict differs from it (see `relabelled`)")
    relabelled: Optional[str] = Field(default=None, description="why the verdict is not the model's label")
    reason: str = ""
    evidence: list[Evidence] = Field(default_factory=list)
    supporting: list[int] = Field(default_factory=list, description="evidence numbers that support the claim")
    refuting: list[int] = Field(default_factory=list, description="evidence numbers that contradict the claim")
    invalid_references: list[int] = Field(default_factory=list,
                                          description="passage numbers the verifier cited that were not shown to it")
    truncated: bool = Field(default=False, description="the answer hit the token limit after the label and reason; "
                                                       "its passage lists were dropped")
    attempts: int = 0
    error: Optional[str] = None


class FaithfulnessReport(BaseModel):
    """Claim-level verdicts and the summary-level share of each label (percent of the verified
    claims; `failures` counts the claims whose verification gave no valid label, which are left
    out of the percentages)."""

    format_version: int = FORMAT_VERSION
    kind: Literal["booklens.faithfulness"] = "booklens.faithfulness"
    book: Optional[str] = None
    book_sha256: Optional[str] = None
    summary: Optional[str] = None
    evidence_mode: Literal["none", "given", "bm25", "dense", "hybrid", "book"]
    k: Optional[int] = None
    budget_tokens: Optional[int] = None
    passage_tokens: Optional[int] = None
    claims: list[ClaimVerdict] = Field(default_factory=list)
    total_claims: Optional[int] = Field(
        default=None, description="claims there were when only the first `len(claims)` were verified "
                                  "(--max-claims); None when all were")
    label_counts: dict[str, int] = Field(default_factory=dict)
    label_percentages: dict[str, float] = Field(default_factory=dict)
    failures: int = 0
    label_set: Literal["four-way", "binary"] = "four-way"
    judge: Optional[JudgeInfo] = None
    lm: str = ""
    usage: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)


# ---------------------------------------------------------------------------
# Coherence (BooookScore): confusion annotations of summary sentences

CoherenceErrorType = Literal[
    "entity omission",
    "event omission",
    "causal omission",
    "salience",
    "discontinuity",
    "duplication",
    "inconsistency",
    "language",
]
COHERENCE_ERROR_TYPES: tuple[str, ...] = get_args(CoherenceErrorType)


class SentenceAnnotation(BaseModel):
    """The confusion verdict for one summary sentence. `confusing` is None when no valid
    answer was obtained (`status == "failed"`, reason in `error`): such a sentence is
    never counted as free of confusion."""

    index: int = Field(description="0-based position of the sentence in the summary")
    sentence: str
    confusing: Optional[bool] = None
    questions: list[str] = Field(default_factory=list)
    types: list[CoherenceErrorType] = Field(default_factory=list)
    status: Literal["ok", "failed"] = "ok"
    attempts: int = 1
    error: Optional[str] = None


class CoherenceResult(BaseModel):
    """BooookScore of one summary with its sentence annotations.

    `score` is Eq. 1 of the BooookScore paper as a fraction: the share of the answered
    sentences without confusion. For human span annotations `score_method` is
    "annotations": following the paper's footnote 12, each annotation (a span, possibly
    covering consecutive sentences, or a relation between two spans) counts as one
    confusing sentence; `score_sentences` is then the share of sentences no span touches."""

    format_version: int = FORMAT_VERSION
    kind: Literal["booklens.coherence"] = "booklens.coherence"
    book: Optional[str] = None
    summary: str
    annotator: str = Field(default="program", description="who annotated: program, gpt4, human, ...")
    score: Optional[float] = None
    score_method: Literal["sentences", "annotations"] = "sentences"
    score_sentences: Optional[float] = None
    n_sentences: int = 0
    n_confusing: int = 0
    n_failed: int = 0
    n_annotations: Optional[int] = Field(default=None, description="human spans + relations (footnote 12 count)")
    annotation_types: Optional[list[list[CoherenceErrorType]]] = Field(
        default=None, description="error types of each human annotation (span or relation), as Table 1 counts them")
    type_counts: dict[str, int] = Field(default_factory=dict)
    sentences: list[SentenceAnnotation] = Field(default_factory=list)
    stats: dict[str, Any] = Field(default_factory=dict, description="length_tokens, repeated/novel trigram percentages")
    mode: Optional[Literal["per-sentence", "batched"]] = None
    batch_size: Optional[int] = None
    judge: Optional[JudgeInfo] = None
    notes: list[str] = Field(default_factory=list)
    lm: str = ""
    usage: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)


class CoherenceSet(BaseModel):
    """BooookScore of a system: many summaries (book -> result) and their mean score."""

    format_version: int = FORMAT_VERSION
    kind: Literal["booklens.coherence_set"] = "booklens.coherence_set"
    annotator: str = "program"
    system_score: Optional[float] = None
    system_score_sentences: Optional[float] = None
    system_score_ci95: Optional[list[float]] = Field(default=None, description="95% percentile bootstrap interval "
                                                                                "of system_score over the scored "
                                                                                "summaries; none for fewer than two")
    n_summaries: int = 0
    n_scored_summaries: Optional[int] = Field(default=None, description="summaries with a score: the system score "
                                                                        "is their mean (a summary none of whose "
                                                                        "sentences was judged has none)")
    n_sentences: int = 0
    n_confusing: int = 0
    n_failed: int = 0
    error_type_rates: dict[str, float] = Field(default_factory=dict, description="errors per sentence, percent")
    stats: dict[str, Any] = Field(default_factory=dict)
    results: dict[str, CoherenceResult] = Field(default_factory=dict)
    judge: Optional[JudgeInfo] = None
    notes: list[str] = Field(default_factory=list)
    lm: str = ""
    usage: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)


# ---------------------------------------------------------------------------
# `booklens run`: the run directory


class GivenSummary(BaseModel):
    """A summary a user gave to `booklens run --summary` as text (not a `booklens summarize` output)."""

    format_version: int = FORMAT_VERSION
    kind: Literal["booklens.summary"] = "booklens.summary"
    source: Literal["given"] = "given"
    file: str
    book: str
    book_sha256: str
    summary: str
    method: Optional[SummaryMethod] = None
    nodes: list[SummaryNode] = Field(default_factory=list)
    chunks: list[dict[str, Any]] = Field(default_factory=list)


class RunStep(BaseModel):
    """One completed step of a run: its record file, a digest of what it was computed from, and
    the LM work its result rests on, counting every call whether the model answered it or the
    cache did (so a resumed run reports the same figures as an uninterrupted one)."""

    file: str
    sha256: str = Field(description="of the record file")
    inputs_sha256: str = Field(description="of the step's inputs and configuration; a rerun reuses the record "
                                           "when it matches")
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: Optional[float] = Field(default=None, description="None when the provider's prices are unknown")
    provider_cached_tokens: int = Field(default=0, description="of prompt_tokens, those the provider read from its "
                                                               "own prompt cache")


class RunRecord(BaseModel):
    """`run.json`: what a run directory holds and how it was made. No wall-clock times (those are
    in `timings.json`), so rerunning the same command rewrites it identically."""

    format_version: int = FORMAT_VERSION
    kind: Literal["booklens.run"] = "booklens.run"
    complete: bool = False
    book: str
    book_sha256: str
    book_chars: int
    book_tokens: Optional[int] = Field(description="None when the book could not be read")
    summary_source: Literal["summarize", "given"]
    lm: str
    judge_lm: Optional[str] = None
    config: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    steps: dict[str, RunStep] = Field(default_factory=dict)
    failures: dict[str, str] = Field(default_factory=dict, description="step -> one-line reason it failed (a step "
                                                                      "that needs a failed one: 'needs <step>')")
    failed_work: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="step -> LM work (as in steps) of a failed step's calls before it failed; "
                                          "counted in totals")
    totals: dict[str, Any] = Field(default_factory=dict, description="LM work of the steps and the failed steps")
    scores: dict[str, Any] = Field(default_factory=dict)
    judges: dict[str, JudgeInfo] = Field(default_factory=dict,
                                         description="the judge of each judging step: coherence, verification")
