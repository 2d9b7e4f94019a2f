"""Question answering over a book (NovelQA) and diverse multi-document summarization
(DiverseSumm) with its judges and bias analyses:

    booklens qa BOOK --questions Q.json [--setting mc|gen] [--evidence MODE]
    booklens diverse EVENTS.json
    booklens judge EVENTS.json SUMMARIES.json [OTHER.json] --protocol binary|likert|pairwise
    booklens bias position EVENTS.json SUMMARIES_1.json SUMMARIES_2.json
    booklens bias verbosity EVENTS.json SUMMARIES.json

Each command parses its options, calls one function of `booklens.programs.qa` or
`booklens.programs.diverse`, and prints what it returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    ApiBaseOption,
    BookArgument,
    CacheDirOption,
    ConcurrencyOption,
    LMOption,
    OutputOption,
    RpmOption,
    StructuredOption,
    TpmOption,
    choices,
    command_group,
    evidence_enum,
    lm_options,
    write_output,
)
from booklens.errors import BooklensError
from booklens.retrieval import (DEFAULT_K, DEFAULT_PASSAGE_TOKENS, EVIDENCE_MODES, MIN_PASSAGE_TOKENS,
                                QA_BOOK_RANK_MODE, SEARCH_MODES)
from booklens.vocabulary import (
    ANSWER_CLUSTERINGS,
    CRITERIA,
    DEFAULT_CONTEXT_WINDOW,
    DIVERSE_METHODS,
    EVIDENCE_RECALL_MODES,
    FAITHFULNESS_CHOICES,
    JUDGE_PROTOCOLS,
    MIN_QA_CONTEXT_WINDOW,
    QA_SETTINGS,
    RATING_SCALES,
    VERBOSITY_PROTOCOLS,
    counted,
)


Setting = choices("Setting", QA_SETTINGS)
Evidence = evidence_enum("Evidence", EVIDENCE_MODES)
RankMode = choices("RankMode", SEARCH_MODES)
EvidenceRecall = choices("EvidenceRecall", EVIDENCE_RECALL_MODES)
FaithfulnessProtocols = choices("FaithfulnessProtocols", FAITHFULNESS_CHOICES)
Method = choices("Method", DIVERSE_METHODS)
Clustering = choices("Clustering", ANSWER_CLUSTERINGS)
Protocol = choices("Protocol", JUDGE_PROTOCOLS)
Criterion = choices("Criterion", CRITERIA)
CriterionOrBoth = choices("CriterionOrBoth", (*CRITERIA, "both"))
VerbosityProtocol = choices("VerbosityProtocol", (*VERBOSITY_PROTOCOLS, "both"))


EVIDENCE_HELP = (Evidence.help + " With 'book', a book longer than the window is not read whole: the model gets "
                 "about 80% of the window (some 6K tokens at 8K) grown around the k passages --rank-mode ranks "
                 "best, which is retrieval; the printed modes say which happened.")

ContextWindowOption = Annotated[Optional[int], typer.Option(
    "--context-window", min=MIN_QA_CONTEXT_WINDOW,
    help=f"Tokens the model reads at once (default: the model's window, else {DEFAULT_CONTEXT_WINDOW}).")]
MaxArticlesOption = Annotated[Optional[int], typer.Option(
    "--max-articles", min=1, help="Judge faithfulness against only the first N articles of each event.")]
PerQAOption = Annotated[bool, typer.Option(
    "--per-qa/--all-qa", help="Pairwise coverage: compare on each reference QA pair, or on all at once.")]


def _fmt(x: Optional[float], digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _fail_if_judged_nothing(result: dict[str, Any]) -> None:
    """A one-line error (exit 2, the record already written) when the judge gave no verdict at all, or
    `qa`'s model no valid answer."""
    from booklens.steps import judged_nothing

    reason = judged_nothing(result)
    if reason:
        raise BooklensError(reason)


def _usage_line(result: dict[str, Any]) -> str:
    from booklens.lm.usage import describe_calls

    return f"{describe_calls(result['usage'])}, {result['seconds']:.1f} s"


def _rating_line(name: str, score: Optional[float], judgments: list, scale: str) -> str:
    failed = sum(1 for j in judgments if j["rating"] is None)
    return (f"{name}: {_fmt(score)} (scale {scale}, {counted(len(judgments), 'judgment')}"
            + (f", {failed} failed" if failed else "") + ")")


def _overall_line(name: str, overall: dict[str, Any]) -> str:
    """A `diverse` figure over every event, as `_rating_line` writes one event's."""
    return (f"{name}: {_fmt(overall['score'])} (scale {_scale(name.rsplit('_', 1)[1])}, "
            f"{counted(overall['judgments'], 'judgment')} over {counted(overall['events'], 'event')}"
            + (f", {overall['failed']} failed" if overall["failed"] else "") + ")")


def _scale(protocol: str) -> str:
    low, high = RATING_SCALES[protocol]
    return f"{low}-{high}"


# ---------------------------------------------------------------------------
# booklens qa


@app.command("qa")
def qa_command(
    book: BookArgument,
    questions: Annotated[Path, typer.Option("--questions", help="NovelQA-format question file (JSON list).")],
    setting: Annotated[Setting, typer.Option("--setting", help="mc: choose an option; gen: free-text answer "
                                                               "graded by an LM judge.")] = "mc",
    evidence: Annotated[Evidence, typer.Option("--evidence", help=EVIDENCE_HELP)] = "book",
    # None until given: one given where the evidence mode never uses it is refused, whatever its value
    k: Annotated[Optional[int], typer.Option(
        "--k", min=1, help=f"Passages retrieved per question (bm25/dense/hybrid/book; default {DEFAULT_K}).")] = None,
    passage_tokens: Annotated[Optional[int], typer.Option(
        "--passage-tokens", min=MIN_PASSAGE_TOKENS,
        help=f"Tokens per passage (bm25/dense/hybrid/book; default {DEFAULT_PASSAGE_TOKENS}).")] = None,
    rank_mode: Annotated[Optional[RankMode], typer.Option(
        "--rank-mode", help=f"Ranking used to pick stretches when --evidence book does not fit (default "
                            f"{QA_BOOK_RANK_MODE}).")] = None,
    quote_evidence: Annotated[bool, typer.Option(
        "--quote-evidence/--no-quote-evidence", help="Also ask for supporting quotes (evidence recall).")] = False,
    evidence_recall: Annotated[Optional[EvidenceRecall], typer.Option(
        "--evidence-recall", help="How --quote-evidence quotes are scored: llm (the default; the seed's judge: "
                                  "correctness, relevance, sufficiency, 0-100; one call per question that quoted "
                                  "any, no quotes scoring 0) or overlap (word overlap with the gold quotes only, "
                                  "no LM call).")] = None,
    title: Annotated[Optional[str], typer.Option(
        "--title", help="Book title the closed-book and judge prompts name (default: from the file name); refused "
                        "where the run has neither.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="Answer only the first N questions.")] = None,
    position_threshold: Annotated[int, typer.Option(
        "--position-threshold", min=1, help="Token index splitting pre/post accuracy (seed: 100K).")] = 100_000,
    context_window: ContextWindowOption = None,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
) -> None:
    """Answer NovelQA-format questions about a book and print accuracy by question type and evidence position."""
    from booklens.metrics.qa import fewer_passages_note, format_report, no_reference_note, unlocated_evidence_note
    from booklens.qa_runs import run_book_qa

    result = run_book_qa(book, questions, setting=setting.value, evidence=evidence.value, k=k,
                         passage_tokens=passage_tokens, rank_mode=getattr(rank_mode, "value", None),
                         quote_evidence=quote_evidence,
                         evidence_recall=getattr(evidence_recall, "value", None), title=title, limit=limit,
                         position_threshold=position_threshold, context_window=context_window, lm=lm,
                         api_base=api_base,
                         lm_options=lm_options(structured, rpm, tpm), cache_dir=cache_dir, concurrency=concurrency)
    # Written before anything is printed: a closed stdout must not lose the result.
    if output is not None:
        write_output(output, result)
    modes = ", ".join(f"{m}: {n}" for m, n in result["context_modes"].items())
    typer.echo(f"{book.name}: {result['book_tokens']} tokens; {len(result['predictions'])} questions; setting "
               f"{setting.value}; evidence {evidence.value} ({modes}); LM {result['lm']}")
    typer.echo(format_report(result["report"]))
    typer.echo(_usage_line(result), err=True)
    _fail_if_judged_nothing(result)
    for note in (no_reference_note(result["predictions"], result["setting"]),
                 unlocated_evidence_note(result["predictions"], book.name),
                 fewer_passages_note(result["predictions"], result["k"])):
        if note:
            typer.echo(f"note: {note}", err=True)


# ---------------------------------------------------------------------------
# booklens diverse


@app.command("diverse")
def diverse_command(
    events_path: Annotated[Path, typer.Argument(metavar="EVENTS.json", help="DiverseSumm-format events (JSON list).")],
    method: Annotated[Method, typer.Option(
        "--method", help="direct: all articles at once; extract: key sentences per article, then summarize; "
                         "auto: direct when the articles fit the window.")] = Method.auto,
    # None until given: one given where it does nothing is refused, whatever its value
    sentences: Annotated[Optional[int], typer.Option(
        "--sentences", min=1, help="Sentences extracted per article (default 10, as the seed takes; extract and "
                                   "auto).")] = None,
    generate_questions: Annotated[int, typer.Option(
        "--generate-questions", min=0, help="Build QA references as the seed does for events without their own "
                                            "question_answers: N questions, answers extracted per article, "
                                            "clustered, filtered for diversity.")] = 0,
    answer_clustering: Annotated[Optional[Clustering], typer.Option(
        "--answer-clustering", help="Generated references: llm groups equivalent answers (the seed clusters "
                                    "them, the default); exact groups only identical wording.")] = None,
    diversity_filter: Annotated[Optional[bool], typer.Option(
        "--diversity-filter/--no-diversity-filter",
        help="Generated references: drop invalid answers and keep only questions answered by >= 30% of the "
             "articles with diverse answers (the seed's post-processing; on unless told).")] = None,
    judge: Annotated[bool, typer.Option("--judge/--no-judge", help="Judge coverage and faithfulness.")] = True,
    faithfulness: Annotated[Optional[FaithfulnessProtocols], typer.Option(
        "--faithfulness", help="Faithfulness protocol(s) per article (default likert).")] = None,
    max_articles: MaxArticlesOption = None,
    context_window: ContextWindowOption = None,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
) -> None:
    """Summarize what the articles of each event say differently, then judge coverage and faithfulness."""
    from booklens.diverse_runs import run_diverse

    result = run_diverse(events_path, method=method.value, sentences=sentences, generate_questions=generate_questions,
                         clustering=getattr(answer_clustering, "value", None), diversity_filter=diversity_filter,
                         judge=judge, faithfulness=getattr(faithfulness, "value", None), max_articles=max_articles,
                         context_window=context_window, concurrency=concurrency, lm=lm, api_base=api_base,
                         lm_options=lm_options(structured, rpm, tpm), cache_dir=cache_dir)
    if output is not None:
        write_output(output, result)
    for row in result["events"]:
        typer.echo(f"== {row['eid']} ({row['method']}) ==")
        typer.echo(row["summary"] if row["summary"] else f"(no summary: {row['error']})")
        if row["summary_cut_off"]:
            typer.echo("(the summary ran into the output token limit and is cut off)")
        if row["summary"] and row.get("extract_notes"):
            typer.echo(f"({counted(len(row['extract_notes']), 'article')} too long to offer whole: "
                       f"{row['extract_notes'][0]})")
        if row["summary"] and row.get("extract_errors"):
            typer.echo(f"(no sentence picked from {len(row['extract_errors'])} of {len(row['extracts'])} articles, "
                       f"shown as '(none)'; first: {row['extract_errors'][0]})")
        if result["generate_questions"] and row["references"] == "own":
            typer.echo(f"references: the event's own ({counted(row['reference_qa_pairs'], 'question')}); "
                       "none generated")
        if row.get("references_skipped"):
            typer.echo(f"references: none generated ({row['references_skipped']})")
        if row.get("reference_error"):
            typer.echo(f"references: none generated ({row['reference_error']})")
        elif row.get("generated_questions") is not None:
            typer.echo(f"references: generated questions ({len(row['generated_question_answers'])} of "
                       f"{len(row['generated_questions'])} kept):")
            for check in row["reference_screening"]:
                detail = (f"{check['articles_answering']} articles, {check['clusters']} answer clusters"
                          if check["kept"] else f"dropped: {check['reason']}")
                typer.echo(f"  - {check['question']} ({detail})")
        if row.get("coverage_not_judged"):
            typer.echo(f"coverage: not judged ({row['coverage_not_judged']})")
        for name, value in row["scores"].items():
            typer.echo(_rating_line(name, value, row["judgments"][name], _scale(name.rsplit("_", 1)[1])))
    if len(result["events"]) > 1:  # one event's figures are its own, printed above
        for name, overall in result["overall"].items():
            typer.echo(f"overall: {_overall_line(name, overall)}")
    typer.echo(_usage_line(result), err=True)
    if not any(row["summary"] for row in result["events"]):  # written above: the record keeps every reason
        raise BooklensError(f"no event got a summary (first: {result['events'][0]['error']})")
    _fail_if_judged_nothing(result)


# ---------------------------------------------------------------------------
# booklens judge


def _generated(refs: dict[str, Any]) -> str:
    """The references a `diverse` record generated for an event, as `judge` and `bias` name them."""
    return f"{counted(refs['questions'], 'question')} {refs['file']} generated"


@app.command("judge")
def judge_command(
    events_path: Annotated[Path, typer.Argument(metavar="EVENTS.json", help="DiverseSumm-format events.")],
    summaries: Annotated[Path, typer.Argument(metavar="SUMMARIES.json",
                                              help="{eid: summary}, [{eid, summary}] or a `booklens diverse` result "
                                                   "(coverage uses the references it generated).")],
    other: Annotated[Optional[Path], typer.Argument(metavar="[OTHER.json]",
                                                    help="Second summaries (pairwise protocol).")] = None,
    protocol: Annotated[Protocol, typer.Option("--protocol", help="binary, likert or pairwise (both orders).")]
    = Protocol.likert,
    criterion: Annotated[Criterion, typer.Option("--criterion", help="coverage (vs QA pairs) or faithfulness "
                                                                     "(vs each article).")] = Criterion.coverage,
    max_articles: MaxArticlesOption = None,
    per_qa: PerQAOption = False,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
) -> None:
    """Judge summaries of DiverseSumm events for coverage or faithfulness with one protocol."""
    from booklens.diverse_runs import judge_summaries

    result = judge_summaries(events_path, summaries, other, protocol=protocol.value, criterion=criterion.value,
                             max_articles=max_articles, per_qa=per_qa, lm=lm, api_base=api_base,
                         lm_options=lm_options(structured, rpm, tpm), cache_dir=cache_dir,
                             concurrency=concurrency)
    if output is not None:
        write_output(output, result)
    # Two files of one name (two systems' diverse.json, say) are told apart by their paths.
    names = (summaries.name, other.name) if other is not None else (summaries.name, "")
    if names[0] == names[1]:
        names = (str(summaries), str(other))
    for row in result["events"]:
        refs = result["generated_references"].get(row["eid"])  # coverage of an event without its own
        against = f"against {_generated(refs)}" if refs else ""
        if protocol == Protocol.pairwise:
            typer.echo(f"{row['eid']}: {criterion.value} pairwise (both orders) over {len(row['cases'])} case(s): "
                       f"{names[0]} wins {row['wins_1']}, {names[1]} wins {row['wins_2']}, ties {row['ties']}"
                       + (f", failed {row['failed']}" if row["failed"] else "") + (f" ({against})" if against else ""))
        else:
            typer.echo(f"{row['eid']}: {criterion.value} {protocol.value} = {_fmt(row['score'])} "
                       f"(scale {_scale(protocol.value)}, {counted(len(row['judgments']), 'judgment')}"
                       + (f", {row['failed']} failed" if row["failed"] else "")
                       + (f"; {against}" if against else "") + ")")
    for skipped in result["not_judged"]:
        typer.echo(f"{skipped['eid']}: not judged ({skipped['reason']})")
    overall, events = result["overall"], counted(result["overall"]["events"], "event")
    if protocol == Protocol.pairwise:
        typer.echo(f"overall: {criterion.value} pairwise (both orders) over {counted(overall['cases'], 'case')} in "
                   f"{events}: {names[0]} wins {overall['wins_1']}, {names[1]} wins {overall['wins_2']}, ties "
                   f"{overall['ties']}" + (f", failed {overall['failed']}" if overall["failed"] else ""))
    else:
        typer.echo(f"overall: {criterion.value} {protocol.value} = {_fmt(overall['score'])} (scale "
                   f"{_scale(protocol.value)}, {counted(overall['judgments'], 'judgment')} over {events}"
                   + (f", {overall['failed']} failed" if overall["failed"] else "") + ")")
    typer.echo(_usage_line(result), err=True)
    _fail_if_judged_nothing(result)


# ---------------------------------------------------------------------------
# booklens bias position|verbosity

bias_app = command_group(help="Biases of the LLM judges: position (pairwise) and verbosity.", no_args_is_help=True)
app.add_typer(bias_app, name="bias")


def _echo_not_judged(result: dict[str, Any]) -> None:
    """The events coverage was judged against generated references for, and those a criterion skipped."""
    for eid, refs in result["generated_references"].items():
        typer.echo(f"{eid}: coverage judged against {_generated(refs)}")
    for skipped in result["not_judged"]:
        typer.echo(f"{skipped['eid']}: {skipped['criterion']} not judged ({skipped['reason']})")


@bias_app.command("position")
def bias_position(
    events_path: Annotated[Path, typer.Argument(metavar="EVENTS.json", help="DiverseSumm-format events.")],
    summaries_1: Annotated[Path, typer.Argument(metavar="SUMMARIES_1.json", help="Summaries of one system.")],
    summaries_2: Annotated[Path, typer.Argument(metavar="SUMMARIES_2.json", help="Summaries of another system.")],
    criterion: Annotated[CriterionOrBoth, typer.Option("--criterion")] = CriterionOrBoth.both,
    max_articles: MaxArticlesOption = None,
    per_qa: PerQAOption = False,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
) -> None:
    """Position bias of the pairwise judge: each pair judged in both orders (seed Table 3)."""
    from booklens.metrics.bias import format_position
    from booklens.diverse_runs import position_bias_study

    result = position_bias_study(events_path, summaries_1, summaries_2, criterion=criterion.value,
                                 max_articles=max_articles, per_qa=per_qa, lm=lm, api_base=api_base,
                                 lm_options=lm_options(structured, rpm, tpm), cache_dir=cache_dir, concurrency=concurrency)
    if output is not None:
        write_output(output, result)
    for crit in CRITERIA:
        if crit in result:
            typer.echo(format_position(result[crit]["result"], crit.capitalize()))
    _echo_not_judged(result)
    typer.echo(_usage_line(result), err=True)
    _fail_if_judged_nothing(result)


@bias_app.command("verbosity")
def bias_verbosity(
    events_path: Annotated[Path, typer.Argument(metavar="EVENTS.json", help="DiverseSumm-format events.")],
    summaries: Annotated[Path, typer.Argument(metavar="SUMMARIES.json", help="The summaries to extend.")],
    criterion: Annotated[CriterionOrBoth, typer.Option("--criterion")] = CriterionOrBoth.both,
    protocol: Annotated[VerbosityProtocol, typer.Option(
        "--protocol", help="single: Likert grading of each version; pairwise: original vs extended, both orders.")]
    = VerbosityProtocol.both,
    max_articles: MaxArticlesOption = None,
    per_qa: PerQAOption = False,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    output: OutputOption = None,
) -> None:
    """Verbosity bias: each summary against itself repeated twice (seed Table 4)."""
    from booklens.metrics.bias import format_verbosity
    from booklens.diverse_runs import verbosity_bias_study

    protocols = list(VERBOSITY_PROTOCOLS) if protocol == VerbosityProtocol.both else [protocol.value]
    result = verbosity_bias_study(events_path, summaries, criterion=criterion.value, protocols=protocols,
                                  max_articles=max_articles, per_qa=per_qa, lm=lm, api_base=api_base,
                                  lm_options=lm_options(structured, rpm, tpm), cache_dir=cache_dir, concurrency=concurrency)
    if output is not None:
        write_output(output, result)
    typer.echo(format_verbosity([(c.capitalize(), p.capitalize(), r) for c, p, r in result["table"]]))
    _echo_not_judged(result)
    typer.echo(_usage_line(result), err=True)
    _fail_if_judged_nothing(result)
