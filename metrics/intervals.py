"""Bootstrap confidence intervals: one implementation for every table that reports a mean over
examples or books (compiled-program evaluations, corpus sweeps)."""

from __future__ import annotations

import math
from typing import Any, Sequence


def bootstrap_ci(scores: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (fixed seed: the same scores give the same interval)."""
    import numpy as np

    values = np.asarray(list(scores), dtype=float)
    if values.size == 0:
        return (math.nan, math.nan)
    if values.size == 1:
        return (float(values[0]), float(values[0]))
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    alpha = (1.0 - confidence) / 2
    return (float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha)))


def paired_bootstrap_ci(a: Sequence[float], b: Sequence[float], **kwargs: Any) -> tuple[float, float, float]:
    """Mean of b - a over the same examples and its bootstrap interval."""
    if len(a) != len(b):
        raise ValueError("paired scores must have the same length")
    diffs = [y - x for x, y in zip(a, b)]
    lo, hi = bootstrap_ci(diffs, **kwargs)
    return (sum(diffs) / len(diffs) if diffs else math.nan, lo, hi)
