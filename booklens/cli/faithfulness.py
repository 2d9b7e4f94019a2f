"""Faithfulness commands (FABLES):

    booklens claims SUMMARY                                   summary -> atomic claims
    booklens verify --claims CLAIMS.json [--book BOOK] --evidence MODE
    booklens check BOOK SUMMARY [--evidence MODE]             claims, evidence, verdicts
    booklens data stats fables [--data PATH]                  the seed's Table 2
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    JUDGE_WINDOW_OPTION,
    ApiBaseOption,
    CacheDirOption,
    ConcurrencyOption,
    JudgeWindowOption,
    LMOption,
    MaxClaimsOption,
    OutputOption,
    ProgramOption,
    RpmOption,
    StructuredOption,
    TpmOption,
    ZeroShotOption,
    claims_verified,
    data_path,
    echo_artifact_note,
    echo_judge,
    evidence_enum,
    label_shares,
    program_path,
    setup_lm,
    write_output,
)
from booklens.cli.data import stats_app
from booklens.errors import BooklensError
from booklens.lm.base import lm_label
from booklens.retrieval import (DEFAULT_K, DEFAULT_PASSAGE_TOKENS, EVIDENCE_MODES, MIN_BUDGET_TOKENS,
                                MIN_PASSAGE_TOKENS, RUN_MODES)
from booklens.vocabulary import counted


EvidenceMode = evidence_enum("EvidenceMode", EVIDENCE_MODES)
EvidenceOption = Annotated[EvidenceMode, typer.Option("--evidence", help="Evidence per claim: " + EvidenceMode.help)]
# `check` makes its claims, so no claim comes with quotes of its own.
CheckEvidence = evidence_enum("CheckEvidence", RUN_MODES)
# k and passage size: None until given, so that one given where the mode never uses it is refused
KOption = Annotated[Optional[int], typer.Option(
    "--k", min=1, help=f"Passages retrieved per claim (bm25/dense/hybrid; default {DEFAULT_K}).")]
BudgetOption = Annotated[Optional[int], typer.Option(
    "--budget-tokens", min=MIN_BUDGET_TOKENS,
    help="Evidence tokens per claim for 'book' and 'given' (default: what the model's context window holds).")]
# `check` has no 'given' mode (see CheckEvidence).
CheckBudgetOption = Annotated[Optional[int], typer.Option(
    "--budget-tokens", min=MIN_BUDGET_TOKENS,
    help="Evidence tokens per claim for 'book' (default: what the model's context window holds).")]
PassageTokensOption = Annotated[Optional[int], typer.Option(
    "--passage-tokens", min=MIN_PASSAGE_TOKENS,
    help=f"Maximum tokens per passage (modes that read the book; default {DEFAULT_PASSAGE_TOKENS}).")]
BinaryOption = Annotated[bool, typer.Option(
    "--binary", help="The binary rater of FABLES Table 5: faithful or unfaithful only (its F1 compares with the "
                     "paper's).")]


def _programs(paths: Optional[list[Path]], command: str, tasks: tuple[str, ...], *, zero_shot: bool,
              binary: bool, evidence: Optional[str] = None) -> tuple[dict, dict]:
    """The command's programs by task: `--program` artifacts, else the default judges (or zero-shot ones),
    loaded before any model (see `booklens.judges.judge_programs`); and the artifacts' files by task."""
    from booklens.judges import judge_programs
    from booklens.pipeline import route_programs

    artifacts = route_programs(list(paths or []), allowed=tasks, command=f"booklens {command}")
    return judge_programs(artifacts, tasks=tasks, zero_shot=zero_shot, binary=binary, evidence=evidence), artifacts


def _report_line(report, cache_dir: Optional[Path] = None) -> None:
    """The command's summary line, then a one-line error (exit 2, the record already written) when the
    judge verified no claim at all: such a report is not a score."""
    from booklens.lm.usage import describe_calls
    from booklens.steps import judged_nothing

    shares = label_shares(report.label_percentages, report.failures, report.label_set)
    verified = claims_verified(len(report.claims), report.total_claims)
    typer.echo(f"{verified}: {shares}; "
               f"{describe_calls(report.usage, tokens=False)}", err=True)
    echo_judge(report.judge, cache_dir)
    reason = judged_nothing(report)
    if reason:
        raise BooklensError(reason)


# ---------------------------------------------------------------------------
# Commands


@app.command("claims")
def claims_command(
    summary: Annotated[Path, typer.Argument(help="The summary: a text file, or JSON with a 'summary' string "
                                                 "(e.g. the output of `booklens summarize`).")],
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
    program: ProgramOption = None,
) -> None:
    """Split a summary into atomic, self-contained claims."""
    # No --concurrency: the whole summary goes to the decomposer in one call.
    from booklens.inputs import read_summary_text
    from booklens.steps import decompose_summary

    text = read_summary_text(summary)
    programs, _ = _programs([program] if program is not None else [], "claims", ("decomposition",), zero_shot=False,
                            binary=False)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm)
    echo_artifact_note(program, lm_label(model))
    record = decompose_summary(text, decomposer=programs.get("decomposition"))
    if record.error:
        raise BooklensError(f"could not split the summary into claims ({record.attempts} tries): {record.error}")
    write_output(output, record)
    from booklens.lm.usage import describe_calls

    typer.echo(f"{counted(len(record.claims), 'claim')}; {describe_calls(record.usage)}", err=True)


@app.command("verify")
def verify_command(
    claims: Annotated[Path, typer.Option("--claims", help="Claims JSON: a list of strings or of "
                                                          "{claim, evidence}, or the output of `booklens claims`.")],
    book: Annotated[Optional[Path], typer.Option("--book", help="The book (.txt, .epub or .html: as `summarize` reads "
                                                                "it); needed by bm25/dense/hybrid/book evidence.")] = None,
    evidence: EvidenceOption = EvidenceMode.bm25,
    k: KOption = None,
    budget_tokens: BudgetOption = None,
    passage_tokens: PassageTokensOption = None,
    max_claims: MaxClaimsOption = None,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: ConcurrencyOption = 4,
    context_window: JudgeWindowOption = None,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
    program: ProgramOption = None,
    zero_shot: ZeroShotOption = False,
    binary: BinaryOption = False,
) -> None:
    """Verify claims against a book: faithful, unfaithful, partial support or can't verify."""
    from booklens.inputs import check_claims_book, read_claims
    from booklens.retrieval import BOOK_MODES, check_evidence_options
    from booklens.steps import verify_claims
    from booklens.text import read_book

    check_evidence_options(evidence.value, k=k, budget_tokens=budget_tokens, passage_tokens=passage_tokens,
                           has_book=book is not None)
    if book is not None and evidence is EvidenceMode.none:
        raise BooklensError("--evidence none reads nothing from the book: --book would not apply")
    claim_list, given = read_claims(claims)
    if evidence.value in BOOK_MODES and book is None:
        raise BooklensError(f"--evidence {evidence.value} needs the book: pass --book BOOK")
    if evidence is EvidenceMode.given:
        from booklens.programs.faithfulness import first_without_quotes

        # Checked here too, before the book is read, to name the file.
        missing = first_without_quotes(given, len(claim_list))
        if missing is not None:
            raise BooklensError(f"--evidence given needs an 'evidence' list of quotes with every claim "
                                f"(claim {missing + 1} of {claims} has none)")
    book_text = read_book(book) if book is not None else None
    if book is not None:
        check_claims_book(claims, book, book_text)
    programs, _ = _programs([program] if program is not None else [], "verify", ("verification",),
                            zero_shot=zero_shot, binary=binary, evidence=evidence.value)
    setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm, context_window=context_window)
    report = verify_claims(claims=claim_list, given=given if evidence is EvidenceMode.given else None,
                           book=book, book_text=book_text, mode=evidence.value, k=k, budget_tokens=budget_tokens,
                           passage_tokens=passage_tokens, concurrency=concurrency, cache_dir=cache_dir,
                           programs=programs, as_keys=False, window_option=JUDGE_WINDOW_OPTION,
                           max_claims=max_claims)
    write_output(output, report)
    _report_line(report, cache_dir)


@app.command("check")
def check_command(
    book: Annotated[Path, typer.Argument(help="The book (.txt or .epub).")],
    summary: Annotated[Path, typer.Argument(help="Its summary: a text file or JSON with a 'summary' string.")],
    evidence: Annotated[CheckEvidence, typer.Option("--evidence", help="Evidence per claim: " + CheckEvidence.help)]
    = CheckEvidence.bm25,
    k: KOption = None,
    budget_tokens: CheckBudgetOption = None,
    passage_tokens: PassageTokensOption = None,
    max_claims: MaxClaimsOption = None,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: ConcurrencyOption = 4,
    context_window: JudgeWindowOption = None,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
    program: Annotated[Optional[list[Path]], typer.Option(
        "--program", parser=program_path, metavar="<path>",
        help="Compiled decomposition and/or verification artifacts (JSON); repeat for both.")] = None,
    zero_shot: ZeroShotOption = False,
    binary: BinaryOption = False,
) -> None:
    """Check a summary against its book: claims, evidence, a verdict per claim, % of each label."""
    from booklens.inputs import other_text_warning, read_summary_text, summary_of_other_text
    from booklens.retrieval import check_evidence_options
    from booklens.steps import verify_claims
    from booklens.text import read_book

    check_evidence_options(evidence.value, k=k, budget_tokens=budget_tokens, passage_tokens=passage_tokens,
                           has_given=False)
    book_text = read_book(book)
    summary_text = read_summary_text(summary)
    if summary_of_other_text(summary, book, book_text):
        typer.echo(other_text_warning(summary, book), err=True)
    programs, artifacts = _programs(program, "check", ("decomposition", "verification"), zero_shot=zero_shot,
                                    binary=binary, evidence=evidence.value)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm, context_window=context_window)
    echo_artifact_note(artifacts.get("decomposition"), lm_label(model))  # the verifier's is under its judge line
    report = verify_claims(claims=[], book=book, book_text=book_text, summary=summary_text, mode=evidence.value,
                           k=k, budget_tokens=budget_tokens, passage_tokens=passage_tokens, concurrency=concurrency,
                           cache_dir=cache_dir, decompose=True, programs=programs, as_keys=False,
                           window_option=JUDGE_WINDOW_OPTION, max_claims=max_claims)
    write_output(output, report)
    _report_line(report, cache_dir)


@stats_app.command("fables")
def fables_stats_command(
    data: Annotated[Optional[Path], typer.Option(
        "--data", parser=data_path, metavar="<path>",
        help="FABLES.json, its folder, or the release's .json.zip; default: ../shared/data/fables/FABLES.json if "
             "present, else the public release, downloaded once.")] = None,
    output: OutputOption = None,
) -> None:
    """Label distribution and claims per summary by summarizer (the seed's Table 2)."""
    from booklens.data.fables import format_statistics, label_statistics, load_fables

    summaries = load_fables(data)
    stats = label_statistics(summaries)
    typer.echo(format_statistics(stats))
    if output is not None:
        write_output(output, stats)
