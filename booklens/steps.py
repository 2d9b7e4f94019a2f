"""The steps of booklens as library functions: each runs one program with the LM DSPy is set up
with (`dspy.configure` or `dspy.context`) and returns the record the CLI writes. Their calls use the
adapter set up there too, else booklens's (`adapter_unless_configured`).

    summarize_book     book -> `Summary` (hierarchical merging or incremental updating)
    score_summaries    summaries -> `CoherenceResult` each (BooookScore)
    decompose_summary  summary -> `ClaimSet` (atomic claims; a failure is recorded, not raised)
    verify_claims      claims (or a summary to decompose) + book -> `FaithfulnessReport`

`booklens.pipeline.run_book` chains them into a resumable run directory; the commands
`summarize`, `score`, `claims`, `verify` and `check` call them one at a time. Usage figures
are counted in a usage scope, so they are exact even when other work shares the LM.
"""

from __future__ import annotations

import functools
import hashlib
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from booklens.errors import BooklensError, check_flag, kind_of
from booklens.lm.base import (CONTEXT_ADVICE, ContextWindowExceeded, lm_label, planned_window_advice,
                              refuse_larger_window, window_setting)
from booklens.lm.usage import usage_scope, usage_step
from booklens.retrieval import DEFAULT_PASSAGE_TOKENS
from booklens.vocabulary import DEFAULT_CHUNK_SIZE, DEFAULT_CONTEXT_WINDOW, DEFAULT_SUMMARY_TOKENS, counted


def _in_booklens_format(step: Callable[..., Any]) -> Callable[..., Any]:
    """A step whose calls use booklens's adapter when the caller configured none (README's snippet
    sets it by hand; a caller who forgot paid for each call twice), the caller's adapter otherwise."""

    @functools.wraps(step)
    def run(*args: Any, **kwargs: Any) -> Any:
        from booklens.lm.adapter import adapter_unless_configured

        with adapter_unless_configured():
            return step(*args, **kwargs)

    return run


def _usage(tracker) -> dict[str, Any]:
    """The record's usage of the calls a usage scope counted (`record_usage`)."""
    return tracker.work()


# ---------------------------------------------------------------------------
# Summarize


def _check_program(name: str, program: Any, what: str) -> None:
    """A program handed over in place of the default (None): something to call, or one line naming
    it (a judge's name given where its program goes failed deep inside, after the setup)."""
    if program is not None and not callable(program):
        raise BooklensError(f"{name} must be {what}, not {kind_of(program)}")


def summary_settings(max_regenerations: Optional[int] = None) -> dict[str, Any]:
    """Regeneration settings of a summarizer: `max_regenerations` when given, else what the configured
    model's backend asks for (the embedded model: none), else the defaults (`booklens.vocabulary`)."""
    import dspy

    from booklens.vocabulary import DEFAULT_GENERATION_ALLOWANCE, DEFAULT_GENERATION_SLACK, DEFAULT_MAX_REGENERATIONS

    settings = {"max_regenerations": DEFAULT_MAX_REGENERATIONS, "generation_slack": DEFAULT_GENERATION_SLACK,
                "generation_allowance": DEFAULT_GENERATION_ALLOWANCE}
    settings.update(getattr(dspy.settings.lm, "summary_settings", None) or {})
    if max_regenerations is not None:
        settings["max_regenerations"] = max_regenerations
    return settings


# How a user names the summarizer settings in an error: the commands' options (or, with
# `as_keys`, the settings' own names, as sweep manifests write them).
_SUMMARY_OPTIONS = {"method": "--method", "level_budgets": "--level-budget", "merge_context": "--merge-context",
                    "max_summary_tokens": "--max-summary-tokens"}


def check_method_options(method: str, level_budgets: Optional[list[int]] = None,
                         merge_context: Optional[str] = None, *, max_summary_tokens: Optional[int] = None,
                         as_keys: bool = False) -> None:
    """A one-line error for a setting the method does not use, which the summary record would
    otherwise list as if it had shaped the summary. None means a setting was not given (and
    `max_summary_tokens` at its default counts as not given)."""
    def name(key: str) -> str:
        return key if as_keys else _SUMMARY_OPTIONS[key]

    if method == "hier":
        # The last level budget is the final summary's: a different G_n would be recorded, not applied.
        if level_budgets and max_summary_tokens not in (None, DEFAULT_SUMMARY_TOKENS, level_budgets[-1]):
            raise BooklensError(f"{name('level_budgets')} sets the budget of every level, the final summary's "
                                f"included ({level_budgets[-1]}): {name('max_summary_tokens')} {max_summary_tokens} "
                                "would not apply")
        return

    if level_budgets:
        raise BooklensError(f"{name('level_budgets')} is for {name('method')} hier; {name('method')} {method} keeps "
                            f"one summary within {name('max_summary_tokens')}")
    if merge_context is not None:
        raise BooklensError(f"{name('merge_context')} is for {name('method')} hier; {name('method')} {method} "
                            "makes no merges")


def budget_list(level_budgets: Any) -> Optional[list[int]]:
    """`level_budgets` as a list (any iterable of budgets: a tuple, a generator), or a one-line error:
    a string's last character would be taken for the final summary's budget."""
    if level_budgets is None:
        return None
    if isinstance(level_budgets, (str, bytes, Mapping)) or not isinstance(level_budgets, Iterable):
        raise BooklensError(f"level_budgets must be a list of token budgets, one per level, not "
                            f"{kind_of(level_budgets)}")
    return list(level_budgets)


def check_context_window(context_window: Optional[int], model_window: Optional[int]) -> None:
    """A one-line error when the summarizer's window (`context_window`; None is the default) is
    larger than the model's (`model_window`; None is unknown, and not checked). It says which of
    the two it was, so a user who never gave --context-window is not told about that option's value."""
    window = DEFAULT_CONTEXT_WINDOW if context_window is None else context_window
    refuse_larger_window(window, model_window, default=context_window is None)


@contextmanager
def judge_window_advice(lm: Any, option: Optional[str], what: str = "the judge"):
    """A prompt a server refused as too long, told to set `option` (None: left as it is) when the
    server's window is smaller than the one `what` (the judge) planned for: `lm`'s, else the default,
    which a server that does not say its window (llama-cpp-python's) is planned with."""
    try:
        yield
    except ContextWindowExceeded as exc:
        if option is None:
            raise
        planned = getattr(lm, "context_window", None) or DEFAULT_CONTEXT_WINDOW
        raise planned_window_advice(exc, planned, what, option) from None


def book_summarizer(*, method: str = "hier", chunk_size: int = DEFAULT_CHUNK_SIZE,
                    context_window: Optional[int] = None, max_summary_tokens: int = DEFAULT_SUMMARY_TOKENS,
                    level_budgets: Optional[list[int]] = None,
                    max_regenerations: Optional[int] = None, remove_artifacts: bool = True, concurrency: int = 4,
                    program_path: Optional[Path] = None, merge_context: Optional[str] = None,
                    words_per_token: Optional[float] = None):
    """The summarizer program `summarize_book` runs, compiled program loaded (a sweep's `--dry-run`
    plans its calls with the same object). `merge_context` and `words_per_token` default to the
    paper's (see `programs.summarizer`); `max_regenerations` to the configured model's (`summary_settings`)."""
    from booklens.inputs import as_path
    from booklens.programs.summarizer import DEFAULT_MERGE_CONTEXT, DEFAULT_WORDS_PER_TOKEN, make_summarizer

    if program_path is not None:  # before the program is built: a wrong one costs nothing
        program_path = as_path(program_path, "program_path", "a compiled summarizer artifact (JSON)")
    check_flag("remove_artifacts", remove_artifacts)
    level_budgets = budget_list(level_budgets)
    check_method_options(method, level_budgets, merge_context, max_summary_tokens=max_summary_tokens)
    if level_budgets and method == "hier":
        max_summary_tokens = level_budgets[-1]  # G_n: the last level budget is the final summary's
    extra = {"merge_context": merge_context or DEFAULT_MERGE_CONTEXT} if method == "hier" else {}
    # None means the default; 0 is a value the program refuses, not a request for the default.
    window = DEFAULT_CONTEXT_WINDOW if context_window is None else context_window
    per_token = DEFAULT_WORDS_PER_TOKEN if words_per_token is None else words_per_token
    program = make_summarizer(method, chunk_size=chunk_size, context_window=window,
                              max_summary_tokens=max_summary_tokens, level_budgets=level_budgets,
                              concurrency=concurrency, remove_artifacts=remove_artifacts,
                              words_per_token=per_token, **summary_settings(max_regenerations), **extra)
    if program_path is not None:
        from booklens.optimizers.artifacts import load_program

        load_program(program, program_path, task="summarize")
    return program


@_in_booklens_format
def summarize_book(book_path: Optional[Path] = None, *, method: str = "hier", chunk_size: int = DEFAULT_CHUNK_SIZE,
                   context_window: Optional[int] = None, max_summary_tokens: int = DEFAULT_SUMMARY_TOKENS,
                   level_budgets: Optional[list[int]] = None, max_regenerations: Optional[int] = None,
                   remove_artifacts: bool = True, drop_matter: bool = False, concurrency: int = 4,
                   program_path: Optional[Path] = None, text: Optional[str] = None,
                   merge_context: Optional[str] = None, words_per_token: Optional[float] = None):
    """Read, chunk and summarize a book with the configured LM; returns a `Summary` record.
    `text` is the book already read (with the same `drop_matter`), to spare a second read; without
    `book_path` too, the record names no book.
    `merge_context` and `words_per_token` default to the paper's (see `programs.summarizer`)."""
    from booklens.lm import current_lm
    from booklens.programs.summarizer import DEFAULT_MERGE_CONTEXT, DEFAULT_WORDS_PER_TOKEN
    from booklens.inputs import book_text
    from booklens.records import Summary, SummaryConfig
    from booklens.text import count_tokens, read_book

    check_flag("drop_matter", drop_matter)
    level_budgets = budget_list(level_budgets)  # a generator is read again below, for the record
    started = time.perf_counter()
    if text is None:
        text = read_book(book_path, drop_matter=drop_matter)
    else:
        text = book_text(text)
    read_seconds = time.perf_counter() - started
    lm = current_lm()
    words_per_token = DEFAULT_WORDS_PER_TOKEN if words_per_token is None else words_per_token
    program = book_summarizer(method=method, chunk_size=chunk_size, context_window=context_window,
                              max_summary_tokens=max_summary_tokens, level_budgets=level_budgets,
                              max_regenerations=max_regenerations, concurrency=concurrency,
                              remove_artifacts=remove_artifacts, program_path=program_path,
                              merge_context=merge_context, words_per_token=words_per_token)
    merge_context = merge_context or DEFAULT_MERGE_CONTEXT
    check_context_window(context_window, getattr(lm, "context_window", None))
    window = program.context_window
    config = SummaryConfig(method=method, chunk_size=chunk_size, context_window=window,
                           max_summary_tokens=program.max_summary_tokens, level_budgets=level_budgets or [],
                           max_regenerations=program.max_regenerations, generation_slack=program.generation_slack,
                           generation_allowance=program.generation_allowance,
                           remove_artifacts=remove_artifacts, drop_matter=drop_matter, concurrency=concurrency,
                           program=str(program_path) if program_path else None,
                           merge_context=merge_context if method == "hier" else None,
                           words_per_token=words_per_token)
    t0 = time.perf_counter()
    with usage_scope() as tracker, usage_step("summarize"):
        try:
            result = program(book=text)
        except ContextWindowExceeded as exc:
            told = planned_window_advice(exc, window, "the summarizer")
            if told is not exc:
                # The server named a smaller window than planned (llama-cpp-python's states none
                # beforehand): what else these settings need at that window, as the check before any
                # call would say once --context-window is set to it, so one rerun is the last.
                try:
                    book_summarizer(method=method, chunk_size=chunk_size, context_window=exc.window,
                                    max_summary_tokens=max_summary_tokens, level_budgets=level_budgets,
                                    max_regenerations=max_regenerations, concurrency=concurrency,
                                    remove_artifacts=remove_artifacts, program_path=program_path,
                                    merge_context=merge_context if method == "hier" else None,
                                    words_per_token=words_per_token).check_budgets()
                except BooklensError as misfit:  # only the window differs: it is the window's (below the least one)
                    settings = getattr(misfit, "settings", "")  # a `BudgetMisfit`'s
                    fact = str(exc).removesuffix(f": {CONTEXT_ADVICE}")
                    told = ContextWindowExceeded(
                        f"{told} (at {exc.window}: {settings})" if settings else
                        f"{fact}: the summarizer holds no chunk and summary in {exc.window} tokens beside its "
                        "prompt; use a model or server with a larger context", window=exc.window)
            raise told from None
    summarize_seconds = time.perf_counter() - t0
    return Summary(
        book=None if book_path is None else str(book_path),
        book_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        book_tokens=count_tokens(text),
        summary=result.summary,
        method=method,
        config=config,
        chunks=[{"index": c.index, "start": c.start, "end": c.end, "tokens": c.tokens,
                 "split_sentence": c.split_sentence} for c in result.chunks],
        nodes=result.nodes,
        lm=lm_label(lm),
        usage=_usage(tracker),
        timings={"read_seconds": round(read_seconds, 3), "summarize_seconds": round(summarize_seconds, 3),
                 "total_seconds": round(time.perf_counter() - started, 3)},
    )


# ---------------------------------------------------------------------------
# Coherence


@_in_booklens_format
def score_summaries(summaries: Mapping[str, str], *, batch_size: int = 1, concurrency: int = 4, tries: int = 3,
                    book_texts: Optional[Mapping[str, str]] = None, scorer: Any = None,
                    window_option: Optional[str] = None) -> dict[str, Any]:
    """Score summaries with the configured LM; name -> `CoherenceResult`, each with its judge. The
    judge is `scorer`, else the default few-shot confusion detector (`booklens.judges`).
    `window_option` names the setting of the window the judge plans for (a command's
    `--context-window`), which a server's refusal of a prompt then advises."""
    from booklens.inputs import summary_text, wordless
    from booklens.judges import judge_info, load_judge
    from booklens.lm import current_lm
    from booklens.metrics.booookscore import finish_result
    from booklens.programs.coherence import demos_note, own_demos_note, refuse_misfits, split_notes
    from booklens.records import CoherenceResult
    from booklens.text import split_sentences

    if not isinstance(summaries, Mapping):
        raise BooklensError(f"summaries must be a mapping of names to summaries, not {type(summaries).__name__}")
    _check_program("scorer", scorer, "a coherence judge: booklens.judges.load_judge('coherence')")
    if book_texts is not None and not isinstance(book_texts, Mapping):
        raise BooklensError(f"book_texts must be a mapping of the summaries' names to their books' texts, "
                            f"not {type(book_texts).__name__}")
    split = {}
    for name, text in summaries.items():  # every summary checked before the first call
        if not isinstance(name, str):  # the name each result is recorded under
            raise BooklensError(f"summaries must be named by text, not {type(name).__name__} ({name!r})")
        if book_texts is not None and book_texts.get(name) is not None:
            from booklens.inputs import book_text

            book_text(book_texts[name], f"the book text of {name!r}")
        if text is None:
            raise BooklensError(f"the summary {name!r} is empty")
        if not isinstance(text, str):
            raise BooklensError(f"the summary {name!r} is {type(text).__name__}, not text")
        if wordless(text):  # judged, it would score 100: nothing in it to confuse
            raise BooklensError(f"the summary {name!r} {wordless(text)}")
        split[name] = split_sentences(summary_text(text))
        if not split[name]:
            raise BooklensError(f"the summary {name!r} has no sentence")
    # As the judge takes it (`summary_text`): a record's trailing newline is no other summary.
    summaries = {name: summary_text(text) for name, text in summaries.items()}
    lm = current_lm()
    scorer = scorer or load_judge("coherence", batch_size=batch_size, concurrency=concurrency, tries=tries)
    refuse_misfits(scorer, ((repr(name), text) for name, text in summaries.items()),
                   getattr(lm, "context_window", None), **window_setting(lm, window_option))
    judge = judge_info("coherence", scorer, lm)
    results = {}
    for name, text in summaries.items():
        sentences = split[name]
        started = time.perf_counter()
        try:
            with usage_scope() as tracker, usage_step("coherence"), judge_window_advice(lm, window_option):
                prediction = scorer(summary=text, sentences=sentences)
        except ContextWindowExceeded as exc:
            # The server named its window in refusing (llama-cpp-python's states none beforehand): when
            # the summary cannot be judged in it even without demos, say so, rather than advise a
            # --context-window at which the check before the first call would refuse it.
            if exc.window:
                refuse_misfits(scorer, [(repr(name), text)], exc.window)
            raise
        seconds = time.perf_counter() - started
        notes = [note for note in [demos_note(prediction), own_demos_note(prediction)] if note]
        notes += split_notes(sentences)
        result = CoherenceResult(
            book=name, summary=text, annotator="program", sentences=prediction.annotations,
            mode=scorer.mode, batch_size=scorer.batch_size, judge=judge, notes=notes, lm=lm_label(lm),
            usage=_usage(tracker), timings={"score_seconds": round(seconds, 3)},
        )
        results[name] = finish_result(result, book_text=(book_texts or {}).get(name))
    return results


def score_coherence(summaries: Mapping[str, str], *, as_set: bool, batch_size: int = 1, concurrency: int = 4,
                    tries: int = 3, book_texts: Optional[Mapping[str, str]] = None, scorer: Any = None,
                    window_option: Optional[str] = None):
    """`score_summaries` for a command: one `CoherenceResult`, or (`as_set`) a `CoherenceSet` of all
    the summaries with the system score and the usage of the whole set."""
    from booklens.lm import current_lm
    from booklens.metrics.booookscore import build_set

    check_flag("as_set", as_set)
    if isinstance(summaries, Mapping) and not summaries:
        raise BooklensError("no summaries to score")
    started = time.perf_counter()
    with usage_scope() as tracker:
        results = score_summaries(summaries, batch_size=batch_size, concurrency=concurrency, tries=tries,
                                  book_texts=book_texts, scorer=scorer, window_option=window_option)
    if not as_set:
        return next(iter(results.values()))
    record = build_set(results, annotator="program")
    record.judge = next(iter(results.values())).judge
    record.lm = lm_label(current_lm())
    record.usage = _usage(tracker)
    record.timings = {"score_seconds": round(time.perf_counter() - started, 3)}
    return record


def judge_notes(record: Any) -> list[str]:
    """The notes a judge left on the summaries it scored (e.g. demos left out to fit the context
    window), one line each, named by book in a set of several: what the console says next to the
    score, since the judge line names the judge as shipped."""
    from booklens.records import CoherenceSet

    if isinstance(record, CoherenceSet):
        return [f"{name!r}: {note}" for name, result in record.results.items() for note in result.notes]
    return [str(note) for note in getattr(record, "notes", None) or []]


# ---------------------------------------------------------------------------
# Faithfulness


@_in_booklens_format
def decompose_summary(summary: str, *, decomposer: Any = None):
    """The summary's atomic claims as a `ClaimSet`; when no valid list came back after the
    decomposer's tries, the set is empty and `error` says why (the caller decides if that is fatal)."""
    from booklens.inputs import wordless
    from booklens.lm import current_lm
    from booklens.programs.faithfulness import build_decomposer
    from booklens.records import ClaimSet

    if not isinstance(summary, str):
        raise BooklensError(f"the summary must be text, not {type(summary).__name__}")
    _check_program("decomposer", decomposer, "a claim decomposer: booklens.programs.faithfulness.ClaimDecomposer()")
    if wordless(summary):  # its claims would all be 'faithful': nothing to be false
        raise BooklensError(f"the summary {wordless(summary)}")
    lm = current_lm()
    with usage_scope() as tracker, usage_step("decompose"):
        result = (decomposer or build_decomposer())(summary=summary)
    return ClaimSet(summary=summary, claims=result.claims, attempts=result.attempts, error=result.error,
                    lm=lm_label(lm), usage=_usage(tracker))


def book_index(book_text: str, *, cache_dir: Optional[Path] = None, passage_tokens: int = DEFAULT_PASSAGE_TOKENS,
               mode: Optional[str] = None, budget_tokens: Optional[int] = None):
    """The book's passage index (built once per book and settings, then loaded from the cache);
    the dense part too when `mode` needs it (`book` mode: unless the book fits `budget_tokens`)."""
    from booklens.inputs import book_text as checked_text
    from booklens.retrieval import BookIndex, index_dir

    index = BookIndex.build(checked_text(book_text), cache_dir=index_dir(cache_dir), passage_tokens=passage_tokens)
    if mode is not None and index.needs_dense(mode, budget_tokens):
        index.ensure_dense()
    return index


def check_claims(claims: Any) -> list[str]:
    """`claims` as a list (any iterable of claims: a generator too), or a one-line error unless none
    of them is empty or without a word (a string would be verified character by character, an empty
    claim judged like any other)."""
    if isinstance(claims, (str, bytes, Mapping)) or not isinstance(claims, Iterable):
        raise BooklensError(f"claims must be a list of claims, not {type(claims).__name__}")
    from booklens.inputs import wordless

    claims = list(claims)
    for n, claim in enumerate(claims, 1):
        if not isinstance(claim, str) or wordless(claim):
            raise BooklensError(f"claim {n} {wordless(claim)}" if isinstance(claim, str) else
                                f"claim {n} is empty" if claim is None else
                                f"claim {n} is {type(claim).__name__}, not text")
    return claims


def _given_quotes(given: Any) -> list[Optional[list[str]]]:
    """`verify_claims`' `given` as a list of each claim's quotes (None: none given), or a one-line
    error: a string where a claim's quotes go would be shown to the judge one character at a time."""
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Iterable):
        raise BooklensError(f"given must be a list of quote lists, one per claim, not {type(given).__name__}")
    quotes = []
    for n, item in enumerate(given, 1):
        if item is not None and (isinstance(item, (str, bytes, Mapping)) or not isinstance(item, Iterable)):
            raise BooklensError(f"given: the quotes of claim {n} must be a list of quotes, not "
                                f"{'one string' if isinstance(item, str) else type(item).__name__}")
        quotes.append(None if item is None else list(item))
    return quotes


@_in_booklens_format
def verify_claims(*, claims: Sequence[str], book_text: Optional[str], book: Optional[Path] = None,
                  summary: Optional[str] = None, given: Optional[Sequence[Optional[Sequence[str]]]] = None,
                  mode: str = "bm25", k: Optional[int] = None, budget_tokens: Optional[int] = None,
                  passage_tokens: Optional[int] = None,
                  concurrency: int = 4, cache_dir: Optional[Path] = None, decompose: bool = False,
                  programs: Optional[Mapping[str, Any]] = None, as_keys: bool = True, index: Any = None,
                  window_option: Optional[str] = None, max_claims: Optional[int] = None):
    """Gather evidence for each claim (decomposing `summary` first when `decompose`) and verify it
    with the configured LM; a `FaithfulnessReport` with its judge. `programs` holds the decomposer and
    verifier to use by task; the verifier defaults to the few-shot one booklens ships (`booklens.judges`).
    No claims given (and none to decompose) give an empty report without an index; a summary to
    decompose has its book indexed first, so an index that cannot be built fails before the paid
    decomposition (even when it then yields no claim). `index` is the book's index when the caller
    built it already (`book_index`, with the same settings). `k` and `passage_tokens` are refused where
    the mode does not use them; not given (None), they are the defaults. Errors name the settings as manifests write
    them (`k`), or as the command line spells them (`--k`) when not `as_keys`. `window_option` is as
    `score_summaries` takes it. `max_claims` verifies only the first that many claims (given, or
    decomposed from the whole summary); the report's `total_claims` then says how many there were."""
    from booklens.judges import judge_info, judge_name, load_judge
    from booklens.lm import current_lm
    from booklens.programs.faithfulness import DemoFit, build_checker, fit_demos_to_evidence, label_summary
    from booklens.records import FaithfulnessReport
    from booklens.retrieval import (BOOK_MODES, BUDGET_MODES, PASSAGE_MODES, check_evidence_options,
                                    retrieval_settings)

    check_evidence_options(mode, k=k, budget_tokens=budget_tokens, passage_tokens=passage_tokens,
                           has_book=book_text is not None, as_keys=as_keys)
    if max_claims is not None:
        from booklens.parallel import check_at_least

        check_at_least("max_claims" if as_keys else "--max-claims", max_claims)
    k, passage_tokens = retrieval_settings(k, passage_tokens)
    if book_text is not None:
        from booklens.inputs import book_text as checked_text

        book_text = checked_text(book_text)
    if mode in BOOK_MODES and book_text is None:
        raise BooklensError(f"evidence mode '{mode}' needs the book")
    if book is not None:  # recorded as the report's book
        from booklens.inputs import as_path

        book = as_path(book, "book")
    if given is not None:
        given = _given_quotes(given)
    if programs is not None and not isinstance(programs, Mapping):
        raise BooklensError(f"programs must be a mapping of tasks to programs (booklens.judges.judge_programs), "
                            f"not {kind_of(programs)}")
    total_claims = None
    if not decompose:
        claims = check_claims(claims)
        if max_claims is not None and len(claims) > max_claims:
            if given is not None and len(given) != len(claims):
                raise BooklensError(f"{len(claims)} claims but {len(given)} evidence lists")
            total_claims = len(claims)
            claims = claims[:max_claims]
            given = given[:max_claims] if given is not None else None
        if mode == "given" and given is not None and len(given) == len(claims):
            from booklens.programs.faithfulness import first_without_quotes

            missing = first_without_quotes(given, len(claims))
            if missing is not None:
                raise BooklensError(f"evidence mode 'given' needs quotes with every claim "
                                    f"(claim {missing + 1} has none)")
    lm = current_lm()
    programs = programs or {}  # programs by task (`booklens.judges.judge_programs`)
    verifier = programs.get("verification") or load_judge("verification")
    checker = build_checker(evidence_mode=mode, k=k, budget_tokens=budget_tokens, concurrency=concurrency,
                            decomposer=programs.get("decomposition"), verifier=verifier)
    fit = DemoFit(verifier)
    if (mode in BOOK_MODES and book_text is not None) or (mode == "given" and given is not None):
        fit = fit_demos_to_evidence(verifier, getattr(lm, "context_window", None), mode=mode, k=k,
                                    passage_tokens=passage_tokens, budget_tokens=budget_tokens, book_text=book_text,
                                    given=given, as_keys=as_keys)
        checker.verifier = fit.verifier
    # The judge (with its stored calibration) is read before any call, as `score_summaries` does: a
    # store that cannot be read then fails the command before the claims are judged, not after. It is
    # the program's, with the demos its window left it.
    judge = judge_info(judge_name("verification", verifier), verifier, lm, evidence=mode)
    judge.demos_shown, judge.demos_note = fit.shown, fit.note
    started = time.perf_counter()
    index_seconds = 0.0
    if index is None and book_text is not None and mode != "none" and (decompose or claims):
        # Before the decomposition: an index that cannot be built (a cache folder that takes no file,
        # no embedding model) is then an error before any call, not after a paid one.
        index = book_index(book_text, cache_dir=cache_dir, passage_tokens=passage_tokens, mode=mode,
                           budget_tokens=checker.resolved_budget() if mode == "book" else None)
        index_seconds = time.perf_counter() - started
    with usage_scope() as tracker:
        claims = checker.claims_of(summary) if decompose else list(claims)
        if decompose and max_claims is not None and len(claims) > max_claims:
            # the whole summary is split, so the claims kept are the ones a full run verifies first
            total_claims = len(claims)
            claims = claims[:max_claims]
        t0 = time.perf_counter()
        given_lists = [list(g or []) for g in given] if given is not None else None
        try:
            with judge_window_advice(lm, window_option):  # the decomposer's prompt is not sized by a window
                verdicts = checker.verify_claims(claims, index=index, given_evidence=given_lists) if claims else []
        except ContextWindowExceeded as exc:
            # The window the server named in refusing, when the judge holds no evidence in it: a smaller
            # --context-window (what the refusal advises) would only be refused before any call.
            from booklens.programs.faithfulness import window_holds_no_evidence

            line = (window_holds_no_evidence(verifier, exc.window, mode=mode, k=k, passage_tokens=passage_tokens)
                    if exc.window else None)
            if line:
                raise BooklensError(line) from None
            raise
        run_seconds = time.perf_counter() - t0
    counts, percentages, failures = label_summary(verdicts)
    return FaithfulnessReport(
        book=str(book) if book else None,
        book_sha256=hashlib.sha256(book_text.encode("utf-8")).hexdigest() if book_text is not None else None,
        summary=summary, evidence_mode=mode,
        k=k if mode in PASSAGE_MODES else None,
        budget_tokens=checker.resolved_budget() if mode in BUDGET_MODES else None,
        passage_tokens=passage_tokens if index is not None else None,
        claims=verdicts, total_claims=total_claims, label_counts=counts, label_percentages=percentages,
        failures=failures, label_set=verifier.label_set,
        judge=judge, lm=lm_label(lm), usage=_usage(tracker),
        timings={"index_seconds": round(index_seconds, 3), "verify_seconds": round(run_seconds, 3),
                 "total_seconds": round(time.perf_counter() - started, 3)},
    )


def judged_nothing(record: Any) -> Optional[str]:
    """Why a record measures nothing, else None: its judge (or `qa`'s model) failed on every item.
    Commands and runs write such a record for a look at the errors, then count it as a failure
    instead of a score (a 0 would say more about the backend than about the summary or model).

    Records: a `CoherenceResult` or `CoherenceSet` (sentences), a `FaithfulnessReport` (claims), and
    the results of `judge` (judgments or pairwise cases), `bias` (cases), `qa` (questions) and
    `diverse`; each protocol of `diverse`, and each criterion (and protocol) of `bias`, is a score of
    its own, so one that failed throughout measured nothing."""
    from booklens.records import CoherenceResult, CoherenceSet, FaithfulnessReport

    if isinstance(record, FaithfulnessReport):
        errors = [c.error for c in record.claims if c.error]
        return all_failed(f"the judge verified none of the {len(record.claims)} claims", len(record.claims),
                          record.failures, errors)
    if isinstance(record, (CoherenceResult, CoherenceSet)):
        results = record.results.values() if isinstance(record, CoherenceSet) else [record]
        return sentences_judged_nothing(record.n_sentences, record.n_failed,
                                        [s.error for r in results for s in r.sentences if s.error])
    kind = record.get("kind") if isinstance(record, Mapping) else None
    if kind == "booklens.qa":
        errors = [p.get("error") or "" for p in record["predictions"]]
        return all_failed("no question got a valid answer or verdict", len(errors), sum(map(bool, errors)), errors,
                          counts="question")
    if kind == "booklens.judge":
        items = [item for row in record["events"] for item in row.get("cases", row.get("judgments", []))]
        failed = sum(row["failed"] for row in record["events"])
        return all_failed("the judge gave no verdict", len(items), failed, [i.get("error") or "" for i in items],
                          counts="pairwise case" if record["protocol"] == "pairwise" else "judgment")
    if kind in ("booklens.bias.position", "booklens.bias.verbosity"):
        parts = _bias_figures(record)
        empty = {name: parts[name] for name in bias_figures_judged_nothing(record)}
        said = "the judge gave no verdict" + ("" if len(empty) == len(parts) else f" on {', '.join(empty)}")
        items = [item for part in empty.values() for item in part.get("cases", [])]
        failed = sum(part["result"]["failed"] for part in empty.values())
        return all_failed(said, failed, failed, [i.get("error") or "" for i in items], counts="case")
    if kind == "booklens.diverse":
        by_protocol: dict[str, list[Any]] = {}
        for row in record["events"]:
            for name, judgments in (row.get("judgments") or {}).items():
                by_protocol.setdefault(name, []).extend(judgments)
        empty = {name: [j.get("error") or "" for j in judgments] for name, judgments in by_protocol.items()
                 if failed_throughout(len(judgments), sum(bool(j.get("error")) for j in judgments))}
        errors = [e for name_errors in empty.values() for e in name_errors]
        return all_failed(f"the judge gave no verdict on {', '.join(empty)}", len(errors), len(errors), errors,
                          counts="judgment")
    return None


def _bias_figures(record: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """{name: {result, cases, ...}} of a `bias` record: each criterion (and protocol) is a figure of
    its own, as each of `diverse`'s protocols is."""
    return {name: part for name, part in record.items() if isinstance(part, Mapping) and "result" in part}


def bias_figures_judged_nothing(record: Mapping[str, Any]) -> list[str]:
    """The figures of a `bias` record (`_bias_figures`) whose every case failed: each measured nothing,
    whatever the others measured."""
    return [name for name, part in _bias_figures(record).items()
            if failed_throughout(part["result"]["failed"] + part["result"]["cases"], part["result"]["failed"])]


def sentences_judged_nothing(n_sentences: int, n_failed: int, errors: Sequence[str]) -> Optional[str]:
    """`judged_nothing` of a coherence judgment of `n_sentences` sentences (also what the
    summarization task's metric says of a summary it cannot score)."""
    return all_failed(f"the judge gave no valid verdict on any of the {n_sentences} sentences", n_sentences,
                      n_failed, errors)


def all_failed(said: str, total: int, failed: int, errors: Sequence[str], *, counts: Optional[str] = None
               ) -> Optional[str]:
    """The rule of `judged_nothing`: `said`, then "(failed of total <counts>s failed)" when `counts`
    names the items, and the first error, when every one of `total` items failed
    (`failed_throughout`); else None."""
    if not failed_throughout(total, failed):
        return None
    tally = f" ({failed} of {counted(total, counts)} failed)" if counts else ""
    return said + tally + quote_first_error(errors)


def failed_throughout(total: int, failed: int) -> bool:
    """Every one of `total` items failed (no item at all is not a failure: there was nothing to judge)."""
    return total > 0 and failed >= total


def require_verdicts(record: Any) -> Any:
    """`record`, or a one-line error when its judge gave no valid verdict at all (`judged_nothing`)."""
    reason = judged_nothing(record)
    if reason:
        raise BooklensError(reason)
    return record


def quote_first_error(errors: Sequence[str]) -> str:
    line = next((e.strip().splitlines()[0] for e in errors if e.strip()), "")
    return f" (first: {line[:200]})" if line else ""
