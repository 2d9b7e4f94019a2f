"""NovelQA metrics: accuracy overall and by complexity x aspect (the seed's Table 3 layout),
accuracy by where the gold evidence lies (before or after the first 100K tokens, Table 4),
and evidence recall: the seed's LLM-scored correctness, relevance and sufficiency of the
model's quotes (Table 5), how much of the gold evidence the context held, and word overlap
between the model's quotes and the gold quotes.

Evidence quotes are located in the book after collapsing runs of whitespace (and, failing
that, after also unifying curly and straight quotes and how dashes and ellipses are typed);
quotes that are reasoning rather than text of the book stay unlocated and are left out of the
position and recall figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence

from booklens.data.novelqa import ASPECT_LABELS, ASPECTS, COMPLEXITIES

if TYPE_CHECKING:
    from booklens.retrieval import QuoteLocator

POSITION_THRESHOLD = 100_000
QUOTE_MATCH = 0.5  # share of a gold quote's words a model quote must contain to count as recalled

_QUOTE_FOLD = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2014": "-",
                             "\u2013": "-"})


def token_positions(text: str, offsets: Iterable[int]) -> dict[int, int]:
    """Token index (cl100k_base) at each character offset, counted incrementally in one pass."""
    from booklens.text import count_tokens

    result: dict[int, int] = {}
    done_chars = 0
    done_tokens = 0
    for off in sorted(set(offsets)):
        done_tokens += count_tokens(text[done_chars:off]) if off > done_chars else 0
        done_chars = max(done_chars, off)
        result[off] = done_tokens
    return result


@dataclass
class EvidenceSpan:
    quote: str
    start: int
    end: int
    start_token: int = 0


def locate_evidence(book: QuoteLocator, quotes: Sequence[str]) -> list[EvidenceSpan]:
    """The located gold evidence quotes, in the order given (unlocated ones are skipped)."""
    spans = []
    for q in quotes:
        found = book.locate(q)
        if found:
            spans.append(EvidenceSpan(q, found[0], found[1]))
    return spans


def share_in_context(spans: Sequence[EvidenceSpan], passages: Sequence[tuple[int, int]]) -> Optional[float]:
    """Share of evidence spans of which at least half the characters lie in the shown passages."""
    if not spans:
        return None
    hit = 0
    for s in spans:
        covered = 0
        for ps, pe in passages:
            covered += max(0, min(s.end, pe) - max(s.start, ps))
        if covered >= 0.5 * (s.end - s.start):
            hit += 1
    return hit / len(spans)


def shown_shares(quotes: Sequence[str], kept: int) -> dict[str, float]:
    """For evidence `quotes` (stripped) shown one after another, two line breaks apart, and cut
    after `kept` characters: the share of each quote's characters that was shown."""
    shares: dict[str, float] = {}
    offset = 0
    for quote in quotes:
        shown = max(0, min(len(quote), kept - offset)) / len(quote)
        shares[quote] = max(shares.get(quote, 0.0), shown)
        offset += len(quote) + 2
    return shares


def share_shown(spans: Sequence[EvidenceSpan], shares: Mapping[str, float]) -> Optional[float]:
    """`share_in_context` for evidence given with the question: the share of located spans of
    which at least half the characters were shown (`shown_shares`)."""
    if not spans:
        return None
    return sum(1 for s in spans if shares.get(s.quote.strip(), 0.0) >= 0.5) / len(spans)


def _words(text: str) -> list[str]:
    from booklens.retrieval import words

    return words(text.translate(_QUOTE_FOLD))


def quote_recall(gold: Sequence[EvidenceSpan], predicted: Sequence[str], locator: Optional[QuoteLocator] = None,
                 threshold: float = QUOTE_MATCH) -> Optional[float]:
    """Share of located gold evidence quotes that the model's quotes recall. A gold quote is
    recalled when a model quote found verbatim in the book overlaps it, or when the model's
    quotes together repeat at least `threshold` of its words."""
    gold = [g for g in gold if _words(g.quote)]
    if not gold:
        return None
    quotes = [p for p in predicted if p and p.strip()]
    spans = [found for found in (locator.locate(p) for p in quotes) if found] if locator else []
    said = set(w for p in quotes for w in _words(p))
    hit = 0
    for g in gold:
        if any(min(g.end, e) > max(g.start, s) for s, e in spans):
            hit += 1
            continue
        words = _words(g.quote)
        if sum(1 for w in words if w in said) / len(words) >= threshold:
            hit += 1
    return hit / len(gold)


# ---------------------------------------------------------------------------
# Accuracy tables


def _get(rec: Any, name: str) -> Any:
    return rec.get(name) if isinstance(rec, dict) else getattr(rec, name)


def _cell(records: list[Any]) -> dict[str, Any]:
    scored = [r for r in records if _get(r, "correct") is not None]
    n = len(scored)
    correct = sum(1 for r in scored if _get(r, "correct"))
    return {"n": n, "correct": correct, "accuracy": round(100.0 * correct / n, 2) if n else None}


def accuracy(records: Sequence[Any]) -> dict[str, Any]:
    """Overall accuracy over scored predictions (a prediction that never parsed counts as wrong;
    one without a gold label or verdict is not scored)."""
    cell = _cell(list(records))
    cell["unscored"] = sum(1 for r in records if _get(r, "correct") is None)
    cell["failed"] = sum(1 for r in records if _get(r, "error"))
    # Where the failures are, so that the accuracy line counts each question once: a failed answer to a
    # question with a reference is scored (as wrong); a failed verdict, or a failure without a reference, is not.
    cell["failed_unscored"] = sum(1 for r in records if _get(r, "error") and _get(r, "correct") is None)
    return cell


def no_reference_note(records: Sequence[Any], setting: str) -> Optional[str]:
    """Why there is no accuracy when no question came with a reference to score against (the
    answers are still recorded), else None."""
    from booklens.data.novelqa import REFERENCE_FIELD

    if not records or any(_get(r, "gold") is not None for r in records):
        return None
    return (f"no question has a reference answer ({REFERENCE_FIELD[setting]}) to score against, so no accuracy "
            "is given")


def unlocated_evidence_note(records: Sequence[Any], book_name: str) -> Optional[str]:
    """A question for the user when the questions come with gold evidence and not one entry of it
    occurs in the book (the question file of another book, say), else None. Every question is then
    'unlocated' and the accuracy is over answers to questions about something else."""
    quotes = sum(_get(r, "gold_evidence_quotes") or 0 for r in records)
    if not quotes or any(_get(r, "gold_evidence_located") for r in records):
        return None
    return (f"none of the questions' {quotes} gold evidence {'quote' if quotes == 1 else 'quotes'} occurs in "
            f"{book_name}: are the questions about this book?")


def fewer_passages_note(records: Sequence[Any], k: Optional[int]) -> Optional[str]:
    """What a run's k does not say, when some questions were shown fewer of their top k passages than k
    (the lowest-ranked left out so that the others fit the window), else None."""
    short = [r for r in records if _get(r, "passages_dropped") or 0]
    if not short or k is None:
        return None
    counts = sorted(len(_get(r, "passages")) for r in short)
    shown = str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]} to {counts[-1]}"
    return (f"{len(short)} of {len(records)} questions were shown fewer than the k = {k} passages ({shown}: as many "
            "as fit the context window); lower --k or --passage-tokens to show all k")


def accuracy_by_type(records: Sequence[Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """{complexity|'avg': {aspect|'avg': {n, correct, accuracy}}}: the seed's Table 3 layout."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for row in (*COMPLEXITIES, "avg"):
        table[row] = {}
        for col in (*ASPECTS, "avg"):
            sel = [r for r in records
                   if (row == "avg" or _get(r, "complexity") == row) and (col == "avg" or _get(r, "aspect") == col)]
            table[row][col] = _cell(sel)
    return table


def accuracy_by_position(records: Sequence[Any], threshold: int = POSITION_THRESHOLD) -> dict[str, dict[str, Any]]:
    """Accuracy of questions whose first gold evidence starts before / after `threshold` tokens
    (Table 4); questions without located evidence are counted apart."""
    pre, post, unlocated = [], [], []
    for r in records:
        pos = _get(r, "gold_evidence_start_token")
        (unlocated if pos is None else pre if pos < threshold else post).append(r)
    at = token_count_label(threshold)
    return {f"pre-{at}": _cell(pre), f"post-{at}": _cell(post), "unlocated": _cell(unlocated)}


def token_count_label(n: int) -> str:
    """100000 -> '100K', 1500 -> '1.5K', 500 -> '500': the position split as the seed writes it."""
    return f"{n / 1000:g}K" if n >= 1000 else str(n)


def _mean_pct(values: Sequence[float], scale: float = 100.0) -> Optional[float]:
    return round(scale * sum(values) / len(values), 2) if values else None


def evidence_recall(records: Sequence[Any]) -> dict[str, Any]:
    """Means over questions: the LLM-scored evidence recall (0-100 per criterion and their
    average, as in the seed's Table 5), how much of the located gold evidence the context held
    (retrieval recall), and how much of it the model's quotes repeat word for word (overlap)."""
    ctx = [_get(r, "gold_evidence_in_context") for r in records if _get(r, "gold_evidence_in_context") is not None]
    quo = [_get(r, "quote_recall") for r in records if _get(r, "quote_recall") is not None]
    scored = [_get(r, "evidence_scores") for r in records if _get(r, "evidence_scores") is not None]
    llm: dict[str, Any] = {name: _mean_pct([s[name] for s in scored], 1.0) for name in ("correctness", "relevance",
                                                                                        "sufficiency")}
    llm["avg"] = _mean_pct([sum(s.values()) / len(s) for s in scored], 1.0)
    llm["questions"] = len(scored)
    llm["failed"] = sum(1 for r in records if _get(r, "evidence_error"))
    return {
        "llm": llm,
        "context_recall": _mean_pct(ctx),
        "context_questions": len(ctx),
        "quote_recall": _mean_pct(quo),
        "quote_questions": len(quo),
    }


def qa_report(records: Sequence[Any], threshold: int = POSITION_THRESHOLD) -> dict[str, Any]:
    return {
        "overall": accuracy(records),
        "by_type": accuracy_by_type(records),
        "by_position": accuracy_by_position(records, threshold),
        "evidence": evidence_recall(records),
    }


def _fmt(cell: dict[str, Any], with_n: bool = True) -> str:
    if not cell["n"]:
        return "-"
    return f"{cell['accuracy']:.1f} ({cell['n']})" if with_n else f"{cell['accuracy']:.1f}"


def format_type_table(table: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Accuracy (%) with the number of scored questions in parentheses; '-' for no questions."""
    cols = [*ASPECTS, "avg"]
    heads = [ASPECT_LABELS.get(c, c) for c in cols]
    rows = [[row] + [_fmt(table[row][c]) for c in cols] for row in (*COMPLEXITIES, "avg")]
    widths = [max(len(x) for x in col) for col in zip(["", *heads], *rows)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(["", *heads], widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def format_report(report: dict[str, Any]) -> str:
    overall = report["overall"]
    unscored_failed = overall.get("failed_unscored", 0)
    scored_failed = overall["failed"] - unscored_failed
    lines = [f"Accuracy: {_fmt(overall)} of {overall['n']} scored questions"
             + (f", {scored_failed} of them without a valid answer (counted wrong)" if scored_failed else "")
             + (f"; {overall['unscored']} not scored" if overall["unscored"] else "")
             + (f", {unscored_failed} of them without a valid answer or verdict" if unscored_failed else ""),
             "", "Accuracy by complexity x aspect (%, scored questions in parentheses)",
             format_type_table(report["by_type"]), "",
             "Accuracy by position of the first gold evidence (%, questions in parentheses)"]
    lines.append("  ".join(f"{k}: {_fmt(v)}" for k, v in report["by_position"].items()))
    ev = report["evidence"]
    llm = ev.get("llm") or {}
    if llm.get("questions") or llm.get("failed"):
        lines += ["", "Evidence recall, LLM-scored (0-100): "
                  + (f"correctness {llm['correctness']:.1f}, relevance {llm['relevance']:.1f}, sufficiency "
                     f"{llm['sufficiency']:.1f}, avg {llm['avg']:.1f} ({llm['questions']} questions)"
                     if llm.get("questions") else "none scored")
                  + (f"; {llm['failed']} not scored (the judge failed)" if llm.get("failed") else "")]
    parts = []
    if ev["context_recall"] is not None:
        parts.append(f"context held {ev['context_recall']:.1f}% of gold evidence ({ev['context_questions']} questions)")
    if ev["quote_recall"] is not None:
        parts.append(f"model quotes overlap {ev['quote_recall']:.1f}% of gold quotes ({ev['quote_questions']} "
                     "questions)")
    if parts:
        lines += ["", "Gold evidence: " + "; ".join(parts)]
    return "\n".join(lines)
