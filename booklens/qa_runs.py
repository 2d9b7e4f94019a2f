"""The `booklens qa` run as a library call: a book and a NovelQA question file in, the
accuracy report and every prediction out.

Inputs are read and checked before DSPy, LiteLLM or a model is loaded, so a wrong path or
a malformed question file fails at once. The programs themselves are in
`booklens.programs.qa`; `setup_run_lm` and `Measured` are shared with
`booklens.diverse_runs`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Optional

from booklens.errors import BooklensError, check_flag, kind_of, setting_name
from booklens.lm.base import ContextWindowExceeded, lm_label, planned_window_advice
from booklens.retrieval import QA_BOOK_RANK_MODE


def title_from_path(path: Path) -> str:
    """A readable title from a book's file name: 'pride_and_prejudice.txt' -> 'Pride And Prejudice'."""
    return path.stem.replace("_", " ").replace("-", " ").title()


def setup_run_lm(lm: Any = None, api_base: Optional[str] = None, cache_dir: Any = None, **options: Any) -> Any:
    """The LM of a run: an LM object as given, or one built from an `--lm` string (`options`: the
    backend options `make_lm` takes: structured, rpm, tpm). `Measured` runs the work on it."""
    from booklens.lm import make_lm, refuse_server_options_for_embedded

    if lm is None or isinstance(lm, str):
        refuse_server_options_for_embedded(lm, api_base, **options)
        return make_lm(lm, api_base=api_base, cache_dir=cache_dir, **options)
    from booklens.lm.cache import cache_folder
    from booklens.lm.model import require_lm

    cache_folder(cache_dir)  # an LM object keeps its own cache, but a cache_dir that is no path is still a slip
    return require_lm(lm, "lm")


class Measured:
    """A block of work on one LM: DSPy runs it on that LM with booklens' adapter (in a
    `dspy.context`, so the caller's own DSPy settings stay as they were and any thread may run
    it), and the LM usage of its own calls (a usage scope: not those other threads make on the same
    LM meanwhile) and its wall time are measured."""

    def __init__(self, lm: Any):
        self.lm = lm
        self.usage: dict[str, Any] = {}
        self.seconds = 0.0

    def __enter__(self) -> "Measured":
        import dspy

        from booklens.lm import BooklensAdapter, usage_scope

        self._context = dspy.context(lm=self.lm, adapter=BooklensAdapter())
        self._context.__enter__()
        self._scope = usage_scope()
        self._tracker = self._scope.__enter__()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = round(time.perf_counter() - self._t0, 2)
        self.usage = self._tracker.work()
        self._scope.__exit__(*exc)
        self._context.__exit__(*exc)


def check_given_window(context_window: Optional[int], model: Any) -> None:
    """The one check of a --context-window against the model's, before any call. Without one, qa and
    diverse take the model's own window, so there is nothing to check (unlike the summarizer's default)."""
    from booklens.steps import check_context_window

    if context_window is not None:
        check_context_window(context_window, getattr(model, "context_window", None))


def _check_title_is_named(setting: str, evidence: str, quote_evidence: bool, evidence_recall: str,
                          questions: list[Any]) -> None:
    """A `--title` no prompt of the run names is refused: only the closed-book prompts and the judges (gen
    answers, LLM-scored evidence) name the book, and the record would hold a title that changed nothing."""
    closed_book = evidence == "none" or evidence == "given" and any(
        not any(e.strip() for e in q.evidences) for q in questions)  # asked closed book without evidence
    if setting == "gen" or closed_book or quote_evidence and evidence_recall == "llm":
        return
    shown = "its gold evidence" if evidence == "given" else "the book or passages of it"
    why = [f"{setting_name('--setting')} mc: no answer judge",
           f"{setting_name('--evidence')} {evidence}: every question is shown {shown}"]
    if quote_evidence:
        why.append(f"{setting_name('--evidence-recall')} overlap: the quotes are scored without a judge")
    raise BooklensError(f"{setting_name('--title')} names the book in the closed-book and judge prompts, and this "
                        f"run has neither ({'; '.join(why)}): leave it out")


def run_book_qa(book: Path, questions: Path, *, setting: str = "mc", evidence: str = "book", k: Optional[int] = None,
                passage_tokens: Optional[int] = None, rank_mode: Optional[str] = None,
                quote_evidence: bool = False,
                evidence_recall: Optional[str] = None, title: Optional[str] = None, limit: Optional[int] = None,
                position_threshold: int = 100_000, context_window: Optional[int] = None, lm: Any = None,
                api_base: Optional[str] = None, lm_options: Optional[dict[str, Any]] = None,
                cache_dir: Any = None, concurrency: int = 4) -> dict[str, Any]:
    """Answer a NovelQA question file about a book and score it. Returns the `booklens qa` result
    (kind `booklens.qa`): the report (`booklens.metrics.qa.qa_report`), every prediction, how
    many questions read the whole book, retrieved passages or nothing, LM usage and time.

    `lm` is an `--lm` string (None: the default) or an LM object such as `ScriptedLM`. `k`,
    `passage_tokens` and `rank_mode` are refused where the evidence mode does not use them; not given
    (None), they are the defaults."""
    from booklens.data.novelqa import check_evidence_recall, check_setting, load_questions
    from booklens.inputs import as_path
    from booklens.parallel import check_at_least
    from booklens.retrieval import (BOOK_MODES, MIN_PASSAGE_TOKENS, check_evidence_options, index_dir,
                                    retrieval_settings)
    from booklens.text import count_tokens, read_book
    from booklens.vocabulary import MIN_QA_CONTEXT_WINDOW

    book, questions = as_path(book, "the book"), as_path(questions, "the question file")
    # The bounds the command's options have, for a library caller who skips them.
    for option, value, least in (("--limit", limit, 1), ("--k", k, 1),
                                 ("--passage-tokens", passage_tokens, MIN_PASSAGE_TOKENS),
                                 ("--context-window", context_window, MIN_QA_CONTEXT_WINDOW)):
        if value is not None:
            check_at_least(option, value, least)
    check_at_least("--position-threshold", position_threshold)
    check_at_least("--concurrency", concurrency)
    if title is not None and not isinstance(title, str):
        raise BooklensError(f"title must be text, not {type(title).__name__}")
    check_flag("quote_evidence", quote_evidence)  # "no" would read as True
    if lm_options is not None and not isinstance(lm_options, Mapping):
        raise BooklensError(f"lm_options must be a mapping of backend options (structured, rpm, tpm), not "
                            f"{kind_of(lm_options)}")
    if title is not None and not title.strip():  # `--title "$TITLE"` with TITLE unset, say
        raise BooklensError(f"{setting_name('--title')} is empty: name the book, or leave it out (the file name "
                            f"gives the title: {title_from_path(book)!r})")
    check_evidence_options(evidence, k=k, passage_tokens=passage_tokens, rank_mode=rank_mode, book_takes_k=True,
                           given_cuts_passages=False)
    k, passage_tokens = retrieval_settings(k, passage_tokens)
    rank_mode = rank_mode or QA_BOOK_RANK_MODE
    if quote_evidence and evidence == "none":
        raise BooklensError(f"{setting_name('--quote-evidence')} asks for quotes from the context, and "
                            f"{setting_name('--evidence')} none gives none")
    if evidence_recall is not None and not quote_evidence:
        raise BooklensError(f"{setting_name('--evidence-recall')} scores the quotes that "
                            f"{setting_name('--quote-evidence')} asks for: add it")
    evidence_recall = evidence_recall or "llm"
    check_evidence_recall(evidence_recall)
    qs = load_questions(questions)
    check_setting(qs, setting, source=str(questions))
    if limit is not None:
        qs = qs[:limit]
    if title is not None:
        _check_title_is_named(setting, evidence, quote_evidence, evidence_recall, qs)
    text = read_book(book)

    from booklens.metrics.qa import qa_report
    from booklens.programs.qa import BookQA, answer_questions

    program = BookQA(setting, evidence, k=k, passage_tokens=passage_tokens, context_window=context_window,
                     quote_evidence=quote_evidence, rank_mode=rank_mode, index_cache_dir=index_dir(cache_dir))
    model = setup_run_lm(lm, api_base, cache_dir, **(lm_options or {}))
    check_given_window(context_window, model)
    title = title or title_from_path(book)
    with Measured(model) as measured:
        try:
            records = answer_questions(program, text, qs, concurrency=concurrency, book_title=title,
                                       evidence_recall=evidence_recall)
        except ContextWindowExceeded as exc:
            from booklens.vocabulary import DEFAULT_CONTEXT_WINDOW

            planned = context_window or getattr(model, "context_window", None) or DEFAULT_CONTEXT_WINDOW
            raise planned_window_advice(exc, planned, "qa") from None
    modes: dict[str, int] = {}
    for r in records:
        modes[r.context_mode] = modes.get(r.context_mode, 0) + 1
    return {
        "kind": "booklens.qa", "book": str(book), "book_tokens": count_tokens(text), "questions": str(questions),
        "setting": setting, "evidence": evidence, "context_modes": modes,
        # the retrieval settings where the evidence mode uses them (None where it does not)
        "k": k if evidence in BOOK_MODES else None,
        "passage_tokens": passage_tokens if evidence in BOOK_MODES else None,
        "rank_mode": rank_mode if evidence == "book" else None,
        # the window given (null: the model's own), which decides whole book or retrieval; the title the
        # closed-book and judge prompts name
        "context_window": context_window, "title": title, "limit": limit, "position_threshold": position_threshold,
        "quote_evidence": program.quote_evidence,
        "evidence_recall": evidence_recall if program.quote_evidence else None, "lm": lm_label(model),
        "report": qa_report(records, threshold=position_threshold), "predictions": [r.model_dump() for r in records],
        "usage": measured.usage, "seconds": measured.seconds,
    }
