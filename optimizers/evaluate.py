"""Run a program on a split and report its metric with a bootstrap confidence interval and
what it cost in LM calls and tokens; print several programs side by side.

Examples run concurrently (like `dspy.Evaluate`), bounded by `threads`. Every example is scored
by the task's metric, the same function the optimizers maximize. An example whose run fails
(the program raised, for instance because the model never produced a parseable answer) scores
0 and is counted as failed; one the metric cannot score (`NoScore`: the judge that scores a
summary gave no valid verdict) is counted as failed and left out of the mean, since nothing was
measured; a permanent backend failure (`LMError`) stops the evaluation.

Calls and tokens are metered on the LM the program talks to, counting calls answered from the
disk cache with the tokens they cost when they were made, so a rerun reports the same usage.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import dspy

from booklens.errors import BooklensError, LMError, first_line
from booklens.lm import BooklensLM, ContextWindowExceeded
from booklens.lm.usage import UsageTracker
from booklens.vocabulary import counted, singular
from booklens.metrics.bootstrap import bootstrap_mean as bootstrap_ci, paired_bootstrap_ci  # noqa: F401 - part of this module's API


class NoScore(BooklensError):
    """A metric has no score for the example: the judge that scores it gave no valid verdict
    (the summarize task's confusion detector on a summary). Unlike a program that gives no answer,
    which the metric scores 0, the program under test did not fail: nothing measured it. The
    example counts as failed and stays out of the mean (`evaluate_program`); an optimizer gets
    DSPy's failure score for it (`booklens.optimizers.compile.as_metric`)."""


# ---------------------------------------------------------------------------
# Metering and rollout-aware LM wrapper


def metered(lm: Any, meter: UsageTracker | None = None, *, halt: list[LMError] | None = None) -> Any:
    """A view of a booklens LM (same backend, cache and usage counters) that also counts its calls
    in `meter`, and turns DSPy's `rollout_id` into a fresh sample. With `halt` (a list, shared by the
    view's copies), the first backend failure is kept there and every later call raises
    `BackendFailed` without going out.

    The meter travels with the LM object, so it also counts calls that an optimizer makes in
    threads of its own, where the usage scopes of this context do not reach.

    Optimizers ask for distinct samples of the same prompt with `lm.copy(rollout_id=i)`. The
    booklens cache key and the embedded model's sampling seed follow `booklens_attempt`, not
    `rollout_id`, so without this every rollout would return the first one's answer."""
    if not isinstance(lm, BooklensLM):
        return lm
    view = lm.view(_MeteredLM)
    view.meter = meter if meter is not None else UsageTracker()
    view.halt = halt
    return view


class BackendFailed(BaseException):
    """A call after the backend failed (`metered(halt=...)`): a BaseException, so that no optimizer
    takes it for one bad example (DSPy's and GEPA's loops catch Exception, and GEPA would go on
    asking) and it ends the work at once; the caller raises the failure itself (`halt[0]`)."""


class _MeteredLM(BooklensLM):
    meter: UsageTracker
    halt: list[LMError] | None = None

    def _count(self, completion: Any, *, cached: bool) -> dict[str, Any]:
        counts = super()._count(completion, cached=cached)
        self.meter.count(**counts)
        return counts

    def forward(self, prompt=None, messages=None, **kwargs):
        merged = {**self.kwargs, **kwargs}
        rollout = merged.get("rollout_id")
        if rollout is not None and not merged.get("booklens_attempt"):
            # A distinct, reproducible sample per rollout (the embedded model's seed adds the attempt).
            kwargs["booklens_attempt"] = 1 + int(rollout) % (2**30)
        if self.halt:  # the backend already failed: no call goes out after it
            raise BackendFailed(self.halt[0])
        try:
            return super().forward(prompt=prompt, messages=messages, **kwargs)
        except ContextWindowExceeded:
            raise  # one prompt's size, which a program may handle (`predict_with_retries`), not the backend's state
        except LMError as exc:
            if self.halt is not None:
                self.halt.append(exc)
            raise


# ---------------------------------------------------------------------------
# Evaluation


@dataclass
class EvalResult:
    label: str
    scores: list[float | None]  # one per example; None where the metric had no score (`NoScore`)
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    predictions: list[Any] = field(default_factory=list, repr=False)
    examples: str | None = None  # fingerprint of the examples, in order (`examples_fingerprint`)
    # The resampling unit of each example for the intervals (the summary a sentence belongs to);
    # None: each example is its own.
    units: list[str] | None = None
    unit_name: str = "examples"
    notes: list[str] = field(default_factory=list)  # what the run said beside its answers (a task's `notes`)

    @property
    def n(self) -> int:
        return len(self.scores)

    @property
    def scored(self) -> list[float]:
        """The scores the mean and its interval are over (the examples the metric had a score for)."""
        return [s for s in self.scores if s is not None]

    @property
    def unscored(self) -> int:
        return self.n - len(self.scored)

    @property
    def mean(self) -> float:
        scored = self.scored
        return sum(scored) / len(scored) if scored else math.nan

    def _scored_units(self) -> list[str] | None:
        if self.units is None:
            return None
        return [u for u, s in zip(self.units, self.scores) if s is not None]

    @property
    def n_units(self) -> int:
        units = self._scored_units()
        return len(set(units)) if units is not None else len(self.scored)

    def ci(self, confidence: float = 0.95) -> tuple[float, float]:
        return bootstrap_ci(self.scored, units=self._scored_units(), confidence=confidence)

    def as_dict(self) -> dict[str, Any]:
        lo, hi = self.ci()
        return {"label": self.label, "n": self.n, "scored": len(self.scored), "metric": _round(self.mean),
                "ci95": [_round(lo), _round(hi)], "resampled": {"unit": self.unit_name, "n": self.n_units},
                "failures": self.failures, **self.usage, "seconds": round(self.seconds, 1), "notes": list(self.notes)}


def _round(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 4)


def examples_fingerprint(examples: Sequence[dspy.Example]) -> str:
    """A digest of the examples' fields, in order: two results over the same examples share it."""
    import hashlib
    import json

    digest = hashlib.sha256()
    for example in examples:
        fields = dict(example.items()) if hasattr(example, "items") else {"example": example}
        digest.update(json.dumps(fields, sort_keys=True, default=repr).encode("utf-8") + b"\0")
    return digest.hexdigest()


def score_of(value: Any) -> float:
    """A metric's return value as a number (bools, None and Predictions with a `score` allowed)."""
    if value is None:
        return 0.0
    if hasattr(value, "score") and not isinstance(value, (int, float)):
        value = value.score
    return float(value)


def evaluate_program(
    program: dspy.Module,
    examples: Sequence[dspy.Example],
    metric: Callable[..., Any],
    *,
    threads: int = 2,
    label: str = "program",
    desc: str | None = None,
    keep_predictions: bool = False,
    units: Sequence[str] | None = None,
    unit_name: str = "examples",
    failure: Callable[[Any], str | None] | None = None,
    notes: Callable[[Sequence[dspy.Example], Sequence[Any]], list[str]] | None = None,
) -> EvalResult:
    """Run `program` on every example with the configured LM and score it with `metric`. `units`
    (one per example, named `unit_name`) makes the intervals resample whole units: examples that
    share a context (the sentences of one summary) do not count as independent evidence.
    `failure` (a task's) says why a prediction holds no answer: such an example scores what the
    metric gives it (0) and counts as failed, as one where the program raised. An example the
    metric raises `NoScore` on counts as failed and has no score (None): the mean leaves it out.
    `notes` (a task's) gives the lines the run has to say beside its figures, from the examples and
    their predictions (None where the program raised)."""
    from booklens.lm import current_lm
    from booklens.parallel import parallel_map

    examples = list(examples)
    if not examples:
        raise BooklensError("nothing to evaluate: the split is empty")
    if units is not None and len(units) != len(examples):
        raise ValueError("units must give one unit per example")
    meter = UsageTracker()
    lm = metered(current_lm(), meter)

    def run(example: dspy.Example) -> tuple[float | None, str | None, Any]:
        try:
            prediction = program(**example.inputs())
        except LMError:
            raise
        except Exception as exc:  # the program gave up on this example
            return 0.0, f"{type(exc).__name__}: {first_line(exc)}", None
        why = failure(prediction) if failure is not None else None
        try:
            score = score_of(metric(example, prediction, None))
        except NoScore as exc:
            return None, f"no score: {first_line(exc)}", prediction
        return score, (f"no answer: {why}" if why else None), prediction

    started = time.perf_counter()
    with dspy.context(lm=lm):
        outcomes = parallel_map(run, examples, concurrency=threads, desc=desc or f"evaluate {label}")
    seconds = time.perf_counter() - started
    errors = [e for _, e, _ in outcomes if e]
    if errors and len(errors) == len(examples):
        raise BooklensError(f"{label} failed on every example; the first failure: {errors[0]}")
    return EvalResult(
        label=label,
        scores=[s for s, _, _ in outcomes],
        failures=len(errors),
        errors=errors[:5],
        usage=meter.work(),
        seconds=seconds,
        predictions=[p for _, _, p in outcomes] if keep_predictions else [],
        examples=examples_fingerprint(examples),
        units=list(units) if units is not None else None,
        unit_name=unit_name if units is not None else "examples",
        notes=notes(examples, [p for _, _, p in outcomes]) if notes is not None else [],
    )


# ---------------------------------------------------------------------------
# Report


def format_table(results: Sequence[EvalResult], *, title: str, metric_name: str) -> str:
    """One Markdown table with a column per program; every program after the first is compared with
    the first when both ran on the same examples (a paired difference means nothing across
    different ones), over the examples both have a score for."""
    headers = [title] + [r.label for r in results]
    rows: list[list[str]] = []

    def ci_cell(r: EvalResult) -> str:
        lo, hi = r.ci()
        return f"{r.mean:.3f}" + ("" if math.isnan(lo) else f" [{lo:.3f}, {hi:.3f}]")  # no interval of one unit

    rows.append([f"{metric_name} (95% CI)"] + [ci_cell(r) for r in results])
    rows.append(["examples (failed)"] + [f"{r.n} ({r.failures})" for r in results])
    rows.append(["LM calls (from cache)"] + [f"{r.usage.get('calls', 0)} ({r.usage.get('cached_calls', 0)})"
                                              for r in results])
    rows.append(["prompt tokens"] + [str(r.usage.get("prompt_tokens", 0)) for r in results])
    rows.append(["completion tokens"] + [str(r.usage.get("completion_tokens", 0)) for r in results])
    rows.append(["seconds"] + [f"{r.seconds:.0f}" for r in results])
    widths = [max(len(row[i]) for row in [headers] + rows) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    first = results[0] if results else None
    paired = [r for r in results[1:] if first.examples is not None and r.examples == first.examples]
    grouped = [r for r in results if r.units is not None]
    if grouped:
        counts = {r.n_units for r in grouped}
        how = (f"{counts.pop()} of them" if len(counts) == 1 else
               ", ".join(f"{r.n_units} for {r.label}" for r in grouped))
        out += ["", f"Intervals resample whole {grouped[0].unit_name} ({how}), not single examples."]
    unscored = [r for r in results if r.unscored]
    if unscored:
        out += ["", f"The {metric_name} means leave out the examples the metric has no score for (counted as "
                    f"failed): " + ", ".join(f"{r.unscored} of {r.n} for {r.label}" for r in unscored) + "."]
    if paired:
        out.append("")
        for r in paired:
            both = [i for i, (a, b) in enumerate(zip(first.scores, r.scores)) if a is not None and b is not None]
            if not both:
                out.append(f"{r.label} - {first.label}: no example has a score from both")
                continue
            units = None if first.units is None else [first.units[i] for i in both]
            diff, lo, hi = paired_bootstrap_ci([first.scores[i] for i in both], [r.scores[i] for i in both],
                                               units=units)
            # Fewer than two units is no interval: every resample is the one unit again.
            n_units = len(both) if units is None else len(set(units))
            interval = (f"(no interval: only {counted(n_units, singular(first.unit_name))} to resample)"
                        if math.isnan(lo) else
                        f"[{lo:+.3f}, {hi:+.3f}] (paired bootstrap over the same {first.unit_name}, 95%)")
            over = "" if len(both) == first.n else f" over the {len(both)} of {first.n} examples both have a score for"
            out.append(f"{r.label} - {first.label}: {diff:+.3f} {interval}{over}")
    return "\n".join(out)
