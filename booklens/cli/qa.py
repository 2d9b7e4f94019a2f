"""Question answering over a book (NovelQA) and diverse multi-document summarization
(DiverseSumm) with its judges and bias analyses:

    booklens qa BOOK --questions Q.json [--setting mc|gen] [--evidence MODE]
    booklens diverse EVENTS.json
    booklens judge EVENTS.json SUMMARIES.json [OTHER.json] --protocol binary|likert|pairwise
    booklens bias position EVENTS.json SUMMARIES_1.json SUMMARIES_2.json
    booklens bias verbosity EVENTS.json SUMMARIES.json
"""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    ApiBaseOption,
    CacheDirOption,
    ConcurrencyOption,
    LMOption,
    OutputOption,
    RpmOption,
    StructuredOption,
    TpmOption,
    read_json_file,
    setup_lm,
    write_output,
)
from booklens.errors import BooklensError


class Setting(str, Enum):
    mc = "mc"
    gen = "gen"


class Evidence(str, Enum):
    none = "none"
    given = "given"
    bm25 = "bm25"
    dense = "dense"
    hybrid = "hybrid"
    book = "book"


class RankMode(str, Enum):
    bm25 = "bm25"
    dense = "dense"
    hybrid = "hybrid"


class Method(str, Enum):
    auto = "auto"
    direct = "direct"
    extract = "extract"


class Protocol(str, Enum):
    binary = "binary"
    likert = "likert"
    pairwise = "pairwise"


class Criterion(str, Enum):
    coverage = "coverage"
    faithfulness = "faithfulness"


class CriterionOrBoth(str, Enum):
    coverage = "coverage"
    faithfulness = "faithfulness"
    both = "both"


class FaithfulnessProtocols(str, Enum):
    likert = "likert"
    binary = "binary"
    both = "both"
    none = "none"


class VerbosityProtocol(str, Enum):
    single = "single"
    pairwise = "pairwise"
    both = "both"


ContextWindowOption = Annotated[Optional[int], typer.Option(
    "--context-window", min=256, help="Tokens the model reads at once (default: the model's window, else 8192).")]
MaxArticlesOption = Annotated[Optional[int], typer.Option(
    "--max-articles", min=1, help="Judge faithfulness against only the first N articles of each event.")]
PerQAOption = Annotated[bool, typer.Option(
    "--per-qa/--all-qa", help="Pairwise coverage: compare on each reference QA pair, or on all at once.")]


# ---------------------------------------------------------------------------
# Program builders (kept small so a compiled program can replace any of them)


def build_qa_program(setting: str, evidence: str, *, k: int = 5, passage_tokens: int = 256,
                     context_window: Optional[int] = None, quote_evidence: bool = False, rank_mode: str = "bm25",
                     index_cache_dir: Any = None):
    from booklens.programs.qa import BookQA

    return BookQA(setting, evidence, k=k, passage_tokens=passage_tokens, context_window=context_window,
                  quote_evidence=quote_evidence, rank_mode=rank_mode, index_cache_dir=index_cache_dir)


def build_answer_judge():
    from booklens.programs.qa import AnswerJudge

    return AnswerJudge()


def build_diverse_summarizer(method: str = "auto", *, num_sentences: int = 5, context_window: Optional[int] = None,
                             concurrency: int = 1):
    from booklens.programs.diverse import DiverseSummarizer

    return DiverseSummarizer(method, num_sentences=num_sentences, context_window=context_window,
                             concurrency=concurrency)


def build_reference_builder(num_questions: int, *, context_window: Optional[int] = None, concurrency: int = 1):
    from booklens.programs.diverse import ReferenceBuilder

    return ReferenceBuilder(num_questions, context_window=context_window, concurrency=concurrency)


def build_coverage_judge(protocol: str, concurrency: int = 1):
    from booklens.programs.diverse import CoverageJudge

    return CoverageJudge(protocol, concurrency=concurrency)


def build_faithfulness_judge(protocol: str, concurrency: int = 1):
    from booklens.programs.diverse import FaithfulnessJudge

    return FaithfulnessJudge(protocol, concurrency=concurrency)


def build_pairwise_judge(criterion: str):
    from booklens.programs.diverse import PairwiseJudge

    return PairwiseJudge(criterion)


# ---------------------------------------------------------------------------
# helpers


def _usage(lm: Any, before: dict) -> dict:
    after = lm.usage.snapshot()
    return {k: after[k] - before[k] for k in ("calls", "cached_calls", "prompt_tokens", "completion_tokens")}


def _usage_line(u: dict, seconds: float) -> str:
    return (f"{u['calls']} LM calls ({u['cached_calls']} from cache), {u['prompt_tokens']} prompt + "
            f"{u['completion_tokens']} completion tokens, {seconds:.1f} s")


def _index_dir(cache_dir: Optional[Path]) -> Path:
    from booklens.lm import default_cache_dir

    return Path(cache_dir or default_cache_dir()) / "index"


def _title_from(path: Path) -> str:
    return path.stem.replace("_", " ").replace("-", " ").title()


def _load_summaries(path: Path, events: list, what: str) -> dict[str, str]:
    from booklens.data.diversesumm import parse_summaries

    summaries = parse_summaries(read_json_file(path, what), source=str(path))
    missing = [e.eid for e in events if e.eid not in summaries]
    if missing:
        raise BooklensError(f"{path}: no summary for event(s) {', '.join(missing)}")
    return summaries


def _check_coverage_refs(events: list) -> None:
    for e in events:
        if not e.question_answers:
            raise BooklensError(f"event {e.eid} has no question_answers to judge coverage against")


def _fmt(x: Optional[float], digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# ---------------------------------------------------------------------------
# booklens qa


@app.command("qa")
def qa_command(
    book: Annotated[Path, typer.Argument(help="The book: .txt (UTF-8) or .epub.")],
    questions: Annotated[Path, typer.Option("--questions", help="NovelQA-format question file (JSON list).")],
    setting: Annotated[Setting, typer.Option("--setting", help="mc: choose an option; gen: free-text answer "
                                                               "graded by an LM judge.")] = Setting.mc,
    evidence: Annotated[Evidence, typer.Option(
        "--evidence", help="book: whole book when it fits, else the most relevant stretches; bm25/dense/hybrid: "
                           "top-k passages; given: the gold evidence; none: closed-book.")] = Evidence.book,
    k: Annotated[int, typer.Option("--k", min=1, help="Passages retrieved per question.")] = 5,
    passage_tokens: Annotated[int, typer.Option("--passage-tokens", min=16, help="Tokens per passage.")] = 256,
    rank_mode: Annotated[RankMode, typer.Option(
        "--rank-mode", help="Ranking used to pick stretches when --evidence book does not fit.")] = RankMode.bm25,
    quote_evidence: Annotated[bool, typer.Option(
        "--quote-evidence/--no-quote-evidence", help="Also ask for supporting quotes (evidence recall).")] = False,
    title: Annotated[Optional[str], typer.Option("--title", help="Book title for closed-book prompts.")] = None,
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
    from booklens.data.novelqa import check_setting, load_questions
    from booklens.metrics.qa import format_report, qa_report
    from booklens.programs.qa import answer_questions
    from booklens.text import count_tokens, read_book

    qs = load_questions(questions)
    check_setting(qs, setting.value, source=str(questions))
    if limit:
        qs = qs[:limit]
    text = read_book(book)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm)
    program = build_qa_program(setting.value, evidence.value, k=k, passage_tokens=passage_tokens,
                               context_window=context_window, quote_evidence=quote_evidence,
                               rank_mode=rank_mode.value, index_cache_dir=_index_dir(cache_dir))
    judge = build_answer_judge() if setting == Setting.gen else None
    before = model.usage.snapshot()
    t0 = time.perf_counter()
    records = answer_questions(program, text, qs, judge=judge, concurrency=concurrency,
                               book_title=title or _title_from(book))
    seconds = time.perf_counter() - t0
    report = qa_report(records, threshold=position_threshold)
    usage = _usage(model, before)
    modes: dict[str, int] = {}
    for r in records:
        modes[r.context_mode] = modes.get(r.context_mode, 0) + 1
    book_tokens = count_tokens(text)
    typer.echo(f"{book.name}: {book_tokens} tokens; {len(records)} questions; setting {setting.value}; evidence "
               f"{evidence.value} ({', '.join(f'{m}: {n}' for m, n in modes.items())}); LM {model.label}")
    typer.echo(format_report(report))
    typer.echo(_usage_line(usage, seconds), err=True)
    if output is not None:
        write_output(output, {
            "kind": "booklens.qa", "book": str(book), "book_tokens": book_tokens, "questions": str(questions),
            "setting": setting.value, "evidence": evidence.value, "k": k, "passage_tokens": passage_tokens,
            "lm": model.label, "report": report, "predictions": [r.model_dump() for r in records],
            "usage": usage, "seconds": round(seconds, 2),
        })


# ---------------------------------------------------------------------------
# booklens diverse


@app.command("diverse")
def diverse_command(
    events_path: Annotated[Path, typer.Argument(metavar="EVENTS.json", help="DiverseSumm-format events (JSON list).")],
    method: Annotated[Method, typer.Option(
        "--method", help="direct: all articles at once; extract: key sentences per article, then summarize; "
                         "auto: direct when the articles fit the window.")] = Method.auto,
    sentences: Annotated[int, typer.Option("--sentences", min=1, help="Sentences extracted per article.")] = 5,
    generate_questions: Annotated[int, typer.Option(
        "--generate-questions", min=0, help="Also write N reference questions and extract answers per article.")] = 0,
    judge: Annotated[bool, typer.Option("--judge/--no-judge", help="Judge coverage and faithfulness.")] = True,
    faithfulness: Annotated[FaithfulnessProtocols, typer.Option(
        "--faithfulness", help="Faithfulness protocol(s) per article.")] = FaithfulnessProtocols.likert,
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
    from booklens.data.diversesumm import QuestionAnswers, load_events
    from booklens.programs.diverse import article_texts

    events = load_events(events_path)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm)
    summarizer = build_diverse_summarizer(method.value, num_sentences=sentences, context_window=context_window,
                                          concurrency=concurrency)
    refs = (build_reference_builder(generate_questions, context_window=context_window, concurrency=concurrency)
            if generate_questions else None)
    faith_protocols = {"both": ["binary", "likert"], "none": []}.get(faithfulness.value, [faithfulness.value])
    before = model.usage.snapshot()
    t0 = time.perf_counter()
    results = []
    from booklens.lm import usage_step

    for event in events:
        row: dict[str, Any] = {"eid": event.eid}
        with usage_step("summarize"):
            pred = summarizer(articles=article_texts(event))
        row.update(summary=pred.summary, method=pred.method, extracts=pred.extracts, error=pred.error)
        if refs is not None:
            with usage_step("reference"):
                ref = refs(articles=[(a.aid, f"[{a.aid}] {a.as_text()}") for a in event.articles])
            row["generated_question_answers"] = ref.question_answers
            row["generated_questions"] = ref.questions
        scores: dict[str, Any] = {}
        judgments: dict[str, Any] = {}
        if judge and pred.summary:
            qa_pairs = event.question_answers
            if not qa_pairs and refs is not None:
                qa_pairs = [QuestionAnswers.model_validate(q) for q in row["generated_question_answers"]]
            if qa_pairs:
                for protocol in ("binary", "likert"):
                    with usage_step(f"coverage-{protocol}"):
                        r = build_coverage_judge(protocol, concurrency)(summary=pred.summary, qa_pairs=qa_pairs)
                    scores[f"coverage_{protocol}"] = r.score
                    judgments[f"coverage_{protocol}"] = r.details
            articles = event.articles[:max_articles] if max_articles else event.articles
            for protocol in faith_protocols:
                with usage_step(f"faithfulness-{protocol}"):
                    r = build_faithfulness_judge(protocol, concurrency)(summary=pred.summary, articles=articles)
                scores[f"faithfulness_{protocol}"] = r.score
                judgments[f"faithfulness_{protocol}"] = r.details
        row["scores"] = scores
        row["judgments"] = judgments
        results.append(row)
    seconds = time.perf_counter() - t0
    usage = _usage(model, before)
    for row in results:
        typer.echo(f"== {row['eid']} ({row['method']}) ==")
        typer.echo(row["summary"] if row["summary"] else f"(no summary: {row['error']})")
        if row.get("generated_questions") is not None:
            kept = len(row["generated_question_answers"])
            typer.echo(f"generated questions ({kept} of {len(row['generated_questions'])} kept):")
            for q in row["generated_question_answers"]:
                typer.echo(f"  - {q['question']} ({sum(len(g) for g in q['answer_groups'])} answers, "
                           f"{len(q['answer_groups'])} groups)")
        for name, value in row["scores"].items():
            failed = sum(1 for j in row["judgments"][name] if j["rating"] is None)
            scale = "0-1" if name.endswith("binary") else "1-10"
            typer.echo(f"{name}: {_fmt(value)} (scale {scale}, {len(row['judgments'][name])} judgments"
                       + (f", {failed} failed" if failed else "") + ")")
    typer.echo(_usage_line(usage, seconds), err=True)
    if output is not None:
        write_output(output, {"kind": "booklens.diverse", "events_file": str(events_path), "lm": model.label,
                              "method": method.value, "events": results, "usage": usage,
                              "seconds": round(seconds, 2)})


# ---------------------------------------------------------------------------
# booklens judge


@app.command("judge")
def judge_command(
    events_path: Annotated[Path, typer.Argument(metavar="EVENTS.json", help="DiverseSumm-format events.")],
    summaries: Annotated[Path, typer.Argument(metavar="SUMMARIES.json",
                                              help="{eid: summary}, [{eid, summary}] or a `booklens diverse` result.")],
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
    from booklens.data.diversesumm import load_events
    from booklens.programs.diverse import judge_pairs, pairwise_cases

    events = load_events(events_path)
    first = _load_summaries(summaries, events, "summaries file")
    second = None
    if protocol == Protocol.pairwise:
        if other is None:
            raise BooklensError("the pairwise protocol needs a second summaries file (OTHER.json)")
        second = _load_summaries(other, events, "second summaries file")
    elif other is not None:
        raise BooklensError("a second summaries file is only used with --protocol pairwise")
    if criterion == Criterion.coverage:
        _check_coverage_refs(events)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm)
    before = model.usage.snapshot()
    t0 = time.perf_counter()
    rows = []
    if protocol == Protocol.pairwise:
        judge = build_pairwise_judge(criterion.value)
        for e in events:
            cases = [(cid, ref, first[e.eid], second[e.eid])
                     for cid, ref in _cases(e, criterion.value, max_articles, per_qa)]
            pairs = judge_pairs(judge, cases, concurrency)
            wins = {w: sum(1 for p in pairs if p["winner"] == w) for w in ("1", "2", "tie")}
            rows.append({"eid": e.eid, "cases": pairs, "wins_1": wins["1"], "wins_2": wins["2"], "ties": wins["tie"],
                         "failed": sum(1 for p in pairs if p["winner"] is None)})
            typer.echo(f"{e.eid}: {criterion.value} pairwise (both orders) over {len(pairs)} case(s): "
                       f"{summaries.name} wins {wins['1']}, {other.name} wins {wins['2']}, ties {wins['tie']}"
                       + (f", failed {rows[-1]['failed']}" if rows[-1]["failed"] else ""))
    else:
        for e in events:
            if criterion == Criterion.coverage:
                r = build_coverage_judge(protocol.value, concurrency)(summary=first[e.eid], qa_pairs=e.question_answers)
            else:
                arts = e.articles[:max_articles] if max_articles else e.articles
                r = build_faithfulness_judge(protocol.value, concurrency)(summary=first[e.eid], articles=arts)
            rows.append({"eid": e.eid, "score": r.score, "judgments": r.details, "failed": r.failed})
            typer.echo(f"{e.eid}: {criterion.value} {protocol.value} = {_fmt(r.score)} "
                       f"(scale {'0-1' if protocol == Protocol.binary else '1-10'}, {len(r.details)} judgments"
                       + (f", {r.failed} failed" if r.failed else "") + ")")
    seconds = time.perf_counter() - t0
    usage = _usage(model, before)
    typer.echo(_usage_line(usage, seconds), err=True)
    if output is not None:
        write_output(output, {"kind": "booklens.judge", "protocol": protocol.value, "criterion": criterion.value,
                              "lm": model.label, "events": rows, "usage": usage})


def _cases(event: Any, criterion: str, max_articles: Optional[int], per_qa: bool = False) -> list[tuple[str, str]]:
    from booklens.programs.diverse import pairwise_cases

    cases = pairwise_cases(event, criterion, per_qa=per_qa)
    if criterion == "faithfulness" and max_articles:
        cases = cases[:max_articles]
    return cases


# ---------------------------------------------------------------------------
# booklens bias position|verbosity

bias_app = typer.Typer(help="Biases of the LLM judges: position (pairwise) and verbosity.", no_args_is_help=True)
app.add_typer(bias_app, name="bias")


def _criteria(value: CriterionOrBoth) -> list[str]:
    return ["coverage", "faithfulness"] if value == CriterionOrBoth.both else [value.value]


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
    from booklens.data.diversesumm import load_events
    from booklens.metrics.bias import format_position, position_bias
    from booklens.programs.diverse import judge_pairs

    events = load_events(events_path)
    s1 = _load_summaries(summaries_1, events, "summaries file")
    s2 = _load_summaries(summaries_2, events, "second summaries file")
    criteria = _criteria(criterion)
    if "coverage" in criteria:
        _check_coverage_refs(events)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm)
    before = model.usage.snapshot()
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    for crit in criteria:
        judge = build_pairwise_judge(crit)
        cases = [(f"{e.eid}/{cid}", ref, s1[e.eid], s2[e.eid]) for e in events for cid, ref in
                 _cases(e, crit, max_articles, per_qa)]
        pairs = judge_pairs(judge, cases, concurrency)
        result = position_bias([(p["first_order"], p["second_order"]) for p in pairs])
        out[crit] = {"result": result, "cases": pairs}
        typer.echo(format_position(result, crit.capitalize()))
    usage = _usage(model, before)
    typer.echo(_usage_line(usage, time.perf_counter() - t0), err=True)
    if output is not None:
        write_output(output, {"kind": "booklens.bias.position", "lm": model.label, **out, "usage": usage})


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
    from booklens.data.diversesumm import load_events
    from booklens.metrics.bias import format_verbosity, repeat_summary, verbosity_pairwise, verbosity_single
    from booklens.programs.diverse import judge_pairs

    events = load_events(events_path)
    originals = _load_summaries(summaries, events, "summaries file")
    extended = {eid: repeat_summary(s) for eid, s in originals.items()}
    criteria = _criteria(criterion)
    if "coverage" in criteria:
        _check_coverage_refs(events)
    protocols = ["single", "pairwise"] if protocol == VerbosityProtocol.both else [protocol.value]
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm)
    before = model.usage.snapshot()
    t0 = time.perf_counter()
    rows = []
    out: dict[str, Any] = {}
    for crit in criteria:
        for proto in protocols:
            if proto == "single":
                orig_scores: list = []
                ext_scores: list = []
                for e in events:
                    for version, store in ((originals, orig_scores), (extended, ext_scores)):
                        if crit == "coverage":
                            r = build_coverage_judge("likert", concurrency)(summary=version[e.eid],
                                                                            qa_pairs=e.question_answers)
                        else:
                            arts = e.articles[:max_articles] if max_articles else e.articles
                            r = build_faithfulness_judge("likert", concurrency)(summary=version[e.eid], articles=arts)
                        store.extend(d["rating"] for d in r.details)
                result = verbosity_single(orig_scores, ext_scores)
                out[f"{crit}_single"] = {"result": result, "original": orig_scores, "extended": ext_scores}
            else:
                judge = build_pairwise_judge(crit)
                cases = [(f"{e.eid}/{cid}", ref, originals[e.eid], extended[e.eid]) for e in events
                         for cid, ref in _cases(e, crit, max_articles, per_qa)]
                pairs = judge_pairs(judge, cases, concurrency)
                result = verbosity_pairwise([(p["first_order"], p["second_order"]) for p in pairs])
                out[f"{crit}_pairwise"] = {"result": result, "cases": pairs}
            rows.append((crit.capitalize(), proto.capitalize(), result))
    typer.echo(format_verbosity(rows))
    usage = _usage(model, before)
    typer.echo(_usage_line(usage, time.perf_counter() - t0), err=True)
    if output is not None:
        write_output(output, {"kind": "booklens.bias.verbosity", "lm": model.label, **out, "usage": usage})
