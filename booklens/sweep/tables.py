"""A sweep's comparison as text to paste into a paper or a README (`booklens report DIR --table`),
made from `results.json` alone:

- `markdown`: the systems' table (the columns of README's sweep table) and a line per pair of
  systems with the paired differences (names and book keys escaped);
- `latex`: the same two tables as booktabs `tabular`s (names escaped, `\\%` for percents);
- `csv`: one row per system with the raw figures of results.json, an interval as `_lo`/`_hi` columns;
- `csv-pairs`: one row per pair of systems, the same way.

The figures are written as the sweep's page writes them (`booklens.sweep.report.system_cells`): a
figure that is not known is `-` (empty in CSV), a difference the page marks is bold.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import Any, Callable, Optional

from booklens.sweep import TABLE_FORMATS
from booklens.vocabulary import CLAIM_LABELS, counted

# The claim labels' shares; faithful, the headline figure, with its interval as on the page.
HEADER = ("system", "books", "BooookScore [95% CI]", "faithful [95% CI]", *CLAIM_LABELS[1:], "summary tokens",
          "LM calls", "prompt tokens")
PAIR_HEADER = ("pair (b - a)", "books", "$\\Delta$ BooookScore [95% CI]", "$\\Delta$ faithful [95% CI] (points)")
NO_INTERVAL = "[-, -]"
# The pairs' figures, each with its scale in the text tables (BooookScore x100, faithful in points).
PAIR_FIGURES = (("booookscore", 100), ("faithful", 1))
_LATEX = {"\\": "\\textbackslash{}", "{": "\\{", "}": "\\}", "_": "\\_", "%": "\\%", "&": "\\&", "#": "\\#",
          "$": "\\$", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}",
          # the default font encoding prints these three as the glyphs of other characters (¡, ¿, —)
          "<": "\\textless{}", ">": "\\textgreater{}", "|": "\\textbar{}"}
_MARKDOWN = re.compile(r"[\\`*_\[\]<>|~&]")


def latex_escape(text: str) -> str:
    """`text` as LaTeX prints it: the characters it reads as markup escaped (a leading `[` braced,
    or the row's `\\\\` before it would take it for an option), and dashes kept apart (LaTeX prints
    `--` as an en dash)."""
    escaped = re.sub(r"-(?=-)", "-{}", "".join(_LATEX.get(ch, ch) for ch in text))
    return "{}" + escaped if escaped.startswith("[") else escaped


def markdown_escape(text: str) -> str:
    """A name or book key as markdown prints it: every character markdown may read as markup
    (emphasis, code, a tag, a link, an entity, or `|`, which would split a table row) backslashed."""
    return _MARKDOWN.sub(r"\\\g<0>", text)


def _system_row(name: str, system: dict[str, Any]) -> list[str]:
    from booklens.sweep.report import system_cells

    cells = system_cells(system)
    score = cells["booookscore"]
    if score != "-":
        score = f"{score} {cells['booookscore_ci'] or NO_INTERVAL}{cells['booookscore_over']}"
    shares = [cells[label] + ("%" if cells[label] != "-" else "") for label in CLAIM_LABELS]
    if shares[0] != "-":
        shares[0] = f"{shares[0]} {cells['faithful_ci'] or NO_INTERVAL}{cells['faithful_over']}"
    return [name, cells["books"], score, *shares, cells["summary_tokens"], cells["calls"], cells["prompt_tokens"]]


def _difference(d: Optional[dict[str, Any]], scale: float, bold: Callable[[str], str]) -> str:
    """A paired difference and its interval ('+2.5 [+0.4, +4.6]'), the difference bold where the page marks it."""
    from booklens.sweep.report import figure_text, interval_text, is_marked

    if not d:
        return "-"
    value = figure_text(d["diff"], scale, signed=True)
    return f"{bold(value) if is_marked(d) else value} {interval_text(d.get('ci95'), scale, signed=True) or NO_INTERVAL}"


def pair_line(pair: dict[str, Any], name: Callable[[str], str] = str,
              bold: Callable[[str], str] = lambda value: value) -> str:
    """One pair of results.json's `pairs` as a sentence: the paired differences (second system minus
    first) with their intervals, a figure over fewer books than the pair completed saying so. `name`
    writes a system's name and `bold` a difference the page marks (markdown's `**`; the terminal
    leaves both as they are)."""
    from booklens.sweep.report import fewer_books_text

    score, faithful = (_difference(pair[key], scale, bold) for key, scale in PAIR_FIGURES)
    score_over, faithful_over = (fewer_books_text(pair[key], pair["books"]) for key, _ in PAIR_FIGURES)
    return (f"Paired difference {name(pair['b'])} - {name(pair['a'])} over {counted(pair['books'], 'book')}: "
            f"BooookScore {score}{score_over}, faithful {faithful} points{faithful_over}.")


def _judge_lines(results: dict[str, Any]) -> list[str]:
    """The lines the sweep printed for its judges: each one's program, LM and agreement with human
    annotators, and its warning, so a table of their scores travels with how far to trust them."""
    from booklens.judges import judge_line
    from booklens.records import JudgeInfo

    return [line for info in (results.get("judges") or {}).values()
            for line in judge_line(JudgeInfo.model_validate(info)).splitlines()]


def _notes(results: dict[str, Any], name: Callable[[str], str] = str) -> list[str]:
    """The lines on what the figures leave out: when the systems' figures are over different books
    (the line the sweep printed; a table pasted without it would read as a like-for-like comparison),
    when no system completed some books (a table would read as the whole corpus's) and the sentences
    and claims the judges left unjudged (a score may be high only because they are left out). `name`
    writes a system's name or a book's key."""
    from booklens.sweep.report import books_left_out_line, different_books_line, unjudged_line

    return [line for line in (different_books_line(results["systems"], name), books_left_out_line(results, name),
                              unjudged_line(results["systems"], name)) if line]


def _markdown(results: dict[str, Any]) -> str:
    rows = [HEADER, ["---"] * len(HEADER)]
    rows += [_system_row(markdown_escape(name), s) for name, s in results["systems"].items()]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    for p in results.get("pairs") or []:
        lines += ["", pair_line(p, markdown_escape, lambda v: f"**{v}**")]
    for note in _notes(results, markdown_escape):
        lines += ["", f"Note: {note}"]
    judges = _judge_lines(results)
    if judges:
        lines += ["", *(f"- {line}" for line in judges)]
    return "\n".join(lines) + "\n"


def _tabular(header: tuple[str, ...], rows: list[list[str]]) -> str:
    lines = [f"\\begin{{tabular}}{{l{'r' * (len(header) - 1)}}}", "\\toprule",
             " & ".join(header) + " \\\\", "\\midrule", *(" & ".join(row) + " \\\\" for row in rows),
             "\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def _latex(results: dict[str, Any]) -> str:
    header = tuple(latex_escape(title) for title in HEADER)
    rows = [[latex_escape(cell) for cell in _system_row(name, s)] for name, s in results["systems"].items()]
    tables = [_tabular(header, rows)]
    pairs = results.get("pairs") or []
    if pairs:
        from booklens.sweep.report import fewer_books_text

        # The titles' $\Delta$ is markup: only their percent sign is escaped.
        pair_header = tuple(title.replace("%", "\\%") for title in PAIR_HEADER)
        pair_rows = [[latex_escape(f"{p['b']} - {p['a']}"), latex_escape(str(p["books"])),
                      *(_difference(p[key], scale, lambda v: f"\\textbf{{{v}}}") + fewer_books_text(p[key], p["books"])
                        for key, scale in PAIR_FIGURES)]
                     for p in pairs]
        tables.append(_tabular(pair_header, pair_rows))
    # comments: LaTeX prints none of it, the one who pastes the table reads it
    comments = [f"note: {note}" for note in _notes(results)] + _judge_lines(results)
    if comments:
        tables.append("".join(f"% {line}\n" for line in comments))
    return "\n".join(tables)


def _raw(value: Any) -> Any:
    """A figure of results.json as it goes into a CSV cell: a number, or None (an empty cell)."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
        return value
    raise TypeError(f"not a figure: {value!r}")


def _bounds(ci: Any) -> list[Any]:
    if ci is None:
        return [None, None]
    lo, hi = ci
    return [_raw(lo), _raw(hi)]


def _csv(header: list[str], rows: list[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)  # RFC 4180: a field with a comma, quote or line break is quoted, lines end in CRLF
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def _systems_csv(results: dict[str, Any]) -> str:
    from booklens.sweep.aggregate import LABEL_COLUMNS

    header = ["system", "books", "booookscore", "booookscore_lo", "booookscore_hi"]
    for label in CLAIM_LABELS:
        header += [LABEL_COLUMNS[label], LABEL_COLUMNS[label] + "_lo", LABEL_COLUMNS[label] + "_hi"]
    header += ["summary_tokens", "calls", "prompt_tokens"]
    rows = []
    for name, s in results["systems"].items():
        intervals = s.get("claims_ci95") or {}
        row = [name, _raw(s["books"]), _raw(s["booookscore"]["mean"]), *_bounds(s["booookscore"]["ci95"])]
        for label in CLAIM_LABELS:
            row += [_raw(s["claims"].get(label)), *_bounds(intervals.get(label))]
        row += [_raw(s["summary_tokens"]), _raw(s["usage"]["calls"]), _raw(s["usage"]["prompt_tokens"])]
        rows.append(row)
    return _csv(header, rows)


def _pairs_csv(results: dict[str, Any]) -> str:
    header = ["a", "b", "books"]
    for key, _ in PAIR_FIGURES:
        header += [f"{key}_books", f"{key}_diff", f"{key}_diff_lo", f"{key}_diff_hi"]
    rows = []
    for p in results.get("pairs") or []:
        row = [str(p["a"]), str(p["b"]), _raw(p["books"])]
        for key, _ in PAIR_FIGURES:
            d = p[key]
            row += [None] * 4 if d is None else [_raw(d["books"]), _raw(d["diff"]), *_bounds(d.get("ci95"))]
        rows.append(row)
    return _csv(header, rows)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "markdown": _markdown, "latex": _latex, "csv": _systems_csv, "csv-pairs": _pairs_csv}
assert tuple(RENDERERS) == TABLE_FORMATS


def _check_finite(value: Any) -> None:
    """Raise ValueError for NaN or infinity anywhere in `value`: no figure booklens writes, but
    Python's json reads them, and the text tables would print 'nan' where CSV refuses it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"not a figure: {value!r}")
    for item in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
        _check_finite(item)


def render_table(results: dict[str, Any], fmt: str) -> str:
    """The tables of a sweep's results (results.json as a dict) as `fmt` text (`TABLE_FORMATS`)."""
    if fmt not in RENDERERS:
        raise ValueError(f"unknown table format {fmt!r}; one of {', '.join(TABLE_FORMATS)}")
    _check_finite([results.get("systems"), results.get("pairs")])  # every format refuses the same files
    return RENDERERS[fmt](results)


def sweep_table(sweep_dir: str | Path, fmt: str, *, notify: Optional[Callable[[str], None]] = None) -> str:
    """The tables of the sweep directory `sweep_dir` as `fmt` text, from its results.json; one-line
    `BooklensError`s for a directory that is no finished sweep's. Writes nothing. `notify` gets the
    lines on what the figures leave out (`_notes`)."""
    from booklens.errors import BooklensError, setting_name
    from booklens.records import read_json_file
    from booklens.reports import RUN_FILE
    from booklens.sweep import PLAN_FILE
    from booklens.sweep.aggregate import RESULTS_FILE

    from booklens.inputs import as_path

    folder = as_path(sweep_dir, "the sweep directory")
    if not isinstance(fmt, str) or fmt not in TABLE_FORMATS:  # else a ValueError once the results are read
        raise BooklensError(f"unknown table format {fmt!r}: use {', '.join(TABLE_FORMATS)}")
    table = setting_name("--table", keyword="sweep_table")  # the command's option, or this function
    if not (folder / PLAN_FILE).is_file():
        if (folder / RUN_FILE).exists():
            raise BooklensError(f"{folder} is a run directory (one book): {table} prints the comparison of a sweep "
                                f"directory's {RESULTS_FILE}")
        raise BooklensError(f"{folder} is not a booklens sweep directory (it has no {PLAN_FILE}): {table} prints "
                            f"the comparison of a sweep directory's {RESULTS_FILE}")
    if not (folder / RESULTS_FILE).exists():
        raise BooklensError(f"{folder} has no {RESULTS_FILE} (the sweep stopped before it wrote its figures), which "
                            f"{table} needs: rerun the sweep to finish it (`booklens report` without --table shows "
                            "the cells done so far)")
    results = read_json_file(folder / RESULTS_FILE, "sweep results")
    try:
        text = render_table(results, fmt)
        notes = _notes(results)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):  # a field of another type than written
        raise BooklensError(f"{folder / RESULTS_FILE} holds figures this booklens cannot read; rerun the sweep to "
                            "write them again") from None
    for note in notes:
        if notify is not None:
            notify(note)
    return text
