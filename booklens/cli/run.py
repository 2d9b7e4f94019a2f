"""From book to report in one command:

    booklens run BOOK [--summary FILE] [--method hier|inc] [--evidence MODE] [--lm ...] -o RUN_DIR
    booklens report RUN_DIR [-o FILE]
    booklens report SWEEP_DIR --table markdown|latex|csv|csv-pairs

`run` drives `booklens.pipeline.run_book` (summary, coherence, claims, verification; each step's
record written as it finishes; a rerun resumes) and prints the scores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    ApiBaseOption,
    BookArgument,
    CacheDirOption,
    ConcurrencyOption,
    LMOption,
    MaxClaimsOption,
    RpmOption,
    StructuredOption,
    TpmOption,
    ZeroShotOption,
    check_not_an_input,
    choices,
    claims_verified,
    echo_artifact_note,
    echo_judge,
    evidence_enum,
    label_shares,
    lm_options,
    output_file,
    output_path,
    output_folder,
    program_path,
)
from booklens.cli.summarize import (
    ChunkSizeOption,
    ContextWindowOption,
    DropMatterOption,
    LevelBudgetOption,
    MaxRegenerationsOption,
    MaxSummaryTokensOption,
    MergeContextOption,
    Method,
    MethodOption,
    RemoveArtifactsOption,
    WordsPerTokenOption,
)
from booklens.errors import BooklensError
from booklens.retrieval import DEFAULT_K, DEFAULT_PASSAGE_TOKENS, MIN_BUDGET_TOKENS, MIN_PASSAGE_TOKENS, RUN_MODES
from booklens.sweep import TABLE_FORMATS
from booklens.vocabulary import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_SUMMARY_TOKENS,
    DEFAULT_WORDS_PER_TOKEN,
    MIN_CONTEXT_WINDOW,
    counted,
)

RunEvidence = evidence_enum("RunEvidence", RUN_MODES)
# The judges' window; --context-window is the summarizer's.
JUDGE_CONTEXT_WINDOW = "--judge-context-window"
TableFormat = choices("TableFormat", TABLE_FORMATS)


def score_line(run, sent_now: int | None = None, total_claims: int | None = None) -> str:
    """One line of a run's scores and LM work, as `run` prints it. The work is the run's
    whole work, as when first made; `sent_now`, the calls this command sent to a model, is said
    beside it when fewer, so that a resumed run does not read as spending it all again.
    `total_claims`: the faithfulness record's, the claims there were when --max-claims verified fewer."""
    s = run.scores
    labels = s.get("claim_labels") or {}
    score = s.get("booookscore")
    parts = [f"BooookScore {'-' if score is None else f'{100 * score:.1f}'}"]
    if s.get("failed_sentences"):
        parts[0] += f" ({counted(s['failed_sentences'], 'sentence')} not judged, left out of the score)"
    if s.get("claims"):
        verifier = run.judges.get("verification")  # its mode is its label set
        shares = label_shares(labels, s.get("failed_claims") or 0, getattr(verifier, "mode", "four-way"))
        parts.append(f"{claims_verified(s['claims'], total_claims)}: {shares}")
    t = run.totals
    calls = counted(t["calls"], "LM call")
    if sent_now is not None and sent_now < t["calls"]:
        calls += f" ({sent_now} sent now, the rest reused from earlier runs or the cache)"
    parts.append(f"{calls}, {t['prompt_tokens']} prompt + {t['completion_tokens']} completion tokens"
                 + (f", ${t['cost_usd']:.4f}" if t.get("cost_usd") is not None else ""))
    return "; ".join(parts)


@app.command("run")
def run_command(
    book: BookArgument,
    output: Annotated[Path, typer.Option("-o", "--output", parser=output_folder, metavar="<path>",
                                         help="The run directory to write (or resume).")],
    summary: Annotated[Optional[Path], typer.Option(
        "--summary", help="Judge this summary instead of writing one: a text file, a `booklens summarize` "
                          "output or JSON with a 'summary' string.")] = None,
    method: MethodOption = Method.hier,
    chunk_size: ChunkSizeOption = DEFAULT_CHUNK_SIZE,
    context_window: ContextWindowOption = None,
    max_summary_tokens: MaxSummaryTokensOption = DEFAULT_SUMMARY_TOKENS,
    level_budget: LevelBudgetOption = None,
    merge_context: MergeContextOption = None,
    words_per_token: WordsPerTokenOption = DEFAULT_WORDS_PER_TOKEN,
    max_regenerations: MaxRegenerationsOption = None,
    remove_artifacts: RemoveArtifactsOption = True,
    drop_matter: DropMatterOption = False,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Coherence: sentences per LM call "
                                                                        "(1 = the paper's setting).")] = 1,
    evidence: Annotated[RunEvidence, typer.Option(
        "--evidence", help="Evidence per claim: " + RunEvidence.help)] = RunEvidence.bm25,
    k: Annotated[Optional[int], typer.Option(
        "--k", min=1, help=f"Passages retrieved per claim (bm25/dense/hybrid; default {DEFAULT_K}).")] = None,
    budget_tokens: Annotated[Optional[int], typer.Option(
        "--budget-tokens", min=MIN_BUDGET_TOKENS,
        help="Evidence tokens per claim with --evidence book (default: what the context window holds).")] = None,
    passage_tokens: Annotated[Optional[int], typer.Option(
        "--passage-tokens", min=MIN_PASSAGE_TOKENS,
        help=f"Maximum tokens per passage (modes that read the book; default {DEFAULT_PASSAGE_TOKENS}).")] = None,
    max_claims: MaxClaimsOption = None,
    judge_context_window: Annotated[Optional[int], typer.Option(
        JUDGE_CONTEXT_WINDOW, min=MIN_CONTEXT_WINDOW,
        help=f"Tokens the judges' prompts are sized for (default: what LiteLLM or the --api-base server states, "
             f"else {DEFAULT_CONTEXT_WINDOW}; llama-cpp-python's server states none). --context-window sets the "
             "summarizer's.")] = None,
    program: Annotated[Optional[list[Path]], typer.Option(
        "--program", parser=program_path, metavar="<path>",
        help="A compiled program (summarize, coherence, decomposition or verification); repeat for several.")] = None,
    zero_shot: ZeroShotOption = False,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
) -> None:
    """Summarize a book, score coherence, verify claims; write a run directory and report.html."""
    from booklens.lm import LMPool, refuse_server_options_for_embedded
    from booklens.inputs import read_given_summary
    from booklens.pipeline import (JudgeConfig, SystemConfig, check_cache_outside, check_configs, previous_run,
                                   route_programs, run_book)
    from booklens.reports import REPORT_FILE
    from booklens.steps import check_method_options
    from booklens.text import read_book

    refuse_server_options_for_embedded(lm, api_base, **lm_options(structured, rpm, tpm))
    programs = route_programs(program or [])
    merge_context = merge_context.value if merge_context is not None else None
    if summary is None:
        check_method_options(method.value, level_budget, merge_context, max_summary_tokens=max_summary_tokens)
    system = SystemConfig(method=method.value, chunk_size=chunk_size, context_window=context_window,
                          max_summary_tokens=max_summary_tokens, max_regenerations=max_regenerations,
                          level_budgets=level_budget, merge_context=merge_context, words_per_token=words_per_token,
                          remove_artifacts=remove_artifacts, drop_matter=drop_matter,
                          program=programs.pop("summarize", None), summary_file=summary, lm=lm, api_base=api_base)
    # k and passage_tokens only when given, so that the config tells them from its defaults
    retrieval = {name: value for name, value in (("k", k), ("passage_tokens", passage_tokens)) if value is not None}
    judge = JudgeConfig(evidence=evidence.value, budget_tokens=budget_tokens, **retrieval, max_claims=max_claims,
                        batch_size=batch_size, programs=programs, zero_shot=zero_shot,
                        context_window=judge_context_window)
    if summary is not None and system.program is not None:
        raise BooklensError("--summary gives the summary: a compiled summarizer (--program) would not run")
    check_configs(system, judge, as_keys=False)
    # Bad input fails before any model loads or anything is written.
    book_text = read_book(book, drop_matter=drop_matter)
    if summary is not None:
        read_given_summary(summary)
    previous_run(output)
    check_cache_outside(output, cache_dir)  # before the pool makes the cache folder
    lms = LMPool(lm, api_base, cache_dir=cache_dir, concurrency=concurrency, **lm_options(structured, rpm, tpm))
    run = run_book(book, output, system, judge, lms=lms, concurrency=concurrency, book_text=book_text,
                   window_option=JUDGE_CONTEXT_WINDOW, as_keys=False)
    total_claims = None
    if "faithfulness" in run.steps:  # run.json's scores count the verified claims only
        from booklens.reports import read_step_record

        total_claims = read_step_record(output, "faithfulness").total_claims
    typer.echo(score_line(run, sent_now=lms.usage.total.calls, total_claims=total_claims), err=True)
    for info in run.judges.values():
        echo_judge(info, cache_dir)
    echo_artifact_note(system.program, run.lm)
    echo_artifact_note(judge.programs.get("decomposition"), run.judge_lm or run.lm)
    typer.echo(f"wrote {output / REPORT_FILE}", err=True)
    if run.failures:
        failed = ", ".join(f"{step} ({reason})" for step, reason in run.failures.items())
        # A step that names a setting to change would fail the same way under the same command.
        from booklens.lm.base import advises_setting

        names_setting = any(advises_setting(reason) for reason in run.failures.values())
        advice = "rerun with the setting it names to retry" if names_setting else "rerun the same command to retry"
        raise BooklensError(f"the run is incomplete: {failed}; {advice}")


@app.command("report")
def report_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `booklens run`, or a sweep directory.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", parser=output_path, callback=output_file,
                                                   help="Write the page here instead of RUN_DIR/report.html.")]
    = None,
    table: Annotated[Optional[TableFormat], typer.Option(
        "--table", help="Print a finished sweep's tables from its results.json instead, to paste into a paper or "
                        "a README: markdown or latex (the systems and the paired differences), csv (the systems' "
                        "raw figures) or csv-pairs (the paired differences'); writes nothing.")] = None,
) -> None:
    """Rebuild a run (or sweep) directory's report.html from its JSON records, or print a sweep's tables
    (--table)."""
    if table is not None:
        if output is not None:
            raise BooklensError("--table prints the tables to stdout and writes no page: -o would not apply")
        from booklens.sweep.tables import sweep_table

        notes: list[str] = []
        text = sweep_table(run_dir, table.value, notify=notes.append)
        for note in notes:
            typer.echo(f"note: {note}", err=True)
        typer.echo(text, nl=False)
        return
    from booklens.reports import run_inputs, write_report

    # the files the run read (its book, given summary, programs) by path; write_report also tells the book and
    # a given summary by their texts, wherever run.json's relative paths point
    check_not_an_input(output, run_inputs(run_dir))
    notes: list[str] = []
    target = write_report(run_dir, output, notify=notes.append)
    typer.echo(f"wrote {target}", err=True)
    for note in notes:
        typer.echo(f"note: {note}", err=True)
