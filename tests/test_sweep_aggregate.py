"""The sweep's aggregate, report page and progress display on hand-made cell records."""

from __future__ import annotations

import io
import json

import pytest

from booklens.sweep.aggregate import CellOutcome, cell_row, outcome_of_run, results, sweep_judges, write_aggregate
from booklens.sweep.progress import SweepProgress
from booklens.sweep.report import render_sweep_report


def run(score: float, faithful: float, calls: int, tokens: int = 100, cost=None, provider_cached: int = 0) -> dict:
    return {"complete": True, "failures": {}, "lm": "openai/x", "book_tokens": 1000,
            "scores": {"booookscore": score, "sentences": 10, "confusing_sentences": round(10 * (1 - score)),
                       "claims": 4, "claim_labels": {"faithful": faithful, "unfaithful": 100 - faithful,
                                                     "partial support": 0.0, "can't verify": 0.0},
                       "summary_tokens": 200, "repeated_trigrams": 1.5},
            "totals": {"calls": calls, "prompt_tokens": tokens, "completion_tokens": 10, "cost_usd": cost,
                       "provider_cached_tokens": provider_cached}}


def failed_run(calls: int) -> dict:
    return {"complete": False, "failures": {"summary": "model gave no usable summary", "coherence": "needs summary"},
            "scores": {"booookscore": None}, "totals": {"calls": calls, "prompt_tokens": 5, "completion_tokens": 0,
                                                        "cost_usd": 0.5}}


@pytest.fixture
def outcomes() -> list[CellOutcome]:
    return [
        outcome_of_run("a", "b1", run(0.8, 50.0, 10, cost=0.25, provider_cached=40)),
        outcome_of_run("a", "b2", run(0.6, 75.0, 12, cost=0.25, provider_cached=60)),
        outcome_of_run("a", "b3", failed_run(3)),
        outcome_of_run("b", "b1", run(0.9, 100.0, 20)),
        outcome_of_run("b", "b2", run(1.0, 100.0, 20)),
        outcome_of_run("b", "b3", run(0.5, 0.0, 20)),
        CellOutcome("c", "b1", "not run"),
        CellOutcome("c", "b2", "failed", "internal error: ValueError: boom"),
        CellOutcome("c", "b3", "not run"),
    ]


def test_what_the_judges_could_not_judge_is_a_column_and_a_sum_per_system():
    partial = run(0.75, 100.0, 10)
    partial["scores"].update({"failed_sentences": 2, "failed_claims": 1})
    rows = [cell_row(outcome_of_run("a", "b1", partial)), cell_row(outcome_of_run("a", "b2", run(1.0, 50.0, 10)))]
    assert [(r["failed_sentences"], r["failed_claims"]) for r in rows] == [(2, 1), (None, None)]
    system = results(["a"], ["b1", "b2"], rows)["systems"]["a"]
    assert (system["failed_sentences"], system["failed_claims"]) == (2, 1)
    page = render_sweep_report(results(["a"], ["b1", "b2"], rows), rows, title="t")
    assert "left out of the scores: a: 2 sentences and 1 claim." in page


def test_failed_cells_are_counted_apart_and_their_work_still_counts(outcomes):
    assert outcomes[2].status == "failed" and outcomes[2].error == "summary: model gave no usable summary"
    data = results(["a", "b", "c"], ["b1", "b2", "b3"], [cell_row(o) for o in outcomes])
    a, b, c = (data["systems"][k] for k in "abc")
    assert (a["books"], a["failed"]) == (2, 1) and (b["books"], b["failed"]) == (3, 0) and (c["books"], c["failed"]) == (0, 1)
    assert a["booookscore"]["mean"] == pytest.approx(0.7)
    assert a["booookscore"]["ci95"] == [pytest.approx(0.6), pytest.approx(0.8)]
    assert a["claims"] == {"faithful": 62.5, "unfaithful": 37.5, "partial support": 0.0, "can't verify": 0.0}
    # a3's run record predates provider-cached tokens: it counts none
    assert a["usage"] == {"calls": 25, "prompt_tokens": 205, "completion_tokens": 20, "cost_usd": 1.0,
                          "provider_cached_tokens": 100}
    assert [cell_row(o)["provider_cached_tokens"] for o in outcomes[:3]] == [40, 60, None]
    assert b["usage"]["cost_usd"] is None  # no price known for any of its cells
    assert c["booookscore"] == {"mean": None, "ci95": None, "books": 0} and c["usage"]["calls"] == 0
    # Pairs are over the books both systems completed: b3 failed under a, so a-b uses b1 and b2.
    ab, ac, bc = data["pairs"]
    assert (ab["a"], ab["b"], ab["books"]) == ("a", "b", 2)
    assert ab["booookscore"]["diff"] == pytest.approx(0.25)  # (0.9 - 0.8 + 1.0 - 0.6) / 2
    assert ab["faithful"]["diff"] == pytest.approx(37.5)
    lo, hi = ab["booookscore"]["ci95"]
    assert 0.1 - 1e-9 <= lo <= 0.25 <= hi <= 0.4 + 1e-9
    assert ac["books"] == 0 and ac["booookscore"] is None and bc["books"] == 0
    # The same cells give the same file: the bootstrap has a fixed seed.
    assert results(["a", "b", "c"], ["b1", "b2", "b3"], [cell_row(o) for o in outcomes]) == data


def test_one_book_gets_a_mean_but_no_interval_and_no_significant_difference():
    """Resampling one book gives it back every time: [v, v] would pass for certainty. A system with
    one completed book, and a pair with one shared book, get their figure and no interval."""
    rows = [cell_row(outcome_of_run("a", "b1", run(0.8, 50.0, 10))),
            cell_row(outcome_of_run("a", "b2", failed_run(3))),
            cell_row(outcome_of_run("b", "b1", run(0.9, 60.0, 10))),
            cell_row(outcome_of_run("b", "b2", run(1.0, 70.0, 10)))]
    data = results(["a", "b"], ["b1", "b2"], rows)
    a, b = data["systems"]["a"], data["systems"]["b"]
    assert a["booookscore"] == {"mean": 0.8, "ci95": None, "books": 1} and a["claims_ci95"]["faithful"] is None
    assert b["booookscore"]["ci95"] is not None  # two books
    (pair,) = data["pairs"]
    assert pair["books"] == 1 and pair["booookscore"]["diff"] == pytest.approx(0.1)
    assert pair["booookscore"]["ci95"] is None and pair["faithful"]["ci95"] is None
    page = render_sweep_report(data, rows, title="t")
    assert '<span class="sig">+' not in page and '<span class="">+10.0</span>' in page


def test_a_cell_with_no_verified_claim_has_no_claim_shares():
    """Every verification failed: the shares are unknown, not 0% faithful (which would pull the
    system's mean down); BooookScore still counts."""
    unverified = run(1.0, 0.0, 10)
    unverified["scores"].update({"claims": 4, "failed_claims": 4,
                                 "claim_labels": {label: 0.0 for label in ("faithful", "unfaithful",
                                                                           "partial support", "can't verify")}})
    rows = [cell_row(outcome_of_run("a", "b1", run(0.5, 100.0, 10))), cell_row(outcome_of_run("a", "b2", unverified))]
    assert rows[1]["faithful_pct"] is None and rows[1]["booookscore"] == 1.0
    system = results(["a"], ["b1", "b2"], rows)["systems"]["a"]
    assert system["claims"]["faithful"] == 100.0 and system["booookscore"]["mean"] == 0.75

def test_cells_jsonl_loads_into_pandas_with_one_row_per_cell(outcomes, tmp_path):
    import pandas

    write_aggregate(tmp_path, ["a", "b", "c"], ["b1", "b2", "b3"], outcomes)
    frame = pandas.read_json(tmp_path / "cells.jsonl", lines=True)
    assert len(frame) == 9 and list(frame.columns[:4]) == ["system", "book", "status", "error"]
    assert frame.groupby("status").size().to_dict() == {"complete": 5, "failed": 2, "not run": 2}
    assert frame.loc[(frame.system == "b") & (frame.book == "b3"), "faithful_pct"].item() == 0.0
    assert json.loads((tmp_path / "results.json").read_text())["kind"] == "booklens.sweep"


def test_the_readmes_pandas_call_keeps_book_keys_that_look_like_numbers(tmp_path):
    """A book named 0042.txt is the key '0042' (its cell is cells/2/0042): the README's call keeps it so."""
    import re
    from pathlib import Path

    import pandas

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    call = re.search(r"`(pandas\.read_json\(path, lines=True[^`]*\))`", readme).group(1)
    write_aggregate(tmp_path, ["2"], ["0042", "1984"], [outcome_of_run("2", "0042", run(0.5, 50.0, 1)),
                                                       outcome_of_run("2", "1984", run(1.0, 100.0, 1))])
    frame = eval(call, {"pandas": pandas, "path": tmp_path / "cells.jsonl"})
    assert frame["book"].tolist() == ["0042", "1984"] and frame["system"].tolist() == ["2", "2"]
    assert frame["dir"].tolist() == ["cells/2/0042", "cells/2/1984"]


def test_the_report_escapes_what_it_did_not_write_and_runs_nothing(outcomes):
    from booklens.reports import CSP, h

    outcomes[7].error = 'internal error: <script>alert("x")</script>'
    rows = [cell_row(o) for o in outcomes]
    for row in rows:
        if row["book"] == "b2":
            row["book"] = "<img src=x onerror=alert(1)>"
    data = results(["a", "b", "c"], ["b1", "<img src=x onerror=alert(1)>", "b3"], rows)
    page = render_sweep_report(data, rows, title="<title>", meta=["a & b"])
    assert f'content="{h(CSP)}"' in page
    assert "<script" not in page and "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "cells/a/%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E/report.html" in page
    assert page.count("not run") >= 2 and "<svg" in page and "a &amp; b" in page
    assert render_sweep_report(data, rows, title="<title>", meta=["a & b"]) == page


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_shows_cells_calls_tokens_cost_and_eta():
    usage = {"calls": 1200, "cached_calls": 34, "prompt_tokens": 1_000_000, "completion_tokens": 150_000,
             "cached_prompt_tokens": 50_000, "cached_completion_tokens": 0, "cost_usd": 0.4, "cached_cost_usd": 0.02}
    clock, stream = Clock(), io.StringIO()
    progress = SweepProgress(12, lambda: usage, stream=stream, tty=False, interval=3600, clock=clock)
    progress.started = clock.now
    assert progress.line() == "sweep: 0/12 cells | 1,234 LM calls (34 from the cache) | 1.2M tokens | $0.4200 | 0s"
    clock.now += 2
    # no work done: not part of the pace; the work of its steps, done by an earlier run, is counted apart
    progress.cell_done("s/b1", reused=True, earlier={"calls": 10, "prompt_tokens": 4000, "completion_tokens": 1000,
                                                     "cost_usd": 0.08})
    clock.now += 60
    progress.cell_done("s/b2")
    progress.cell_done("s/b3", failed="summary: no usable summary")
    assert stream.getvalue() == "cell s/b3 failed: summary: no usable summary\n"
    # 62 s for the 1 cell that completed work (a failed cell is not part of the pace); 9 cells left -> 558 s
    assert progress.line() == ("sweep: 3/12 cells (1 reused, 1 failed) | 1,234 LM calls (34 from the cache) "
                               "+ 10 reused from earlier runs | 1.2M tokens | $0.5000 | 1m02s, ETA 9m18s")
    progress.cell_done("s/b4", earlier={"calls": 2, "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": None})
    assert "+ 12 reused from earlier runs" in progress.line() and "$" not in progress.line()  # a call had no price
    progress.close()
    assert stream.getvalue().splitlines()[-1].startswith("sweep: 4/12 cells (1 reused, 1 failed)")


def test_the_last_progress_line_of_a_stopped_sweep_has_no_eta():
    """With --fail-fast (or an interrupt) cells are left when the display closes: they will not run."""
    clock, stream = Clock(), io.StringIO()
    progress = SweepProgress(4, lambda: {"calls": 3}, stream=stream, tty=False, interval=3600, clock=clock)
    progress.started = clock.now
    clock.now += 2
    progress.cell_done("s/b1", failed="summary: no usable summary")
    progress.cell_done("s/b2")
    assert progress.line().endswith("| 2s, ETA 4s")
    progress.close()
    assert stream.getvalue().splitlines()[-1] == "sweep: 2/4 cells (1 failed) | 3 LM calls | 0 tokens | 2s"


def test_cells_that_failed_at_once_do_not_set_the_pace():
    """Three cells whose book could not be read fail in the first second; the ETA waits for a cell
    that completed work rather than promising the other 7 in 2 seconds."""
    clock, stream = Clock(), io.StringIO()
    progress = SweepProgress(10, lambda: {"calls": 0}, stream=stream, tty=False, interval=3600, clock=clock)
    progress.started = clock.now
    clock.now += 1
    for name in ("s/b1", "s/b2", "s/b3"):
        progress.cell_done(name, failed="book: no such file")
    assert "ETA" not in progress.line()
    clock.now += 99
    progress.cell_done("s/b4")
    assert progress.line().endswith("| 1m40s, ETA 10m00s")


def test_progress_on_a_terminal_redraws_one_line():
    stream = io.StringIO()
    progress = SweepProgress(2, lambda: {"calls": 3}, stream=stream, tty=True, interval=3600, clock=Clock())
    progress._draw()
    progress.cell_done("s/b", failed="boom")
    progress.cell_done("s/c")
    progress.close()
    text = stream.getvalue()
    assert text.startswith("\rsweep: 0/2 cells | 3 LM calls") and "\rcell s/b failed: boom\n" in text
    assert text.endswith("sweep: 2/2 cells (1 failed) | 3 LM calls | 0 tokens | 0s\n")


def test_the_figures_do_not_depend_on_the_order_of_the_books():
    """A manifest that lists the same books in another order gives the same intervals (the bootstrap
    draws by position: unsorted, 0.9 0.5 0.7 0.2 0.95 gave a lower bound of 0.40, reversed 0.41)."""
    scores = {"b1": (0.9, 0.6), "b2": (0.5, 0.45), "b3": (0.7, 1.0), "b4": (0.2, 0.3), "b5": (0.95, 0.6)}
    rows = [cell_row(outcome_of_run(system, book, run(pair[i], 100 * pair[i], 1)))
            for i, system in enumerate("ab") for book, pair in scores.items()]
    books = list(scores)
    forward = results(["a", "b"], books, rows)
    backward = results(["a", "b"], books[::-1], rows[::-1])
    assert forward["systems"] == backward["systems"] and forward["pairs"] == backward["pairs"]


def test_a_cost_is_known_only_when_every_call_that_counted_was_priced(tmp_path):
    """One rule for the records, the aggregate, the report and the progress line: a sum over calls of
    which some had no price is unknown, not the price of the others (a system's cost summed the
    cells that had one, a step's the calls that had one)."""
    from booklens.lm.usage import UsageTracker, known_cost

    assert known_cost([(10, 0.25), (3, 0.5)]) == 0.75
    assert known_cost([(10, 0.25), (3, None)]) is None
    assert known_cost([(10, 0.25), (0, None)]) == 0.25  # no call: nothing to price
    assert known_cost([(0, None)]) is None and known_cost([]) is None  # no call made: no cost to state

    # A step: one priced call and one the provider gave no price for, fresh or from the cache.
    for cached in (False, True):
        tracker = UsageTracker()
        tracker.record(cached=False, prompt_tokens=10, completion_tokens=2, cost=0.01)
        tracker.record(cached=cached, prompt_tokens=10, completion_tokens=2, cost=None)
        assert tracker.work()["calls"] == 2 and tracker.work()["cost_usd"] is None, cached
    tracker = UsageTracker()
    tracker.record(cached=False, prompt_tokens=10, completion_tokens=2, cost=0.01)
    tracker.record(cached=True, prompt_tokens=10, completion_tokens=2, cost=0.02)
    assert tracker.work()["cost_usd"] == 0.03
    # Between two snapshots only the calls made in between count: an unpriced call before them does not.
    before = tracker.snapshot()
    tracker.record(cached=False, prompt_tokens=10, completion_tokens=2, cost=None)
    middle = tracker.snapshot()
    tracker.record(cached=False, prompt_tokens=10, completion_tokens=2, cost=0.04)
    from booklens.lm.usage import work_between

    assert work_between(before, middle)["cost_usd"] is None
    assert work_between(middle, tracker.snapshot())["cost_usd"] == 0.04

    # A system whose cells were priced but one: unknown in results.json and the report, not $0.25.
    outcomes = [outcome_of_run("a", "b1", run(0.8, 50.0, 10, cost=0.25)),
                outcome_of_run("a", "b2", run(0.6, 75.0, 12, cost=None)),
                outcome_of_run("b", "b1", run(0.9, 100.0, 20, cost=0.5)),
                outcome_of_run("b", "b2", failed_run(3))]
    data = write_aggregate(tmp_path, ["a", "b"], ["b1", "b2"], outcomes)
    assert data["systems"]["a"]["usage"]["cost_usd"] is None
    assert data["systems"]["b"]["usage"]["cost_usd"] == 1.0
    rows = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
    assert [r["cost_usd"] for r in rows] == [0.25, None, 0.5, 0.5]
    page = render_sweep_report(data, rows, title="t")
    table = page.split("<caption>Systems compared</caption>")[1].split("</table>")[0]
    assert [row.rsplit('<td class="num">', 1)[1].split("<")[0] for row in table.split("<tr>")[2:]] == \
        ["unknown", "$1.00"]

    # The progress line states a cost on the same rule (and none while it is unknown).
    usage = {"calls": 2, "cached_calls": 1, "cost_usd": 0.4, "cached_cost_usd": 0.02, "unpriced_calls": 1}
    assert "$" not in SweepProgress(2, lambda: usage, stream=io.StringIO(), tty=False).line()
    usage["unpriced_calls"] = 0
    assert "| $0.4200 |" in SweepProgress(2, lambda: usage, stream=io.StringIO(), tty=False).line()


def test_a_system_whose_hard_book_failed_is_not_ranked_above_one_that_completed_it():
    """b failed the book it did worst on: its mean over the books it completed is higher than a's
    over all three. The table's rows are then over different books: results.json names the books
    each system's figures leave out, and the page says so above the table and sends the reader to
    the paired differences, which use only the books both completed."""
    rows = [cell_row(outcome_of_run("a", "b1", run(0.8, 80.0, 1))),
            cell_row(outcome_of_run("a", "b2", run(0.8, 80.0, 1))),
            cell_row(outcome_of_run("a", "b3", run(0.2, 20.0, 1))),
            cell_row(outcome_of_run("b", "b1", run(0.9, 90.0, 1))),
            cell_row(outcome_of_run("b", "b2", run(0.9, 90.0, 1))),
            cell_row(outcome_of_run("b", "b3", failed_run(1))),
            cell_row(CellOutcome("c", "b1", "not run")),
            cell_row(CellOutcome("c", "b2", "not run")),
            cell_row(CellOutcome("c", "b3", "not run"))]
    data = results(["a", "b", "c"], ["b1", "b2", "b3"], rows)
    assert data["systems"]["b"]["booookscore"]["mean"] > data["systems"]["a"]["booookscore"]["mean"]
    assert [data["systems"][s]["missing_books"] for s in "abc"] == [[], ["b3"], ["b1", "b2", "b3"]]
    page = render_sweep_report(data, rows, title="t")
    table = page.split('<section id="systems"')[1].split("</section>")[0]
    assert ("The rows are over different books: b lacks b3 and c lacks b1, b2 and b3, which another system "
            "completed.") in table
    assert "compare systems by the paired differences" in table
    # Every system completed the same books (b3 failed for all): the rows compare, and nothing is said.
    same = [r for r in rows if r["system"] != "c" and not (r["system"] == "a" and r["book"] == "b3")]
    data = results(["a", "b"], ["b1", "b2", "b3"], same)
    assert [data["systems"][s]["missing_books"] for s in "ab"] == [[], []]
    assert "over different books" not in render_sweep_report(data, same, title="t")


def test_a_difference_over_a_few_books_is_not_marked_significant():
    """Over n books, the percentile bootstrap's interval excludes 0 whenever every book moves the same
    way, which two systems with no real difference do half the time over 2 books and a quarter of the
    time over 3. A test that assumes nothing of how the differences are distributed (sign, sign-flip)
    cannot reach 5% before 6 books (at best 2/2^n), so fewer shared books are not marked bold; the
    interval is still given."""

    def pair_page(n: int) -> tuple[dict, str]:
        rows = [cell_row(outcome_of_run(system, f"b{i}", run(score + i / 100, 50.0 + 10 * (system == "b"), 1)))
                for i in range(n) for system, score in (("a", 0.5), ("b", 0.6))]
        data = results(["a", "b"], [f"b{i}" for i in range(n)], rows)
        return data["pairs"][0], render_sweep_report(data, rows, title="t")

    for n in (2, 3, 5):
        pair, page = pair_page(n)
        assert pair["booookscore"]["ci95"][0] > 0, n  # the interval excludes 0 ...
        assert '<span class="sig">+' not in page, n  # ... but so few books cannot show a difference
        assert '<span class="">+10.0</span> <span class="ci">[+10.0, +10.0]</span>' in page, n
    pair, page = pair_page(6)
    assert page.count('<span class="sig">+10.0</span>') == 2  # BooookScore and % faithful


def test_the_pages_line_counts_one_system_and_one_book_in_the_singular():
    from booklens.sweep.report import sweep_meta

    assert sweep_meta(2, 1, "/x/s.yaml", ["coherence"], "bm25")[0] == "2 systems \u00d7 1 book"
    assert sweep_meta(1, 3, "/x/s.yaml", ["coherence"], "bm25")[0] == "1 system \u00d7 3 books"


def test_the_readme_names_every_key_of_results_json(outcomes):
    """results.json is read by scripts: its keys are the ones README lists, no more and no fewer."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    listed = re.search(r"results\.json`'s keys: (.*?)\n- ", readme, re.S)
    assert listed, "README lists results.json's keys"
    named = set(re.findall(r"`([^`]+)`", listed.group(1)))
    data = results(["a", "b", "c"], ["b1", "b2", "b3"], [cell_row(o) for o in outcomes])
    system, pair = data["systems"]["a"], data["pairs"][0]
    keys = set(data) | set(system) | set(system["booookscore"]) | set(pair) | set(pair["booookscore"])
    assert keys == named, (keys - named, named - keys)


def test_a_score_that_is_not_a_number_is_left_out_of_the_pairs_as_of_the_means(tmp_path):
    """A run record holding NaN for a score (Python's json writes and reads it) was left out of a
    system's mean but not of the paired difference, which became NaN: results.json then held a NaN
    literal, which is not JSON, and so did cells.jsonl, which copied the score. Unknown: null."""
    runs = {(s, b): run(score, faithful, 1) for s, b, score, faithful in (
        ("a", "b1", 0.5, 50.0), ("a", "b2", 0.5, 50.0), ("a", "b3", 0.7, 70.0),
        ("b", "b1", 0.6, 60.0), ("b", "b2", 0.9, 90.0), ("b", "b3", 0.9, 90.0))}
    runs[("a", "b2")]["scores"]["booookscore"] = float("nan")
    runs[("a", "b2")]["scores"]["claim_labels"]["faithful"] = float("nan")
    rows = [cell_row(outcome_of_run(s, b, json.loads(json.dumps(r)))) for (s, b), r in runs.items()]
    data = results(["a", "b"], ["b1", "b2", "b3"], rows)
    assert data["systems"]["a"]["booookscore"]["mean"] == pytest.approx(0.6)
    (pair,) = data["pairs"]
    assert pair["booookscore"]["books"] == 2 and pair["booookscore"]["diff"] == pytest.approx(0.15)
    assert pair["faithful"]["books"] == 2 and pair["faithful"]["diff"] == pytest.approx(15.0)
    json.dumps(data, allow_nan=False)

    def strict(text: str):
        def refuse(name: str):
            raise ValueError(f"{name} is not JSON")
        return json.loads(text, parse_constant=refuse)

    write_aggregate(tmp_path, ["a", "b"], ["b1", "b2", "b3"],
                    [outcome_of_run(s, b, json.loads(json.dumps(r))) for (s, b), r in runs.items()])
    lines = [strict(line) for line in (tmp_path / "cells.jsonl").read_text(encoding="utf-8").splitlines()]
    assert (lines[1]["booookscore"], lines[1]["faithful_pct"]) == (None, None)
    assert strict((tmp_path / "results.json").read_text(encoding="utf-8")) == data


def test_the_progress_line_says_one_call_and_one_cell_in_the_singular():
    clock = Clock()
    progress = SweepProgress(1, lambda: {"calls": 1}, stream=io.StringIO(), tty=False, interval=3600, clock=clock)
    progress.started = clock.now
    assert progress.line() == "sweep: 0/1 cell | 1 LM call | 0 tokens | 0s"
    progress = SweepProgress(1, lambda: {"calls": 0, "cached_calls": 1}, stream=io.StringIO(), tty=False,
                             interval=3600, clock=clock)
    progress.started = clock.now
    progress.cell_done("s/b", reused=True, earlier={"calls": 1, "prompt_tokens": 1, "completion_tokens": 0,
                                                    "cost_usd": 0.0})
    assert progress.line() == ("sweep: 1/1 cell (1 reused) | 1 LM call (1 from the cache) + 1 reused from "
                               "earlier runs | 1 token | 0s")


def test_a_cells_claim_shares_reach_the_sweep_unrounded():
    """A run's claim shares are shown to two decimals, but the sweep averages them over books: three
    books with 2 of 3 claims faithful averaged the shown 66.67 (66.67 in results.json, its interval
    from 66.67 too), where the books' share is 66.666667."""
    from booklens.pipeline import run_scores
    from booklens.records import FaithfulnessReport

    counts = {"faithful": 2, "unfaithful": 1, "partial support": 0, "can't verify": 0, "failed": 1}
    report = FaithfulnessReport(evidence_mode="book", claims=[], label_counts=counts, failures=1,
                                label_percentages={"faithful": 66.67, "unfaithful": 33.33,
                                                   "partial support": 0.0, "can't verify": 0.0})
    shares = run_scores(None, None, report)["claim_labels"]
    assert shares == {"faithful": 200 / 3, "unfaithful": 100 / 3, "partial support": 0.0, "can't verify": 0.0}
    runs = {("a", f"b{i}"): run(0.8, 0.0, calls=5) for i in range(3)}
    for r in runs.values():
        r["scores"]["claim_labels"] = shares
    rows = [cell_row(outcome_of_run(s, b, r)) for (s, b), r in runs.items()]
    system = results(["a"], ["b0", "b1", "b2"], rows)["systems"]["a"]
    assert system["claims"]["faithful"] == 66.666667
    # a record written before label counts were kept still gives its shares
    legacy = FaithfulnessReport(evidence_mode="book", label_percentages={"faithful": 50.0, "unfaithful": 50.0})
    assert run_scores(None, None, legacy)["claim_labels"] == {"faithful": 50.0, "unfaithful": 50.0}


def test_the_sweep_display_outlives_a_stream_nobody_reads():
    """The display writes to a stream of its own beside Ray (a copy of stderr): its reader gone, a
    failed cell's line or the last line raised BrokenPipeError and ended the sweep. They are dropped."""
    class Gone(io.TextIOBase):
        writes = 0

        def write(self, text):
            Gone.writes += 1
            raise BrokenPipeError(32, "Broken pipe")

    progress = SweepProgress(2, lambda: {"calls": 3}, stream=Gone(), tty=False, interval=3600, clock=Clock())
    progress.cell_done("s/b1", failed="summary: no usable summary")
    progress.cell_done("s/b2")
    progress.close()
    assert progress.done == 2 and Gone.writes == 1


def test_the_sweeps_judge_record_gives_the_range_of_demos_its_cells_showed():
    """A verifier shows as many demos as its window holds beside each book's evidence: the short
    book's cell showed all 6, the long ones 4 and 5. The first cell's record alone said 6."""
    base = {"task": "verification", "program": "default", "demos": 6}
    note = "the judge is shown 4 of its 6 demos: its 2048-token context window holds no more beside the book"
    cells = [CellOutcome("s", "short", "complete", run={"judges": {"verification": dict(base)}}),
             CellOutcome("s", "long", "complete", run={"judges": {"verification": {**base, "demos_shown": 4,
                                                                                    "demos_note": note}}}),
             CellOutcome("s", "mid", "complete", run={"judges": {"verification": {**base, "demos_shown": 5}}})]
    verification = sweep_judges(cells)["verification"]
    assert (verification["demos"], verification["demos_shown"]) == (6, 4)
    assert verification["demos_note"] == ("the judge is shown 4 to 6 of its 6 demos, by book: as many as its "
                                          "context window holds beside each book's evidence")
    # every cell showed the same: its own record, note and all
    same = sweep_judges(cells[1:2] * 2)["verification"]
    assert (same["demos_shown"], same["demos_note"]) == (4, note)
    assert "demos_shown" not in sweep_judges(cells[:1])["verification"]


def test_rerun_advice_tells_the_cells_a_rerun_retries_from_those_of_books_it_cannot_read():
    """One wording for the sweep's last line, `booklens report`'s note and the page: a rerun retries cells
    that failed at the LM (with the setting a shown failure names), not those of a book it cannot read."""
    from booklens.sweep.aggregate import rerun_advice

    def row(book: str, error: str, unreadable: bool = False) -> dict:
        return cell_row(CellOutcome("hier", book, "failed", error, unreadable=unreadable))

    lm = row("a", "summary: the server's window is too small; set --context-window 2048")
    empty, binary = row("e", "summary: the book is empty", True), row("b", "summary: not text", True)
    assert rerun_advice([empty]) == "the book 'e' cannot be read: fix it or take it out of the manifest, then rerun"
    assert rerun_advice([empty, binary], rerun="rerun the sweep") == (
        "the books 'e', 'b' cannot be read: fix them or take them out of the manifest, then rerun the sweep")
    assert rerun_advice([empty, lm]) == ("rerun with the setting it names to retry them (the cells of the book 'e' "
                                         "fail again until it is fixed)")
    # where the failure is not shown beside the advice, "the setting it names" would name nothing
    assert rerun_advice([lm], rerun="rerun the sweep", first_error_shown=False) == "rerun the sweep to retry them"
