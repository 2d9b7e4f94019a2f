"""Agreement between two coherence annotation sets (A judged against B, the reference).

Any two sets of `CoherenceResult`s keyed by book compare: the program against humans,
GPT-4's released labels against humans, or one human set against another. Only books
in both sets count, and their summaries must be the same text (so that both sides cut
the same sentences). Sentences that either side failed to answer are left out and
counted.

- "confusing" per sentence: precision, recall, F1 (A's positives against B's), Cohen's
  kappa and raw agreement, over all compared sentences pooled;
- per error type: the same for "the sentence has this type", plus each side's rate
  (percent of sentences);
- system level: each side's mean BooookScore over the compared books and A - B.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from booklens.errors import BooklensError
from booklens.records import COHERENCE_ERROR_TYPES, CoherenceResult
from booklens.vocabulary import counted


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> Optional[float]:
    """Cohen's kappa of two binary labelings; None when undefined (no items, or chance
    agreement is 1 because both sides gave one and the same label to everything)."""
    n = len(a)
    if n == 0 or n != len(b):
        return None
    tp = sum(1 for x, y in zip(a, b) if x and y)
    fp = sum(1 for x, y in zip(a, b) if x and not y)
    fn = sum(1 for x, y in zip(a, b) if not x and y)
    return kappa_from_counts(tp, fp, fn, n - tp - fp - fn)


def kappa_from_counts(tp: float, fp: float, fn: float, tn: float) -> Optional[float]:
    """Cohen's kappa of a 2x2 table, (p_o - p_e) / (1 - p_e) written over the counts:
    2 (tp tn - fp fn) / ((tp + fp)(fp + tn) + (tp + fn)(fn + tn)). On whole counts it is exact, so a
    kappa of no agreement beyond chance is 0, not a rounding error's -0.000. None when chance
    agreement is 1 (both sides gave one and the same label to everything)."""
    denominator = (tp + fp) * (fp + tn) + (tp + fn) * (fn + tn)
    if denominator == 0:
        return None
    return 2 * (tp * tn - fp * fn) / denominator


def binary_agreement(predicted: Sequence[bool], reference: Sequence[bool]) -> dict[str, Any]:
    """Precision/recall/F1 of `predicted` positives against `reference`, kappa and raw agreement."""
    if len(predicted) != len(reference):
        raise ValueError("the two labelings have different lengths")
    tp = sum(1 for p, r in zip(predicted, reference) if p and r)
    fp = sum(1 for p, r in zip(predicted, reference) if p and not r)
    fn = sum(1 for p, r in zip(predicted, reference) if not p and r)
    tn = len(predicted) - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    # F1 is 0 when either side has positives but none are shared; undefined when neither has any
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
    n = len(predicted)
    return {
        "n": n, "tp": tp, "fp": fp, "fn": fn, "tn": tn,
        "precision": precision, "recall": recall, "f1": f1,
        "kappa": cohen_kappa(list(predicted), list(reference)),
        "accuracy": (tp + tn) / n if n else None,
        "rate_a": (tp + fp) / n if n else None,
        "rate_b": (tp + fn) / n if n else None,
    }


def _same_text(x: str, y: str) -> bool:
    return " ".join(x.split()) == " ".join(y.split())


def agreement(a: Mapping[str, CoherenceResult], b: Mapping[str, CoherenceResult], *,
              name_a: str = "A", name_b: str = "B") -> dict[str, Any]:
    """The agreement report of set `a` against the reference set `b` (see the module docstring)."""
    common = [book for book in a if book in b]
    if not common:
        raise BooklensError(f"{name_a} and {name_b} have no book in common")
    flags_a: list[bool] = []
    flags_b: list[bool] = []
    types_a: list[set[str]] = []
    types_b: list[set[str]] = []
    skipped = 0
    scores_a: list[float] = []
    scores_b: list[float] = []
    for book in common:
        ra, rb = a[book], b[book]
        if not _same_text(ra.summary, rb.summary):
            raise BooklensError(f"book {book!r} has a different summary in {name_a} and in {name_b}")
        if len(ra.sentences) != len(rb.sentences):
            raise BooklensError(f"book {book!r}: {name_a} has {len(ra.sentences)} sentences and {name_b} "
                                f"{len(rb.sentences)} (annotations made with different sentence splits)")
        for sa, sb in zip(ra.sentences, rb.sentences):
            if sa.status != "ok" or sb.status != "ok" or sa.confusing is None or sb.confusing is None:
                skipped += 1
                continue
            flags_a.append(bool(sa.confusing))
            flags_b.append(bool(sb.confusing))
            types_a.append(set(sa.types))
            types_b.append(set(sb.types))
        if ra.score is not None and rb.score is not None:
            scores_a.append(ra.score)
            scores_b.append(rb.score)
    confusing = binary_agreement(flags_a, flags_b)
    per_type = {}
    for t in COHERENCE_ERROR_TYPES:
        row = binary_agreement([t in x for x in types_a], [t in y for y in types_b])
        per_type[t] = row
    system_a = sum(scores_a) / len(scores_a) if scores_a else None
    system_b = sum(scores_b) / len(scores_b) if scores_b else None
    return {
        "a": name_a,
        "b": name_b,
        "books": len(common),
        "only_in_a": len([x for x in a if x not in b]),
        "only_in_b": len([x for x in b if x not in a]),
        "sentences": len(flags_a),
        "skipped_sentences": skipped,
        "confusing": confusing,
        "per_type": per_type,
        "system_score_a": system_a,
        "system_score_b": system_b,
        "system_score_diff": (system_a - system_b) if system_a is not None and system_b is not None else None,
        "score_methods": {"a": sorted({a[x].score_method for x in common}),
                          "b": sorted({b[x].score_method for x in common})},
    }


def _fmt(x: Optional[float], scale: float = 1.0, digits: int = 3) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def format_agreement(report: Mapping[str, Any]) -> str:
    """The agreement report as a plain-text table (markdown-compatible)."""
    a, b = report["a"], report["b"]
    c = report["confusing"]
    lines = [
        f"Agreement of {a} (A) with {b} (B, reference): {counted(report['books'], 'book')}, "
        f"{counted(report['sentences'], 'sentence')}"
        + (f", {report['skipped_sentences']} skipped (no valid answer)" if report["skipped_sentences"] else "")
        + (f"; books only in A: {report['only_in_a']}, only in B: {report['only_in_b']}"
           if report["only_in_a"] or report["only_in_b"] else ""),
        "",
        "| label | A % | B % | precision | recall | F1 | kappa | accuracy |",
        "|---|---|---|---|---|---|---|---|",
        f"| confusing | {_fmt(c['rate_a'], 100, 1)} | {_fmt(c['rate_b'], 100, 1)} | {_fmt(c['precision'])} | "
        f"{_fmt(c['recall'])} | {_fmt(c['f1'])} | {_fmt(c['kappa'])} | {_fmt(c['accuracy'])} |",
    ]
    for t, row in report["per_type"].items():
        lines.append(f"| {t} | {_fmt(row['rate_a'], 100, 1)} | {_fmt(row['rate_b'], 100, 1)} | "
                     f"{_fmt(row['precision'])} | {_fmt(row['recall'])} | {_fmt(row['f1'])} | "
                     f"{_fmt(row['kappa'])} | {_fmt(row['accuracy'])} |")
    lines += [
        "",
        f"System BooookScore: A {_fmt(report['system_score_a'], 100, 1)} ({'/'.join(report['score_methods']['a'])}), "
        f"B {_fmt(report['system_score_b'], 100, 1)} ({'/'.join(report['score_methods']['b'])}), "
        f"A - B {_fmt(report['system_score_diff'], 100, 1)} points",
    ]
    return "\n".join(lines)


def confusion_match(example: Any, prediction: Any, trace: Any = None) -> float:
    """A DSPy metric for one sentence: 1 when the verdict matches the label; with matching
    "confusion" verdicts, half of the credit depends on the overlap (Jaccard) of error types."""
    gold = example.verdict if hasattr(example, "verdict") else ("confusion" if example.confusing else "no confusion")
    verdict = getattr(prediction, "verdict", None)
    if verdict != gold:
        return 0.0
    if gold == "no confusion":
        return 1.0
    g, p = set(getattr(example, "error_types", []) or []), set(getattr(prediction, "error_types", []) or [])
    jaccard = len(g & p) / len(g | p) if g | p else 1.0
    return 0.5 + 0.5 * jaccard
