"""A sweep's figures: one flat row per cell (`cells.jsonl`) and per system and pair of systems
(`results.json`).

Per system, over the books whose cell completed: the mean BooookScore with a 95% bootstrap
interval over books, the mean share of claims per label (each book's percentages of its verified
claims averaged, so every book weighs the same, with intervals for each label), the sentences and
claims the judges could not judge (left out of those figures), the mean summary length and share of
repeated trigrams, the LM work of all the system's cells (failed ones included: it was
spent), and the books another system completed that it did not (its figures are over other books
than theirs, so they do not rank it against them). For every pair of systems, the paired bootstrap
difference (second minus first) over the books both completed. The bootstrap has a fixed seed and
resamples the books' figures in sorted order: the same cells give the same file, whatever the order
of the books in the manifest.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Optional, Sequence

from booklens.lm.usage import WORK_KEYS, total_work
from booklens.pipeline import STEPS
from booklens.vocabulary import CLAIM_LABELS

RESULTS_FILE = "results.json"
CELLS_FILE = "cells.jsonl"
CELLS_DIR = "cells"
# Flat column names of the claim labels in cells.jsonl (no spaces or quotes: easy in pandas):
# faithful_pct, unfaithful_pct, partial_support_pct, cant_verify_pct.
LABEL_COLUMNS = {label: label.replace("'", "").replace(" ", "_") + "_pct" for label in CLAIM_LABELS}
STATUSES = ("complete", "failed", "not run")


@dataclass
class CellOutcome:
    """What became of one cell in this invocation: its run record (run.json as a dict) or why not."""

    system: str
    book: str
    status: str  # complete | failed | not run
    error: Optional[str] = None
    run: Optional[dict[str, Any]] = None
    # Its book could not be read when the sweep was planned (empty, binary, not UTF-8): a rerun reads the
    # same file, so the cell fails again until the book is fixed.
    unreadable: bool = False


def cell_dir(output: Path, system: str, book: str) -> Path:
    return Path(output) / CELLS_DIR / system / book


def first_failure(run: dict[str, Any]) -> Optional[str]:
    """'step: reason' of the first step that failed (the others usually only say 'needs <step>')."""
    failures = run.get("failures") or {}
    for step in (*STEPS, *failures):
        if step in failures:
            return f"{step}: {failures[step]}"
    return None


def outcome_of_run(system: str, book: str, run: dict[str, Any]) -> CellOutcome:
    failed = run.get("status") == "failed" or bool(run.get("failures")) or not run.get("complete", False)
    if failed:
        return CellOutcome(system, book, "failed", first_failure(run) or "the run did not complete", run)
    return CellOutcome(system, book, "complete", None, run)


def cell_row(outcome: CellOutcome) -> dict[str, Any]:
    """One flat line of cells.jsonl: every column present in every row (None where unknown)."""
    run = outcome.run or {}
    scores = run.get("scores") or {}
    totals = run.get("totals") or {}
    labels = scores.get("claim_labels") or {}
    if (scores.get("claims") or 0) <= (scores.get("failed_claims") or 0):
        labels = {}  # no claim verified: the shares are unknown, not 0% of every label
    row: dict[str, Any] = {
        "system": outcome.system,
        "book": outcome.book,
        "status": outcome.status,
        "error": outcome.error,
        "book_unreadable": outcome.unreadable,
        "dir": f"{CELLS_DIR}/{outcome.system}/{outcome.book}",
        "lm": run.get("lm"),
        "book_tokens": run.get("book_tokens"),
        "booookscore": scores.get("booookscore"),
        "sentences": scores.get("sentences"),
        "confusing_sentences": scores.get("confusing_sentences"),
        "failed_sentences": scores.get("failed_sentences"),
        "claims": scores.get("claims"),
        "failed_claims": scores.get("failed_claims"),
    }
    for label, column in LABEL_COLUMNS.items():
        row[column] = labels.get(label) if labels else None
    row["summary_tokens"] = scores.get("summary_tokens")
    row["repeated_trigrams"] = scores.get("repeated_trigrams")
    for key in WORK_KEYS:
        row[key] = totals.get(key)
    # NaN or infinity in a record (Python's json reads and writes them) is no figure, and no JSON: unknown.
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def rerun_advice(failed: Sequence[dict[str, Any]], *, rerun: str = "rerun", first_error_shown: bool = True) -> str:
    """What to do about a sweep's failed cells (their rows): a rerun retries those that failed at the LM
    (with the setting the first one's failure names, where that failure is shown beside the advice);
    a book that could not be read fails its cells again until it is fixed. `rerun`: the words for
    a rerun where the advice is read."""
    from booklens.lm.base import advises_setting

    unread = list(dict.fromkeys(str(r["book"]) for r in failed if r.get("book_unreadable")))
    plural = len(unread) > 1
    books = f"the book{'s' if plural else ''} {', '.join(map(repr, unread))}"
    retriable = [r for r in failed if not r.get("book_unreadable")]
    if not retriable:
        them = "them" if plural else "it"
        return f"{books} cannot be read: fix {them} or take {them} out of the manifest, then {rerun}"
    if first_error_shown and advises_setting(retriable[0].get("error")):
        rerun = f"{rerun} with the setting it names"
    return f"{rerun} to retry them" + (f" (the cells of {books} fail again until "
                                       f"{'they are' if plural else 'it is'} fixed)" if unread else "")


# ---------------------------------------------------------------------------
# results.json


def _mean(values: Sequence[float]) -> Optional[float]:
    return round(sum(values) / len(values), 6) if values else None


def _ci(values: Sequence[float]) -> Optional[list[float]]:
    if not values:
        return None
    from booklens.metrics.bootstrap import bootstrap_mean  # NumPy: only once there is something to resample

    # Sorted: the resamples' draws go by position, so the interval would move with the order of the
    # manifest's books; sorted, the same cells give the same interval whatever that order.
    lo, hi = bootstrap_mean(sorted(values))
    return None if math.isnan(lo) else [round(lo, 6), round(hi, 6)]  # NaN: no interval (one book)


def _is_figure(value: Any) -> bool:
    """A number a mean or a difference can take (not None, NaN or infinite)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def _present(rows: Sequence[dict[str, Any]], column: str) -> list[float]:
    return [float(r[column]) for r in rows if _is_figure(r.get(column))]


def system_results(rows: Sequence[dict[str, Any]], missing: Sequence[str] = ()) -> dict[str, Any]:
    """`missing`: the books another system completed and this one did not (`missing_books`)."""
    complete = [r for r in rows if r["status"] == "complete"]
    scores = _present(complete, "booookscore")
    claims = {label: _mean(_present(complete, column)) for label, column in LABEL_COLUMNS.items()}
    return {
        "books": len(complete),
        "failed": sum(1 for r in rows if r["status"] == "failed"),
        "missing_books": list(missing),
        # `books` of a figure: fewer than the system's when a completed cell has none (no sentence or
        # claim judged), which the row then says
        "booookscore": {"mean": _mean(scores), "ci95": _ci(scores), "books": len(scores)},
        "claims": claims,
        "claims_ci95": {label: _ci(_present(complete, column)) for label, column in LABEL_COLUMNS.items()},
        "claims_books": len(_present(complete, LABEL_COLUMNS["faithful"])),
        # What the judges could not judge in the completed cells, left out of the scores above.
        "failed_sentences": int(sum(_present(complete, "failed_sentences"))),
        "failed_claims": int(sum(_present(complete, "failed_claims"))),
        "summary_tokens": _mean(_present(complete, "summary_tokens")),
        "repeated_trigrams": _mean(_present(complete, "repeated_trigrams")),
        "usage": total_work(rows),
    }


def _paired(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]], books: list[str],
            column: str) -> Optional[dict[str, Any]]:
    shared = [k for k in books if _is_figure(a[k].get(column)) and _is_figure(b[k].get(column))]
    if not shared:
        return None
    from booklens.metrics.bootstrap import paired_bootstrap_ci

    # Ordered by the difference, for an interval that does not depend on the order of the books (see _ci).
    shared.sort(key=lambda k: (b[k][column] - a[k][column], k))
    diff, lo, hi = paired_bootstrap_ci([a[k][column] for k in shared], [b[k][column] for k in shared])
    ci = None if math.isnan(lo) else [round(lo, 6), round(hi, 6)]  # NaN: no interval (one shared book)
    return {"books": len(shared), "diff": round(diff, 6), "ci95": ci}


def pair_results(systems: list[str], rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every pair (a, b) in manifest order: b - a over the books both completed."""
    by_system: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in systems}
    for r in rows:
        if r["status"] == "complete" and r["system"] in by_system:
            by_system[r["system"]][r["book"]] = r
    pairs = []
    for a, b in combinations(systems, 2):
        books = [k for k in by_system[a] if k in by_system[b]]
        pairs.append({
            "a": a, "b": b, "books": len(books),
            "booookscore": _paired(by_system[a], by_system[b], books, "booookscore"),
            "faithful": _paired(by_system[a], by_system[b], books, "faithful_pct"),
        })
    return pairs


def sweep_judges(outcomes: Sequence[CellOutcome]) -> dict[str, Any]:
    """The judge of each judging step (program, demos, LM, calibration), as the cells recorded it.
    Every cell is judged by the same program, so the first cell that recorded a step's judge speaks
    for all, but for one figure: a verifier shows as many of its demos as its window holds beside
    each book's evidence, so a short book's cell may show more than a long one's. Where cells
    differ, the record gives the fewest and its note the range."""
    judges: dict[str, Any] = {}
    shown: dict[str, set[int]] = {}
    for outcome in outcomes:
        for task, info in ((outcome.run or {}).get("judges") or {}).items():
            judges.setdefault(task, info)
            demos = info.get("demos")
            count = info.get("demos_shown")
            if isinstance(demos, int):
                shown.setdefault(task, set()).add(demos if count is None else count)
    for task, counts in shown.items():
        if len(counts) > 1:
            fewest, most = min(counts), max(counts)
            judges[task] = {**judges[task], "demos_shown": fewest,
                            "demos_note": f"the judge is shown {fewest} to {most} of its {judges[task]['demos']} "
                                          "demos, by book: as many as its context window holds beside each "
                                          "book's evidence"}
    return {task: judges[task] for task in ("coherence", "verification") if task in judges}


def missing_books(systems: list[str], books: list[str], rows: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Per system, the books another system completed and it did not (failed or not run), in the
    sweep's order. A system's figures leave these out, so its row is over other books than the rows
    it is compared with, and a book it failed because it was hard would flatter it."""
    completed = {(r["system"], r["book"]) for r in rows if r["status"] == "complete"}
    return {s: [b for b in books if (s, b) not in completed
                and any((other, b) in completed for other in systems if other != s)] for s in systems}


def books_left_out(books: list[str], rows: Sequence[dict[str, Any]]) -> list[str]:
    """The books no system completed, in the sweep's order: every system's figures leave them out,
    and no system's `missing_books` names them."""
    completed = {r["book"] for r in rows if r["status"] == "complete"}
    return [b for b in books if b not in completed]


def results(systems: list[str], books: list[str], rows: Sequence[dict[str, Any]],
            judges: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    missing = missing_books(systems, books, rows)
    return {
        "kind": "booklens.sweep",
        "format_version": 1,
        "books": list(books),
        "books_left_out": books_left_out(books, rows),
        "judges": judges or {},
        "systems": {s: system_results([r for r in rows if r["system"] == s], missing[s]) for s in systems},
        "pairs": pair_results(systems, rows),
    }


def write_aggregate(output: Path, systems: list[str], books: list[str],
                    outcomes: Sequence[CellOutcome]) -> dict[str, Any]:
    """Write cells.jsonl and results.json (atomically); return the results."""
    from booklens.records import save_json
    from booklens.reports import write_text_atomic

    rows = [cell_row(o) for o in outcomes]
    lines = "".join(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in rows)
    write_text_atomic(Path(output) / CELLS_FILE, lines)
    payload = results(systems, books, rows, sweep_judges(outcomes))
    save_json(Path(output) / RESULTS_FILE, payload)
    return payload
