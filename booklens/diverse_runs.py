"""The `booklens diverse`, `judge` and `bias` runs as library calls: DiverseSumm events (and
summaries) in, summaries, scores and bias tables out.

Files are read and checked before DSPy, LiteLLM or a model is loaded, so a wrong path or a
malformed file fails at once. The programs are in `booklens.programs.diverse`, the bias
arithmetic in `booklens.metrics.bias`.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from booklens.data.diversesumm import coverage_events, generated_references, load_events, load_summaries, \
    with_references
from booklens.errors import BooklensError, setting_name
from booklens.lm.base import lm_label
from booklens.qa_runs import Measured, check_given_window, setup_run_lm
from booklens.vocabulary import CRITERIA, FAITHFULNESS_CHOICES, JUDGE_PROTOCOLS, VERBOSITY_PROTOCOLS


def _path(value: Any, what: str, hint: Optional[str] = None) -> Path:
    """A file a library caller named (a `Path` or a string), or one line naming `what`: the loaded
    events or summaries handed over in its place would fail deep inside as a TypeError."""
    from booklens.inputs import as_path

    return as_path(value, what, hint if isinstance(value, list) else None)


def overall_rating(judgments_per_event: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """One protocol's figure over every event: the mean of every valid rating (per reference QA pair,
    per article, as the seed averages its scores; not the mean of the events' means, which weighs an
    event of one question as much as one of ten), with the judgments, failed ones and events it counts."""
    ratings = [j["rating"] for judgments in judgments_per_event for j in judgments]
    valid = [r for r in ratings if r is not None]
    return {"score": round(sum(valid) / len(valid), 4) if valid else None, "judgments": len(ratings),
            "failed": len(ratings) - len(valid), "events": len(judgments_per_event)}


def _criteria(criterion: str) -> list[str]:
    if criterion == "both":
        return list(CRITERIA)
    if criterion not in CRITERIA:
        raise BooklensError(f"unknown criterion {criterion!r}: use {', '.join(CRITERIA)} or both")
    return [criterion]


def _check_case_options(criteria: Sequence[str], protocols: Sequence[str], per_qa: bool,
                        max_articles: Optional[int], concurrency: int = 1) -> None:
    """`--per-qa` and `--max-articles` where no judgment uses them would do nothing, and counts the
    commands bound (a library caller skips their options): one line."""
    from booklens.parallel import check_at_least

    check_at_least("--concurrency", concurrency)
    if max_articles is not None:
        check_at_least("--max-articles", max_articles)
    if per_qa and ("coverage" not in criteria or "pairwise" not in protocols):
        raise BooklensError(f"{setting_name('--per-qa')} is for pairwise coverage (each reference QA pair a case)")
    if max_articles is not None and "faithfulness" not in criteria:
        raise BooklensError(f"{setting_name('--max-articles')} limits the articles faithfulness is judged against; "
                            "coverage is judged against the QA pairs")


def run_diverse(events_path: Path, *, faithfulness: Optional[str] = None, lm: Any = None, api_base: Optional[str] = None,
                lm_options: Optional[dict[str, Any]] = None, cache_dir: Any = None, **options: Any) -> dict[str, Any]:
    """The `booklens diverse` run (kind `booklens.diverse`): `summarize_events` over an events
    file, with LM usage and time. `faithfulness` is one of FAITHFULNESS_CHOICES (None: not given, likert);
    the other `options` are those of `booklens.programs.diverse.summarize_events`."""
    if faithfulness is not None and (not isinstance(faithfulness, str)
                                     or faithfulness not in FAITHFULNESS_CHOICES):  # a list is no key
        raise BooklensError(f"unknown faithfulness choice {faithfulness!r}: use {', '.join(FAITHFULNESS_CHOICES)}")
    events = load_events(_path(events_path, "the events file", "summarize_events takes loaded events"))
    from booklens.programs.diverse import check_event_options, event_settings, summarize_events

    protocols = FAITHFULNESS_CHOICES[faithfulness] if faithfulness is not None else None
    # The settings as the run takes them, defaults included (summarize_events' own), for the record.
    given = inspect.signature(summarize_events).bind(events, faithfulness=protocols, **options)
    given.apply_defaults()
    used = given.arguments
    check_event_options(**used)  # before the LM is set up: a wrong setting costs no model load
    used = event_settings(**used)  # those not given at their defaults, as the run takes them
    model = setup_run_lm(lm, api_base, cache_dir, **(lm_options or {}))
    check_given_window(options.get("context_window"), model)
    with Measured(model) as measured:
        results = summarize_events(events, faithfulness=protocols, **options)
    generated = bool(used["generate_questions"])
    names = list(dict.fromkeys(name for row in results for name in row["judgments"]))
    overall = {name: overall_rating([row["judgments"][name] for row in results if name in row["judgments"]])
               for name in names}
    # The settings that shape the figures (null where they do not apply), so that two records made
    # with different ones do not read alike.
    return {"kind": "booklens.diverse", "events_file": str(events_path), "lm": lm_label(model),
            "method": used["method"], "sentences": used["sentences"] if used["method"] != "direct" else None,
            "generate_questions": used["generate_questions"],
            "answer_clustering": used["clustering"] if generated else None,
            "diversity_filter": used["diversity_filter"] if generated else None, "judge": used["judge"],
            "faithfulness": list(used["faithfulness"]) if used["judge"] else [], "max_articles": used["max_articles"],
            "context_window": used["context_window"], "events": results, "overall": overall, "usage": measured.usage,
            "seconds": measured.seconds}


def _summarized(events: list[Any], failed: dict[str, str]) -> tuple[list[Any], list[dict[str, str]]]:
    """The events with a summary in every file given, and the others as {eid, reason}: a `diverse`
    run that left one event without a summary does not cost the rest their judgments. Refused when
    no event has one, since nothing would be judged."""
    kept = [e for e in events if e.eid not in failed]
    if not kept:
        raise BooklensError(f"no event has a summary to judge (first: {failed[events[0].eid]})")
    return kept, [{"eid": e.eid, "reason": failed[e.eid]} for e in events if e.eid in failed]


def _generated(events: list[Any], paths: Sequence[Optional[Path]]) -> dict[str, tuple[list[Any], str]]:
    """{eid: (QA pairs, file)}: the references `diverse` records among the summaries files generated
    for the events without their own, the first file's where two hold some for one event."""
    found: dict[str, tuple[list[Any], str]] = {}
    for path in paths:
        if path is not None:
            for eid, pairs in generated_references(path, events).items():
                found.setdefault(eid, (pairs, str(path)))
    return found


def _coverage_events(events: list[Any], paths: Sequence[Optional[Path]]
                     ) -> tuple[list[Any], list[dict[str, str]], dict[str, dict[str, Any]]]:
    """The events coverage is judged on (with references of their own, or generated for them in a
    `diverse` record among the summaries files `paths`), the others as {eid, reason}, and
    {eid: {file, questions}} of the generated references used."""
    covered, generated = with_references(events, _generated(events, paths))
    judged, no_references = coverage_events(covered)
    return judged, no_references, generated


def _events_per_criterion(events: list[Any], criteria: Sequence[str], failed: dict[str, str],
                          paths: Sequence[Optional[Path]] = ()
                          ) -> tuple[dict[str, list[Any]], list[dict[str, str]], dict[str, dict[str, Any]]]:
    """The events each criterion is judged on (those with summaries; for coverage, those with
    references too, own or generated in a `diverse` record among the summaries files `paths`), the
    others as {eid, criterion, reason}, criterion by criterion, and {eid: {file, questions}} of the
    generated references coverage is judged against."""
    events, no_summary = _summarized(events, failed)
    judged = {crit: list(events) for crit in criteria}
    not_judged: list[dict[str, str]] = []
    generated: dict[str, dict[str, Any]] = {}
    for crit in criteria:
        skipped = list(no_summary)
        if crit == "coverage":
            judged[crit], no_references, generated = _coverage_events(events, paths)
            skipped += no_references
        not_judged += [{**entry, "criterion": crit} for entry in skipped]
    return judged, not_judged, generated


def judge_summaries(events_path: Path, summaries_path: Path, other_path: Optional[Path] = None, *,
                    protocol: str = "likert", criterion: str = "coverage", max_articles: Optional[int] = None,
                    per_qa: bool = False, lm: Any = None, api_base: Optional[str] = None,
                    lm_options: Optional[dict[str, Any]] = None, cache_dir: Any = None,
                    concurrency: int = 1) -> dict[str, Any]:
    """The `booklens judge` run (kind `booklens.judge`): each event's summary rated with one
    protocol (binary or likert), or two systems' summaries compared pairwise in both orders."""
    _criteria(criterion)
    if protocol not in JUDGE_PROTOCOLS:
        raise BooklensError(f"unknown protocol {protocol!r}: use {', '.join(JUDGE_PROTOCOLS)}")
    _check_case_options([criterion], [protocol], per_qa, max_articles, concurrency)
    events_path, summaries_path = _path(events_path, "the events file"), _path(summaries_path, "the summaries file")
    if other_path is not None:
        other_path = _path(other_path, "the second summaries file")
    events = load_events(events_path)
    failed: dict[str, str] = {}
    first = load_summaries(summaries_path, events, failed=failed)
    second = None
    if protocol == "pairwise":
        if other_path is None:
            raise BooklensError("the pairwise protocol needs a second summaries file (OTHER.json)")
        second = load_summaries(other_path, events, "second summaries file", failed=failed)
    elif other_path is not None:
        raise BooklensError(f"a second summaries file is only used with {setting_name('--protocol')} pairwise")
    events, not_judged = _summarized(events, failed)
    generated: dict[str, dict[str, Any]] = {}
    if criterion == "coverage":
        # A `diverse` record given as summaries holds the references it built for events without their own.
        events, no_references, generated = _coverage_events(events, [summaries_path, other_path])
        not_judged += no_references
    from booklens.programs.diverse import PairwiseJudge, check_judgments_fit, judge_pairs, judgments_misfit, \
        pairwise_cases, rate_event, refused_windows

    model = setup_run_lm(lm, api_base, cache_dir, **(lm_options or {}))
    figure = f"{criterion} {protocol}"
    jobs = [(figure, e, criterion, protocol, (first[e.eid],) if second is None else (first[e.eid], second[e.eid]))
            for e in events]
    fit = {"per_qa": per_qa, "max_articles": max_articles, "protocol_option": True}
    check_judgments_fit(jobs, getattr(model, "context_window", None), **fit)
    rows = []
    with Measured(model) as measured, refused_windows(lambda window: judgments_misfit(jobs, window, **fit)):
        for e in events:
            against = {"references": "generated" if e.eid in generated else "own"} if criterion == "coverage" else {}
            if second is None:
                rows.append({"eid": e.eid, **against, **rate_event(criterion, protocol, e, first[e.eid],
                                                                   max_articles=max_articles,
                                                                   concurrency=concurrency)})
                continue
            cases = [(cid, ref, first[e.eid], second[e.eid])
                     for cid, ref in pairwise_cases(e, criterion, per_qa, max_articles)]
            pairs = judge_pairs(PairwiseJudge(criterion), cases, concurrency)
            wins = {w: sum(1 for p in pairs if p["winner"] == w) for w in ("1", "2", "tie")}
            rows.append({"eid": e.eid, **against, "cases": pairs, "wins_1": wins["1"], "wins_2": wins["2"],
                         "ties": wins["tie"], "failed": sum(1 for p in pairs if p["winner"] is None)})
    if second is None:
        overall = overall_rating([row["judgments"] for row in rows])
    else:  # every case of every event, as the bias studies count them
        overall = {"cases": sum(len(row["cases"]) for row in rows),
                   **{key: sum(row[key] for row in rows) for key in ("wins_1", "wins_2", "ties", "failed")},
                   "events": len(rows)}
    # the files in the order the results name them: wins_1 counts the first summaries file's wins
    return {"kind": "booklens.judge", "events_file": str(events_path),
            "summaries": [str(p) for p in (summaries_path, other_path) if p is not None], "protocol": protocol,
            "criterion": criterion, "max_articles": max_articles, "per_qa": per_qa, "lm": lm_label(model),
            "events": rows, "overall": overall, "not_judged": not_judged,
            "generated_references": generated, "usage": measured.usage, "seconds": measured.seconds}


def position_bias_study(events_path: Path, summaries_1: Path, summaries_2: Path, *, criterion: str = "both",
                        max_articles: Optional[int] = None, per_qa: bool = False, lm: Any = None,
                        api_base: Optional[str] = None,
                lm_options: Optional[dict[str, Any]] = None, cache_dir: Any = None,
                        concurrency: int = 1) -> dict[str, Any]:
    """Position bias of the pairwise judge (the seed's Table 3): every case judged in both orders.
    Kind `booklens.bias.position`, with {criterion: {result, cases}} per criterion."""
    criteria = _criteria(criterion)
    _check_case_options(criteria, ["pairwise"], per_qa, max_articles, concurrency)
    events_path, summaries_1 = _path(events_path, "the events file"), _path(summaries_1, "the summaries file")
    summaries_2 = _path(summaries_2, "the second summaries file")
    events = load_events(events_path)
    failed: dict[str, str] = {}
    s1 = load_summaries(summaries_1, events, failed=failed)
    s2 = load_summaries(summaries_2, events, "second summaries file", failed=failed)
    judged, not_judged, generated = _events_per_criterion(events, criteria, failed, [summaries_1, summaries_2])
    from booklens.metrics.bias import position_bias
    from booklens.programs.diverse import PairwiseJudge, check_judgments_fit, judge_pairs, judgments_misfit, \
        pairwise_cases, refused_windows

    model = setup_run_lm(lm, api_base, cache_dir, **(lm_options or {}))
    jobs = [(f"{crit} pairwise", e, crit, "pairwise", (s1[e.eid], s2[e.eid])) for crit in criteria
            for e in judged[crit]]
    fit = {"per_qa": per_qa, "max_articles": max_articles}
    check_judgments_fit(jobs, getattr(model, "context_window", None), **fit)
    out: dict[str, Any] = {}
    with Measured(model) as measured, refused_windows(lambda window: judgments_misfit(jobs, window, **fit)):
        for crit in criteria:
            cases = [(f"{e.eid}/{cid}", ref, s1[e.eid], s2[e.eid]) for e in judged[crit]
                     for cid, ref in pairwise_cases(e, crit, per_qa, max_articles)]
            pairs = judge_pairs(PairwiseJudge(crit), cases, concurrency)
            out[crit] = {"result": position_bias([(p["first_order"], p["second_order"]) for p in pairs]),
                         "cases": pairs}
    return {"kind": "booklens.bias.position", "events_file": str(events_path),
            "summaries": [str(summaries_1), str(summaries_2)], "criterion": criterion, "max_articles": max_articles,
            "per_qa": per_qa, "lm": lm_label(model), **out, "not_judged": not_judged,
            "generated_references": generated, "usage": measured.usage, "seconds": measured.seconds}


def verbosity_bias_study(events_path: Path, summaries: Path, *, criterion: str = "both",
                         protocols: Sequence[str] = VERBOSITY_PROTOCOLS, max_articles: Optional[int] = None,
                         per_qa: bool = False, lm: Any = None, api_base: Optional[str] = None,
                lm_options: Optional[dict[str, Any]] = None, cache_dir: Any = None,
                         concurrency: int = 1) -> dict[str, Any]:
    """Verbosity bias (the seed's Table 4): each summary against itself repeated twice, graded
    alone on the Likert scale (`single`) and compared in both orders (`pairwise`). Kind
    `booklens.bias.verbosity`, with {criterion_protocol: {result, cases, ...}} and `table` rows
    (criterion, protocol, result) in the seed's layout."""
    criteria = _criteria(criterion)
    if isinstance(protocols, Iterable) and not isinstance(protocols, (str, bytes, Mapping)):
        protocols = list(protocols)  # a generator or set of them, as a list is
    if not isinstance(protocols, list):
        shown = "one string" if isinstance(protocols, str) else type(protocols).__name__
        raise BooklensError(f"protocols must be a list of verbosity protocols ({', '.join(VERBOSITY_PROTOCOLS)}), "
                            f"not {shown}")
    if not protocols:
        raise BooklensError(f"protocols is empty: give {', '.join(VERBOSITY_PROTOCOLS)} or both")
    unknown = [p for p in protocols if p not in VERBOSITY_PROTOCOLS]
    if unknown:
        raise BooklensError(f"unknown verbosity protocol {unknown[0]!r}: use single or pairwise")
    _check_case_options(criteria, protocols, per_qa, max_articles, concurrency)
    events_path, summaries = _path(events_path, "the events file"), _path(summaries, "the summaries file")
    events = load_events(events_path)
    failed: dict[str, str] = {}
    originals = load_summaries(summaries, events, failed=failed)
    judged, not_judged, generated = _events_per_criterion(events, criteria, failed, [summaries])
    from booklens.metrics.bias import repeat_summary, verbosity_pairwise, verbosity_single
    from booklens.programs.diverse import PairwiseJudge, check_judgments_fit, judge_pairs, judgments_misfit, \
        pairwise_cases, rate_event, refused_windows

    extended = {eid: repeat_summary(s) for eid, s in originals.items()}
    model = setup_run_lm(lm, api_base, cache_dir, **(lm_options or {}))
    # single: each version rated alone on the Likert scale; pairwise: the two versions compared
    versions = {"single": lambda eid: [("likert", (originals[eid],)), ("likert", (extended[eid],))],
                "pairwise": lambda eid: [("pairwise", (originals[eid], extended[eid]))]}
    jobs = [(f"{crit} {proto}", e, crit, how, shown) for crit in criteria for proto in protocols
            for e in judged[crit] for how, shown in versions[proto](e.eid)]
    fit = {"per_qa": per_qa, "max_articles": max_articles}
    check_judgments_fit(jobs, getattr(model, "context_window", None), **fit)
    out: dict[str, Any] = {}
    table = []
    with Measured(model) as measured, refused_windows(lambda window: judgments_misfit(jobs, window, **fit)):
        for crit in criteria:
            for proto in protocols:
                if proto == "single":
                    scores: dict[str, list] = {"original": [], "extended": []}
                    cases = []
                    for e in judged[crit]:
                        rated = [rate_event(crit, "likert", e, version[e.eid], max_articles=max_articles,
                                            concurrency=concurrency)["judgments"] for version in (originals, extended)]
                        # Each case keeps its two ratings and the error of a missing one, as a pairwise
                        # case does: the record shows why a case failed, and the error line quotes it.
                        for o, x in zip(*rated):
                            scores["original"].append(o["rating"])
                            scores["extended"].append(x["rating"])
                            cases.append({"case": f"{e.eid}/{o['key']}", "original": o["rating"],
                                          "extended": x["rating"], "explanations": [o["explanation"], x["explanation"]],
                                          "error": o["error"] or x["error"]})
                    result = verbosity_single(scores["original"], scores["extended"])
                    out[f"{crit}_single"] = {"result": result, **scores, "cases": cases}
                else:
                    cases = [(f"{e.eid}/{cid}", ref, originals[e.eid], extended[e.eid]) for e in judged[crit]
                             for cid, ref in pairwise_cases(e, crit, per_qa, max_articles)]
                    pairs = judge_pairs(PairwiseJudge(crit), cases, concurrency)
                    result = verbosity_pairwise([(p["first_order"], p["second_order"]) for p in pairs])
                    out[f"{crit}_pairwise"] = {"result": result, "cases": pairs}
                table.append((crit, proto, result))
    return {"kind": "booklens.bias.verbosity", "events_file": str(events_path), "summaries": [str(summaries)],
            "criterion": criterion, "protocols": list(protocols), "max_articles": max_articles, "per_qa": per_qa,
            "lm": lm_label(model), **out, "table": table, "not_judged": not_judged,
            "generated_references": generated, "usage": measured.usage, "seconds": measured.seconds}
