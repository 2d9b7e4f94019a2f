"""BooookScore (Eq. 1 of the BooookScore paper) and the other columns of its Table 2.

- `booookscore`: the share of a summary's sentences without confusion (a fraction;
  tables print it x100). Sentences without a valid answer are left out and counted
  apart, never taken as free of confusion.
- `annotation_booookscore`: the human-annotation variant of the paper's footnote 12:
  every annotation (a span, even one covering consecutive sentences, or a relation
  between two spans) counts as one confusing sentence.
- `system_score`: the mean over the summaries of a system.
- `error_type_rates`: occurrences of each error type per sentence (Table 1, last column).
- `summary_stats`: length in tokens (cl100k), % repeated trigrams in the summary and,
  with the book, % novel trigrams against it (Table 2, other columns).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable, Mapping, Optional, Sequence

from booklens.records import COHERENCE_ERROR_TYPES, CoherenceResult, CoherenceSet, SentenceAnnotation
from booklens.vocabulary import CHARACTER_WORD_SCRIPTS


def _flag(item: Any) -> Optional[bool]:
    if isinstance(item, SentenceAnnotation):
        return item.confusing if item.status == "ok" else None
    return item


def booookscore(sentences: Sequence[SentenceAnnotation | Optional[bool]]) -> Optional[float]:
    """Eq. 1: the fraction of answered sentences with no confusion; None when none was answered.

    Items are `SentenceAnnotation`s or plain flags (True = confusing, None = no valid answer)."""
    flags = [_flag(s) for s in sentences]
    answered = [f for f in flags if f is not None]
    if not answered:
        return None
    return sum(1 for f in answered if not f) / len(answered)


def annotation_booookscore(n_annotations: int, n_sentences: int) -> Optional[float]:
    """Footnote 12: each human annotation counts as one confusing sentence (floored at 0)."""
    if n_sentences <= 0:
        return None
    return max(0.0, 1.0 - n_annotations / n_sentences)


def system_score(scores: Iterable[Optional[float]]) -> Optional[float]:
    """The mean BooookScore over the summaries of a system (summaries without a score left out)."""
    values = [s for s in scores if s is not None]
    return sum(values) / len(values) if values else None


def system_score_interval(scores: Iterable[Optional[float]]) -> Optional[list[float]]:
    """The 95% bootstrap interval of the system score, resampling summaries (the scores sorted, so
    the same summaries give the same interval in any order, as a sweep's over its books); None
    when fewer than two summaries have a score."""
    values = sorted(s for s in scores if s is not None)
    if len(values) < 2:
        return None
    import math

    from booklens.metrics.bootstrap import bootstrap_mean  # NumPy: only once there is something to resample

    lo, hi = bootstrap_mean(values)
    return None if math.isnan(lo) else [lo, hi]


def error_type_rates(type_lists: Iterable[Sequence[str]], n_sentences: int) -> dict[str, float]:
    """Percent occurrences of each error type per sentence: one count per error type named in
    each annotation (a sentence's answer, or a human span or relation), over `n_sentences`: the
    judged sentences (a sentence the judge gave no valid answer for says nothing of its errors)."""
    counts = Counter(t for types in type_lists for t in set(types))
    if n_sentences <= 0:
        return {t: 0.0 for t in COHERENCE_ERROR_TYPES}
    return {t: 100.0 * counts.get(t, 0) / n_sentences for t in COHERENCE_ERROR_TYPES}


def type_counts(sentences: Iterable[SentenceAnnotation]) -> dict[str, int]:
    counts = Counter(t for s in sentences if s.status == "ok" for t in set(s.types))
    return {t: counts.get(t, 0) for t in COHERENCE_ERROR_TYPES}


# ---------------------------------------------------------------------------
# Table 2's other columns

# Chinese and Japanese write words without spaces between them: each Han or kana character is a
# token of its own (as a \w run, a whole clause would be one "word").
_CJK = CHARACTER_WORD_SCRIPTS
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+(?:'[^\W{_CJK}]+)?|[^\w\s]")
# Typography that differs between a book and a summary of it without changing a word: curly and
# straight quotes and apostrophes, an em dash and the double hyphen plain-text books write for it.
_PLAIN_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201b": "'", "\u2032": "'",
                               "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"'})
_DASH = re.compile(r"-{2,}|\u2014|\u2015")


def words(text: str) -> list[str]:
    """Word and punctuation tokens (and Chinese and Japanese characters), case kept, for trigram
    statistics. Quotes and apostrophes are read as straight ones and "--" as an em dash, so that a
    passage the summary copies from the book in another typography counts as copied."""
    return _WORD.findall(_DASH.sub("\u2014", text.translate(_PLAIN_QUOTES)))


def trigrams(text: str) -> list[tuple[str, str, str]]:
    w = words(text)
    return [tuple(w[i : i + 3]) for i in range(len(w) - 2)]  # type: ignore[misc]


def repeated_trigram_pct(summary: str) -> Optional[float]:
    """Percent of the summary's trigram occurrences that repeat an earlier one."""
    grams = trigrams(summary)
    if not grams:
        return None
    return 100.0 * (len(grams) - len(set(grams))) / len(grams)


def novel_trigram_pct(summary: str, source: str) -> Optional[float]:
    """Percent of the summary's trigram occurrences that never occur in the source."""
    grams = trigrams(summary)
    if not grams:
        return None
    seen = set(trigrams(source))
    return 100.0 * sum(1 for g in grams if g not in seen) / len(grams)


def summary_stats(summary: str, book: Optional[str] = None) -> dict[str, Any]:
    from booklens.text import count_tokens

    stats: dict[str, Any] = {
        "length_tokens": count_tokens(summary),
        "repeated_trigrams_pct": repeated_trigram_pct(summary),
    }
    if book is not None:
        stats["novel_trigrams_pct"] = novel_trigram_pct(summary, book)
    return stats


# ---------------------------------------------------------------------------
# Putting a result together


def finish_result(result: CoherenceResult, *, book_text: Optional[str] = None, stats: bool = True) -> CoherenceResult:
    """Fill the counts, the score(s) and the Table 2 statistics of a result from its sentences."""
    answered = [s for s in result.sentences if s.status == "ok"]
    result.n_sentences = len(result.sentences)
    result.n_failed = len(result.sentences) - len(answered)
    result.n_confusing = sum(1 for s in answered if s.confusing)
    result.type_counts = type_counts(result.sentences)
    result.score_sentences = booookscore(result.sentences)
    if result.score_method == "annotations" and result.n_annotations is not None:
        result.score = annotation_booookscore(result.n_annotations, result.n_sentences)
    else:
        result.score = result.score_sentences
    if stats:
        result.stats = summary_stats(result.summary, book_text)
    return result


def _mean(values: Iterable[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def build_set(results: Mapping[str, CoherenceResult], *, annotator: Optional[str] = None,
              notes: Optional[list[str]] = None) -> CoherenceSet:
    """The system-level record: mean score, totals, error rates per sentence, mean statistics."""
    n_sentences = sum(r.n_sentences for r in results.values())
    type_lists = _type_lists(results)
    stats: dict[str, Any] = {}
    for key in ("length_tokens", "repeated_trigrams_pct", "novel_trigrams_pct"):
        stats[f"avg_{key}"] = _mean(r.stats.get(key) for r in results.values())
    return CoherenceSet(
        annotator=annotator or next((r.annotator for r in results.values()), "program"),
        system_score=system_score(r.score for r in results.values()),
        system_score_ci95=system_score_interval(r.score for r in results.values()),
        system_score_sentences=system_score(r.score_sentences for r in results.values()),
        n_summaries=len(results),
        n_scored_summaries=sum(1 for r in results.values() if r.score is not None),
        n_sentences=n_sentences,
        n_confusing=sum(r.n_confusing for r in results.values()),
        n_failed=sum(r.n_failed for r in results.values()),
        error_type_rates=error_type_rates(type_lists, n_sentences - sum(r.n_failed for r in results.values())),
        stats=stats,
        results=dict(results),
        notes=list(notes or []),
    )


def _type_lists(results: Mapping[str, CoherenceResult]) -> list[Sequence[str]]:
    """One list of types per annotation: human results carry them in `annotation_types`
    (spans and relations, as Table 1 counts them); others per confusing sentence."""
    lists: list[Sequence[str]] = []
    for r in results.values():
        if r.annotation_types is not None:
            lists.extend(r.annotation_types)
        else:
            lists.extend(s.types for s in r.sentences if s.status == "ok" and s.confusing)
    return lists
