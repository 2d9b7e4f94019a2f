"""Coherence (BooookScore):

    booklens score SUMMARY [--book BOOK] [--batch-size K] -o OUT.json
    booklens score --annotations ANNOT.json [--summaries SUMMARIES.json] -o OUT.json
    booklens agree A.json B.json [--summaries SUMMARIES.json]

SUMMARY is a text file, a `booklens summarize` output, or a JSON map book -> summary
(a value may also be an object with a "summary" string, e.g. the human annotation file).
With --annotations no LM runs: the scores come from existing annotations (human span
annotations, or sentence annotations such as GPT-4's with the matching summaries).
"""

from __future__ import annotations

import inspect

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    JUDGE_WINDOW_OPTION,
    ApiBaseOption,
    CacheDirOption,
    ConcurrencyOption,
    JudgeWindowOption,
    LMOption,
    OutputOption,
    ProgramOption,
    RpmOption,
    StructuredOption,
    SplitName,
    TpmOption,
    ZeroShotOption,
    check_lm_options,
    check_not_an_input,
    echo_judge,
    read_json_file,
    retry_count,
    setup_lm,
    write_output,
)
from booklens.errors import BooklensError
from booklens.vocabulary import DEFAULT_TRIES, counted, retry_range


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _report_line(record: Any) -> str:
    from booklens.records import CoherenceSet

    if isinstance(record, CoherenceSet):
        scored = record.n_scored_summaries
        over = (f"{record.n_summaries}" if scored is None or scored == record.n_summaries
                else f"{scored} of {record.n_summaries}")  # the mean leaves out a summary with no score
        ci = record.system_score_ci95
        interval = f" [{_pct(ci[0])}, {_pct(ci[1])}]" if ci else ""  # 95%, resampling summaries
        text = (f"BooookScore {_pct(record.system_score)}{interval} over {over} "
                f"summar{'y' if over == '1' else 'ies'} "
                f"({counted(record.n_sentences, 'sentence')}, {record.n_confusing} confusing"
                + (f"; {record.n_failed} not judged, left out of the score)" if record.n_failed else ")"))
        if record.system_score_sentences is not None and record.system_score_sentences != record.system_score:
            text += f"; {_pct(record.system_score_sentences)} counting every sentence a span touches"
        return text
    text = (f"BooookScore {_pct(record.score)} ({counted(record.n_sentences, 'sentence')}, "
            f"{record.n_confusing} confusing")
    if record.n_failed:
        return text + f"; {record.n_failed} not judged, left out of the score)"
    return text + ")"


@app.command()
def score(
    summary: Annotated[Optional[Path], typer.Argument(
        help="A summary: text file, `booklens summarize` output, JSON with a 'summary' string, or JSON map "
             "book -> summary.")] = None,
    book: Annotated[Optional[Path], typer.Option(
        "--book", help="The book of a single summary, for % novel trigrams (a summarize output names its own).")]
    = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Sentences per LM call: 1 = one call per sentence (the paper's setting).")] = 1,
    annotations: Annotated[Optional[Path], typer.Option(
        "--annotations", help="Score existing annotations (no LM): human span or sentence annotations.")] = None,
    summaries: Annotated[Optional[Path], typer.Option(
        "--summaries", help="With --annotations: JSON map book -> summary the sentence annotations refer to.")]
    = None,
    split: Annotated[Optional[SplitName], typer.Option(
        "--split", help="Only the books of this split (by book, fixed seed) of a JSON map of summaries.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="Only the first N books (sorted).")] = None,
    tries: Annotated[int, typer.Option("--tries", parser=retry_count("--tries"),
                                       help=f"Asks per sentence before a parse failure, {retry_range('--tries')}.")
                     ] = DEFAULT_TRIES,
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
) -> None:
    """BooookScore: the share of a summary's sentences that confuse no reader (Eq. 1)."""
    if annotations is not None:
        if summary is not None:
            raise BooklensError("give either SUMMARY (to score with an LM) or --annotations, not both")
        # Annotations are scored as they are: an option of the LM judge would do nothing.
        judge_settings = {"book": book, "batch_size": batch_size, "tries": tries, "lm": lm, "api_base": api_base,
                          "structured": structured, "rpm": rpm, "tpm": tpm, "concurrency": concurrency,
                          "context_window": context_window, "cache_dir": cache_dir, "program": program,
                          "zero_shot": zero_shot}
        defaults = inspect.signature(score).parameters
        judge_options = {"--" + name.replace("_", "-"): value != defaults[name].default
                         for name, value in judge_settings.items()}
        given = [name for name, is_given in judge_options.items() if is_given]
        if given:
            raise BooklensError(f"--annotations scores existing annotations with no LM: {', '.join(given)} "
                                "would not apply")
        from booklens.data.booookscore import score_annotations

        record, gist = score_annotations(annotations, summaries, split=split.value if split else None,
                                         limit=limit)
        write_output(output, record)
        typer.echo(_report_line(record), err=True)
        if gist:
            typer.echo(f"note: {gist}", err=True)
        return
    if summary is None:
        raise BooklensError("missing SUMMARY (a text file, summarize output or JSON map), or use --annotations")
    if summaries is not None:
        raise BooklensError("--summaries goes with --annotations")
    check_lm_options(lm, api_base, structured=structured, rpm=rpm, tpm=tpm)
    from booklens.inputs import load_summaries

    texts, recorded, is_map = load_summaries(summary, elsewhere=output if book is None else None)
    book_path, book_text = recorded or (None, None)  # the text as summarized, read once
    if book is not None:
        if len(texts) != 1:
            raise BooklensError("--book needs a single summary, not a map of several")
        book_path, book_text = book, None
    check_not_an_input(output, [book_path])  # the book a summarize record names is read too
    if book_path is not None and book_text is None:
        from booklens.text import read_book

        book_text = read_book(book_path)
    book_texts = {next(iter(texts)): book_text} if book_text is not None else None
    from booklens.data.splits import select_books

    names = select_books(list(texts), split.value if split else None, limit)
    if not names:
        raise BooklensError("no summary left to score after --split/--limit")
    texts = {n: texts[n] for n in names}
    from booklens.judges import load_judge  # the shipped few-shot judge, --zero-shot, or --program

    scorer = load_judge("coherence", program, zero_shot=zero_shot, batch_size=batch_size, concurrency=concurrency,
                        tries=tries)
    from booklens.steps import judge_notes, judged_nothing, score_coherence

    setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm, context_window=context_window)
    record = score_coherence(texts, as_set=is_map, batch_size=batch_size, concurrency=concurrency, tries=tries,
                             book_texts=book_texts, scorer=scorer, window_option=JUDGE_WINDOW_OPTION)
    write_output(output, record)
    from booklens.lm.usage import describe_calls

    typer.echo(f"{_report_line(record)}; {describe_calls(record.usage)}", err=True)
    echo_judge(record.judge, cache_dir)
    for note in judge_notes(record):
        typer.echo(f"note: {note}", err=True)
    reason = judged_nothing(record)  # written above for a look at the errors, but not a score
    if reason:
        raise BooklensError(reason)


@app.command()
def agree(
    a: Annotated[Path, typer.Argument(help="Annotation set A (judged): a score output or annotation file.")],
    b: Annotated[Path, typer.Argument(help="Annotation set B (the reference), same formats.")],
    summaries: Annotated[Optional[Path], typer.Option(
        "--summaries", help="Summaries (book -> summary) for a set given as sentence annotations (both sets "
        "judge the same summaries, so one file serves both).")] = None,
    output: OutputOption = None,
) -> None:
    """Agreement of two annotation sets: P/R/F1 and kappa of "confusing", per type, system scores."""
    from booklens.data.booookscore import SummariesNeeded, annotation_set_from_json, is_sentence_format
    from booklens.metrics.agreement import agreement, format_agreement

    data_a = read_json_file(a, "annotation set A")
    data_b = read_json_file(b, "annotation set B")
    if summaries is not None and not (is_sentence_format(data_a) or is_sentence_format(data_b)):
        raise BooklensError("--summaries is only read for sentence annotations, and neither set holds them "
                            "(each carries its own summaries)")
    from booklens.data.booookscore import read_summaries_file

    summaries_data = read_summaries_file(summaries)
    sets = {}
    try:
        for name, path, data in (("A", a, data_a), ("B", b, data_b)):
            sets[name] = annotation_set_from_json(data, summaries_data, what=f"annotation set {path}",
                                                  summaries_what=f"summaries file {summaries}")
    except SummariesNeeded as exc:
        raise BooklensError(f"{exc}: pass them with --summaries") from None
    (results_a, notes_a), (results_b, notes_b) = sets["A"], sets["B"]
    report = agreement(results_a, results_b, name_a=a.name, name_b=b.name)
    # Annotated sentences found in no summary are left out of the figures; say so, and list them.
    report["ignored_annotations"] = {"a": notes_a.ignored, "b": notes_b.ignored}
    report["notes"] = {"a": list(notes_a), "b": list(notes_b)}
    for name, notes in (("A", notes_a), ("B", notes_b)):
        if notes.ignored:
            typer.echo(f"note: set {name}: {notes.summary_line()}" + (" (-o lists them)" if output is None else
                                                                      f" ({output} lists them)"), err=True)
    typer.echo(format_agreement(report))
    if output is not None:
        write_output(output, report)
