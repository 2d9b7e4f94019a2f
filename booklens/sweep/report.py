"""The sweep's `report.html`: one self-contained page like a run's report (inline CSS, an inline
SVG chart, no script, nothing loaded, the same Content-Security-Policy), made from `results.json`
and `cells.jsonl` only, so it is the same bytes for the same figures.

It shows a table in the layout of the papers' Table 2 (one row per system), a chart of each
system's BooookScore and share of faithful claims with their 95% intervals, the paired
differences between systems, and a book x system heatmap whose cells link to each cell's own
report. Every name that comes from a manifest, a book or a model goes through `html.escape`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence
from urllib.parse import quote

from booklens.lm.usage import cost_text
from booklens.reports import SEP, h, page_head
from booklens.vocabulary import CANT_VERIFY, CLAIM_LABELS, counted

REPORT_FILE = "report.html"
# Fewest shared books for a difference to be marked. The percentile bootstrap's interval excludes 0
# whenever every book moves the same way, which two equal systems do by chance with probability
# 2/2^n; a test that assumes nothing of the differences' distribution (sign, sign-flip) cannot
# reach 5% below 6 books.
MIN_BOOKS_MARKED = 6

SWEEP_STYLE = """
table.data td.best { font-weight: 700; }
.ci { color: var(--muted); font-size: .85em; white-space: nowrap; }
.chart-svg { max-width: 56rem; width: 100%; height: auto; }
.chart-svg text { font-family: system-ui, sans-serif; font-size: 12px; fill: #1f2328; }
.chart-svg .axis { stroke: #d0d7de; stroke-width: 1; }
.chart-svg .grid { stroke: #eaeef2; stroke-width: 1; }
.chart-svg .whisker { stroke-width: 2; }
.chart-svg .score { stroke: #0b57d0; fill: #0b57d0; }
.chart-svg .faith { stroke: #1a7f37; fill: #1a7f37; }
.chart-svg .muted { fill: #57606a; }
table.heat td { text-align: center; min-width: 6.5rem; }
table.heat td a { color: inherit; text-decoration: underline; text-underline-offset: 2px; }
table.heat td.failed { background: #f3eefc; color: #6639ba; }
table.heat td.missing { color: var(--muted); }
.heat .sub { display: block; font-size: .8em; color: #3d444d; }
.sig { font-weight: 700; }
"""


# ---------------------------------------------------------------------------
# The figures as text: the page and the tables `booklens report --table` prints (`booklens.sweep.tables`)
# write them alike.


def figure_text(value: Optional[float], scale: float = 1.0, digits: int = 1, *, signed: bool = False) -> str:
    """A figure of results.json as the tables show it ('62.5', BooookScore scaled by 100), '-' when unknown."""
    return "-" if value is None else f"{value * scale:{'+' if signed else ''}.{digits}f}"


def interval_text(ci: Optional[Sequence[float]], scale: float = 1.0, digits: int = 1, *,
                  signed: bool = False) -> Optional[str]:
    """A 95% interval as '[lo, hi]', or None when there is none (one book)."""
    if not ci or ci[0] is None:
        return None
    return f"[{figure_text(ci[0], scale, digits, signed=signed)}, {figure_text(ci[1], scale, digits, signed=signed)}]"


def count_text(value: Optional[int]) -> str:
    return "-" if value is None else f"{value:,}"


def is_marked(difference: dict[str, Any]) -> bool:
    """Whether a paired difference is shown in bold: its interval excludes 0 over `MIN_BOOKS_MARKED` books."""
    ci = difference.get("ci95")
    return bool(ci) and (ci[0] > 0 or ci[1] < 0) and difference.get("books", 0) >= MIN_BOOKS_MARKED


def fewer_books_text(difference: Optional[dict[str, Any]], shared: int) -> str:
    """' (over 2 books)' when a paired difference is over fewer books than the pair completed (a
    completed cell with no figure of its own: every claim left unverified, say); else ''."""
    if not difference or difference.get("books", shared) == shared:
        return ""
    from booklens.vocabulary import counted

    return f" (over {counted(difference['books'], 'book')})"


def system_cells(system: dict[str, Any]) -> dict[str, Optional[str]]:
    """One system of results.json as the text of its table row, by figure: `books`, `failed`,
    `booookscore` (x100) and `booookscore_ci`, each claim label's share (%) and `faithful_ci`,
    `booookscore_over` and `faithful_over` (' (over 2 books)' when that figure is over fewer books
    than the system completed, else ''), `summary_tokens`, `repeated_trigrams` (with its %), `calls`,
    `prompt_tokens`, `tokens` (prompt and completion), `cost`. A figure not known is '-'; an interval
    not known is None."""
    b, c, u = system["booookscore"], system["claims"], system["usage"]
    trigrams = system["repeated_trigrams"]

    def over(books: Optional[int]) -> str:  # None: results.json of a booklens that did not count them
        return fewer_books_text({"books": books}, system["books"]) if books else ""

    return {
        "books": str(system["books"]),
        "failed": str(system["failed"]),
        "booookscore": figure_text(b["mean"], 100),
        "booookscore_ci": interval_text(b["ci95"], 100),
        "booookscore_over": over(b.get("books")),
        **{label: figure_text(c.get(label)) for label in CLAIM_LABELS},
        "faithful_ci": interval_text((system.get("claims_ci95") or {}).get("faithful")),
        "faithful_over": over(system.get("claims_books")),
        "summary_tokens": figure_text(system["summary_tokens"], digits=0),
        "repeated_trigrams": figure_text(trigrams) + ("%" if trigrams is not None else ""),
        "calls": count_text(u["calls"]),
        "prompt_tokens": count_text(u["prompt_tokens"]),
        "tokens": count_text(u["prompt_tokens"] + u["completion_tokens"]),
        "cost": cost_text(u["cost_usd"]),
    }


def _ci_span(text: Optional[str]) -> str:
    return "" if text is None else f'<span class="ci">{text}</span>'


def _cell_href(row: dict[str, Any], to_sweep: Sequence[str] = ()) -> str:
    """The link to a cell's report from the page; `to_sweep`: the path from the page's folder to the
    sweep directory, one part a step (none for a page in the sweep directory)."""
    parts = (*to_sweep, "cells", row["system"], row["book"], "report.html")
    return "/".join(quote(part, safe="") for part in parts)


# ---------------------------------------------------------------------------
# Sections


def _table_section(results: dict[str, Any]) -> str:
    systems = results["systems"]
    head = ("<tr><th scope=\"col\">System</th><th scope=\"col\" class=\"num\">Books</th>"
            "<th scope=\"col\" class=\"num\">Failed</th><th scope=\"col\" class=\"num\">BooookScore</th>"
            "<th scope=\"col\" class=\"num\">% faithful</th><th scope=\"col\" class=\"num\">% unfaithful</th>"
            "<th scope=\"col\" class=\"num\">% partial support</th><th scope=\"col\" class=\"num\">% can't verify</th>"
            "<th scope=\"col\" class=\"num\">Summary tokens</th><th scope=\"col\" class=\"num\">Repeated trigrams</th>"
            "<th scope=\"col\" class=\"num\">LM calls</th><th scope=\"col\" class=\"num\">Tokens</th>"
            "<th scope=\"col\" class=\"num\">Cost</th></tr>")
    rows = []
    for name, s in systems.items():
        t = system_cells(s)
        rows.append(
            f'<tr><th scope="row">{h(name)}</th><td class="num">{t["books"]}</td><td class="num">{t["failed"]}</td>'
            f'<td class="num">{t["booookscore"]} {_ci_span(t["booookscore_ci"])}{t["booookscore_over"]}</td>'
            f'<td class="num">{t["faithful"]} {_ci_span(t["faithful_ci"])}{t["faithful_over"]}</td>'
            f'<td class="num">{t["unfaithful"]}</td><td class="num">{t["partial support"]}</td>'
            f'<td class="num">{t[CANT_VERIFY]}</td>'
            f'<td class="num">{t["summary_tokens"]}</td>'
            f'<td class="num">{t["repeated_trigrams"]}</td>'
            f'<td class="num">{t["calls"]}</td>'
            f'<td class="num">{t["tokens"]}</td>'
            f'<td class="num">{h(t["cost"])}</td></tr>')
    note = ("<p class=\"note\">One row per system, over the books whose cell completed. BooookScore is the "
            "share of summary sentences a reader would not find confusing (\u00d7100, higher is better); claim "
            "shares are the mean over books of each book's share of its verified claims with that label. "
            "Brackets hold 95% bootstrap intervals over books. LM work counts every cell of the system, failed "
            "ones included; its cost is unknown unless every call had a price." + _unjudged_note(systems) + "</p>")
    return (f'{note}\n{_different_books_note(systems)}<table class="data"><caption>Systems compared</caption>'
            f'<thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>')


def _in_words(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _different_books_note(systems: dict[str, Any]) -> str:
    """When some system lacks a book another completed, its row's means are over other books: a book
    it failed for being hard would raise them. Said above the table, with where to compare instead."""
    lacking = [f"{h(name)} lacks {h(_in_words(s['missing_books']))}" for name, s in systems.items()
               if s.get("missing_books")]
    if not lacking:
        return ""
    return (f'<p class="note"><strong>The rows are over different books: {_in_words(lacking)}, which another '
            "system completed.</strong> A system's figures leave out the books it did not complete, which may "
            "be the ones it found hardest: compare systems by the paired differences below, over the books "
            "both completed.</p>\n")


def different_books_line(systems: dict[str, Any], name: Callable[[str], str] = str) -> Optional[str]:
    """The page's note on rows over different books as one line of the command's (None when every
    system completed the same books); `name` writes a system's name or a book's key (escaped, in a table)."""
    lacking = [f"{name(system)} lacks {', '.join(map(name, s['missing_books']))}"
               for system, s in systems.items() if s.get("missing_books")]
    if not lacking:
        return None
    return (f"the systems' figures are over different books ({'; '.join(lacking)}): compare them by the paired "
            "differences over the books both completed (results.json's pairs, report.html)")


def books_left_out_line(results: dict[str, Any], name: Callable[[str], str] = str) -> Optional[str]:
    """One line on the books no system completed, naming them, else None: without it, a table reads
    as a sweep of the books it counts. `name` writes a book's key (escaped, in a table). A
    results.json written before it named them (`books_left_out`) gives only how many."""
    total = len(results.get("books") or [])
    named = results.get("books_left_out")
    if named is not None:
        left = len(named)
    else:
        systems = results["systems"].values()
        if any("missing_books" not in s for s in systems):  # written before booklens named them: cannot tell
            return None
        # A system's `missing_books` names only books another system completed, so the books a system
        # lacks beyond those are the ones no system completed, the same for every system.
        left = max((total - s["books"] - len(s["missing_books"]) for s in systems), default=0)
    if left <= 0:
        return None
    one = left == 1
    which = f" ({', '.join(map(name, named))})" if named else ""
    return (f"{left} of the {counted(total, 'book')}{which} {'has' if one else 'have'} no completed cell "
            f"({'its' if one else 'their'} cells failed or did not run): every system's figures leave "
            f"{'it' if one else 'them'} out (cells.jsonl says why)")


def unjudged_counts(system: dict[str, Any]) -> Optional[str]:
    """What the judges of a system's completed cells gave no valid verdict on, left out of its scores
    ('2 sentences and 1 claim'), or None."""
    parts = [counted(n, what, f"{n:,}") for n, what in (
        (system.get("failed_sentences") or 0, "sentence"), (system.get("failed_claims") or 0, "claim")) if n]
    return " and ".join(parts) or None


def system_line(name: str, system: dict[str, Any], steps: Sequence[str] = ("coherence", "faithfulness")) -> str:
    """The line `booklens sweep` prints for one system of results.json: its books, failed cells,
    BooookScore and % faithful with their 95% intervals over books, each over fewer books than it
    completed saying so, and what its judges could not judge. A figure whose judge step the sweep
    did not take (`steps`) is left out, not shown as '-'."""
    cells = system_cells(system)
    score, faithful = cells["booookscore"], cells["faithful"]
    unjudged = unjudged_counts(system)

    def ci(text: Optional[str]) -> str:  # none over one book
        return f" {text}" if text else ""

    figures = [f"BooookScore {score}{ci(cells['booookscore_ci'])}{cells['booookscore_over']}"] * ("coherence" in steps)
    figures += [f"{faithful + '%' if faithful != '-' else '-'} faithful{ci(cells['faithful_ci'])}"
                f"{cells['faithful_over']}"] * ("faithfulness" in steps)
    return (f"{name}: {counted(system['books'], 'book')}" + (f", {system['failed']} failed" if system["failed"] else "")
            + "".join(f"; {figure}" for figure in figures) + (f" ({unjudged} not judged, left out)" if unjudged else ""))


def unjudged_line(systems: dict[str, Any], name: Callable[[str], str] = str) -> Optional[str]:
    """The systems whose judges left sentences or claims unjudged, as one line (None when none did);
    `name` writes a system's name (escaped, on the page)."""
    parts = [f"{name(system)}: {counts}" for system, s in systems.items() if (counts := unjudged_counts(s))]
    if not parts:
        return None
    return ("the judges gave no valid verdict on some sentences or claims of completed cells, which are left out "
            "of the scores: " + "; ".join(parts))


def _unjudged_note(systems: dict[str, Any]) -> str:
    """Where the judges gave no valid verdict, by system: left out of the figures, but said."""
    line = unjudged_line(systems, h)
    return f" {line[0].upper()}{line[1:]}." if line else ""


def _chart_section(results: dict[str, Any]) -> str:
    systems = list(results["systems"].items())
    if not systems:
        return '<p class="note">No systems.</p>'
    label_w, panel_w, gap, row_h, top = 170, 300, 40, 34, 44
    width = label_w + 2 * panel_w + gap + 20
    height = top + row_h * len(systems) + 30
    panels = [("BooookScore (\u00d7100)", "score", lambda s: (s["booookscore"]["mean"], s["booookscore"]["ci95"], 100)),
              ("% faithful claims", "faith",
               lambda s: (s["claims"].get("faithful"), (s.get("claims_ci95") or {}).get("faithful"), 1))]
    parts = [f'<svg class="chart-svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
             f'role="img" aria-labelledby="chart-title chart-desc" xmlns="http://www.w3.org/2000/svg">',
             '<title id="chart-title">BooookScore and share of faithful claims per system</title>',
             '<desc id="chart-desc">Dots are means over books, lines their 95% bootstrap intervals; both axes '
             'run from 0 to 100. The same figures are in the table above.</desc>']
    for p, (title, cls, _) in enumerate(panels):
        x0 = label_w + p * (panel_w + gap)
        parts.append(f'<text x="{x0}" y="16" font-weight="600">{h(title)}</text>')
        for tick in (0, 25, 50, 75, 100):
            x = x0 + panel_w * tick / 100
            parts.append(f'<line class="grid" x1="{x:.1f}" y1="{top - 10}" x2="{x:.1f}" y2="{height - 26}"/>')
            parts.append(f'<text class="muted" x="{x:.1f}" y="{height - 10}" text-anchor="middle">{tick}</text>')
        parts.append(f'<line class="axis" x1="{x0}" y1="{height - 26}" x2="{x0 + panel_w}" y2="{height - 26}"/>')
    for i, (name, s) in enumerate(systems):
        y = top + row_h * i + row_h / 2
        shown = name if len(name) <= 24 else name[:23] + "\u2026"
        parts.append(f'<text x="{label_w - 10}" y="{y + 4:.1f}" text-anchor="end"><title>{h(name)}</title>'
                     f'{h(shown)}</text>')
        for p, (title, cls, get) in enumerate(panels):
            x0 = label_w + p * (panel_w + gap)
            mean, ci, scale = get(s)
            if mean is None:
                parts.append(f'<text class="muted" x="{x0 + 4}" y="{y + 4:.1f}">no score</text>')
                continue

            def px(v: float) -> float:
                return x0 + panel_w * max(0.0, min(100.0, v * scale)) / 100

            tip = f"{name}: {title} {mean * scale:.1f}"
            if ci:
                tip += f" [{ci[0] * scale:.1f}, {ci[1] * scale:.1f}]"
                parts.append(f'<line class="whisker {cls}" x1="{px(ci[0]):.1f}" y1="{y:.1f}" x2="{px(ci[1]):.1f}" '
                             f'y2="{y:.1f}"/>')
                for end in ci:
                    parts.append(f'<line class="whisker {cls}" x1="{px(end):.1f}" y1="{y - 5:.1f}" '
                                 f'x2="{px(end):.1f}" y2="{y + 5:.1f}"/>')
            parts.append(f'<circle class="{cls}" cx="{px(mean):.1f}" cy="{y:.1f}" r="5"><title>{h(tip)}</title>'
                         f'</circle>')
    parts.append("</svg>")
    return "".join(parts)


def _pairs_section(results: dict[str, Any]) -> str:
    pairs = results.get("pairs") or []
    if not pairs:
        return '<p class="note">One system: nothing to compare.</p>'

    def cell(d: Optional[dict[str, Any]], scale: float, shared: int) -> str:
        if not d:
            return '<td class="num">-</td>'
        value = figure_text(d["diff"], scale, signed=True)
        return (f'<td class="num"><span class="{"sig" if is_marked(d) else ""}">{value}</span> '
                f'{_ci_span(interval_text(d["ci95"], scale, signed=True))}{fewer_books_text(d, shared)}</td>')

    rows = "".join(f'<tr><th scope="row">{h(p["b"])} \u2212 {h(p["a"])}</th><td class="num">{p["books"]}</td>'
                   f'{cell(p["booookscore"], 100, p["books"])}{cell(p["faithful"], 1, p["books"])}</tr>'
                   for p in pairs)
    note = ("<p class=\"note\">Paired over the books both systems completed: the mean difference (second system "
            "minus first) and its 95% bootstrap interval (none over one book). A <span class=\"sig\">bold</span> "
            f"difference has an interval that excludes 0 over at least {MIN_BOOKS_MARKED} books: over fewer, "
            "the interval excludes 0 whenever every book moves the same way, which chance alone does often "
            "(half the time over 2 books).</p>")
    return (f'{note}\n<table class="data"><caption>Paired differences</caption><thead><tr><th scope="col">Pair'
            f'</th><th scope="col" class="num">Shared books</th><th scope="col" class="num">\u0394 BooookScore'
            f'</th><th scope="col" class="num">\u0394 % faithful</th></tr></thead><tbody>{rows}</tbody></table>')


def _judges_section(results: dict[str, Any]) -> str:
    """The judge cards of a run report, for the one judge every cell shared."""
    from booklens.records import JudgeInfo
    from booklens.reports import judge_card

    judges = results.get("judges") or {}
    cards = "".join(judge_card(task, JudgeInfo.model_validate(info)) for task, info in judges.items())
    return f'<ul class="cards judges">{cards}</ul>' if cards else ""


def _heat_color(score: float) -> str:
    """Red (0) through yellow to green (100), light enough for dark text."""
    hue = 120.0 * max(0.0, min(1.0, score))
    return f"hsl({hue:.0f}, 70%, 82%)"


def _heatmap_section(results: dict[str, Any], rows: Sequence[dict[str, Any]], to_sweep: Sequence[str] = ()) -> str:
    systems = list(results["systems"])
    books = list(results.get("books") or sorted({r["book"] for r in rows}))
    by_cell = {(r["system"], r["book"]): r for r in rows}
    head = "".join(f'<th scope="col">{h(s)}</th>' for s in systems)
    body = []
    for book in books:
        cells = []
        for system in systems:
            r = by_cell.get((system, book))
            if r is None or r["status"] == "not run":
                cells.append('<td class="missing">not run</td>')
                continue
            link = f'<a href="{h(_cell_href(r, to_sweep))}">{{}}</a>'
            if r["status"] == "failed":
                error = r.get("error") or "failed"
                cells.append(f'<td class="failed" title="{h(error)}">'
                             + link.format("failed") + f'<span class="sub">{h(error[:60])}</span></td>')
                continue
            score = r.get("booookscore")
            faithful = r.get("faithful_pct")
            style = f' style="background:{_heat_color(score)}"' if isinstance(score, (int, float)) else ""
            text = figure_text(score, 100)
            sub = f"{figure_text(faithful)}% faithful" if faithful is not None else ""
            cells.append(f'<td{style}>' + link.format(h(text)) + f'<span class="sub">{h(sub)}</span></td>')
        body.append(f'<tr><th scope="row">{h(book)}</th>{"".join(cells)}</tr>')
    note = ("<p class=\"note\">BooookScore (\u00d7100) of each book under each system, coloured from red (0) to "
            "green (100), with the share of faithful claims below it. Each cell links to that run's own "
            "report.</p>")
    return (f'{note}\n<table class="data heat"><caption>Books \u00d7 systems</caption><thead><tr>'
            f'<th scope="col">Book</th>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def render_sweep_report(results: dict[str, Any], rows: Sequence[dict[str, Any]], *, title: str,
                        meta: Sequence[str] = (), to_sweep: Sequence[str] = ()) -> str:
    """The page (deterministic: the same figures give the same bytes). `to_sweep`: the path from the
    page's folder to the sweep directory, for a page written outside it (`_cell_href`)."""
    from booklens import __version__

    sections = [
        ("systems", "Systems", _table_section(results)),
        ("chart", "BooookScore and faithfulness", _chart_section(results)),
        ("pairs", "Paired differences", _pairs_section(results)),
        ("books", "Books \u00d7 systems", _heatmap_section(results, rows, to_sweep)),
    ]
    judges = _judges_section(results)
    if judges:
        sections.insert(1, ("judges", "Who judged, and how well that judge agrees with humans", judges))
    nav = "".join(f'<li><a href="#{sid}">{h(name)}</a></li>' for sid, name, _ in sections)
    body = "\n".join(f'<section id="{sid}" aria-labelledby="{sid}-h">\n<h2 id="{sid}-h">{h(name)}</h2>\n'
                     f'{content}\n</section>' for sid, name, content in sections)
    failed = sum(1 for r in rows if r["status"] == "failed")
    not_run = sum(1 for r in rows if r["status"] == "not run")
    warning = ""
    if failed or not_run:
        bits = []
        if failed:
            bits.append(f"{failed} cell{'s' if failed != 1 else ''} failed")
        if not_run:
            bits.append(f"{not_run} did not run")
        then = "Rerun the same <code>booklens sweep</code> command to resume."
        if not not_run:  # every cell ran: a rerun retries the failed ones, but not those of a book it cannot read
            from booklens.sweep.aggregate import rerun_advice

            advice = rerun_advice([r for r in rows if r["status"] == "failed"],
                                  rerun="rerun the same booklens sweep command", first_error_shown=False)
            then = h(advice[0].upper() + advice[1:]) + "."
        warning = (f'<p class="note"><strong>{h(", ".join(bits))}</strong>: the figures cover the completed '
                   f'cells only. {then}</p>')
    return f"""{page_head(f"booklens sweep: {title}", SWEEP_STYLE)}
<body>
<a class="skip" href="#main">Skip to the report</a>
<header>
<h1>booklens sweep: {h(title)}</h1>
<p class="meta">{SEP.join(h(m) for m in meta)}</p>
<nav aria-label="Sections of the report"><ul>{nav}</ul></nav>
</header>
<main id="main" tabindex="-1">
{warning}
{body}
</main>
<footer>
<p>Made by booklens {h(__version__)} from results.json and cells.jsonl next to this file. The page loads
nothing and runs no script.</p>
</footer>
</body>
</html>
"""


def write_sweep_report(output: Path, results: dict[str, Any], rows: Sequence[dict[str, Any]], *, title: str,
                       meta: Sequence[str] = (), target: Optional[Path] = None) -> Path:
    from booklens.reports import write_text_atomic

    target = Path(target) if target is not None else Path(output) / REPORT_FILE
    write_text_atomic(target, render_sweep_report(results, rows, title=title, meta=meta,
                                                  to_sweep=_path_between(target.parent, Path(output))))
    return target


def _path_between(folder: Path, sweep_dir: Path) -> tuple[str, ...]:
    """The relative path from `folder` (where a page is written) to `sweep_dir`, one part a step; the
    cell links of a page written elsewhere lead back to the cells. As the browser reads a link:
    by the folders' names, not where their links resolve."""
    import os

    try:
        relative = os.path.relpath(os.path.abspath(sweep_dir), os.path.abspath(folder))
    except ValueError:  # on another drive (Windows) there is no relative path: links as from the sweep directory
        return ()
    return () if relative == os.curdir else Path(relative).parts


def sweep_meta(systems: int, books: int, manifest: str, judge_steps: Sequence[str], evidence: str) -> list[str]:
    """The line under the page's title: the sweep's size, its manifest and how it was judged."""
    return [f"{counted(systems, 'system')} \u00d7 {counted(books, 'book')}", f"manifest {Path(manifest).name}",
            f"judge: {', '.join(judge_steps)}" + (f", evidence {evidence}" if "faithfulness" in judge_steps else "")]


def unfinished_note(rows: Sequence[dict[str, Any]], earlier: int = 0, *, stopped: bool = True) -> Optional[str]:
    """One line on the cells of a sweep that are not done (failed, or not run), else None; `earlier`:
    how many cells on disk were left out as an earlier plan's. A sweep that ran to its end (`stopped`
    False: it wrote its aggregate) with every cell run is finished, its failed cells said as such."""
    undone = [r for r in rows if r["status"] != "complete"]
    if not undone:
        return None
    failed = sum(1 for r in undone if r["status"] == "failed")
    books = ", ".join(dict.fromkeys(r["book"] for r in undone))
    left_out = (f" ({counted(earlier, 'cell')} on disk {'is' if earlier == 1 else 'are'} left out as from an "
                "earlier plan)" if earlier else "")
    if not stopped and failed == len(undone):
        from booklens.sweep.aggregate import rerun_advice

        advice = rerun_advice(undone, rerun="rerun the sweep", first_error_shown=False)
        return (f"{failed} of {counted(len(rows), 'cell')} failed (books without every cell: {books}); the page "
                f"covers the complete cells only{left_out}; {advice}")
    kinds = ", ".join(bit for bit in (f"{failed} failed" if failed else "",
                                      f"{len(undone) - failed} not run" if len(undone) > failed else "") if bit)
    return (f"the sweep is not finished: {len(undone)} of {counted(len(rows), 'cell')} "
            f"{'is' if len(undone) == 1 else 'are'} not done ({kinds}; books without every cell: "
            f"{books}); the page covers the complete cells only{left_out}; rerun the sweep to finish it")


def _cells_on_disk(sweep_dir: Path, plan: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                                   Optional[int]]:
    """The figures and rows of the cells a sweep left in its directory before it wrote its aggregate
    (stopped or killed): a cell without a run record, or whose run stopped part-way with no step
    failed, did not run; one whose run recorded a failure failed,
    and a complete one that the plan in sweep.json would not reuse whole (`cells_of_plan`) was made by
    an earlier plan and counts as not run; also how many of those there were (None when the plan
    cannot be had again to tell: every complete cell is kept then)."""
    from booklens.errors import BooklensError
    from booklens.reports import RUN_FILE, read_run_record
    from booklens.sweep.aggregate import CellOutcome, cell_dir, cell_row, outcome_of_run, results, sweep_judges
    from booklens.sweep.run import cells_of_plan

    systems = [str(spec["name"]) for spec in plan["systems"]]
    books = [str(key) for key in plan["books"]]
    of_plan = cells_of_plan(sweep_dir, plan)
    earlier = 0
    outcomes = []
    for system in systems:
        for book in books:
            path = cell_dir(sweep_dir, system, book) / RUN_FILE
            if not path.exists():
                outcomes.append(CellOutcome(system, book, "not run"))
                continue
            try:
                run = read_run_record(path).model_dump(mode="json")
            except BooklensError as exc:
                outcomes.append(CellOutcome(system, book, "failed", str(exc).splitlines()[0]))
                continue
            if not run.get("complete") and not run.get("failures"):
                # Stopped part-way (Ctrl-C, a kill) or still running: nothing failed, and the rerun
                # finishes it as it would a cell that never started.
                outcomes.append(CellOutcome(system, book, "not run"))
                continue
            outcome = outcome_of_run(system, book, run)
            if outcome.status == "complete" and of_plan is not None and (system, book) not in of_plan:
                earlier += 1
                outcome = CellOutcome(system, book, "not run")
            outcomes.append(outcome)
    rows = [cell_row(o) for o in outcomes]
    return results(systems, books, rows, sweep_judges(outcomes)), rows, (earlier if of_plan is not None else None)


def rebuild_sweep_report(sweep_dir: str | Path, output: Optional[str | Path] = None, *,
                         notify: Optional[Callable[[str], None]] = None) -> Path:
    """Write a sweep directory's report.html (or `output`) again from its sweep.json, results.json and
    cells.jsonl, as the sweep wrote it; one-line `BooklensError`s for anything missing or unreadable.
    A sweep stopped before it wrote results.json gets the page of the cells in its directory (nothing
    else is written). `notify` gets one line when some cells are not done."""
    import json

    from booklens.errors import BooklensError
    from booklens.pipeline import JudgeConfig
    from booklens.records import read_json_file
    from booklens.sweep.aggregate import CELLS_FILE, RESULTS_FILE
    from booklens.sweep import PLAN_FILE

    from booklens.inputs import as_path

    sweep_dir = as_path(sweep_dir, "the sweep directory")
    if output is not None:
        as_path(output, "output", "the report file to write")
    plan = read_json_file(sweep_dir / PLAN_FILE, "sweep plan")
    stopped = not (sweep_dir / RESULTS_FILE).exists() and not (sweep_dir / CELLS_FILE).exists()
    earlier: Optional[int] = 0
    try:
        if stopped:
            results, rows, earlier = _cells_on_disk(sweep_dir, plan)
        else:
            results = read_json_file(sweep_dir / RESULTS_FILE, "sweep results")
            rows = [json.loads(line) for line in (sweep_dir / CELLS_FILE).read_text(encoding="utf-8").splitlines()
                    if line.strip()]
        judge = JudgeConfig(**{k: v for k, v in (plan.get("judge") or {}).items() if k in ("steps", "evidence")})
        systems, books = results["systems"], results["books"]
        if not isinstance(systems, dict) or not isinstance(books, list) or not all(isinstance(r, dict) for r in rows):
            raise TypeError("unexpected layout")
        meta = sweep_meta(len(systems), len(books), str(plan["manifest"]), judge.steps, judge.evidence)
        title = Path(str(plan["manifest"])).stem
    except OSError as exc:
        raise BooklensError(f"cannot read {sweep_dir / CELLS_FILE}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BooklensError(f"{sweep_dir} holds records this booklens cannot read (sweep.json, results.json or "
                            "cells.jsonl); rerun the sweep to write them again") from None
    target = Path(output) if output is not None else sweep_dir / REPORT_FILE
    from booklens.reports import same_file

    for name in (PLAN_FILE, RESULTS_FILE, CELLS_FILE):
        # also a record a stopped sweep has not written yet: the page there would break the sweep directory
        if same_file(target, sweep_dir / name):
            raise BooklensError(f"cannot write the report to {target}: it is the sweep's {name}, which the page is "
                                f"built from; write it elsewhere (by default {sweep_dir / REPORT_FILE})")
    try:
        written = write_sweep_report(sweep_dir, results, rows, title=title, meta=meta, target=target)
        note = unfinished_note(rows, earlier or 0, stopped=stopped)
        if earlier is None:
            unmatched = ("the cells on disk cannot be matched to the plan in sweep.json (its manifest is gone, or no "
                         "longer gives that plan): the page shows every complete cell, whichever plan made it")
            note = f"{note}; {unmatched}" if note else unmatched
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):  # a field of another type or length
        raise BooklensError(f"{sweep_dir} holds records this booklens cannot read (results.json or cells.jsonl); "
                            "rerun the sweep to write them again") from None
    if note and notify is not None:
        notify(note)
    return written
