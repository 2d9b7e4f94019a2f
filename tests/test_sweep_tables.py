"""`booklens report SWEEP_DIR --table FORMAT`: a sweep's comparison as markdown, LaTeX or CSV text,
every figure read from results.json (built here from hand-made cell records, as in
test_sweep_aggregate.py: no LM)."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from booklens.sweep.aggregate import CellOutcome, cell_row, outcome_of_run, results, write_aggregate
from booklens.sweep.tables import latex_escape, render_table
from booklens.testing import run_command

README = Path(__file__).resolve().parents[1] / "README.md"


def run(score: float, faithful: float, calls: int = 10, prompt_tokens: int = 100, summary_tokens: int = 200) -> dict:
    return {"complete": True, "failures": {}, "lm": "openai/x", "book_tokens": 1000,
            "scores": {"booookscore": score, "sentences": 10, "confusing_sentences": round(10 * (1 - score)),
                       "claims": 4, "claim_labels": {"faithful": faithful, "unfaithful": 100 - faithful,
                                                     "partial support": 0.0, "can't verify": 0.0},
                       "summary_tokens": summary_tokens, "repeated_trigrams": 1.5},
            "totals": {"calls": calls, "prompt_tokens": prompt_tokens, "completion_tokens": 10, "cost_usd": None}}


def failed_run(calls: int) -> dict:
    return {"complete": False, "failures": {"summary": "model gave no usable summary"},
            "scores": {"booookscore": None}, "totals": {"calls": calls, "prompt_tokens": 5, "completion_tokens": 0,
                                                        "cost_usd": None}}


def three_systems(names=("a", "b", "c")) -> dict:
    """a: two books (b3 failed); b: three; c: none (one failed, two not run)."""
    a, b, c = names
    outcomes = [
        outcome_of_run(a, "b1", run(0.8, 50.0, 10, 1000)),
        outcome_of_run(a, "b2", run(0.6, 75.0, 12, 1500)),
        outcome_of_run(a, "b3", failed_run(3)),
        outcome_of_run(b, "b1", run(0.9, 100.0, 20)),
        outcome_of_run(b, "b2", run(1.0, 100.0, 20)),
        outcome_of_run(b, "b3", run(0.5, 0.0, 20)),
        CellOutcome(c, "b1", "not run"),
        CellOutcome(c, "b2", "failed", "internal error: boom"),
        CellOutcome(c, "b3", "not run"),
    ]
    return results(list(names), ["b1", "b2", "b3"], [cell_row(o) for o in outcomes])


def pct(ci, scale=1.0, sign="") -> str:
    return f"[{ci[0] * scale:{sign}.1f}, {ci[1] * scale:{sign}.1f}]"


def readme_table_header() -> str:
    text = README.read_text(encoding="utf-8")
    return next(line for line in text.splitlines() if line.startswith("| system | books |"))


def test_markdown_has_the_readmes_columns_and_the_figures_of_results_json():
    data = three_systems()
    a, b = data["systems"]["a"], data["systems"]["b"]
    ab, ac, bc = data["pairs"]
    text = render_table(data, "markdown")
    lines = text.splitlines()
    assert lines[0] == readme_table_header()
    assert lines[1] == "| --- |" + " --- |" * 9
    assert lines[2] == (f"| a | 2 | 70.0 {pct(a['booookscore']['ci95'], 100)} | 62.5% {pct(a['claims_ci95']['faithful'], 1)} "
                        "| 37.5% | 0.0% | 0.0% | 200 "
                        "| 25 | 2,505 |")
    assert lines[3] == (f"| b | 3 | 80.0 {pct(b['booookscore']['ci95'], 100)} | 66.7% {pct(b['claims_ci95']['faithful'], 1)} "
                        "| 33.3% | 0.0% | 0.0% | 200 "
                        "| 60 | 300 |")
    assert lines[4] == "| c | 0 | - | - | - | - | - | - | 0 | 0 |"  # nothing completed: unknown, not 0
    assert lines[5] == ""
    assert (f"Paired difference b - a over 2 books: BooookScore +25.0 {pct(ab['booookscore']['ci95'], 100, '+')}, "
            f"faithful +37.5 {pct(ab['faithful']['ci95'], 1, '+')} points.") in lines
    assert (ac["books"], bc["books"]) == (0, 0)
    assert "Paired difference c - a over 0 books: BooookScore -, faithful - points." in lines
    assert "Paired difference c - b over 0 books: BooookScore -, faithful - points." in lines
    assert text.count("Paired difference") == 3
    # c completed nothing, a fewer books than b: the table says its rows are over different books
    assert text.endswith(" points.\n\nNote: the systems' figures are over different books (a lacks b3; c lacks b1, b2, "
                         "b3): compare them by the paired differences over the books both completed (results.json's "
                         "pairs, report.html)\n")


def test_an_unknown_interval_is_a_dash_in_markdown_and_latex_and_empty_in_csv():
    """One completed book: a mean and no interval (results.json says null)."""
    rows = [cell_row(outcome_of_run("a", "b1", run(0.8, 50.0))), cell_row(outcome_of_run("a", "b2", failed_run(1))),
            cell_row(outcome_of_run("b", "b1", run(0.9, 60.0))), cell_row(outcome_of_run("b", "b2", run(1.0, 70.0)))]
    data = results(["a", "b"], ["b1", "b2"], rows)
    assert data["systems"]["a"]["booookscore"]["ci95"] is None and data["pairs"][0]["booookscore"]["ci95"] is None
    markdown = render_table(data, "markdown")
    assert "| a | 1 | 80.0 [-, -] | 50.0% [-, -] |" in markdown
    assert "Paired difference b - a over 1 book: BooookScore +10.0 [-, -], faithful +10.0 [-, -] points." in markdown
    assert "a & 1 & 80.0 [-, -] & 50.0\\% [-, -] &" in render_table(data, "latex")
    (row_a, _) = csv.DictReader(io.StringIO(render_table(data, "csv")))
    assert (row_a["booookscore"], row_a["booookscore_lo"], row_a["booookscore_hi"]) == ("0.8", "", "")
    (pair,) = csv.DictReader(io.StringIO(render_table(data, "csv-pairs")))
    assert (pair["booookscore_diff_lo"], pair["booookscore_diff_hi"], pair["books"]) == ("", "", "1")


def test_latex_is_a_booktabs_tabular_with_the_names_escaped():
    names = ("hier_512", "50% & #1", "cost $5 {x}")
    data = three_systems(names)
    a = data["systems"][names[0]]
    text = render_table(data, "latex")
    tables = text.split("\n\n")
    assert len(tables) == 3 and tables[2].startswith("% note: the systems' figures are over different books")
    lines = tables[0].splitlines()
    assert lines[0] == "\\begin{tabular}{lrrrrrrrrr}" and lines[1] == "\\toprule"
    assert lines[2] == ("system & books & BooookScore [95\\% CI] & faithful [95\\% CI] & unfaithful & partial support & "
                        "can't verify & summary tokens & LM calls & prompt tokens \\\\")
    assert lines[3] == "\\midrule"
    assert lines[4] == (f"hier\\_512 & 2 & 70.0 {pct(a['booookscore']['ci95'], 100)} & 62.5\\% "
                        f"{pct(a['claims_ci95']['faithful'], 1)} & 37.5\\% & 0.0\\% & "
                        "0.0\\% & 200 & 25 & 2,505 \\\\")
    assert lines[5].startswith("50\\% \\& \\#1 & 3 & 80.0 [")
    assert lines[6] == "cost \\$5 \\{x\\} & 0 & - & - & - & - & - & - & 0 & 0 \\\\"
    assert lines[7:] == ["\\bottomrule", "\\end{tabular}"]
    pairs = tables[1].splitlines()
    assert pairs[0] == "\\begin{tabular}{lrrr}" and pairs[1] == "\\toprule"
    assert pairs[2] == ("pair (b - a) & books & $\\Delta$ BooookScore [95\\% CI] & "
                        "$\\Delta$ faithful [95\\% CI] (points) \\\\")
    assert pairs[4].startswith("50\\% \\& \\#1 - hier\\_512 & 2 & +25.0 [+")
    assert pairs[6] == "cost \\$5 \\{x\\} - 50\\% \\& \\#1 & 0 & - & - \\\\"
    assert pairs[-2:] == ["\\bottomrule", "\\end{tabular}"]
    # the rows are over different books (the third system completed none): said in a comment after the
    # tables, as written (LaTeX reads nothing in a comment)
    assert text.endswith("\\end{tabular}\n\n% note: the systems' figures are over different books (hier_512 lacks "
                         "b3; cost $5 {x} lacks b1, b2, b3): compare them by the paired differences over the "
                         "books both completed (results.json's pairs, report.html)\n")


def test_csv_reads_back_to_the_numbers_of_results_json():
    names = ("plain", 'with, comma and "quotes"', "c")
    data = three_systems(names)
    text = render_table(data, "csv")
    assert text.endswith("\r\n")  # RFC 4180 line ends
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert [r["system"] for r in rows] == list(names)
    header = list(rows[0])
    assert header[:5] == ["system", "books", "booookscore", "booookscore_lo", "booookscore_hi"]
    assert header[-3:] == ["summary_tokens", "calls", "prompt_tokens"]
    labels = {"faithful": "faithful_pct", "unfaithful": "unfaithful_pct", "partial support": "partial_support_pct",
              "can't verify": "cant_verify_pct"}
    for row in rows:
        s = data["systems"][row["system"]]

        def number(text: str):
            return None if text == "" else float(text)

        assert int(row["books"]) == s["books"]
        assert number(row["booookscore"]) == s["booookscore"]["mean"]
        ci = s["booookscore"]["ci95"] or [None, None]
        assert [number(row["booookscore_lo"]), number(row["booookscore_hi"])] == ci
        for label, column in labels.items():
            assert number(row[column]) == s["claims"][label]
            ci = s["claims_ci95"][label] or [None, None]
            assert [number(row[column + "_lo"]), number(row[column + "_hi"])] == ci
        assert number(row["summary_tokens"]) == s["summary_tokens"]
        assert int(row["calls"]) == s["usage"]["calls"] and int(row["prompt_tokens"]) == s["usage"]["prompt_tokens"]
    assert rows[2]["booookscore"] == "" and rows[2]["faithful_pct"] == ""  # unknown: empty, not 0

    pairs = list(csv.DictReader(io.StringIO(render_table(data, "csv-pairs"), newline="")))
    assert [(p["a"], p["b"]) for p in pairs] == [(p["a"], p["b"]) for p in data["pairs"]]
    for row, pair in zip(pairs, data["pairs"]):
        assert int(row["books"]) == pair["books"]
        for figure in ("booookscore", "faithful"):
            d = pair[figure]
            if d is None:
                assert row[f"{figure}_books"] == row[f"{figure}_diff"] == row[f"{figure}_diff_lo"] == ""
                continue
            assert int(row[f"{figure}_books"]) == d["books"] and float(row[f"{figure}_diff"]) == d["diff"]
            assert [float(row[f"{figure}_diff_lo"]), float(row[f"{figure}_diff_hi"])] == d["ci95"]


def test_a_difference_the_page_marks_is_bold_in_markdown_and_latex():
    """The page's rule: an interval that excludes 0 over 6 books or more."""
    def pair_data(n: int) -> dict:
        rows = [cell_row(outcome_of_run(system, f"b{i}", run(score + i / 100, 50.0 + 10 * (system == "b"))))
                for i in range(n) for system, score in (("a", 0.5), ("b", 0.6))]
        return results(["a", "b"], [f"b{i}" for i in range(n)], rows)

    few, many = pair_data(5), pair_data(6)
    assert "BooookScore +10.0 [+10.0, +10.0], faithful +10.0 [+10.0, +10.0] points" in render_table(few, "markdown")
    assert ("BooookScore **+10.0** [+10.0, +10.0], faithful **+10.0** [+10.0, +10.0] points"
            in render_table(many, "markdown"))
    assert "b - a & 5 & +10.0 [+10.0, +10.0] & +10.0 [+10.0, +10.0] \\\\" in render_table(few, "latex")
    assert ("b - a & 6 & \\textbf{+10.0} [+10.0, +10.0] & \\textbf{+10.0} [+10.0, +10.0] \\\\"
            in render_table(many, "latex"))


def test_one_system_has_no_pairs():
    data = results(["a"], ["b1"], [cell_row(outcome_of_run("a", "b1", run(0.5, 50.0)))])
    assert "Paired" not in render_table(data, "markdown")
    assert render_table(data, "latex").count("\\begin{tabular}") == 1
    assert render_table(data, "csv-pairs").splitlines()[0].startswith("a,b,books,")
    assert len(render_table(data, "csv-pairs").splitlines()) == 1


def test_the_readmes_embedded_model_table_is_what_the_export_prints_for_those_figures():
    """README's table and its paired line come out of `--table markdown` for a sweep with its figures."""
    rows = []
    # the cells' figures of that run (cells.jsonl): summary tokens, LM calls and prompt tokens per book
    for system, tokens, calls, prompts in (("hier-512", (64, 31), (10, 9), (21_423, 15_985)),
                                           ("inc-512", (156, 128), (24, 28), (79_931, 59_493))):
        for book, t, c, p in zip(("the_cask_of_amontillado", "sample_story"), tokens, calls, prompts):
            rows.append(cell_row(outcome_of_run(system, book, run(1.0, 100.0, c, p, t))))
    data = results(["hier-512", "inc-512"], ["the_cask_of_amontillado", "sample_story"], rows)
    readme = README.read_text(encoding="utf-8")
    for line in render_table(data, "markdown").splitlines():
        if line:
            assert line in readme.splitlines(), line


def sweep_dir(tmp_path: Path, names=("a", "b")) -> Path:
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text("{}")
    outcomes = [outcome_of_run(names[0], "b1", run(0.8, 50.0)), outcome_of_run(names[0], "b2", failed_run(2)),
                outcome_of_run(names[1], "b1", run(0.9, 60.0)), outcome_of_run(names[1], "b2", run(1.0, 70.0))]
    write_aggregate(out, list(names), ["b1", "b2"], outcomes)
    return out


def listing(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fmt", ["markdown", "latex", "csv", "csv-pairs"])
def test_report_table_prints_the_tables_of_results_json_and_writes_nothing(tmp_path, fmt):
    out = sweep_dir(tmp_path)
    before = listing(out)
    proc = run_command(["report", out, "--table", fmt])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == render_table(json.loads((out / "results.json").read_text()), fmt)
    assert listing(out) == before and not (out / "report.html").exists()
    # a lacks b2, which b completed: the rows are over different books, said apart from the table
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("note: the systems' figures are over different "
                                                                   "books (a lacks b2)")
    # and in the text a paper takes (LaTeX as a comment): a table of rows over different books says so
    note = {"markdown": "\nNote: the systems' figures are over different books (a lacks b2)",
            "latex": "\n% note: the systems' figures are over different books (a lacks b2)"}.get(fmt)
    assert (note is not None and note in proc.stdout) or (note is None and "different books" not in proc.stdout)


def test_report_table_needs_a_finished_sweep(tmp_path):
    out = sweep_dir(tmp_path)
    proc = run_command(["report", out, "--table", "html"])
    # (typer words a choice it refuses as a pydantic error: 'Value error, ' is no part of the message)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == (
        "error: Invalid value for '--table': 'html' is not one of 'markdown', 'latex', 'csv', 'csv-pairs'. "
        "(see booklens report --help)\n"), proc.stderr
    proc = run_command(["report", out, "--table", "csv", "-o", tmp_path / "page.html"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "-o" in proc.stderr
    assert not (tmp_path / "page.html").exists()
    # A sweep stopped before it wrote results.json has no figures to print.
    (out / "results.json").unlink()
    (out / "cells.jsonl").unlink()
    proc = run_command(["report", out, "--table", "markdown"])
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: ") and "results.json" in proc.stderr
    assert not (out / "report.html").exists()
    # A run directory (one book) has no comparison.
    single = tmp_path / "run"
    single.mkdir()
    (single / "run.json").write_text("{}")
    proc = run_command(["report", single, "--table", "markdown"])
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "run directory" in proc.stderr and "sweep" in proc.stderr
    # Neither kind, or not there at all.
    for folder in (tmp_path / "empty", tmp_path / "nowhere"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        proc = run_command(["report", folder, "--table", "csv"])
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "sweep.json" in proc.stderr, proc.stderr


def test_report_table_on_a_results_json_of_another_layout_is_one_line(tmp_path):
    out = sweep_dir(tmp_path)
    data = json.loads((out / "results.json").read_text())
    data["systems"]["a"]["usage"]["calls"] = "x"
    (out / "results.json").write_text(json.dumps(data))
    proc = run_command(["report", out, "--table", "markdown"])
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    (out / "results.json").write_text("{")
    proc = run_command(["report", out, "--table", "latex"])
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("fmt", ["markdown", "latex", "csv", "csv-pairs"])
@pytest.mark.parametrize("where", ["mean", "interval", "pair"])
def test_report_table_refuses_a_figure_that_is_no_number_in_every_format(tmp_path, fmt, where):
    """NaN or infinity is no figure (booklens writes none; Python's json reads them): every format
    refuses the file alike, rather than markdown and LaTeX printing 'nan' into a paper's table."""
    out = sweep_dir(tmp_path)
    data = json.loads((out / "results.json").read_text())
    if where == "mean":
        data["systems"]["b"]["booookscore"]["mean"] = float("nan")
    elif where == "interval":
        data["systems"]["b"]["claims_ci95"]["faithful"] = [60.0, float("inf")]
    else:
        data["pairs"][0]["faithful"]["diff"] = float("nan")
    (out / "results.json").write_text(json.dumps(data))
    proc = run_command(["report", out, "--table", fmt])
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "results.json" in proc.stderr


@pytest.mark.parametrize("fmt", ["csv", "latex"])
def test_report_table_loads_no_heavy_library(tmp_path, fmt):
    """Nor do the judges' lines (latex) need one."""
    out = sweep_dir(tmp_path)
    data = json.loads((out / "results.json").read_text())
    data["judges"] = {"verification": {"task": "verification", "mode": "four-way", "program": "default",
                                       "program_sha256": "ab" * 32, "demos": 6, "lm": "local/model"}}
    (out / "results.json").write_text(json.dumps(data))
    probe = ("import sys\nsys.argv = ['booklens', 'report', sys.argv[1], '--table', sys.argv[2]]\n"
             "import booklens.cli\ntry:\n    booklens.cli.main()\nexcept SystemExit:\n    pass\n"
             "heavy = ('dspy', 'litellm', 'torch', 'faiss', 'numpy', 'tiktoken', 'llama_cpp', 'ray')\n"
             "print('HEAVY', sorted(m for m in heavy if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(out), fmt], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr
    first = {"csv": "system,books,", "latex": "\\begin{tabular}"}[fmt]
    assert proc.stdout.startswith(first), proc.stdout + proc.stderr
    assert ("% judge: " in proc.stdout) == (fmt == "latex"), proc.stdout


def test_readme_documents_the_table_export():
    readme = README.read_text(encoding="utf-8")
    assert re.search(r"booklens report \S+ --table markdown", readme)
    help_text = run_command(["report", "--help"]).stdout
    assert "--table" in help_text and "csv-pairs" in help_text


def test_the_judges_agreement_goes_with_the_tables():
    """A table of judge scores is read with how far the judges agree with humans: markdown and LaTeX end
    with the lines the sweep printed for its judges (LaTeX as comments), CSV holds figures only."""
    from booklens.judges import judge_line
    from booklens.records import JudgeInfo

    data = three_systems()
    info = {"task": "verification", "mode": "four-way", "program": "default", "program_sha256": "302c1e22" * 8,
            "demos": 6, "lm": "local/model", "evidence": "bm25",
            "warning": "low agreement: this judge found 0 of 4 unfaithful claims"}
    data["judges"] = {"verification": info}
    lines = judge_line(JudgeInfo.model_validate(info)).splitlines()
    assert len(lines) == 2 and lines[0].startswith("judge: ") and lines[1].startswith("warning: low agreement")
    markdown = render_table(data, "markdown").splitlines()
    assert markdown[-len(lines):] == [f"- {line}" for line in lines]
    latex = render_table(data, "latex").splitlines()
    assert latex[-len(lines):] == [f"% {line}" for line in lines]
    assert "judge" not in render_table(data, "csv") and "judge" not in render_table(data, "csv-pairs")
    data["judges"] = {}
    assert not any(line.startswith("- judge") for line in render_table(data, "markdown").splitlines())


@pytest.mark.parametrize("name, escaped", [("hier--2048", "hier-{}-2048"), ("a---b", "a-{}-{}-b"), ("inc-1", "inc-1"),
                                           ("--x-", "-{}-x-")])
def test_dashes_in_a_name_stay_hyphens_in_latex(name, escaped):
    """LaTeX prints `--` as an en dash and `---` as an em dash: a system named hier--2048 would come out
    as hier–2048 in the paper."""
    assert latex_escape(name) == escaped
    data = three_systems((name, "b", "c"))
    assert f"\n{escaped} & " in render_table(data, "latex")


def test_books_no_system_completed_are_said_to_be_left_out(tmp_path):
    """A book whose cells failed in every system is in no row and no one's `missing_books`: the tables
    would read as a sweep of the books they count. results.json names those books, and every text
    format says which are left out, as the sweep itself does when it ends."""
    outcomes = [outcome_of_run(s, b, run(0.8, 50.0)) for s in ("a", "b") for b in ("b1", "b2")]
    outcomes += [outcome_of_run("a", "b3", failed_run(2)), CellOutcome("b", "b3", "not run"),
                 outcome_of_run("a", "b4", failed_run(1)), outcome_of_run("b", "b4", failed_run(1))]
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text("{}")
    data = write_aggregate(out, ["a", "b"], ["b1", "b2", "b3", "b4"], outcomes)
    assert json.loads((out / "results.json").read_text())["books_left_out"] == ["b3", "b4"]
    line = ("2 of the 4 books (b3, b4) have no completed cell (their cells failed or did not run): every system's "
            "figures leave them out (cells.jsonl says why)")
    assert render_table(data, "markdown").endswith(f" points.\n\nNote: {line}\n")
    assert render_table(data, "latex").endswith(f"\\end{{tabular}}\n\n% note: {line}\n")
    for fmt in ("markdown", "csv"):
        proc = run_command(["report", out, "--table", fmt])
        assert proc.returncode == 0 and proc.stderr == f"note: {line}\n", proc.stderr
    # one such book is said in the singular, its key escaped as the table's names are; a sweep whose
    # every book has a completed cell says nothing
    rows = [cell_row(o) for o in outcomes if o.book in ("b1", "b3")]
    one = results(["a", "b"], ["b1", "b_3"], [{**r, "book": "b_3"} if r["book"] == "b3" else r for r in rows])
    assert "Note: 1 of the 2 books (b\\_3) has no completed cell (its cells failed or did not run): every " \
           "system's figures leave it out (cells.jsonl says why)\n" in render_table(one, "markdown")
    full = results(["a", "b"], ["b1", "b2"], [cell_row(o) for o in outcomes if o.book in ("b1", "b2")])
    assert full["books_left_out"] == []
    assert "Note" not in render_table(full, "markdown") and "note" not in render_table(full, "latex")
    # a results.json written before it named them gives how many, from the systems' counts; one written
    # before systems named their missing books cannot tell: nothing is said rather than a guess
    unnamed = {k: v for k, v in data.items() if k != "books_left_out"}
    assert "Note: 2 of the 4 books have no completed cell (their" in render_table(unnamed, "markdown")
    older = {**unnamed, "systems": {name: {k: v for k, v in s.items() if k != "missing_books"}
                                    for name, s in data["systems"].items()}}
    assert "no completed cell" not in render_table(older, "markdown")


def test_sentences_and_claims_the_judges_left_unjudged_are_said_with_the_tables(tmp_path):
    """A sentence or claim the judge gave no valid verdict on is left out of its cell's scores (the
    sweep's line and page say so): a table for a paper, whose figures may be 100 only because the
    unjudged sentence was the confusing one, says so too, in every format."""
    unsure = run(1.0, 100.0)
    unsure["scores"].update(failed_sentences=2, failed_claims=1)
    once = run(1.0, 100.0)
    once["scores"].update(failed_sentences=0, failed_claims=1)
    outcomes = [outcome_of_run("a", "b1", unsure), outcome_of_run("a", "b2", run(0.9, 100.0)),
                outcome_of_run("b", "b1", once), outcome_of_run("b", "b2", run(0.8, 50.0))]
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text("{}")
    data = write_aggregate(out, ["a", "b"], ["b1", "b2"], outcomes)
    line = ("the judges gave no valid verdict on some sentences or claims of completed cells, which are left out of "
            "the scores: a: 2 sentences and 1 claim; b: 1 claim")
    assert render_table(data, "markdown").endswith(f" points.\n\nNote: {line}\n")
    assert render_table(data, "latex").endswith(f"\\end{{tabular}}\n\n% note: {line}\n")
    for fmt in ("markdown", "csv"):
        proc = run_command(["report", out, "--table", fmt])
        assert proc.returncode == 0 and proc.stderr == f"note: {line}\n", proc.stderr


def test_names_and_book_keys_are_plain_text_in_markdown():
    """A system name or book key with markdown's markup characters (`*`, `_`, backticks, `<`, `|`,
    brackets) rendered as emphasis, code, a tag or a link where the markdown was pasted, or (`|`)
    split a table row: each is escaped, in the rows, the pairs' lines and the notes alike."""
    names = ("*bold*", "hier_512_x", "`c` <b> [l](u) | ~~s~~ &amp;")
    unsure = run(1.0, 100.0)
    unsure["scores"].update(failed_sentences=0, failed_claims=1)  # said in a note, by system name
    outcomes = [outcome_of_run(names[0], "key_*1*", run(0.8, 50.0)), outcome_of_run(names[0], "b2", run(0.6, 75.0)),
                outcome_of_run(names[1], "key_*1*", failed_run(2)), outcome_of_run(names[1], "b2", run(0.9, 100.0)),
                outcome_of_run(names[2], "key_*1*", unsure), outcome_of_run(names[2], "b2", run(0.5, 0.0))]
    data = results(list(names), ["key_*1*", "b2"], [cell_row(o) for o in outcomes])
    text = render_table(data, "markdown")
    escaped = {names[0]: "\\*bold\\*", names[1]: "hier\\_512\\_x",
               names[2]: "\\`c\\` \\<b\\> \\[l\\](u) \\| \\~\\~s\\~\\~ \\&amp;"}
    lines = text.splitlines()
    for line, name in zip(lines[2:5], names):
        assert line.startswith(f"| {escaped[name]} | ") and line.count(" | ") == 9, line
    assert f"Paired difference {escaped[names[1]]} - {escaped[names[0]]} over 1 book: " in text
    assert f"Paired difference {escaped[names[2]]} - {escaped[names[1]]} over 1 book: " in text
    assert f"({escaped[names[1]]} lacks key\\_\\*1\\*)" in text  # the note on rows over different books
    assert f"scores: {escaped[names[2]]}: " in text  # the note on what the judges left unjudged
    # no name or key is left as it was anywhere in the markdown
    assert not any(name in text for name in (*names, "key_*1*"))


def test_angle_brackets_and_bars_in_a_name_print_as_themselves_in_latex():
    """LaTeX's default font encoding prints `<`, `>` and `|` in text as ¡, ¿ and an em dash: a system
    named a<b|c came out as a¡b—c in the paper."""
    assert latex_escape("a<b>|c") == "a\\textless{}b\\textgreater{}\\textbar{}c"
    data = three_systems(("a<b>|c", "b", "c"))
    assert "\na\\textless{}b\\textgreater{}\\textbar{}c & 2 & " in render_table(data, "latex")


def b3_unverified() -> tuple[list, dict]:
    """Cell rows and results of a and b over b1-b3, where every claim of b's b3 went unverified."""
    unverified = run(0.5, 0.0)
    unverified["scores"].update({"claims": 4, "failed_claims": 4})
    outcomes = [outcome_of_run("a", k, run(0.6, 50.0)) for k in ("b1", "b2", "b3")]
    outcomes += [outcome_of_run("b", "b1", run(0.7, 60.0)), outcome_of_run("b", "b2", run(0.8, 80.0)),
                 outcome_of_run("b", "b3", unverified)]
    rows = [cell_row(o) for o in outcomes]
    return rows, results(["a", "b"], ["b1", "b2", "b3"], rows)


def test_a_difference_over_fewer_books_than_the_pair_shares_says_how_many():
    """Both systems completed three books, but every claim of b's b3 went unverified: the faithful
    difference is over two books, and the tables and the page must not call it one over three."""
    from booklens.sweep.report import render_sweep_report

    rows, data = b3_unverified()
    (pair,) = data["pairs"]
    assert (pair["books"], pair["booookscore"]["books"], pair["faithful"]["books"]) == (3, 3, 2)
    assert pair["faithful"]["diff"] == pytest.approx(20.0)
    markdown = render_table(data, "markdown")
    assert (f"Paired difference b - a over 3 books: BooookScore +6.7 {pct(pair['booookscore']['ci95'], 100, '+')}, "
            f"faithful +20.0 {pct(pair['faithful']['ci95'], 1, '+')} points (over 2 books).") in markdown
    latex = render_table(data, "latex")
    assert f"+20.0 {pct(pair['faithful']['ci95'], 1, '+')} (over 2 books) \\\\" in latex
    page = render_sweep_report(data, rows, title="t")
    assert "(over 2 books)" in page


def test_a_systems_figure_over_fewer_books_than_it_completed_says_how_many():
    """b completed three books but every claim of b3 went unverified: its % faithful is a mean over
    two books, which its row (three books) must say, in results.json, the tables and the page."""
    from booklens.sweep.report import render_sweep_report

    rows, data = b3_unverified()
    a, b = data["systems"]["a"], data["systems"]["b"]
    assert (a["books"], a["booookscore"]["books"], a["claims_books"]) == (3, 3, 3)
    assert (b["books"], b["booookscore"]["books"], b["claims_books"]) == (3, 3, 2)
    assert b["claims"]["faithful"] == pytest.approx(70.0)
    markdown = render_table(data, "markdown")
    assert f"| b | 3 | 66.7 {pct(b['booookscore']['ci95'], 100)} | 70.0% {pct(b['claims_ci95']['faithful'])} " \
           "(over 2 books) | 30.0% |" in markdown
    assert f"| a | 3 | 60.0 {pct(a['booookscore']['ci95'], 100)} | 50.0% {pct(a['claims_ci95']['faithful'])} " \
           "| 50.0% |" in markdown  # every figure over its 3 books
    page = render_sweep_report(data, rows, title="t")
    assert page.count("(over 2 books)") == 2  # b's row, and the pair's faithful difference
    # results.json of an earlier booklens (no per-figure counts) still renders, with no count
    del b["claims_books"], b["booookscore"]["books"]
    assert "(over" not in render_table(data, "markdown").split("Paired")[0]


def test_the_commands_line_for_a_system_says_a_score_over_fewer_books_than_it_completed():
    unverified = run(0.5, 0.0)
    unverified["scores"].update({"claims": 4, "failed_claims": 4})
    outcomes = [outcome_of_run("b", "b1", run(0.7, 60.0)), outcome_of_run("b", "b2", run(0.8, 80.0)),
                outcome_of_run("b", "b3", unverified), outcome_of_run("b", "b4", failed_run(1))]
    data = results(["b"], ["b1", "b2", "b3", "b4"], [cell_row(o) for o in outcomes])
    from booklens.sweep.report import system_line

    b = data["systems"]["b"]
    assert system_line("b", b) == (f"b: 3 books, 1 failed; BooookScore 66.7 {pct(b['booookscore']['ci95'], 100)}; "
                                   f"70.0% faithful {pct(b['claims_ci95']['faithful'], 1)} (over 2 books) "
                                   "(4 claims not judged, left out)")
    # over one book there is no interval, and none is shown
    one = results(["b"], ["b1"], [cell_row(outcomes[0])])["systems"]["b"]
    assert system_line("b", one) == "b: 1 book; BooookScore 70.0; 60.0% faithful"
