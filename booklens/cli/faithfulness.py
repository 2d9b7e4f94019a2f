"""Faithfulness commands (FABLES):

    booklens claims SUMMARY                                   summary -> atomic claims
    booklens verify --claims CLAIMS.json [--book BOOK] --evidence MODE
    booklens check BOOK SUMMARY [--evidence MODE]             claims, evidence, verdicts
    booklens data stats fables [--data PATH]                  the seed's Table 2
"""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    ApiBaseOption,
    CacheDirOption,
    ConcurrencyOption,
    LMOption,
    OutputOption,
    ProgramOption,
    read_json_file,
    setup_lm,
    write_output,
)
from booklens.cli.data import stats_app
from booklens.errors import BooklensError
from booklens.lm import usage_delta


class EvidenceMode(str, Enum):
    none = "none"
    given = "given"
    bm25 = "bm25"
    dense = "dense"
    hybrid = "hybrid"
    book = "book"


EvidenceOption = Annotated[EvidenceMode, typer.Option(
    "--evidence", help="none; given (quotes in the claims file); bm25 / dense / hybrid (top-k passages); "
                       "book (as much of the book as the budget holds, around the best passages).")]
KOption = Annotated[int, typer.Option("--k", min=1, help="Passages retrieved per claim (bm25/dense/hybrid).")]
BudgetOption = Annotated[Optional[int], typer.Option(
    "--budget-tokens", min=64, help="Evidence tokens per claim for 'book' and 'given' (default: what the "
                                    "model's context window holds).")]
PassageTokensOption = Annotated[int, typer.Option("--passage-tokens", min=32, help="Maximum tokens per passage.")]


# ---------------------------------------------------------------------------
# Input files


def read_summary(path: Path) -> str:
    """A summary from a text file, a `booklens summarize` result, or JSON with a 'summary' string."""
    from booklens.text import read_text_file

    if path.suffix.lower() == ".json":
        data = read_json_file(path, "summary file")
        text = data.get("summary") if isinstance(data, Mapping) else None
        if not isinstance(text, str):
            raise BooklensError(f"summary file {path} has no 'summary' string")
    else:
        if path.exists() and path.is_file() and path.stat().st_size == 0:
            raise BooklensError(f"the summary is empty: {path}")
        text = read_text_file(path)
    if not text.strip():
        raise BooklensError(f"the summary is empty: {path}")
    return text.strip()


def _evidence_texts(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise BooklensError(f"{where}: 'evidence' must be a list of quotes")
    out = []
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Mapping) and isinstance(item.get("text"), str):
            out.append(item["text"])  # evidence of an earlier booklens result
        else:
            raise BooklensError(f"{where}: 'evidence' must be a list of quotes (strings)")
    return out


def read_claims(path: Path) -> tuple[list[str], Optional[list[Optional[list[str]]]]]:
    """Claims (and evidence quotes where given) from a claims file.

    Accepted: a list of claim strings or of objects {"claim": str, "evidence": [str, ...]}, or an
    object with such a list under "claims" (what `booklens claims` and `booklens verify` write)."""
    data = read_json_file(path, "claims file")
    items = data.get("claims") if isinstance(data, Mapping) else data
    shape = ("expected a list of claims (strings or objects with a 'claim' string), "
             "or an object with such a list under 'claims'")
    if not isinstance(items, list):
        raise BooklensError(f"claims file {path}: {shape}")
    if not items:
        raise BooklensError(f"claims file {path} has no claims")
    claims: list[str] = []
    evidence: list[Optional[list[str]]] = []
    for n, item in enumerate(items):
        where = f"claims file {path}, claim {n}"
        if isinstance(item, str):
            claims.append(item)
            evidence.append(None)
        elif isinstance(item, Mapping) and isinstance(item.get("claim"), str):
            claims.append(item["claim"])
            evidence.append(_evidence_texts(item["evidence"], where) if "evidence" in item else None)
        else:
            raise BooklensError(f"claims file {path}: {shape} (claim {n} is {type(item).__name__})")
        if not claims[-1].strip():
            raise BooklensError(f"{where} is empty")
    return claims, (evidence if any(e is not None for e in evidence) else None)


def _read_book(book: Path) -> str:
    from booklens.text import read_book

    return read_book(book)


def _needs_book(mode: EvidenceMode, book: Optional[Path]) -> None:
    if mode.value in ("bm25", "dense", "hybrid", "book") and book is None:
        raise BooklensError(f"--evidence {mode.value} needs the book: pass --book BOOK")


def _index(text: str, cache_dir: Optional[Path], passage_tokens: int):
    from booklens.lm import default_cache_dir
    from booklens.retrieval import BookIndex

    return BookIndex.build(text, cache_dir=Path(cache_dir or default_cache_dir()) / "indexes",
                           passage_tokens=passage_tokens)


def _lm_label(lm) -> str:
    return str(getattr(lm, "label", getattr(lm, "model", lm)))


def run_verification(*, claims: list[str], given: Optional[list[Optional[list[str]]]], book: Optional[Path],
                     book_text: Optional[str], summary: Optional[str], mode: str, k: int,
                     budget_tokens: Optional[int], passage_tokens: int, concurrency: int,
                     cache_dir: Optional[Path], lm, decompose: bool = False, programs: Optional[dict] = None):
    """Build the index when needed, run the checker, and wrap the result in a FaithfulnessReport."""
    import hashlib

    from booklens.programs.faithfulness import build_checker
    from booklens.records import FaithfulnessReport

    started = time.perf_counter()
    index = None
    index_seconds = 0.0
    if book_text is not None and mode != "none":
        index = _index(book_text, cache_dir, passage_tokens)
        if mode in ("dense", "hybrid", "book"):
            index.ensure_dense()
        index_seconds = time.perf_counter() - started
    programs = programs or {}  # compiled programs by task (`--program`)
    checker = build_checker(evidence_mode=mode, k=k, budget_tokens=budget_tokens, concurrency=concurrency,
                            decomposer=programs.get("decomposition"), verifier=programs.get("verification"))
    before = lm.usage.snapshot()
    t0 = time.perf_counter()
    given_lists = [g or [] for g in given] if given is not None else None
    if decompose:
        result = checker(summary=summary, index=index, given_evidence=given_lists)
    else:
        result = checker(claims=claims, index=index, given_evidence=given_lists)
    run_seconds = time.perf_counter() - t0
    return FaithfulnessReport(
        book=str(book) if book else None,
        book_sha256=hashlib.sha256(book_text.encode("utf-8")).hexdigest() if book_text is not None else None,
        summary=summary, evidence_mode=mode,
        k=k if mode in ("bm25", "dense", "hybrid") else None,
        budget_tokens=checker.resolved_budget() if mode in ("book", "given") else None,
        passage_tokens=passage_tokens if index is not None else None,
        claims=result.claims, label_counts=result.label_counts, label_percentages=result.label_percentages,
        failures=result.failures, lm=_lm_label(lm), usage=usage_delta(before, lm.usage.snapshot()),
        timings={"index_seconds": round(index_seconds, 3), "verify_seconds": round(run_seconds, 3),
                 "total_seconds": round(time.perf_counter() - started, 3)},
    )


def _compiled(paths: Optional[list[Path]], command: str, tasks: tuple[str, ...]) -> dict:
    """`--program` artifacts loaded into fresh programs of their tasks (before any model loads)."""
    if not paths:
        return {}
    from booklens.optimizers.artifacts import load_programs
    from booklens.programs.faithfulness import build_decomposer, build_verifier

    builders = {"decomposition": build_decomposer, "verification": build_verifier}
    return load_programs(paths, {t: builders[t] for t in tasks}, command=command)


def _report_line(report) -> None:
    p = report.label_percentages
    cant = p["can't verify"]
    typer.echo(f"{len(report.claims)} claims: {p['faithful']:.1f}% faithful, {p['unfaithful']:.1f}% unfaithful, "
               f"{p['partial support']:.1f}% partial support, {cant:.1f}% can't verify, "
               f"{report.failures} failed; {report.usage.get('calls', 0)} LM calls "
               f"({report.usage.get('cached_calls', 0)} from cache)", err=True)


# ---------------------------------------------------------------------------
# Commands


@app.command("claims")
def claims_command(
    summary: Annotated[Path, typer.Argument(help="The summary: a text file, or JSON with a 'summary' string "
                                                 "(e.g. the output of `booklens summarize`).")],
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
    program: ProgramOption = None,
) -> None:
    """Split a summary into atomic, self-contained claims."""
    from booklens.lm import usage_step
    from booklens.programs.faithfulness import build_decomposer
    from booklens.records import ClaimSet

    text = read_summary(summary)
    decomposer = build_decomposer()
    if program is not None:
        from booklens.optimizers.artifacts import load_program

        load_program(decomposer, program, task="decomposition")
    model = setup_lm(lm, api_base, cache_dir)
    before = model.usage.snapshot()
    with usage_step("decompose"):
        result = decomposer(summary=text)
    if result.error:
        raise BooklensError(f"could not split the summary into claims ({result.attempts} tries): {result.error}")
    record = ClaimSet(summary=text, claims=result.claims, attempts=result.attempts, lm=_lm_label(model),
                      usage=usage_delta(before, model.usage.snapshot()))
    write_output(output, record)
    if output is not None:
        typer.echo(f"{len(record.claims)} claims", err=True)


@app.command("verify")
def verify_command(
    claims: Annotated[Path, typer.Option("--claims", help="Claims JSON: a list of strings or of "
                                                          "{claim, evidence}, or the output of `booklens claims`.")],
    book: Annotated[Optional[Path], typer.Option("--book", help="The book (.txt or .epub); needed by "
                                                                "bm25/dense/hybrid/book evidence.")] = None,
    evidence: EvidenceOption = EvidenceMode.bm25,
    k: KOption = 5,
    budget_tokens: BudgetOption = None,
    passage_tokens: PassageTokensOption = 256,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
    program: ProgramOption = None,
) -> None:
    """Verify claims against a book: faithful, unfaithful, partial support or can't verify."""
    claim_list, given = read_claims(claims)
    _needs_book(evidence, book)
    if evidence is EvidenceMode.given:
        missing = [i for i, g in enumerate(given or [None] * len(claim_list)) if g is None]
        if missing:
            raise BooklensError(f"--evidence given needs an 'evidence' list of quotes with every claim "
                                f"(claim {missing[0]} of {claims} has none)")
    book_text = _read_book(book) if book is not None else None
    programs = _compiled([program] if program is not None else [], "verify", ("verification",))
    model = setup_lm(lm, api_base, cache_dir)
    report = run_verification(claims=claim_list, given=given if evidence is EvidenceMode.given else None,
                              book=book, book_text=book_text, summary=None, mode=evidence.value, k=k,
                              budget_tokens=budget_tokens, passage_tokens=passage_tokens, concurrency=concurrency,
                              cache_dir=cache_dir, lm=model, programs=programs)
    write_output(output, report)
    if output is not None:
        _report_line(report)


@app.command("check")
def check_command(
    book: Annotated[Path, typer.Argument(help="The book (.txt or .epub).")],
    summary: Annotated[Path, typer.Argument(help="Its summary: a text file or JSON with a 'summary' string.")],
    evidence: EvidenceOption = EvidenceMode.bm25,
    k: KOption = 5,
    budget_tokens: BudgetOption = None,
    passage_tokens: PassageTokensOption = 256,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
    program: Annotated[Optional[list[Path]], typer.Option(
        "--program", help="Compiled decomposition and/or verification artifacts (JSON); repeat for both.")] = None,
) -> None:
    """Check a summary against its book: claims, evidence, a verdict per claim, % of each label."""
    if evidence is EvidenceMode.given:
        raise BooklensError("--evidence given needs quotes with each claim; use `booklens verify` with a claims file")
    book_text = _read_book(book)
    summary_text = read_summary(summary)
    programs = _compiled(program, "check", ("decomposition", "verification"))
    model = setup_lm(lm, api_base, cache_dir)
    report = run_verification(claims=[], given=None, book=book, book_text=book_text, summary=summary_text,
                              mode=evidence.value, k=k, budget_tokens=budget_tokens, passage_tokens=passage_tokens,
                              concurrency=concurrency, cache_dir=cache_dir, lm=model, decompose=True,
                              programs=programs)
    write_output(output, report)
    if output is not None:
        _report_line(report)


@stats_app.command("fables")
def fables_stats_command(
    data: Annotated[Optional[Path], typer.Option("--data", help="FABLES.json (or the release's .json.zip); "
                                                                "default: download the public release.")] = None,
    output: OutputOption = None,
) -> None:
    """Label distribution and claims per summary by summarizer (the seed's Table 2)."""
    from booklens.data.fables import format_statistics, label_statistics, load_fables

    summaries = load_fables(data)
    stats = label_statistics(summaries)
    typer.echo(format_statistics(stats))
    if output is not None:
        write_output(output, stats)
