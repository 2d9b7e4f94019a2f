"""BooookScore annotations: human span annotations and GPT-4 sentence annotations.

Files (the BooookScore release, MIT; see `../shared/README.md`):

- human: `summary-gpt4-4096-{inc,hier}.json`, book -> {"summary", "singles", "relations"}.
  A single is a highlighted span (any length, possibly several consecutive sentences)
  with questions and error labels; a relation links two spans that share one confusion.
  Spans are given as text: each is located at its first occurrence in the summary (a
  relation's second span, and a duplication single over repeated text, at a later copy: see
  `_place_relation_b` and `_place_duplication_single`) and mapped to the sentences it
  overlaps. A sentence is confusing when any span (of a single or of a relation) touches it.
  The BooookScore of a human-annotated summary follows the paper's footnote 12: a span over
  consecutive sentences, and a relation, each count as one confusing sentence, i.e.
  1 - (singles + relations) / sentences.
- GPT-4: `<config>.json`, book -> null | {sentence: {"questions", "types"}} listing only
  the confusing sentences, with `<config>-cleaned.json`, book -> summary. A summary absent
  from the annotation file (or null) has no confusing sentence.

Both become `CoherenceResult`s (the records `booklens score` writes) and `dspy.Example`s
(summary, sentence -> verdict, error types, questions), split by book with a fixed seed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from pydantic import BaseModel, Field, ValidationError

from booklens.data.splits import DEFAULT_FRACTIONS, DEFAULT_SEED, split_by_book
from booklens.errors import BooklensError, validation_problem
from booklens.records import (
    COHERENCE_ERROR_TYPES,
    CoherenceErrorType,
    CoherenceResult,
    CoherenceSet,
    SentenceAnnotation,
    read_json_file,
)

if TYPE_CHECKING:  # DSPy loads only where examples are built: scoring annotations needs no LM layer
    import dspy

HUMAN_CONFIGS = ("gpt4-4096-inc", "gpt4-4096-hier")
GPT4_CONFIGS = ("gpt4-2048-hier", "gpt4-2048-inc", "claude-2048-hier", "claude-2048-inc",
                "chatgpt-2048-hier", "chatgpt-2048-inc")
# Table 2 of the paper (BooookScore x100) for the configurations with released annotations.
PAPER_TABLE2 = {"gpt4-2048-hier": 89.1, "gpt4-2048-inc": 82.5, "claude-2048-hier": 91.1, "claude-2048-inc": 78.6,
                "chatgpt-2048-hier": 84.2, "chatgpt-2048-inc": 67.0}
# Section 4: BooookScore of the GPT-4 4096 summaries computed from the human annotations.
PAPER_HUMAN = {"gpt4-4096-inc": 82.1, "gpt4-4096-hier": 89.4}


def default_data_dir() -> Path:
    """`$BOOKLENS_BOOOOKSCORE_DIR`, else `../shared/data/booookscore` next to the repository."""
    env = os.environ.get("BOOKLENS_BOOOOKSCORE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "booookscore"


# ---------------------------------------------------------------------------
# Records


class HumanSpan(BaseModel):
    """A highlighted span of the summary; `start`/`end` are offsets of the place it was put (None when
    it could not be found) and `sentences` the indices of the sentences it touches."""

    id: str = ""
    span: str
    questions: str = ""
    labels: list[CoherenceErrorType] = Field(default_factory=list)
    start: Optional[int] = None
    end: Optional[int] = None
    sentences: list[int] = Field(default_factory=list)


class HumanRelation(BaseModel):
    """Two spans sharing one confusion (shared questions and labels)."""

    id_a: str = ""
    id_b: str = ""
    a: HumanSpan
    b: HumanSpan
    questions: str = ""
    labels: list[CoherenceErrorType] = Field(default_factory=list)
    same: Optional[bool] = None

    @property
    def sentences(self) -> list[int]:
        return sorted(set(self.a.sentences) | set(self.b.sentences))


class HumanSummaryAnnotation(BaseModel):
    """The human annotation of one summary, with its sentences (as `split_sentences` cuts them)."""

    book: str
    summary: str
    sentences: list[str]
    singles: list[HumanSpan] = Field(default_factory=list)
    relations: list[HumanRelation] = Field(default_factory=list)
    unlocated: int = Field(default=0, description="spans that were not found in the summary")

    def placed(self) -> tuple[list[HumanSpan], list[HumanRelation]]:
        """The singles found in the summary, and the relations with a span found in it: a span in no
        sentence is ignored, as the notes say (it counts in no figure, the footnote's count too)."""
        return ([s for s in self.singles if s.start is not None],
                [r for r in self.relations if r.a.start is not None or r.b.start is not None])

    @property
    def n_annotations(self) -> int:
        singles, relations = self.placed()
        return len(singles) + len(relations)

    def sentence_annotations(self) -> list[SentenceAnnotation]:
        """Per sentence: confusing when any span touches it; the questions and labels of those spans."""
        questions: list[list[str]] = [[] for _ in self.sentences]
        types: list[list[str]] = [[] for _ in self.sentences]
        hits: list[tuple[list[int], str, list[str]]] = [(s.sentences, s.questions, list(s.labels))
                                                         for s in self.singles]
        hits += [(r.sentences, r.questions, list(r.labels)) for r in self.relations]
        for indices, q, labels in hits:
            for i in indices:
                if q and q not in questions[i]:
                    questions[i].append(q)
                for label in labels:
                    if label not in types[i]:
                        types[i].append(label)
        touched = {i for indices, _, _ in hits for i in indices}
        return [
            SentenceAnnotation(index=i, sentence=s, confusing=i in touched, questions=questions[i],
                               types=sorted(types[i], key=COHERENCE_ERROR_TYPES.index))
            for i, s in enumerate(self.sentences)
        ]

    def to_result(self, *, stats: bool = True) -> CoherenceResult:
        from booklens.metrics.booookscore import finish_result

        result = CoherenceResult(
            book=self.book,
            summary=self.summary,
            annotator="human",
            score_method="annotations",
            n_annotations=self.n_annotations,
            annotation_types=[list(s.labels) for s in self.placed()[0]] + [list(r.labels) for r in self.placed()[1]],
            sentences=self.sentence_annotations(),
            notes=[f"{self.unlocated} span(s) not found in the summary"] if self.unlocated else [],
        )
        return finish_result(result, stats=stats)


# ---------------------------------------------------------------------------
# Locating text in a summary


def sentence_offsets(text: str, sentences: list[str]) -> list[tuple[int, int]]:
    """(start, end) of each sentence in `text`, searched in order."""
    offsets = []
    cursor = 0
    for sentence in sentences:
        start = text.find(sentence, cursor)
        if start < 0:  # the splitter normalised something: fall back to a whitespace-insensitive search
            found = _find_loose(text, sentence, cursor)
            start, end = found if found else (cursor, cursor)
        else:
            end = start + len(sentence)
        offsets.append((start, end))
        cursor = max(cursor, end)
    return offsets


def _find_loose(text: str, needle: str, start: int = 0) -> Optional[tuple[int, int]]:
    """Find `needle` in `text` ignoring differences in whitespace; (start, end) in `text`."""
    words = needle.split()
    if not words:
        return None
    pattern = r"\s+".join(re.escape(w) for w in words)
    match = re.compile(pattern).search(text, start)
    if match is None and start:
        match = re.compile(pattern).search(text)
    return (match.start(), match.end()) if match else None


def _locate(text: str, span: str) -> Optional[tuple[int, int]]:
    """The first place of `span` in `text` (see `_occurrences`), or None."""
    places = _occurrences(text, span)
    return places[0] if places else None


def _occurrences(text: str, span: str) -> list[tuple[int, int]]:
    """Every place of `span` in `text`, in order and not overlapping: exact matches, else matches
    ignoring whitespace, else also ignoring case."""
    places = []
    start = text.find(span)
    while start >= 0 and span:
        places.append((start, start + len(span)))
        start = text.find(span, start + len(span))
    if places:
        return places
    words = span.split()
    if not words:
        return []
    pattern = r"\s+".join(re.escape(w) for w in words)
    for flags in (0, re.IGNORECASE):
        places = [(m.start(), m.end()) for m in re.finditer(pattern, text, flags)]
        if places:
            return places
    return []


def _place_relation_b(places_b: list[tuple[int, int]], a: tuple[int, int]) -> tuple[int, int]:
    """Where span b of a relation goes: its first place, unless that lands on span a. The two spans of a
    relation are two highlights; the files give them as text only, so a passage linked to its copy reads
    as one text twice and would put both on the first copy, counting the copy a reader trips over
    clean. Then b takes the next place of its text after a, when the text is said again."""
    first = places_b[0]
    if first[0] < a[1] and a[0] < first[1]:
        return next((p for p in places_b if p[0] >= a[1]), first)
    return first


def _place_duplication_single(places: list[tuple[int, int]], k: int) -> tuple[int, int]:
    """Where the k-th (from 0) single labelled duplication over one repeated text goes. Its question is
    why the passage is said again, a confusion of the later copy: the second place, the next single of
    that text the third, and so on; once the later copies run out, the first (an annotator who marked
    every copy of a twice-said passage gave two singles)."""
    return places[(k + 1) % len(places)]


def _covered(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    return [i for i, (a, z) in enumerate(offsets) if a < end and z > start]


# ---------------------------------------------------------------------------
# Validation helpers: a wrong shape is a one-line user error


def summaries_by_book(data: Any, what: str = "summaries file") -> Mapping[str, Any]:
    """The summaries a user gave for sentence annotations (book -> summary, as read from JSON), or a
    one-line error."""
    return _require_mapping(data, what)


def _require_mapping(data: Any, what: str, allow_empty: bool = False) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise BooklensError(f"{what} must be a JSON object mapping book names to entries, got {type(data).__name__}")
    if not data and not allow_empty:
        raise BooklensError(f"{what} is empty")
    return data


def _labels(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BooklensError(f"{where}: error labels must be a list of strings")
    labels = [v.strip().lower() for v in value if v.strip()]
    unknown = [v for v in labels if v not in COHERENCE_ERROR_TYPES]
    if unknown:
        raise BooklensError(f"{where}: unknown error type {unknown[0]!r} (expected one of: "
                            f"{', '.join(COHERENCE_ERROR_TYPES)})")
    return sorted(set(labels), key=COHERENCE_ERROR_TYPES.index)


def _text(value: Any, where: str) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(v.strip() for v in value)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BooklensError(f"{where} must be a string")
    return value


# ---------------------------------------------------------------------------
# Human span annotations


def is_human_format(data: Any) -> bool:
    return (isinstance(data, Mapping) and bool(data)
            and all(isinstance(v, Mapping) and "summary" in v and ("singles" in v or "relations" in v)
                    for v in data.values()))


def parse_human_annotations(data: Any, what: str = "annotation file") -> dict[str, HumanSummaryAnnotation]:
    """Human span annotations (already read JSON) -> book -> `HumanSummaryAnnotation`."""
    from booklens.text import split_sentences

    data = _require_mapping(data, what)
    out: dict[str, HumanSummaryAnnotation] = {}
    for book, entry in data.items():
        where = f"{what}, book {book!r}"
        if not isinstance(entry, Mapping):
            raise BooklensError(f"{where}: expected an object with 'summary', 'singles' and 'relations'")
        if "singles" not in entry and "relations" not in entry:
            # Read as human annotations, an entry without either list would be a summary in which the
            # humans found nothing: every sentence a clean label (the precision-study file has this shape).
            if "annotations" in entry:
                also = (" (this is the shape of the precision-study file annotations-gpt4-4096-inc.json, not of "
                        "the human span annotations summary-gpt4-4096-{inc,hier}.json)")
            elif "summary" not in entry and is_sentence_format({book: entry}):
                also = (" (this is the shape of sentence annotations, book -> {sentence: {questions, types}}, "
                        "such as GPT-4's released labels, not of the human span annotations "
                        "summary-gpt4-4096-{inc,hier}.json)")
            else:
                also = ""
            raise BooklensError(f"{where}: no 'singles' or 'relations': not human span annotations{also}")
        summary = entry.get("summary")
        if not isinstance(summary, str) or not summary.strip():
            raise BooklensError(f"{where}: 'summary' must be a non-empty string")
        singles_raw = entry.get("singles", [])
        relations_raw = entry.get("relations", [])
        if not isinstance(singles_raw, list) or not isinstance(relations_raw, list):
            raise BooklensError(f"{where}: 'singles' and 'relations' must be lists")
        sentences = split_sentences(summary)
        offsets = sentence_offsets(summary, sentences)
        unlocated = 0

        duplication_singles: dict[str, int] = {}  # text -> singles labelled duplication placed so far

        def make_span(span_text: Any, sid: str, questions: str, labels: list[str], w: str, *,
                      single: bool = False, a: Optional[HumanSpan] = None) -> HumanSpan:
            """A single's span (`single`), a relation's span a, or its span b (given its span `a`)."""
            nonlocal unlocated
            if not isinstance(span_text, str) or not span_text.strip():
                raise BooklensError(f"{w}: the span must be a non-empty string")
            places = _occurrences(summary, span_text)
            if not places:
                unlocated += 1
                return HumanSpan(id=sid, span=span_text, questions=questions, labels=labels)
            found = places[0]
            if a is not None and a.start is not None and a.end is not None:
                found = _place_relation_b(places, (a.start, a.end))
            elif single and "duplication" in labels and len(places) > 1:
                key = " ".join(span_text.split())
                k = duplication_singles.get(key, 0)
                duplication_singles[key] = k + 1
                found = _place_duplication_single(places, k)
            return HumanSpan(id=sid, span=span_text, questions=questions, labels=labels, start=found[0],
                             end=found[1], sentences=_covered(offsets, *found))

        singles = []
        for k, s in enumerate(singles_raw):
            w = f"{where}, single {k}"
            if not isinstance(s, Mapping) or "span" not in s:
                raise BooklensError(f"{w}: expected an object with 'span', 'questions' and 'labels'")
            singles.append(make_span(s["span"], str(s.get("id", "")), _text(s.get("questions"), f"{w} questions"),
                                     _labels(s.get("labels"), w), w, single=True))
        relations = []
        for k, r in enumerate(relations_raw):
            w = f"{where}, relation {k}"
            if not isinstance(r, Mapping) or "span_a" not in r or "span_b" not in r:
                raise BooklensError(f"{w}: expected an object with 'span_a', 'span_b', 'shared_questions' "
                                    "and 'shared_labels'")
            labels = _labels(r.get("shared_labels"), w)
            questions = _text(r.get("shared_questions"), f"{w} shared_questions")
            a = make_span(r["span_a"], str(r.get("id_a", "")), questions, labels, w)
            relations.append(HumanRelation(
                id_a=str(r.get("id_a", "")), id_b=str(r.get("id_b", "")), a=a,
                b=make_span(r["span_b"], str(r.get("id_b", "")), questions, labels, w, a=a),
                questions=questions, labels=labels,
                same=r.get("same") if isinstance(r.get("same"), bool) else None,
            ))
        out[str(book)] = HumanSummaryAnnotation(book=str(book), summary=summary, sentences=sentences,
                                                singles=singles, relations=relations, unlocated=unlocated)
    return out


def load_human_annotations(path: str | Path) -> dict[str, HumanSummaryAnnotation]:
    return parse_human_annotations(read_json_file(path, "annotation file"), f"annotation file {path}")


def human_results(annotations: Mapping[str, HumanSummaryAnnotation], *, stats: bool = True) -> dict[str, CoherenceResult]:
    return {book: a.to_result(stats=stats) for book, a in annotations.items()}


# ---------------------------------------------------------------------------
# Sentence annotations (GPT-4 / BooookScore release)


def is_sentence_format(data: Any) -> bool:
    if not isinstance(data, Mapping) or not data:
        return False
    for value in data.values():
        if value is None:
            continue
        if not isinstance(value, Mapping):
            return False
        for entry in value.values():
            if not (isinstance(entry, Mapping) and ("types" in entry or "questions" in entry)):
                return False
    return True


# The share of annotated sentences that may be missing from their summaries before the summaries are
# taken for other ones than those annotated. The released files miss at most 3% (ChatGPT inc).
MAX_IGNORED_SHARE = 0.5


def _split_questions(text: str) -> list[str]:
    parts = [p.strip() for p in re.split(r"(?<=\?)\s+", text.strip()) if p.strip()]
    return parts


class MatchNotes(list):
    """The notes of matching annotations to their summaries (strings), with the counts a command
    reports: `annotated` sentences (with an error type) or human spans (`unit`), `ignored` ones not
    in their summary."""

    def __init__(self, notes: list[str] = (), *, annotated: int = 0, ignored: int = 0,
                 unit: str = "annotated sentences"):
        super().__init__(notes)
        self.annotated = annotated
        self.ignored = ignored
        self.unit = unit

    def summary_line(self) -> Optional[str]:
        """'N of M annotated sentences are not in their summaries and were ignored', or None."""
        if not self.ignored:
            return None
        return f"{self.ignored} of {self.annotated} {self.unit} are not in their summaries and were ignored"

    def gist(self) -> Optional[str]:
        """One line on the ignored annotations, or None when every one was matched."""
        line = self.summary_line()
        return None if line is None else f"{line} (the record's notes list them)"


def human_match_notes(annotations: Mapping[str, HumanSummaryAnnotation]) -> MatchNotes:
    """The spans of human annotations that were not found in their summaries: they mark no sentence,
    and an annotation none of whose spans was found is left out of the footnote's count."""
    notes: list[str] = []
    spans = 0
    for book, a in annotations.items():
        for span in [*a.singles, *(s for r in a.relations for s in (r.a, r.b))]:
            spans += 1
            if span.start is None:
                notes.append(f"{book}: an annotated span is not in the summary and was ignored: {span.span[:80]!r}")
    return MatchNotes(notes, annotated=spans, ignored=len(notes), unit="human-annotated spans")


def parse_sentence_annotations(data: Any, summaries: Any, *, annotator: str = "gpt4",
                               what: str = "annotation file", summaries_what: str = "summaries file",
                               stats: bool = True) -> tuple[dict[str, CoherenceResult], MatchNotes]:
    """Sentence annotations + summaries (already read JSON) -> book -> `CoherenceResult`, notes.

    Every summary is scored; one without annotations has no confusing sentence. An
    annotated sentence is matched to the summary's sentences exactly, else ignoring
    whitespace; if it covers several of our sentences (a splitter difference) they are all
    marked. A sentence the summary says more than once is marked at every copy, since the
    label is keyed by its text. One not in the summary at all is ignored and reported in the notes. When
    not one annotated sentence is in its summary, the summaries are not the annotated ones:
    an error, not a perfect score."""
    from booklens.metrics.booookscore import finish_result
    from booklens.text import split_sentences

    data = _require_mapping(data, what, allow_empty=True)
    summaries = summaries_by_book(summaries, summaries_what)
    for book, summary in summaries.items():
        if not isinstance(summary, str):
            raise BooklensError(f"{summaries_what}: the summary of {book!r} must be a string")
    missing = [b for b in data if b not in summaries]
    if missing:
        raise BooklensError(f"book {missing[0]!r} is in the {what} but not in the {summaries_what}"
                            + (f" ({len(missing) - 1} more)" if len(missing) > 1 else ""))
    notes: list[str] = []
    annotated = ignored = 0
    results: dict[str, CoherenceResult] = {}
    for book, summary in summaries.items():
        if not summary.strip():
            raise BooklensError(f"{summaries_what}: the summary of {book!r} is empty")
        entry = data.get(book) or {}
        if not isinstance(entry, Mapping):
            raise BooklensError(f"{what}, book {book!r}: expected null or an object mapping sentences to "
                                "{'questions', 'types'}")
        sentences = split_sentences(summary)
        offsets = sentence_offsets(summary, sentences)
        exact: dict[str, list[int]] = {}
        loose: dict[str, list[int]] = {}
        for i, s in enumerate(sentences):
            exact.setdefault(s, []).append(i)
            loose.setdefault(" ".join(s.split()), []).append(i)
        marks: dict[int, tuple[list[str], list[str]]] = {}
        for key, ann in entry.items():
            where = f"{what}, book {book!r}, sentence {key[:40]!r}"
            if not isinstance(ann, Mapping):
                raise BooklensError(f"{where}: expected an object with 'questions' and 'types'")
            types = _labels(ann.get("types"), where)
            questions = ann.get("questions")
            qs = _split_questions(questions) if isinstance(questions, str) else [
                q for q in (questions or []) if isinstance(q, str) and q.strip()]
            if not types:
                continue  # listed without any error type: not a confusion
            annotated += 1
            # A label keyed by text is the label of every copy of that text: marking one copy would count
            # the others as clean sentences.
            if key in exact:
                indices = exact[key]
            elif " ".join(key.split()) in loose:
                indices = loose[" ".join(key.split())]
            else:
                places = _occurrences(summary, key)
                if not places:
                    ignored += 1
                    notes.append(f"{book}: an annotated sentence is not in the summary and was ignored: "
                                 f"{key[:80]!r}")
                    continue
                indices = sorted({i for place in places for i in _covered(offsets, *place)})
                notes.append(f"{book}: an annotated sentence covers {len(_covered(offsets, *places[0]))} of our "
                             f"sentences: {key[:60]!r}")
            for i in indices:
                q0, t0 = marks.get(i, ([], []))
                marks[i] = (q0 + [q for q in qs if q not in q0], t0 + [t for t in types if t not in t0])
        sentence_annotations = [
            SentenceAnnotation(index=i, sentence=s, confusing=i in marks,
                               questions=marks[i][0] if i in marks else [],
                               types=sorted(marks[i][1], key=COHERENCE_ERROR_TYPES.index) if i in marks else [])
            for i, s in enumerate(sentences)
        ]
        result = CoherenceResult(book=str(book), summary=summary, annotator=annotator, sentences=sentence_annotations)
        results[str(book)] = finish_result(result, stats=stats)
    if annotated and ignored == annotated:
        raise BooklensError(f"no annotated sentence of the {what} ({annotated} in all) is in its summary in the "
                            f"{summaries_what}: these summaries are not the ones annotated")
    if ignored > annotated * MAX_IGNORED_SHARE:
        # A few sentences whose wording differs from the summary are the release's own noise (ChatGPT inc:
        # 21 of 651); most of them missing means other summaries, whose figures would count the
        # annotations that were not found as clean sentences.
        raise BooklensError(f"{ignored} of the {annotated} annotated sentences of the {what} are not in their "
                            f"summaries in the {summaries_what}: these summaries are not the ones annotated")
    return results, MatchNotes(notes, annotated=annotated, ignored=ignored)


def load_sentence_annotations(annotations_path: str | Path, summaries_path: str | Path, *, annotator: str = "gpt4",
                              stats: bool = True) -> tuple[dict[str, CoherenceResult], MatchNotes]:
    return parse_sentence_annotations(
        read_json_file(annotations_path, "annotation file"), read_json_file(summaries_path, "summaries file"),
        annotator=annotator, what=f"annotation file {annotations_path}",
        summaries_what=f"summaries file {summaries_path}", stats=stats)


def load_gpt4_config(config: str, data_dir: str | Path | None = None,
                     stats: bool = True) -> tuple[dict[str, CoherenceResult], list[str]]:
    """The released GPT-4 annotations of one Table 2 configuration, e.g. `gpt4-2048-hier`."""
    d = Path(data_dir) if data_dir else default_data_dir()
    return load_sentence_annotations(d / "gpt4" / f"{config}.json", d / "summaries" / f"{config}-cleaned.json",
                                     stats=stats)


def load_human_config(config: str, data_dir: str | Path | None = None,
                      stats: bool = True) -> dict[str, CoherenceResult]:
    """The human annotations of `gpt4-4096-inc` or `gpt4-4096-hier` as results."""
    d = Path(data_dir) if data_dir else default_data_dir()
    return human_results(load_human_annotations(d / "human" / f"summary-{config}.json"), stats=stats)


# ---------------------------------------------------------------------------
# The precision study (`annotations-gpt4-4096-inc.json`)


def is_validation_format(data: Any) -> bool:
    return (isinstance(data, Mapping) and bool(data)
            and all(isinstance(v, Mapping) and "summary" in v and isinstance(v.get("annotations"), list)
                    for v in data.values()))


def parse_validation_study(data: Any, *, source: str = "model", what: str = "annotation file",
                           stats: bool = True) -> tuple[dict[str, CoherenceResult], MatchNotes]:
    """The GPT-4 ("model") sentence annotations of the precision study, book -> result.

    That file holds, for 88 of the incremental GPT-4 4096 summaries, the annotations that
    annotators validated: GPT-4's (one sentence each) and the humans'. With `source="model"`
    this gives GPT-4's annotations of the same summaries the humans annotated."""
    data = _require_mapping(data, what)
    sentence_map: dict[str, dict[str, Any]] = {}
    summaries: dict[str, str] = {}
    for book, entry in data.items():
        summaries[book] = _text(entry.get("summary"), f"{what}, book {book!r} summary")
        marks: dict[str, Any] = {}
        for k, item in enumerate(entry["annotations"]):
            if not isinstance(item, Mapping) or not isinstance(item.get("anno"), Mapping):
                raise BooklensError(f"{what}, book {book!r}, annotation {k}: expected an object with 'anno'")
            if item.get("source") != source:
                continue
            anno = item["anno"]
            span = anno.get("span")
            if not isinstance(span, str):
                continue  # a relation: only single-sentence annotations come from the model
            prior = marks.setdefault(span, {"questions": "", "types": []})
            prior["questions"] = " ".join(x for x in (prior["questions"], _text(anno.get("questions"), what)) if x)
            prior["types"] = sorted(set(prior["types"]) | set(_labels(anno.get("labels"), what)),
                                    key=COHERENCE_ERROR_TYPES.index)
        sentence_map[book] = marks
    return parse_sentence_annotations(sentence_map, summaries, annotator="gpt4" if source == "model" else source,
                                      what=what, summaries_what=what, stats=stats)


# ---------------------------------------------------------------------------
# Any annotation set


class SummariesNeeded(BooklensError):
    """Sentence annotations came without their summaries; the caller says how to give them."""


def results_from_json(data: Any, summaries: Any = None, *, what: str = "annotation file",
                      summaries_what: str = "summaries file", stats: bool = False) -> dict[str, CoherenceResult]:
    """book -> result from any annotation set (see `annotation_set_from_json`)."""
    return annotation_set_from_json(data, summaries, what=what, summaries_what=summaries_what, stats=stats)[0]


def annotation_set_from_json(data: Any, summaries: Any = None, *, what: str = "annotation file",
                             summaries_what: str = "summaries file",
                             stats: bool = False) -> tuple[dict[str, CoherenceResult], MatchNotes]:
    """book -> result from any annotation set: a `booklens score` output (one summary or a
    set), human span annotations, or sentence annotations (which need `summaries`); with the
    notes of matching sentence annotations to their summaries (empty for the other formats)."""
    if isinstance(data, Mapping) and data.get("kind") == "booklens.coherence_set":
        try:
            return dict(CoherenceSet.model_validate(data).results), MatchNotes()
        except ValidationError as exc:
            raise BooklensError(f"{what} is not a valid booklens coherence set: {validation_problem(exc)}") from None
    if isinstance(data, Mapping) and data.get("kind") == "booklens.coherence":
        try:
            result = CoherenceResult.model_validate(data)
        except ValidationError as exc:
            raise BooklensError(f"{what} is not a valid booklens coherence result: {validation_problem(exc)}") from None
        return {result.book or "summary": result}, MatchNotes()
    if is_human_format(data):
        human = parse_human_annotations(data, what)
        return human_results(human, stats=stats), human_match_notes(human)
    if is_validation_format(data):
        return parse_validation_study(data, what=what, stats=stats)
    if is_sentence_format(data):
        if summaries is None:
            raise SummariesNeeded(f"{what} holds sentence annotations, which need the summaries they refer to")
        return parse_sentence_annotations(data, summaries, what=what, summaries_what=summaries_what, stats=stats)
    raise BooklensError(
        f"{what} is not an annotation set: expected a booklens score output, human span annotations "
        "(book -> {summary, singles, relations}), sentence annotations (book -> {sentence: {questions, types}}) "
        "or the precision-study file (book -> {summary, annotations})")


# ---------------------------------------------------------------------------
# dspy.Examples split by book


def to_examples(results: Mapping[str, CoherenceResult]) -> list[dspy.Example]:
    """One example per answered sentence: inputs (summary, sentence); labels verdict,
    error_types, questions, confusing; plus book and index for bookkeeping."""
    import dspy

    examples = []
    for book, result in results.items():
        for s in result.sentences:
            if s.status != "ok" or s.confusing is None:
                continue
            examples.append(dspy.Example(
                book=book, index=s.index, summary=result.summary, sentence=s.sentence,
                confusing=s.confusing, verdict="confusion" if s.confusing else "no confusion",
                error_types=list(s.types), questions=list(s.questions), annotator=result.annotator,
            ).with_inputs("summary", "sentence"))
    return examples


def split_examples(results: Mapping[str, CoherenceResult], *, seed: int = DEFAULT_SEED,
                   fractions: Mapping[str, float] | None = None) -> dict[str, list[dspy.Example]]:
    """train/dev/test examples, split by book (all sentences of a summary stay together)."""
    return split_by_book(to_examples(results), "book", seed=seed, fractions=dict(fractions or DEFAULT_FRACTIONS))


def split_results(results: Mapping[str, CoherenceResult], *, seed: int = DEFAULT_SEED,
                  fractions: Mapping[str, float] | None = None) -> dict[str, dict[str, CoherenceResult]]:
    """The same split at the level of whole summaries: split -> book -> result."""
    books = split_by_book(list(results), key=lambda b: b, seed=seed, fractions=dict(fractions or DEFAULT_FRACTIONS))
    return {name: {b: results[b] for b in group} for name, group in books.items()}


# ---------------------------------------------------------------------------
# Whole human-annotated summaries, split by book


def human_annotation_files(path: str | Path) -> list[Path]:
    """The human annotation files (summary-*.json) a path names: the file itself, or those in the
    folder (or in its `human/` subfolder), sorted by name."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise BooklensError(f"BooookScore human annotations not found: {path}")
    candidates = sorted(path.glob("summary-*.json")) or sorted((path / "human").glob("summary-*.json"))
    if not candidates:
        raise BooklensError(f"no BooookScore human annotation files (summary-*.json) in {path}")
    return candidates


def load_human_summaries(path: str | Path) -> list[tuple[str, HumanSummaryAnnotation]]:
    """(file name, annotation) of every human-annotated summary under `path`, files in name order,
    books in file order. The same book summarized twice (inc and hier) appears twice."""
    items = [(file.name, annotation) for file in human_annotation_files(path)
             for annotation in load_human_annotations(file).values()]
    refuse_copies(((name, a.book, a.summary) for name, a in items), path)
    return items


def refuse_copies(entries: Iterable[tuple[str, str, str]], path: str | Path) -> None:
    """Refuse (file name, book, summary) entries where two files hold the same summary of a book.
    A copy of a file left in the folder would count each of its summaries twice (doubled
    sentences, too narrow intervals); two summaries of one book must differ to both count."""
    seen: dict[tuple[str, str], str] = {}
    for name, book, summary in entries:
        first = seen.setdefault((book, summary), name)
        if first != name:
            raise BooklensError(f"the summary of book {book!r} is in both {first} and {name} in {path}: "
                                "remove the copy")


def split_human_summaries(items: list[tuple[str, HumanSummaryAnnotation]], *, seed: int = DEFAULT_SEED,
                          fractions: Mapping[str, float] | None = None
                          ) -> dict[str, list[tuple[str, HumanSummaryAnnotation]]]:
    """train/dev/test of whole summaries by book: both summaries of a book land in one split, the
    same split `split_examples` gives their sentences."""
    return split_by_book(items, key=lambda item: item[1].book, seed=seed,
                         fractions=dict(fractions or DEFAULT_FRACTIONS))


def read_summaries_file(path: str | Path | None) -> Any:
    """The JSON of a summaries file (book -> summary; None when none is given), its shape checked at
    once: a file holding `null` would otherwise read as no file given."""
    if path is None:
        return None
    from booklens.inputs import as_path
    from booklens.records import read_json_file

    data = read_json_file(as_path(path, "the summaries file"), "summaries file")
    summaries_by_book(data, f"summaries file {path}")
    return data


def score_annotations(annotations: str | Path, summaries: str | Path | None = None, *, split: Optional[str] = None,
                      limit: Optional[int] = None) -> tuple[Any, Optional[str]]:
    """`booklens score --annotations`: the coherence set (`CoherenceSet`) that an annotation file
    gives, with no LM (human span annotations, BooookScore's validation study, or sentence
    annotations of the `summaries` given), over the books of `split` and the first `limit`
    (`select_books`); and a line on the annotations it had to ignore (None when none)."""
    from booklens.data.splits import DEFAULT_FRACTIONS, select_books
    from booklens.inputs import as_path, summary_map
    from booklens.metrics.booookscore import build_set, summary_stats
    from booklens.parallel import check_at_least
    from booklens.records import read_json_file

    annotations = as_path(annotations, "annotations")
    summaries = as_path(summaries, "summaries") if summaries is not None else None
    if split is not None and split not in DEFAULT_FRACTIONS:
        raise BooklensError(f"split must be one of {', '.join(DEFAULT_FRACTIONS)}, not {split!r}")
    if limit is not None:
        check_at_least("--limit", limit)
    data = read_json_file(annotations, "annotation file")
    what = f"annotation file {annotations}"
    summaries_data = read_summaries_file(summaries)
    notes: Any = []
    if is_human_format(data):
        human = parse_human_annotations(data, what)
        if summaries_data is not None:
            given = summary_map(summaries_data, f"summaries file {summaries}")
            for name, entry in human.items():
                if name not in given:
                    raise BooklensError(f"book {name!r} is in the {what} but not in the summaries file {summaries}")
                if " ".join(given[name].split()) != " ".join(entry.summary.split()):
                    raise BooklensError(f"book {name!r} has a different summary in the {what} and in {summaries}")
        names = select_books(list(human), split, limit)
        results = human_results({n: human[n] for n in names})
        notes = human_match_notes({n: human[n] for n in names})
        annotator = "human"
    elif is_validation_format(data):
        results, notes = parse_validation_study(data, what=what)
        names = select_books(list(results), split, limit)
        results = {n: results[n] for n in names}
        annotator = "gpt4"
    elif is_sentence_format(data):
        if summaries_data is None:
            raise BooklensError(f"{what} holds sentence annotations: pass the summaries they refer to with "
                                "--summaries")
        results, notes = parse_sentence_annotations(data, summaries_data, what=what,
                                                    summaries_what=f"summaries file {summaries}", stats=False)
        names = select_books(list(results), split, limit)
        results = {n: results[n] for n in names}
        for r in results.values():
            r.stats = summary_stats(r.summary)
        annotator = "gpt4"
    else:
        raise BooklensError(
            f"{what} is not an annotation set: expected human span annotations (book -> {{summary, singles, "
            "relations}) or sentence annotations (book -> {sentence: {questions, types}} or null)")
    if not results:
        raise BooklensError("no summary left to score after --split/--limit")
    gist = notes.gist() if isinstance(notes, MatchNotes) else None
    return build_set(results, annotator=annotator, notes=notes), gist
