"""The run directory's records, read back and checked, and `report.html`.

`report.html` is one self-contained page: inline CSS, no script, no external resource, a
Content-Security-Policy that forbids loading anything, so it opens offline and can be mailed
around. It shows score cards (BooookScore, share of claims per label), the summary with each
confusing sentence highlighted (error types and questions on hover and on keyboard focus), the
error types as a bar chart, every claim with its label, reason and evidence passages placed in
the book, how the summary was made (the merge tree, collapsible), and what the run cost.

Every piece of book text and model output goes through `html.escape`: nothing a book or a model
writes can become markup. The page depends only on the JSON records, so `booklens report RUN_DIR`
rebuilds it byte for byte.
"""

from __future__ import annotations

import html
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from pydantic import BaseModel, ValidationError

from booklens.errors import BooklensError, first_line
from booklens.lm.usage import cost_text
from booklens.records import (
    COHERENCE_ERROR_TYPES,
    FORMAT_VERSION,
    ClaimSet,
    ClaimVerdict,
    CoherenceResult,
    Evidence,
    FaithfulnessReport,
    GivenSummary,
    RunRecord,
    SentenceAnnotation,
    Summary,
    SummaryNode,
    read_json_file,
    write_atomically,
)
from booklens.vocabulary import labels_of

RUN_FILE = "run.json"
REPORT_FILE = "report.html"
TIMINGS_FILE = "timings.json"
# Step name -> record file, in the order the steps run.
STEP_FILES = {
    "summary": "summary.json",
    "coherence": "coherence.json",
    "claims": "claims.json",
    "faithfulness": "faithfulness.json",
}
SEP = " \u00b7 "
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

LABEL_CLASS = {"faithful": "ok", "unfaithful": "bad", "partial support": "part", "can't verify": "unk",
               None: "fail"}
EVIDENCE_NAMES = {"none": "no evidence (the model's own knowledge)", "given": "the quotes given with the claims",
                  "bm25": "BM25 retrieval", "dense": "dense retrieval (MiniLM)",
                  "hybrid": "hybrid retrieval (BM25 + dense)", "book": "as much of the book as fits, around the "
                                                                        "best passages"}


# ---------------------------------------------------------------------------
# Reading a run directory


@dataclass
class RunData:
    """The records of one run directory, checked."""

    path: Path
    run: RunRecord
    summary: Optional[Union[Summary, GivenSummary]] = None
    coherence: Optional[CoherenceResult] = None
    claims: Optional[ClaimSet] = None
    faithfulness: Optional[FaithfulnessReport] = None
    # Step records whose bytes are not those run.json lists (replaced or edited since the run wrote them).
    changed: tuple[str, ...] = ()


def check_format(data: Any, path: Path, what: str, kind: str) -> None:
    """A one-line error unless `data` is a booklens record of `kind` this version can read."""
    if not isinstance(data, dict) or data.get("kind") != kind:
        found = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise BooklensError(f"{path} is not a {what} (expected kind '{kind}', found {found!r})")
    version = data.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BooklensError(f"{path} has no valid format_version")
    if version > FORMAT_VERSION:
        raise BooklensError(f"{path} was written by a newer booklens (format version {version}; this version "
                            f"reads up to {FORMAT_VERSION}): upgrade booklens to read it")


def _validate(model: type[BaseModel], data: Any, path: Path, what: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "record"
        raise BooklensError(f"{path} is not a valid {what}: {where}: {err.get('msg', 'invalid')}") from None


def read_run_record(path: Path) -> RunRecord:
    data = read_json_file(path, "run record")
    check_format(data, path, "booklens run record", "booklens.run")
    return _validate(RunRecord, data, path, "run record")


def read_step_record(run_dir: Path, step: str) -> Any:
    """The checked record of one step of a run directory."""
    path = run_dir / STEP_FILES[step]
    data = read_json_file(path, f"{step} record")
    if step == "summary":
        check_format(data, path, "summary record", "booklens.summary")
        given = isinstance(data, dict) and data.get("source") == "given"
        return _validate(GivenSummary if given else Summary, data, path, "summary record")
    model, kind = {"coherence": (CoherenceResult, "booklens.coherence"), "claims": (ClaimSet, "booklens.claims"),
                   "faithfulness": (FaithfulnessReport, "booklens.faithfulness")}[step]
    check_format(data, path, f"{step} record", kind)
    return _validate(model, data, path, f"{step} record")


def run_inputs(run_dir: str | Path) -> list[Path]:
    """The files the run of `run_dir` read, as its run.json names them: the book, a given summary's
    file, compiled programs (none when run.json does not read, which `load_run` reports)."""
    try:
        run = read_run_record(Path(run_dir) / RUN_FILE)
    except (BooklensError, OSError):
        return []
    files = [run.book, run.config.get("summary_file")]
    programs = run.config.get("programs")
    if isinstance(programs, dict):
        files += [entry.get("file") for entry in programs.values() if isinstance(entry, dict)]
    return [Path(f) for f in files if isinstance(f, str) and f]


def load_run(run_dir: str | Path) -> RunData:
    """Read and check a run directory; one-line `BooklensError`s for anything unreadable."""
    from booklens.records import present

    run_dir = Path(run_dir)
    if not present(run_dir):
        raise BooklensError(f"run directory not found: {run_dir}")
    if not run_dir.is_dir():
        raise BooklensError(f"not a directory: {run_dir} (give the directory `booklens run -o` wrote)")
    if not os.access(run_dir, os.R_OK | os.X_OK):
        raise BooklensError(f"cannot read the run directory {run_dir}: permission denied")
    if not (run_dir / RUN_FILE).exists():
        raise BooklensError(f"{run_dir} is not a booklens run directory (it has no {RUN_FILE})")
    run = read_run_record(run_dir / RUN_FILE)
    if "summary" not in run.steps and "summary" not in run.failures:
        raise BooklensError(f"{run_dir} holds no summary yet: the run stopped before its first step finished; "
                            "rerun `booklens run` to complete it")
    records = {step: read_step_record(run_dir, step) for step in STEP_FILES if step in run.steps}
    from booklens.pipeline import sha256_file

    # A record replaced after run.json listed it (another run, a kill between the two writes, an edit)
    # is shown as it is, but not passed off as the result run.json describes.
    changed = tuple(STEP_FILES[step] for step, entry in run.steps.items()
                    if step in STEP_FILES and sha256_file(run_dir / STEP_FILES[step]) != entry.sha256)
    return RunData(path=run_dir, run=run, summary=records.get("summary"), coherence=records.get("coherence"),
                   claims=records.get("claims"), faithfulness=records.get("faithfulness"), changed=changed)


def write_text_atomic(path: Path, text: str) -> None:
    """Write a text file atomically (`write_atomically`), with the usual file mode: a page to share."""

    def write(tmp: str) -> None:
        # (a file name that is not UTF-8 shows its undecodable bytes as `\udce9`)
        with open(tmp, "w", encoding="utf-8", errors="backslashreplace", newline="\n") as handle:
            handle.write(text)

    try:
        write_atomically(path, write, shared=True)
    except OSError as exc:
        raise BooklensError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_report(run_dir: str | Path, output: str | Path | None = None, *,
                 notify: Optional[Callable[[str], None]] = None) -> Path:
    """Rebuild `report.html` (or `output`) from a run directory's records, or a sweep directory's page
    from its results.json and cells.jsonl (`notify` gets a line when some of its cells are not done)."""
    from booklens.sweep import PLAN_FILE

    if not (Path(run_dir) / RUN_FILE).exists() and (Path(run_dir) / PLAN_FILE).is_file():
        from booklens.sweep.report import rebuild_sweep_report

        return rebuild_sweep_report(run_dir, output, notify=notify)
    folder = Path(run_dir)
    if folder.is_dir() and os.access(folder, os.R_OK | os.X_OK) and not (folder / RUN_FILE).exists():
        # Either kind of directory would do here, so name the record of each.
        raise BooklensError(f"{folder} is not a booklens run or sweep directory (it has no {RUN_FILE} or {PLAN_FILE})")
    data = load_run(run_dir)
    if data.changed and notify is not None:
        notify(changed_records_text(data.changed))
    target = Path(output) if output is not None else Path(run_dir) / REPORT_FILE
    for name in (RUN_FILE, *STEP_FILES.values(), TIMINGS_FILE):
        # The page must not replace a record it is built from: the run directory would be broken.
        if same_file(target, Path(run_dir) / name):
            raise BooklensError(f"cannot write the report to {target}: it is the run's {name}, which the page is "
                                f"built from; write it elsewhere (by default {Path(run_dir) / REPORT_FILE})")
    if output is not None and holds_the_book(target, data.run):
        raise BooklensError(f"cannot write the report to {target}: it holds the book this run read "
                            f"({data.run.book}); choose another output file")
    if output is not None and holds_the_given_summary(target, data):
        source = data.run.config.get("summary_file") or getattr(data.summary, "file", None)  # or a sweep's summaries
        raise BooklensError(f"cannot write the report to {target}: it holds the summary this run judged "
                            f"({source}); choose another output file")
    try:
        page = render_report(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a field of another type than written
        raise BooklensError(f"{Path(run_dir)} holds records this booklens cannot show ({first_line(exc)}); rerun "
                            "the run to write them again") from None
    write_text_atomic(target, page)
    return target


def holds_the_book(path: Path, run: RunRecord) -> bool:
    """Whether the existing file `path` is the run's book, read as `run` read it. run.json names the
    book as `run` was given it, often relative to a folder this process may not be in, so the text's
    digest it records is what tells the book wherever it lies."""
    from booklens.pipeline import sha256_text
    from booklens.text import read_book

    if not run.book_sha256 or not path.is_file():
        return False
    try:
        text = read_book(path, drop_matter=bool(run.config.get("drop_matter")))
    except (BooklensError, OSError, ValueError):  # not a book at all: not this one either
        return False
    return sha256_text(text) == run.book_sha256


def holds_the_given_summary(path: Path, data: RunData) -> bool:
    """Whether the existing file `path` is the summary file a `run --summary` run judged. As with the
    book, run.json names that file as `run` was given it; the summary record the run kept tells it
    wherever it lies, read as `run` read it."""
    from booklens.inputs import read_given_summary

    kept = data.summary
    if data.run.summary_source != "given" or kept is None or not path.is_file():
        return False
    try:
        given = read_given_summary(path)
    except (BooklensError, OSError, ValueError):  # not a summary at all: not this one either
        return False
    # a text is kept in a record of its own; a `booklens summarize` record is kept as it was given
    return given == kept.summary if isinstance(given, str) else given == kept


def same_file(a: Path, b: Path) -> bool:
    """One file under two spellings (`RUN/./run.json`, a link to it), or one path not yet written."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return False


# ---------------------------------------------------------------------------
# Formatting helpers


def h(value: Any) -> str:
    """Text for HTML content or a quoted attribute value: <, >, &, " and ' escaped."""
    return html.escape("" if value is None else str(value), quote=True)


def _int(n: Optional[int]) -> str:
    return "-" if n is None else f"{n:,}"


def _pct(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}%"


def _plural(n: int, word: str, plural: Optional[str] = None) -> str:
    return f"{n:,} {word if n == 1 else (plural or word + 's')}"


def _label_class(label: Optional[str]) -> str:
    return LABEL_CLASS.get(label, "fail")


def _badge(label: Optional[str]) -> str:
    text = label if label is not None else "failed"
    return f'<span class="badge {_label_class(label)}">{h(text)}</span>'


def _book_name(run: RunRecord) -> str:
    return Path(run.book).name or run.book


def _chunk_of(offset: int, chunks: Sequence[dict[str, Any]]) -> Optional[int]:
    for c in chunks:
        if isinstance(c.get("start"), int) and isinstance(c.get("end"), int) and c["start"] <= offset < c["end"]:
            return c.get("index")
    return None


def where_in_book(start: Optional[int], end: Optional[int], book_chars: int,
                  chunks: Sequence[dict[str, Any]] = ()) -> str:
    """'characters 1,200-2,350 (6-12% into the book), chunk 0' for a span of the book."""
    if start is None or end is None:
        return "not found in the book"
    text = f"characters {start:,}\u2013{end:,}"
    if book_chars > 0:
        a, b = 100.0 * start / book_chars, 100.0 * end / book_chars
        text += f" ({a:.0f}\u2013{b:.0f}% into the book)"
    chunk = _chunk_of(start, chunks)
    if chunk is not None:
        text += f", summarized in chunk {chunk}"
    return text


# ---------------------------------------------------------------------------
# Page


STYLE = """
:root { color-scheme: light; --ink: #1f2328; --muted: #57606a; --line: #d0d7de; --bg: #ffffff;
  --soft: #f6f8fa; --accent: #0b57d0; --ok: #1a7f37; --bad: #b42318; --part: #8a5a00; --unk: #57606a;
  --fail: #6639ba; --hl: #fff1a8; --hl-line: #b08800; }
* { box-sizing: border-box; }
html { font-size: 16px; }
body { margin: 0; color: var(--ink); background: var(--bg); line-height: 1.5;
  font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", "DejaVu Sans", sans-serif; }
a { color: var(--accent); }
:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
.skip { position: absolute; left: -999px; top: 0; background: var(--bg); padding: .5rem 1rem; }
.skip:focus { left: 1rem; z-index: 10; }
header, main, footer { max-width: 72rem; margin: 0 auto; padding: 0 1.5rem; }
/* A word longer than its box (a URL in a summary, claim or passage) breaks rather than widening the page;
   a table keeps its words and scrolls in its own box. */
header, main, footer { overflow-wrap: anywhere; }
table.data { overflow-wrap: normal; }
header { padding-top: 1.25rem; border-bottom: 1px solid var(--line); }
header h1 { margin: 0; font-size: 1.6rem; }
header .meta { margin: .25rem 0 .75rem; color: var(--muted); }
nav ul { list-style: none; display: flex; flex-wrap: wrap; gap: .25rem 1.25rem; margin: 0; padding: 0 0 .75rem; }
section { margin: 2rem 0; }
h2 { font-size: 1.3rem; border-bottom: 1px solid var(--line); padding-bottom: .25rem; margin: 0 0 1rem; }
h3 { font-size: 1.05rem; margin: 1.25rem 0 .5rem; }
.note { color: var(--muted); }
.note.failed { color: var(--ink); border-left: 4px solid var(--fail); padding: .3em .8em; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(10.5rem, 1fr)); gap: .75rem;
  list-style: none; margin: 0; padding: 0; }
.card { border: 1px solid var(--line); border-left: 6px solid var(--muted); border-radius: 6px;
  padding: .6rem .8rem; background: var(--soft); }
.card .name { font-weight: 600; }
.card .value { font-size: 1.9rem; font-weight: 700; line-height: 1.2; }
.card .detail { color: var(--muted); font-size: .85rem; }
.card.score { border-left-color: var(--accent); }
.card.ok { border-left-color: var(--ok); } .card.bad { border-left-color: var(--bad); }
.card.part { border-left-color: var(--part); } .card.unk { border-left-color: var(--unk); }
.card.fail { border-left-color: var(--fail); }
.badge { display: inline-block; border-radius: 999px; padding: 0 .6rem; font-size: .85rem; font-weight: 600;
  border: 1px solid currentColor; background: var(--bg); white-space: nowrap; }
.badge.ok { color: var(--ok); } .badge.bad { color: var(--bad); } .badge.part { color: var(--part); }
.badge.unk { color: var(--unk); } .badge.fail { color: var(--fail); }
.summary-text { white-space: pre-wrap; font-size: 1.05rem; line-height: 1.75; max-width: 48rem;
  background: var(--soft); border: 1px solid var(--line); border-radius: 6px; padding: 1rem 1.25rem; }
.legend { font-size: .9rem; color: var(--muted); }
.legend mark { white-space: nowrap; }
.summary-text { position: relative; }
.sent mark { background: var(--hl); color: inherit; border-bottom: 2px solid var(--hl-line); cursor: help;
  padding: .05rem 0; }
.sent.failed mark { background: transparent; border-bottom: 2px dashed var(--fail); }
.sent mark:hover, .sent mark:focus { background: #ffe066; }
.sent.failed mark:hover, .sent.failed mark:focus { background: #efe7fb; }
.flag { font-size: .7rem; font-weight: 700; vertical-align: super; color: #5c4400; margin-left: .1rem; }
.sent.failed .flag { color: var(--fail); }
.tip { display: none; position: absolute; left: 1rem; right: 1rem; margin-top: .3rem; z-index: 5;
  max-width: 34rem; white-space: normal; background: #fffdf3; color: var(--ink); border: 1px solid var(--hl-line);
  border-radius: 6px; box-shadow: 0 4px 14px rgba(0,0,0,.18); padding: .6rem .8rem; font-size: .9rem;
  line-height: 1.45; }
.sent.failed .tip { border-color: var(--fail); background: #faf7fe; }
.sent mark:hover + .tip, .sent mark:focus + .tip, .tip:hover { display: block; }
.tip ul, .qlist ul { margin: .25rem 0 0; padding-left: 1.2rem; }
.tip .types, .qlist .types { font-weight: 600; }
.qlist { max-width: 48rem; padding-left: 1.5rem; }
.qlist li { margin: .5rem 0; }
.qlist .quote { font-style: italic; }
.chart { border-collapse: collapse; width: 100%; max-width: 44rem; }
.chart caption { text-align: left; color: var(--muted); font-size: .9rem; padding-bottom: .4rem; }
.chart th { text-align: left; font-weight: 500; padding: .2rem .75rem .2rem 0; white-space: nowrap; width: 10rem; }
.chart td { padding: .2rem 0; }
.chart td.num { width: 9rem; padding-left: .75rem; font-variant-numeric: tabular-nums; white-space: nowrap; }
.track { background: var(--soft); border: 1px solid var(--line); height: 1.1rem; border-radius: 3px; }
.bar { display: block; height: 100%; background: #d4a72c; border-radius: 2px 0 0 2px; }
.claims { list-style: none; padding: 0; margin: 0; }
.claim { border: 1px solid var(--line); border-left: 6px solid var(--muted); border-radius: 6px;
  padding: .75rem 1rem; margin: 0 0 1rem; }
.claim.ok { border-left-color: var(--ok); } .claim.bad { border-left-color: var(--bad); }
.claim.part { border-left-color: var(--part); } .claim.unk { border-left-color: var(--unk); }
.claim.fail { border-left-color: var(--fail); }
.claim h3 { margin: 0 0 .35rem; font-size: 1rem; font-weight: 600; }
.claim h3 .num { color: var(--muted); font-weight: 500; margin-right: .4rem; }
.claim .reason { margin: .35rem 0; }
.claim .reason b { font-weight: 600; }
.evidence { list-style: none; padding: 0; margin: .5rem 0 0; }
.evidence li { margin: .5rem 0; }
.evidence blockquote { margin: 0; padding: .4rem .75rem; border-left: 3px solid var(--line); background: var(--soft);
  font-size: .92rem; }
.evidence blockquote p { margin: 0 0 .4rem; } .evidence blockquote p:last-child { margin-bottom: 0; }
.evidence .supports blockquote { border-left-color: var(--ok); }
.evidence .refutes blockquote { border-left-color: var(--bad); }
.where { font-size: .82rem; color: var(--muted); margin: .15rem 0 0; }
.role { font-weight: 600; }
.supports .role { color: var(--ok); } .refutes .role { color: var(--bad); }
details { margin: .35rem 0; }
summary { cursor: pointer; }
.tree, .tree ul { list-style: none; padding-left: 1.25rem; margin: .25rem 0; }
.tree { padding-left: 0; }
.tree summary { font-size: .95rem; }
.tree .kind { font-weight: 600; }
.node-text { white-space: pre-wrap; margin: .35rem 0 .5rem; padding: .5rem .75rem; background: var(--soft);
  border: 1px solid var(--line); border-radius: 4px; font-size: .92rem; max-width: 48rem; }
.leaf { color: var(--muted); font-size: .9rem; margin: .2rem 0; }
/* A table wider than the column (many systems or labels, a narrow window) scrolls inside it. */
table.data { border-collapse: collapse; font-size: .92rem; display: block; max-width: 100%; overflow-x: auto; }
table.data th, table.data td { border: 1px solid var(--line); padding: .25rem .6rem; text-align: left; }
table.data td.num, table.data th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.data caption { text-align: left; font-weight: 600; padding: .25rem 0; }
dl.config { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; font-size: .92rem; }
dl.config dt { color: var(--muted); } dl.config dd { margin: 0; }
code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .9em; }
footer { border-top: 1px solid var(--line); color: var(--muted); font-size: .85rem; padding-top: .75rem;
  padding-bottom: 2rem; }
.card.judge { border-left-color: var(--accent); background: var(--bg); }
.card.judge.warn { border-left-color: var(--bad); }
.card.judge .value { font-size: 1.25rem; }
.judges { grid-template-columns: repeat(auto-fit, minmax(22rem, 1fr)); margin-top: .75rem; }
.warning { border: 2px solid var(--bad); background: #fdecea; color: #5f1410; border-radius: 6px;
  padding: .5rem .8rem; margin: .6rem 0 0; font-size: .95rem; }
.warning strong { color: var(--bad); }
@media print { .tip { display: none !important; } nav, .skip { display: none; } }
"""


def render_report(data: RunData) -> str:
    """The report page of a run directory (deterministic: the same records give the same bytes)."""
    run = data.run
    sections = [
        ("scores", "Scores", _scores_section(data)),
        ("summary", "Summary", _summary_section(data)),
        ("errors", "Error types", _errors_section(data)),
        ("claims", "Claims", _claims_section(data)),
        ("tree", "How the summary was made", _tree_section(data)),
        ("run", "Run", _run_section(data)),
    ]
    nav = "".join(f'<li><a href="#{sid}">{h(title)}</a></li>' for sid, title, _ in sections)
    body = "\n".join(
        f'<section id="{sid}" aria-labelledby="{sid}-h">\n<h2 id="{sid}-h">{h(title)}</h2>\n{content}\n</section>'
        for sid, title, content in sections
    )
    book = _book_name(run)
    if run.failures:
        items = "".join(f"<li>{h(_STEP_NAMES.get(step, step))}: {h(reason)}</li>"
                        for step, reason in run.failures.items())
        incomplete = (f'<div class="note failed" role="alert"><strong>Some steps failed</strong>, and their '
                      f'sections are empty:<ul>{items}</ul>Rerunning the same command retries them; LM calls '
                      'that completed are answered from the cache.</div>')
    elif not run.complete:
        incomplete = ('<p class="note"><strong>This run is not finished:</strong> the sections of its missing '
                      'steps are empty. Rerun the same <code>booklens run</code> command to complete it.</p>')
    else:
        incomplete = ""
    if data.changed:
        incomplete += f'<div class="note failed" role="alert">{h(changed_records_text(data.changed))}</div>'
    from booklens import __version__

    return f"""{page_head(f"booklens report: {book}")}
<body>
<a class="skip" href="#main">Skip to the report</a>
<header>
<h1>booklens report: {h(book)}</h1>
<p class="meta">{_header_meta(data)}</p>
<nav aria-label="Sections of the report"><ul>{nav}</ul></nav>
</header>
<main id="main" tabindex="-1">
{incomplete}
{body}
</main>
<footer>
<p>Made by booklens {h(__version__)} from the JSON records next to this file; <code>booklens report
DIR</code> rebuilds it. The page loads nothing and runs no script.</p>
</footer>
</body>
</html>
"""


def changed_records_text(files: Sequence[str]) -> str:
    """What the page and `booklens report` say of step records that are not the ones run.json lists."""
    one = len(files) == 1
    return (f"{', '.join(files)} {'is not the record' if one else 'are not the records'} run.json lists "
            f"(replaced or edited since the run wrote {'it' if one else 'them'}): shown as found, though the run's "
            f"settings and figures describe another result; rerunning the run's command writes "
            f"{'it' if one else 'them'} again")


def _method_text(summary: Optional[Union[Summary, GivenSummary]]) -> str:
    if summary is None:
        return "no summary"
    if isinstance(summary, GivenSummary):
        return f"summary given in {Path(summary.file).name}"
    name = "hierarchical merging" if summary.method == "hier" else "incremental updating"
    return f"summary by {name} of chunks of up to {summary.config.chunk_size:,} tokens"


def _header_meta(data: RunData) -> str:
    run = data.run
    parts = [f"book of {_int(run.book_tokens)} tokens", _method_text(data.summary), f"model {run.lm}"]
    if data.faithfulness is not None:
        parts.append(f"evidence: {EVIDENCE_NAMES.get(data.faithfulness.evidence_mode, data.faithfulness.evidence_mode)}")
    return SEP.join(h(p) for p in parts)


# -- scores --------------------------------------------------------------------


def _card(cls: str, name: str, value: str, detail: str) -> str:
    return (f'<li class="card {cls}"><div class="name">{h(name)}</div><div class="value">{h(value)}</div>'
            f'<div class="detail">{h(detail)}</div></li>')


def _scores_section(data: RunData) -> str:
    cards = []
    c = data.coherence
    if c is not None:
        judged = c.n_sentences - c.n_failed
        value = "-" if c.score is None else f"{100 * c.score:.1f}"
        detail = f"{judged - c.n_confusing:,} of {_plural(judged, 'judged sentence')} without confusion"
        if c.n_failed:
            detail += (f"; {c.n_failed:,} of {_plural(c.n_sentences, 'sentence')} could not be judged: left out "
                       f"of the score")
        cards.append(_card("score", "BooookScore", value, detail))
    f = data.faithfulness
    if f is not None and f.claims:
        total = len(f.claims)
        verified = total - f.failures
        for label in labels_of(f.label_set):  # a binary rater's two, not two more it never gives
            n = f.label_counts.get(label, 0)
            cards.append(_card(_label_class(label), label.capitalize(),
                               _pct(f.label_percentages.get(label)) if verified else "-",
                               f"{n:,} of {_plural(verified, 'verified claim')}"))
        if f.failures:
            cards.append(_card("fail", "Not verified", f"{f.failures:,}",
                               f"of {_plural(total, 'claim')}: no valid label, left out of the shares"))
    if not cards:
        if not data.run.config.get("judge_steps", True):  # [] : an older run.json without the key had steps
            return '<p class="note">This run judged nothing: it was made without judging steps.</p>'
        return '<p class="note">No scores yet.</p>'
    text = ('<p class="note">BooookScore is the share of summary sentences a reader would not find confusing '
            '(higher is better). The claim shares are of the claims the judge verified against the book.</p>')
    return f'{text}\n<ul class="cards">{"".join(cards)}</ul>\n{_judges_block(data)}'


def run_judges(data: RunData) -> dict[str, Any]:
    """The judge of each judging step: from its record, else from run.json. A record kept from an
    earlier version of booklens may lack what run.json says of the same program (`compiled_with`),
    and a record a rerun reused predates a calibration made since: for the same judge (program, mode,
    LM and server), run.json, written by the latest run, says how far it is trusted."""
    judges = dict(data.run.judges)
    for task, record in (("coherence", data.coherence), ("verification", data.faithfulness)):
        if record is None or record.judge is None:
            continue
        judge, listed = record.judge, judges.get(task)
        if listed is not None and listed.program_sha256 == judge.program_sha256:
            if judge.compiled_with is None and listed.compiled_with:
                judge = judge.model_copy(update={"compiled_with": listed.compiled_with})
            if (listed.mode, listed.lm, listed.api_base) == (judge.mode, judge.lm, judge.api_base):
                judge = judge.model_copy(update={"calibration": listed.calibration, "warning": listed.warning})
        judges[task] = judge
    return {name: judges[name] for name in ("coherence", "verification") if name in judges}


_JUDGE_NAMES = {"coherence": "Coherence judge", "verification": "Claim verification judge"}


def _figure_text(name: str, block: Any) -> Optional[str]:
    if not isinstance(block, dict) or block.get("value") is None:
        return None
    lo, hi = (block.get("ci95") or [None, None])[:2]
    interval = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
    return f"{name} {block['value']:.2f}{interval}"


# Every booklens page names its maker: a command may replace such a page where it would refuse to
# replace somebody's file (`booklens.records.written_by_booklens`).
GENERATOR = "booklens"


def page_head(title: str, extra_style: str = "") -> str:
    """The start of every booklens page, up to </head>: no script, nothing loaded (CSP), inline style."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="{GENERATOR}">
<meta http-equiv="Content-Security-Policy" content="{h(CSP)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{h(title)}</title>
<style>{STYLE}{extra_style}</style>
</head>"""


def judge_card(task: str, judge: Any) -> str:
    """A score card naming a judge, its agreement with humans and, when low or unknown, a warning."""
    from booklens.judges import judge_lm, window_note

    program = {"default": "default few-shot program", "zero-shot": "zero-shot program"}.get(
        judge.program, f"program {judge.program}")
    window = window_note(judge)
    detail = [f"{program} ({judge.mode}, {_plural(judge.demos, 'demo')}) on {judge_lm(judge)}"
              + (f", {window}" if window else "")]
    if judge.compiled_with and judge.compiled_with != judge.lm:
        detail.append(f"compiled with {judge.compiled_with}, whose answers chose its demos and instructions")
    if getattr(judge, "demos_note", None):
        detail.append(judge.demos_note)
    c = judge.calibration or {}
    figures = c.get("figures") or {}
    if task == "coherence":
        shown = [_figure_text('"confusing" F1', figures.get("f1")), _figure_text("kappa", figures.get("kappa"))]
        headline = _figure_text("kappa", figures.get("kappa"))
    else:
        f1 = figures.get("f1") or {}
        shown = [_figure_text("F1 faithful", f1.get("faithful")), _figure_text("F1 unfaithful", f1.get("unfaithful")),
                 _figure_text("accuracy", figures.get("accuracy"))]
        headline = _figure_text("F1 unfaithful", f1.get("unfaithful"))
    if c:
        from booklens.judges import evidence_note, failed_note

        failed = failed_note(task, c)
        detail.append(f"agreement with human annotators on {c.get('sample_name', 'the test split')}: "
                      + ", ".join(x for x in shown if x) + (f" ({failed})" if failed else ""))
        setting = evidence_note(judge)
        if setting:
            detail.append(setting)
        value = (headline or "measured").split(" [")[0]
    else:
        detail.append("its agreement with human annotators was never measured")
        value = "not calibrated"
    cls = "card judge warn" if judge.warning else "card judge"
    warning = (f'<p class="warning"><strong>Warning:</strong> {h(judge.warning)}</p>' if judge.warning else "")
    return (f'<li class="{cls}"><div class="name">{h(_JUDGE_NAMES.get(task, task))}</div>'
            f'<div class="value">{h(value)}</div><div class="detail">{h("; ".join(detail))}.</div>{warning}</li>')


def _judges_block(data: RunData) -> str:
    judges = run_judges(data)
    if not judges:
        return ""
    cards = "".join(judge_card(task, judge) for task, judge in judges.items())
    return (f'<h3 id="judges">Who judged, and how well that judge agrees with humans</h3>\n'
            f'<ul class="cards judges">{cards}</ul>')


# -- summary with highlights -----------------------------------------------------


def _sentence_pieces(text: str, sentences: Sequence[SentenceAnnotation]) -> list[tuple[str, Optional[SentenceAnnotation], str]]:
    """(sentence text, its annotation, the whitespace after it) in order, covering `text`."""
    from booklens.text import sentence_spans

    spans = sentence_spans(text)
    by_index = {s.index: s for s in sentences}
    pieces = []
    if len(spans) == len(sentences):
        ok = True
        for i, (start, end) in enumerate(spans):
            chunk = text[start:end]
            body = chunk.rstrip()
            ann = by_index.get(i)
            if ann is None or " ".join(ann.sentence.split()) != " ".join(body.split()):
                ok = False
                break
            pieces.append((body, ann, chunk[len(body):]))
        if ok:
            return pieces
    # The records disagree with today's sentence splitter: show the judged sentences one after another.
    return [(s.sentence, s, " ") for s in sorted(sentences, key=lambda s: s.index)]


def _tip_body(ann: SentenceAnnotation) -> str:
    if ann.status == "failed":
        return (f'<span class="types">Not judged.</span> The model gave no valid answer after '
                f'{_plural(ann.attempts, "try", "tries")}: {h(ann.error or "no reason recorded")}')
    questions = "".join(f"<li>{h(q)}</li>" for q in ann.questions)
    return (f'<span class="types">Confusing: {h(", ".join(ann.types) or "no type given")}</span>'
            + (f'<br>Questions a reader would ask:<ul>{questions}</ul>' if questions else ""))


def _summary_section(data: RunData) -> str:
    c = data.coherence
    if data.summary is None:
        return '<p class="note">There is no summary: the summary step failed.</p>'
    summary_text = data.summary.summary
    if c is None:
        return (f'<p class="note">Coherence was not scored in this run.</p>\n'
                f'<div class="summary-text">{h(summary_text)}</div>')
    out = []
    n = 0
    for body, ann, after in _sentence_pieces(c.summary, c.sentences):
        if ann is not None and (ann.confusing or ann.status == "failed"):
            failed = ann.status == "failed"
            n += not failed  # the number of the sentence in the list of confusing ones below
            cls = "sent failed" if failed else "sent confusing"
            flag = "?" if failed else str(n)
            out.append(f'<span class="{cls}" id="s{ann.index + 1}"><mark tabindex="0" aria-describedby="tip{ann.index + 1}">'
                       f'{h(body)}<span class="flag" aria-hidden="true">{h(flag)}</span></mark>'
                       f'<span class="tip" role="tooltip" id="tip{ann.index + 1}">{_tip_body(ann)}</span></span>')
        else:
            out.append(h(body))
        out.append(h(after))
    legend = ('<p class="legend">Each <mark>highlighted</mark> sentence confused the judge; hover over it or move '
              'to it with the Tab key to see its error types and the questions a reader would ask. '
              'A dashed underline marks a sentence that could not be judged.</p>')
    listing = _question_list(c)
    return f'{legend}\n<div class="summary-text">{"".join(out)}</div>\n{listing}'


def _question_list(c: CoherenceResult) -> str:
    confusing = [s for s in c.sentences if s.status == "ok" and s.confusing]
    if not confusing:
        return (f'<p>No sentence was judged confusing ({_plural(c.n_sentences, "sentence")}'
                + (f", {c.n_failed:,} not judged" if c.n_failed else "") + ").</p>")
    items = []
    for n, s in enumerate(confusing, start=1):
        questions = "".join(f"<li>{h(q)}</li>" for q in s.questions)
        items.append(f'<li><a href="#s{s.index + 1}">Sentence {s.index + 1}</a> '
                     f'<span class="quote">\u201c{h(s.sentence)}\u201d</span><br>'
                     f'<span class="types">{h(", ".join(s.types))}</span>'
                     f'{f"<ul>{questions}</ul>" if questions else ""}</li>')
    return (f'<h3 id="questions">Confusing sentences and their questions</h3>\n'
            f'<ol class="qlist">{"".join(items)}</ol>')


# -- error type chart ------------------------------------------------------------


def _errors_section(data: RunData) -> str:
    c = data.coherence
    if c is None:
        return '<p class="note">Coherence was not scored in this run.</p>'
    n = c.n_sentences - c.n_failed  # the judged sentences, as the metrics count them
    rates = {t: (100.0 * c.type_counts.get(t, 0) / n if n else 0.0) for t in COHERENCE_ERROR_TYPES}
    top = max(rates.values()) if rates else 0.0
    axis = 10.0
    while axis < top:
        axis = 25.0 if axis == 10.0 else (50.0 if axis == 25.0 else 100.0)
    rows = []
    for t in COHERENCE_ERROR_TYPES:
        width = min(100.0, 100.0 * rates[t] / axis)
        rows.append(f'<tr><th scope="row">{h(t)}</th><td><div class="track" aria-hidden="true">'
                    f'<span class="bar" style="width:{width:.1f}%"></span></div></td>'
                    f'<td class="num">{rates[t]:.1f}% ({c.type_counts.get(t, 0):,} of {n:,})</td></tr>')
    judged = f"{_plural(n, 'judged sentence')}" if c.n_failed else _plural(n, "sentence")
    caption = (f"Share of the summary's {judged} with each error type "
               f"(a sentence can have several); the bars run from 0 to {axis:.0f}%.")
    return f'<table class="chart"><caption>{h(caption)}</caption><tbody>{"".join(rows)}</tbody></table>'


# -- claims ------------------------------------------------------------------------


_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def _evidence_item(e: Evidence, book_chars: int, chunks: Sequence[dict[str, Any]]) -> str:
    role = "supports" if e.supports else ("refutes" if e.refutes else "")
    role_text = {"supports": "Supports the claim", "refutes": "Contradicts the claim"}.get(role, "")
    where = [f"Passage [{e.number}]"]
    if e.passage is not None:
        where.append(f"book passage {e.passage:,}")
    where.append(where_in_book(e.start, e.end, book_chars, chunks))
    if e.score is not None:
        where.append(f"{e.source} score {e.score:.3g}")
    head = f'<span class="role">{h(role_text)}.</span> ' if role_text else ""
    paragraphs = [p for p in _PARAGRAPH_BREAK.split(e.text.strip()) if p.strip()] or [e.text]
    quote = "".join(f"<p>{h(p)}</p>" for p in paragraphs)
    return (f'<li class="{role or "shown"}"><blockquote>{quote}</blockquote>'
            f'<p class="where">{head}{h(SEP.join(where))}</p></li>')


def _claim_item(v: ClaimVerdict, book_chars: int, chunks: Sequence[dict[str, Any]]) -> str:
    parts = [f'<li class="claim {_label_class(v.label)}" id="claim{v.index + 1}">',
             f'<h3><span class="num">Claim {v.index + 1}</span>{h(v.claim)}</h3>',
             f'<p>{_badge(v.label)}</p>']
    if v.label is None:
        parts.append(f'<p class="reason"><b>Not verified:</b> {h(v.error or "no valid label")} '
                     f'({_plural(v.attempts, "try", "tries")})</p>')
    elif v.reason:
        parts.append(f'<p class="reason"><b>Reason:</b> {h(v.reason)}</p>')
    if getattr(v, "truncated", False):
        parts.append('<p class="where">The verifier\u2019s answer was cut off at its token limit after the label '
                     'and reason; the passages it cited are unknown.</p>')
    if v.invalid_references:
        parts.append(f'<p class="where">The verifier also cited passages it was not shown: '
                     f'{h(", ".join(str(n) for n in v.invalid_references))}.</p>')
    key = [e for e in v.evidence if e.supports or e.refutes]
    rest = [e for e in v.evidence if not (e.supports or e.refutes)]
    if key:
        parts.append(f'<ul class="evidence" aria-label="Evidence cited by the verifier">'
                     f'{"".join(_evidence_item(e, book_chars, chunks) for e in key)}</ul>')
    if rest:
        label = ("Evidence shown to the verifier" if not key else "Other passages shown to the verifier")
        parts.append(f'<details><summary>{h(label)} ({len(rest):,})</summary><ul class="evidence">'
                     f'{"".join(_evidence_item(e, book_chars, chunks) for e in rest)}</ul></details>')
    if not v.evidence:
        parts.append('<p class="where">No evidence passages were shown for this claim.</p>')
    parts.append("</li>")
    return "".join(parts)


def _claims_section(data: RunData) -> str:
    f, claim_set = data.faithfulness, data.claims
    if claim_set is not None and claim_set.error:
        return (f'<p>The summary could not be split into claims ({_plural(claim_set.attempts, "try", "tries")}): '
                f'{h(claim_set.error)}</p>')
    if f is None:
        note = "The claims were not verified in this run."
        if claim_set is None or not claim_set.claims:
            return f'<p class="note">{h(note)}</p>'
        # The claims were split (their calls made) though verification failed or has not run: shown
        # unlabelled rather than missing from the page.
        items = "".join(f'<li class="claim" id="claim{i}"><h3><span class="num">Claim {i}</span>{h(claim)}</h3></li>'
                        for i, claim in enumerate(claim_set.claims, start=1))
        note += f" The summary's {_plural(len(claim_set.claims), 'claim')}:"
        return f'<p class="note">{h(note)}</p>\n<ol class="claims">{items}</ol>'
    if not f.claims:
        return '<p>No claims to verify.</p>'
    chunks = getattr(data.summary, "chunks", []) or []
    total = len(claim_set.claims) if claim_set is not None else len(f.claims)
    mode = EVIDENCE_NAMES.get(f.evidence_mode, f.evidence_mode)
    note = f"{_plural(len(f.claims), 'claim')} verified against the book with {mode}"
    if f.evidence_mode in ("bm25", "dense", "hybrid") and f.k:
        note += f" (top {f.k} passages of up to {f.passage_tokens or 0:,} tokens)"
    note += "."
    if total > len(f.claims):
        note += f" The summary has {total:,} claims; the run checked the first {len(f.claims):,} (--max-claims)."
    items = "".join(_claim_item(v, data.run.book_chars, chunks) for v in f.claims)
    return f'<p class="note">{h(note)}</p>\n<ol class="claims">{items}</ol>'


# -- merge tree --------------------------------------------------------------------


_KIND_NAMES = {"chunk": "chunk summary", "merge": "merge", "update": "update", "compress": "compression",
               "clean": "cleanup"}


def _chunk_range(indices: Sequence[int]) -> str:
    if not indices:
        return ""
    lo, hi = min(indices), max(indices)
    return f"chunk {lo}" if lo == hi else f"chunks {lo}\u2013{hi}"


def _node_summary(n: SummaryNode) -> str:
    tokens = f"{n.tokens:,} of {n.budget:,} tokens" if n.budget else f"{n.tokens:,} tokens"
    bits = [f"level {n.level}", tokens, _chunk_range(n.chunks)]
    if n.attempts > 1:
        bits.append(f"{n.attempts} tries")
    if n.cut_off:
        bits.append("the answer stopped at the token cap")
    if n.truncated:  # the answer ran over its budget and was cut to whole sentences within it
        bits.append("trimmed to the budget")
    elif n.over_budget:  # kept whole over its budget (an update or compression a cut would rob of the newest chunk)
        bits.append("over budget")
    if n.dropped_rewrite_tokens is not None and n.cut_off:
        bits.append("the rewrite was left unfinished: summary kept")
    elif n.dropped_rewrite_tokens is not None and n.dropped_rewrite_tokens > n.tokens:
        bits.append(f"the rewrite ran to {n.dropped_rewrite_tokens:,} tokens, longer than the summary: summary kept")
    elif n.dropped_rewrite_tokens is not None:  # it dropped most of the summary's words
        bits.append(f"the rewrite kept too little of the summary ({n.dropped_rewrite_tokens:,} tokens): summary kept")
    elif n.fallback and n.filtered:
        bits.append("the provider's content filter stopped every answer: input kept")
    elif n.fallback:
        bits.append("no answer with words: input kept")
    return (f'<span class="kind">{h(_KIND_NAMES.get(n.kind, n.kind).capitalize())}</span> {h(n.id)}{SEP}'
            f'{h(SEP.join(b for b in bits if b))}')


def _tree_section(data: RunData) -> str:
    s = data.summary
    if s is None:
        return '<p class="note">There is no summary: the summary step failed.</p>'
    nodes: list[SummaryNode] = list(getattr(s, "nodes", []) or [])
    chunks = list(getattr(s, "chunks", []) or [])
    if not nodes:
        return '<p class="note">The summary was given to the run; how it was made is not recorded.</p>'
    by_id = {n.id: n for n in nodes}
    chunk_by_index = {c.get("index"): c for c in chunks}
    book_chars = data.run.book_chars

    def leaf(child: str) -> str:
        try:
            index = int(child[1:])
        except ValueError:
            return f'<li class="leaf">{h(child)}</li>'
        c = chunk_by_index.get(index, {})
        where = where_in_book(c.get("start"), c.get("end"), book_chars) if c else ""
        tokens = f", {c['tokens']:,} tokens" if isinstance(c.get("tokens"), int) else ""
        return f'<li class="leaf">Book chunk {index}: {h(where)}{h(tokens)}</li>'

    method = getattr(s, "method", None)
    if method == "inc":
        items = "".join(f'<li><details><summary>{_node_summary(n)}</summary><div class="node-text">{h(n.text)}</div>'
                        f'</details></li>' for n in nodes)
        intro = (f"Incremental updating: the first chunk was summarized, then the summary was rewritten with each "
                 f"next chunk ({_plural(len(chunks), 'chunk')}), and compressed when it grew past its budget.")
        return f'<p class="note">{h(intro)}</p>\n<ol class="tree">{items}</ol>'

    seen: set[str] = set()

    def render(node_id: str, depth: int) -> str:
        if node_id not in by_id:
            return leaf(node_id)
        if node_id in seen:  # a malformed record must not loop
            return f'<li class="leaf">{h(node_id)} (repeated)</li>'
        seen.add(node_id)
        n = by_id[node_id]
        children = "".join(render(c, depth + 1) for c in n.children)
        open_attr = " open" if depth == 0 else ""
        return (f'<li><details{open_attr}><summary>{_node_summary(n)}</summary>'
                f'<div class="node-text">{h(n.text)}</div>'
                f'{f"<ul>{children}</ul>" if children else ""}</details></li>')

    levels = sorted({n.level for n in nodes if n.kind in ("chunk", "merge")})
    intro = (f"Hierarchical merging: {_plural(len(chunks), 'chunk')} of the book were summarized, and the "
             f"summaries merged level by level ({_plural(len(levels), 'level')}) into one. Open a node to read "
             f"its text and the nodes it was made from.")
    return f'<p class="note">{h(intro)}</p>\n<ul class="tree">{render(nodes[-1].id, 0)}</ul>'


# -- run -----------------------------------------------------------------------------


_STEP_NAMES = {"summary": "Summarize", "coherence": "Coherence (BooookScore)", "claims": "Claim decomposition",
               "faithfulness": "Claim verification"}


def _run_section(data: RunData) -> str:
    run = data.run
    t = run.totals
    # Prompt tokens a provider served from its own prompt cache: a column only where there are any.
    provider_cached = bool(t.get("provider_cached_tokens"))

    def row(label: str, calls: Any, prompt: Any, completion: Any, cost: Any, cached: Any) -> str:
        extra = f'<td class="num">{_int(cached)}</td>' if provider_cached else ""
        return (f'<tr><th scope="row">{h(label)}</th><td class="num">{_int(calls)}</td>'
                f'<td class="num">{_int(prompt)}</td>{extra}<td class="num">{_int(completion)}</td>'
                f'<td class="num">{h(cost_text(cost))}</td></tr>')

    rows = [row(_STEP_NAMES.get(name, name), step.calls, step.prompt_tokens, step.completion_tokens, step.cost_usd,
                step.provider_cached_tokens) for name, step in run.steps.items()]
    rows += [row(f"{_STEP_NAMES.get(name, name)} (failed)", w.get("calls"), w.get("prompt_tokens"),
                 w.get("completion_tokens"), w.get("cost_usd"), w.get("provider_cached_tokens"))
             for name, w in run.failed_work.items()]
    rows.append(row("Total", t.get("calls"), t.get("prompt_tokens"), t.get("completion_tokens"), t.get("cost_usd"),
                    t.get("provider_cached_tokens")))
    cached_head = ('<th scope="col" class="num">of which cached by the provider</th>' if provider_cached else "")
    table = ('<table class="data"><caption>LM work per step (every call the results rest on, including those '
             'answered from the cache)</caption><thead><tr><th scope="col">Step</th><th scope="col" class="num">'
             f'LM calls</th><th scope="col" class="num">Prompt tokens</th>{cached_head}<th scope="col" class="num">'
             f'Completion tokens</th><th scope="col" class="num">Cost</th></tr></thead><tbody>{"".join(rows)}'
             '</tbody></table>')
    config = "".join(f"<dt>{h(k)}</dt><dd>{h(_config_value(v))}</dd>" for k, v in run.config.items())
    versions = ", ".join(f"{k} {v}" for k, v in run.versions.items())
    return (f"{table}\n<h3>Configuration</h3>\n<dl class=\"config\"><dt>book</dt><dd>{h(run.book)}</dd>"
            f"<dt>book sha256</dt><dd><code>{h(run.book_sha256)}</code></dd>{config}</dl>\n"
            f'<h3>Versions</h3>\n<p class="note">{h(versions)}</p>')


def _config_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)
