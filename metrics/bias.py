"""Biases of LLM judges (DiverseSumm §4.2).

Position bias (the seed's Table 3): each pair of summaries is judged twice, once in
each order. A case *prefers the first position* when the summary shown first wins
both times, *prefers the second position* when the summary shown second wins both
times, and is *consistent* when both orders name the same winner (or both say tie).
The three shares need not add up to 100: a win in one order against a tie in the
other is neither consistent nor a pure position preference.

Verbosity bias (Table 4): a summary is compared with itself repeated twice, which
says nothing more. A fair judge rates both the same (single-answer grading) or calls
the pair a tie (pairwise comparison); the shares of cases where the original or the
extended version is preferred measure the bias.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

VERDICTS = ("A", "B", "tie")


def repeat_summary(summary: str, times: int = 2, separator: str = "\n\n") -> str:
    """The extended summary of the verbosity test: the same text `times` times, nothing new."""
    if times < 1:
        raise ValueError("times must be at least 1")
    text = summary.strip()
    return separator.join([text] * times)


def winner(verdict_first_order: str, verdict_second_order: str) -> tuple[str, str]:
    """Map the two position verdicts of one pair to summary terms.

    In the first order summary 1 is shown as A; in the second order summary 2 is shown as A.
    Returns (winner in the first order, winner in the second order), each '1', '2' or 'tie'."""
    first = {"A": "1", "B": "2", "tie": "tie"}[verdict_first_order]
    second = {"A": "2", "B": "1", "tie": "tie"}[verdict_second_order]
    return first, second


def aggregate_both_orders(verdict_first_order: str, verdict_second_order: str) -> str:
    """The both-ways verdict: a summary wins when it wins on balance over the two orders
    (two wins, or a win and a tie); otherwise it is a tie."""
    score = 0
    for w in winner(verdict_first_order, verdict_second_order):
        score += 1 if w == "1" else -1 if w == "2" else 0
    return "1" if score > 0 else "2" if score < 0 else "tie"


def _pct(count: int, n: int) -> Optional[float]:
    return round(100.0 * count / n, 2) if n else None


def position_bias(pairs: Iterable[tuple[Optional[str], Optional[str]]]) -> dict[str, Any]:
    """Table 3 from (verdict with summary 1 first, verdict with summary 2 first) per case.

    Verdicts are 'A' (the summary shown first), 'B' (shown second) or 'tie'; a case with a
    missing verdict (the judge failed) is counted under `failed` and left out of the shares."""
    pairs = list(pairs)
    valid = [(a, b) for a, b in pairs if a in VERDICTS and b in VERDICTS]
    n = len(valid)
    first = sum(1 for a, b in valid if a == "A" and b == "A")
    second = sum(1 for a, b in valid if a == "B" and b == "B")
    consistent = sum(1 for a, b in valid if len(set(winner(a, b))) == 1)
    verdicts = [v for pair in valid for v in pair]
    return {
        "cases": n,
        "failed": len(pairs) - n,
        "first_pct": _pct(first, n),
        "second_pct": _pct(second, n),
        "consistency_pct": _pct(consistent, n),
        # the single verdicts, position by position
        "verdicts": len(verdicts),
        "verdict_first_pct": _pct(verdicts.count("A"), len(verdicts)),
        "verdict_second_pct": _pct(verdicts.count("B"), len(verdicts)),
        "verdict_tie_pct": _pct(verdicts.count("tie"), len(verdicts)),
    }


def verbosity_single(original: Sequence[Optional[float]], extended: Sequence[Optional[float]]) -> dict[str, Any]:
    """Table 4, single-answer grading: shares of cases where the original summary scores higher
    than its repeated version (original_pct), lower (extended_pct) or the same (tie_pct)."""
    if len(original) != len(extended):
        raise ValueError("original and extended scores must pair up")
    valid = [(o, e) for o, e in zip(original, extended) if o is not None and e is not None]
    n = len(valid)
    return {
        "cases": n,
        "failed": len(original) - n,
        "original_pct": _pct(sum(1 for o, e in valid if o > e), n),
        "extended_pct": _pct(sum(1 for o, e in valid if e > o), n),
        "tie_pct": _pct(sum(1 for o, e in valid if o == e), n),
        "mean_original": round(sum(o for o, _ in valid) / n, 3) if n else None,
        "mean_extended": round(sum(e for _, e in valid) / n, 3) if n else None,
    }


def verbosity_pairwise(pairs: Iterable[tuple[Optional[str], Optional[str]]]) -> dict[str, Any]:
    """Table 4, pairwise comparison of original (summary 1) against extended (summary 2), each case
    judged in both orders and aggregated: shares preferring the original, the extended, or neither."""
    pairs = list(pairs)
    valid = [(a, b) for a, b in pairs if a in VERDICTS and b in VERDICTS]
    n = len(valid)
    agg = [aggregate_both_orders(a, b) for a, b in valid]
    return {
        "cases": n,
        "failed": len(pairs) - n,
        "original_pct": _pct(agg.count("1"), n),
        "extended_pct": _pct(agg.count("2"), n),
        "tie_pct": _pct(agg.count("tie"), n),
        "position": position_bias(valid),
    }


def format_position(result: dict[str, Any], label: str = "") -> str:
    def f(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}"

    head = f"{'Aspect':<14}{'First (%)':>11}{'Second (%)':>12}{'Consistency (%)':>17}{'cases':>7}"
    row = (f"{label:<14}{f(result['first_pct']):>11}{f(result['second_pct']):>12}"
           f"{f(result['consistency_pct']):>17}{result['cases']:>7}")
    extra = (f"single verdicts: first {f(result['verdict_first_pct'])}%, second {f(result['verdict_second_pct'])}%, "
             f"tie {f(result['verdict_tie_pct'])}% of {result['verdicts']}"
             + (f"; {result['failed']} case(s) without a verdict" if result["failed"] else ""))
    return "\n".join([head, row, extra])


def format_verbosity(rows: list[tuple[str, str, dict[str, Any]]]) -> str:
    """rows of (aspect, protocol, result) in the layout of the seed's Table 4."""
    def f(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines = [f"{'Aspect':<14}{'Protocol':<10}{'Original (%)':>14}{'Extended (%)':>14}{'Tie (%)':>9}{'cases':>7}"]
    for aspect, protocol, r in rows:
        lines.append(f"{aspect:<14}{protocol:<10}{f(r['original_pct']):>14}{f(r['extended_pct']):>14}"
                     f"{f(r['tie_pct']):>9}{r['cases']:>7}" + (f"  ({r['failed']} failed)" if r["failed"] else ""))
    return "\n".join(lines)
