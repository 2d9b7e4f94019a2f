"""Percentile bootstrap intervals: the one resampler every booklens figure uses.

A figure is a function of additive counts: a mean is (sum, n), an F1 is (tp, fp, fn), a kappa
is the four cells of a 2x2 table. Each resampling unit (an example, a summary, a book) carries
its vector of counts; a resample draws units with replacement, adds their counts and applies the
statistic to the sums. Resampling whole summaries rather than sentences keeps the interval honest
when the items of one unit are correlated (the sentences of one summary, the claims of one book).

The seed is fixed, so the same counts give the same interval.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
_BLOCK = 250  # resamples drawn at once (bounds memory for many units)


def bootstrap_counts(units: Sequence[Sequence[float]] | np.ndarray,
                     statistic: Callable[[np.ndarray], np.ndarray], *, resamples: int = DEFAULT_RESAMPLES,
                     confidence: float = DEFAULT_CONFIDENCE, seed: int = 0
                     ) -> tuple[Optional[float], Optional[float]]:
    """The percentile interval of `statistic` over resamples of `units`.

    `units` is an (n_units, k) array of counts; `statistic` maps an (m, k) array of summed counts to
    m values (NaN where the figure is undefined in that resample; those resamples are left out).
    Returns (None, None) when there are fewer than two units (every resample of one unit gives it
    back: [v, v] would read as certainty), when only one unit defines the figure on its own and the
    resamples all repeat its value, or when the figure is undefined in every resample."""
    counts = np.asarray(units, dtype=float)
    if counts.ndim != 2 or counts.shape[0] < 2:
        return (None, None)
    n = counts.shape[0]
    rng = np.random.default_rng(seed)
    values = []
    for start in range(0, resamples, _BLOCK):
        size = min(_BLOCK, resamples - start)
        draws = rng.integers(0, n, size=(size, n))
        weights = np.zeros((size, n))
        rows = np.repeat(np.arange(size), n)
        np.add.at(weights, (rows, draws.ravel()), 1.0)
        values.append(np.asarray(statistic(weights @ counts), dtype=float))
    stats = np.concatenate(values)
    stats = stats[~np.isnan(stats)]
    if stats.size == 0:
        return (None, None)
    if stats.min() == stats.max() and np.count_nonzero(~np.isnan(np.asarray(statistic(counts), dtype=float))) < 2:
        # Only one unit defines the figure on its own (the one summary holding every sentence the
        # judge flagged, for a precision): each resample that defines it repeats that unit's value.
        return (None, None)
    alpha = (1.0 - confidence) / 2
    return (float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha)))


def mean_of(sums: np.ndarray) -> np.ndarray:
    """Statistic for units (value, 1): the mean."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sums[:, 1] > 0, sums[:, 0] / np.where(sums[:, 1] > 0, sums[:, 1], 1), np.nan)


def unit_sums(values: Sequence[float], units: Sequence[object]) -> list[list[float]]:
    """(sum, count) of `values` per unit, in the order units first appear."""
    sums: dict[object, list[float]] = {}
    for value, unit in zip(values, units, strict=True):
        row = sums.setdefault(unit, [0.0, 0.0])
        row[0] += float(value)
        row[1] += 1.0
    return list(sums.values())


def bootstrap_mean(scores: Sequence[float], units: Optional[Sequence[object]] = None,
                   **kwargs) -> tuple[float, float]:
    """Interval of the mean of `scores` (NaN, NaN for fewer than two units). Each score is its own resampling
    unit unless `units` gives the unit of each (the summary a sentence belongs to): then whole
    units are drawn, and the interval is as wide as the units' agreement warrants."""
    if len(scores) == 0:
        return (math.nan, math.nan)
    rows = [[float(s), 1.0] for s in scores] if units is None else unit_sums(scores, units)
    lo, hi = bootstrap_counts(rows, mean_of, **kwargs)
    return (math.nan if lo is None else lo, math.nan if hi is None else hi)


def paired_bootstrap_ci(a: Sequence[float], b: Sequence[float], units: Optional[Sequence[object]] = None,
                        **kwargs) -> tuple[float, float, float]:
    """Mean of b - a over the same examples and the bootstrap interval of that mean (over `units`
    of examples when given, as `bootstrap_mean`)."""
    if len(a) != len(b):
        raise ValueError("paired scores must have the same length")
    diffs = [y - x for x, y in zip(a, b)]
    lo, hi = bootstrap_mean(diffs, units=units, **kwargs)
    return (sum(diffs) / len(diffs) if diffs else math.nan, lo, hi)


# ---------------------------------------------------------------------------
# Statistics over confusion counts: units carry (tp, fp, fn, tn)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def precision_of(c: np.ndarray) -> np.ndarray:
    return _ratio(c[:, 0], c[:, 0] + c[:, 1])


def recall_of(c: np.ndarray) -> np.ndarray:
    return _ratio(c[:, 0], c[:, 0] + c[:, 2])


def f1_of(c: np.ndarray) -> np.ndarray:
    return _ratio(2 * c[:, 0], 2 * c[:, 0] + c[:, 1] + c[:, 2])


def accuracy_of(c: np.ndarray) -> np.ndarray:
    return _ratio(c[:, 0] + c[:, 3], c.sum(axis=1))


def kappa_of(c: np.ndarray) -> np.ndarray:
    """Cohen's kappa from (tp, fp, fn, tn): NaN when chance agreement is 1."""
    tp, fp, fn, tn = c[:, 0], c[:, 1], c[:, 2], c[:, 3]
    # (p_o - p_e) / (1 - p_e) over the counts (`metrics.agreement.kappa_from_counts`): exact on whole
    # counts, so no agreement beyond chance is 0, not -0.0000; undefined where both sides are constant.
    return _ratio(2 * (tp * tn - fp * fn), (tp + fp) * (fp + tn) + (tp + fn) * (fn + tn))


CONFUSION_STATISTICS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "precision": precision_of, "recall": recall_of, "f1": f1_of, "kappa": kappa_of, "accuracy": accuracy_of,
}


def confusion_counts(predicted: Sequence[bool], reference: Sequence[bool]) -> list[int]:
    """(tp, fp, fn, tn) of predicted positives against reference positives."""
    tp = sum(1 for p, r in zip(predicted, reference) if p and r)
    fp = sum(1 for p, r in zip(predicted, reference) if p and not r)
    fn = sum(1 for p, r in zip(predicted, reference) if not p and r)
    return [tp, fp, fn, len(predicted) - tp - fp - fn]


def figure(units: Sequence[Sequence[float]], name: str, *, n: int, **kwargs) -> dict:
    """{"value", "ci95", "n"} of one confusion statistic over units of (tp, fp, fn, tn) counts."""
    statistic = CONFUSION_STATISTICS[name]
    counts = np.asarray(units, dtype=float).reshape(-1, 4)
    total = counts.sum(axis=0, keepdims=True) if len(counts) else np.zeros((1, 4))
    value = float(statistic(total)[0])
    lo, hi = bootstrap_counts(counts, statistic, **kwargs)
    return {"value": None if math.isnan(value) else round(value, 4),
            "ci95": [None if lo is None else round(lo, 4), None if hi is None else round(hi, 4)], "n": int(n)}
