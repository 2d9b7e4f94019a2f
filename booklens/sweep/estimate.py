"""`booklens sweep --dry-run`: the cells, and per system the LM calls and tokens it will take and
what that costs where LiteLLM knows the model's prices. No LM is called and no model is loaded (a
self-hosted server is asked its context window, a GET as the run's checks make, not a completion).

A hierarchical summary's calls come from the summarizer's own plan of each book's real chunks
(`HierarchicalSummarizer.plan`): its budget checks, level-1 groups, level budgets and merge tree,
run without a model on summaries of the assumed lengths, so a configuration the summarizer would
refuse is refused here too. Incremental updating is counted here, after the summarizer's budget
checks: a call per chunk, and a compression after each update over the budget. The judge's calls are
sized for the judge's LM: with `evidence: book` each verification holds what the verifier's own
budget on that LM's context window holds (`ClaimVerifier.evidence_budget`), the whole book at most;
the window is the judge's `context_window`, else the one its server states, else the model's known one.
What cannot be known before the model writes is assumed, and said: every summary fills its token
budget unless what it summarizes is shorter (then it is as long as that: a short book's summary is
no longer than the book), a same-level merge context cut to its cap keeps all of the cap,
incremental updating compresses every update over its budget (upper bounds on calls), a summary
sentence is about `TOKENS_PER_SENTENCE` tokens and yields one claim, and no answer needs a retry
(nor a compression a second one: a compression longer than the next call's room is compressed
again). A cell whose run directory holds steps a run reuses (a judge setting changed) is estimated
for the other steps only, judging the summary and claims on disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping, Optional

from booklens.errors import BooklensError
from booklens.lm.usage import known_cost
from booklens.retrieval import BOOK_MODES
from booklens.sweep.manifest import Sweep

TOKENS_PER_SENTENCE = 25
CLAIMS_PER_SENTENCE = 1.0
CLAIM_TOKENS = 20
# Typical answer lengths of the judge's calls (tokens).
COHERENCE_ANSWER_TOKENS = 40
CLAIM_ANSWER_TOKENS = 25
VERIFY_ANSWER_TOKENS = 60


@dataclass
class Work:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, calls: int, prompt: int, completion: int) -> None:
        self.calls += calls
        self.prompt_tokens += prompt
        self.completion_tokens += completion


@dataclass
class SystemEstimate:
    name: str
    books: int
    chunks: int = 0
    summarize_lm: Optional[str] = None  # None for a `summaries:` system
    judge_lm: str = ""
    summarize: Work = field(default_factory=Work)
    judge: Work = field(default_factory=Work)
    cost_usd: Optional[float] = None

    @property
    def calls(self) -> int:
        return self.summarize.calls + self.judge.calls

    @property
    def prompt_tokens(self) -> int:
        return self.summarize.prompt_tokens + self.judge.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self.summarize.completion_tokens + self.judge.completion_tokens


def price(lm: str, prompt_tokens: int, completion_tokens: int, server: Optional[str] = None) -> Optional[float]:
    """USD for this much work where LiteLLM knows the model's prices and they apply at `server` (the
    runs' rule, `booklens.lm.remote.list_priced`); 0 for the embedded model."""
    from booklens.lm import LOCAL_LM
    from booklens.lm.remote import list_priced

    if lm == LOCAL_LM:
        return 0.0
    if not list_priced(lm.split("/", 1)[0] if "/" in lm else "", server):
        return None
    try:
        import litellm

        prompt_cost, completion_cost = litellm.cost_per_token(model=lm, prompt_tokens=prompt_tokens,
                                                              completion_tokens=completion_tokens)
    except Exception:  # an unknown model or provider: the price is not known
        return None
    return float(prompt_cost + completion_cost)


class _Overheads:
    """Prompt tokens of each predictor with empty inputs (instructions, field layout, demos)."""

    def __init__(self):
        # id -> (predictor, tokens): holding the predictor keeps its id from being reused
        self._cache: dict[int, tuple[Any, int]] = {}

    def of(self, predictor: Any, **empty: Any) -> int:
        from booklens.programs.base import prompt_tokens

        key = id(predictor)
        if key not in self._cache:
            self._cache[key] = (predictor, prompt_tokens(predictor, **empty))
        return self._cache[key][1]


def summary_work(summarizer: Any, chunks: list[Any], overheads: _Overheads) -> tuple[Work, int]:
    """Calls and tokens to summarize one book's chunks, and the final summary's tokens."""
    work = Work()
    if summarizer.method == "hier":
        # The summarizer's own plan (its groups, contexts and budgets), each summary at its budget
        # or as long as the book text under it when that is shorter.
        calls, root = summarizer.plan(chunks)
        heads = {"chunk": overheads.of(summarizer.summarize_chunk, excerpt="", word_limit=0),
                 "merge": overheads.of(summarizer.merge, summaries=[], word_limit=0),
                 "context": overheads.of(summarizer.merge_with_context, context="", summaries=[], word_limit=0)}
        for call in calls:
            kind = "context" if call.context_tokens is not None else call.summary.kind
            work.add(1, heads[kind] + (call.context_tokens or 0) + call.input_tokens, call.summary.tokens)
        final = root.tokens
    else:
        from booklens.programs.summarizer import UPDATE_ALLOWANCE  # loaded already: it built `summarizer`

        summarizer.check_budgets()
        g = summarizer.max_summary_tokens
        first = overheads.of(summarizer.summarize_chunk, excerpt="", word_limit=0)
        update = overheads.of(summarizer.update, running_summary="", excerpt="", word_limit=0)
        compress = overheads.of(summarizer.compress, summary="", current_words=0, word_limit=0)
        current = min(g, chunks[0].tokens)
        work.add(1, first + chunks[0].tokens, current)
        grown = int(g * UPDATE_ALLOWANCE)
        for chunk in chunks[1:]:
            updated = min(grown, current + chunk.tokens)  # no longer than the summary and chunk it updates
            work.add(1, update + current + chunk.tokens, updated)
            current = updated
            if updated > g:  # as the run: only an update over the budget is compressed
                work.add(1, compress + updated, g)
                current = g
        final = current
    if summarizer.remove_artifacts:
        work.add(1, overheads.of(summarizer.clean, summary="") + final, final)
    return work, final


def judge_work(judge: Any, summary_tokens: int, sentences: int, book_tokens: int, judge_window: Optional[int],
               overheads: _Overheads, programs: dict[str, Any], reused: Collection[str] = (),
               claims: Optional[int] = None, book_text: Optional[str] = None) -> Work:
    """Calls and tokens to judge one summary of this many tokens and sentences, of a book of
    `book_tokens`, on a judge LM whose context window is `judge_window` (None: unknown), less the
    run steps in `reused` (on disk: a run makes them without a call); `claims`: how many the summary
    was split into, when known. With `book_text`, the verifier shows the demos its window holds
    beside that book's evidence, as the cell's run decides (`fit_demos_to_evidence`)."""
    work = Work()
    sentences = max(1, sentences)
    if "coherence" in judge.steps and "coherence" not in reused:
        scorer = programs["coherence"]
        if judge.batch_size == 1:
            head = overheads.of(scorer.detect, summary="", sentence="")
            per_sentence = math.ceil(summary_tokens / sentences)
            work.add(sentences, sentences * (head + summary_tokens + per_sentence),
                     sentences * COHERENCE_ANSWER_TOKENS)
        else:
            head = overheads.of(scorer.detect_batch, summary="", sentences="")
            batches = math.ceil(sentences / judge.batch_size)
            work.add(batches, batches * (head + 2 * summary_tokens // batches + summary_tokens),
                     sentences * COHERENCE_ANSWER_TOKENS)
    if "faithfulness" in judge.steps:
        if claims is None:
            claims = max(1, round(sentences * CLAIMS_PER_SENTENCE))
        if "claims" not in reused:
            decomposer = programs["decomposition"]
            work.add(1, overheads.of(decomposer.decompose, summary="") + summary_tokens, claims * CLAIM_ANSWER_TOKENS)
        if "faithfulness" in reused:
            return work
        if judge.max_claims:
            claims = min(claims, judge.max_claims)
        verifier = programs["verification"]
        if judge.evidence in BOOK_MODES and book_text is not None:
            from booklens.programs.faithfulness import fit_demos_to_evidence

            try:
                verifier = fit_demos_to_evidence(verifier, judge_window, mode=judge.evidence, k=judge.k,
                                                 passage_tokens=judge.passage_tokens,
                                                 budget_tokens=judge.budget_tokens, book_text=book_text).verifier
            except BooklensError:  # settings no demo fits beside: the run refuses them before any call
                pass
        if judge.evidence == "none":
            head, evidence = overheads.of(verifier.verify_without_evidence, claim=""), 0
        else:
            head = overheads.of(verifier.verify, evidence="", claim="")
            if judge.evidence == "book":  # as much of the book as the judge LM's budget holds, at most all of it
                evidence = min(book_tokens, judge.budget_tokens or verifier.evidence_budget(judge_window))
            else:  # k passages, or the whole of a book shorter than that
                evidence = min(book_tokens, judge.k * judge.passage_tokens)
        work.add(claims, claims * (head + CLAIM_TOKENS + evidence), claims * VERIFY_ANSWER_TOKENS)
    return work


def _step_on_disk(output: Optional[Path], system: str, book: str, step: str) -> Any:
    """A step's record in a cell's run directory, or None when there is none to read."""
    from booklens.reports import read_step_record
    from booklens.sweep.aggregate import cell_dir

    if output is None:
        return None
    try:
        return read_step_record(cell_dir(output, system, book), step)
    except BooklensError:
        return None


def _summary_on_disk(output: Optional[Path], system: str, book: str) -> Optional[str]:
    record = _step_on_disk(output, system, book, "summary")
    return None if record is None else record.summary


def _claims_on_disk(output: Optional[Path], system: str, book: str) -> Optional[int]:
    record = _step_on_disk(output, system, book, "claims")
    return None if record is None else len(record.claims)


def _judge_programs(judge: Any) -> dict[str, Any]:
    """The programs the cells judge with (the pipeline's: default few-shot, zero-shot or compiled)."""
    from booklens.pipeline import load_judge_programs

    return load_judge_programs(judge)


def estimate_sweep(sweep: Sweep, *, reused: Optional[Mapping[tuple[str, str], Collection[str]]] = None,
                   output: Optional[Path] = None, programs: Optional[dict[str, Any]] = None) -> list[SystemEstimate]:
    """Per system: books, chunks, LM calls and tokens (summarizing and judging), cost where known.
    `reused`: per (system, book) cell, the run steps on disk that a run reuses without a call
    (`reusable_cell_steps`): they are left out, so a cell complete on disk counts nothing and one
    whose judge changed counts its judging only, of the summary in its run directory under the sweep
    directory `output`. `programs`: the judge programs, when already loaded."""
    import dspy

    from booklens.lm import BooklensAdapter, served_context_window
    from booklens.lm.pool import resolve_model
    from booklens.pipeline import build_summarizer
    from booklens.text import chunk_text, count_tokens, read_book, split_sentences

    judge = sweep.judge_config()
    overheads = _Overheads()
    texts: dict[tuple[str, bool], Optional[tuple[str, int]]] = {}

    def book_text(key: str, drop_matter: bool) -> Optional[tuple[str, int]]:
        """The book's text and its tokens; None when it cannot be read (its cells fail, making no call)."""
        if (key, drop_matter) not in texts:
            if sweep.book_read(key, drop_matter)[0] is None:  # as the manifest found it: not read again
                texts[(key, drop_matter)] = None
                return None
            try:
                text = read_book(sweep.book(key).path, drop_matter=drop_matter)
                texts[(key, drop_matter)] = (text, count_tokens(text))
            except BooklensError:
                texts[(key, drop_matter)] = None
        return texts[(key, drop_matter)]

    estimates = []
    with dspy.context(adapter=BooklensAdapter()):
        programs = programs if programs is not None else _judge_programs(judge)
        judge_lm, judge_server = resolve_model(sweep.lm, sweep.api_base, judge.lm, judge.api_base)
        # the judge's calls run on its LM, not the summarizer's, planned for the judge's window where one is set,
        # else for the window its server states (asked once: the checks before this asked already)
        judge_window = judge.context_window or served_context_window(judge_lm, judge_server)
        for spec in sweep.systems:
            first = sweep.system_config(spec.name, sweep.books[0].key)
            given = spec.summaries is not None
            summarize_lm, summarize_server = resolve_model(sweep.lm, sweep.api_base, first.lm, first.api_base)
            est = SystemEstimate(spec.name, len(sweep.books), judge_lm=judge_lm,
                                 summarize_lm=None if given else summarize_lm)
            summarizer = None
            if not given:
                try:
                    summarizer = build_summarizer(first)
                    summarizer.check_budgets()
                except BooklensError as exc:
                    raise BooklensError(f"system {spec.name!r}: {exc}") from None
            for book in sweep.books:
                done = set((reused or {}).get((spec.name, book.key), ()))
                if done >= set(judge.wanted_steps()):
                    continue
                read = book_text(book.key, first.drop_matter)
                if read is None:
                    continue
                text, book_tokens = read
                if given:
                    summary = sweep.summaries[spec.name][book.key]
                    tokens, sentences = count_tokens(summary), len(split_sentences(summary))
                else:
                    chunks = chunk_text(text, first.chunk_size)
                    work, tokens = summary_work(summarizer, chunks, overheads)
                    sentences = max(1, round(tokens / TOKENS_PER_SENTENCE))
                    made = _summary_on_disk(output, spec.name, book.key) if "summary" in done else None
                    if made is not None:  # judged as it is, not at the size a new one is assumed to have
                        tokens, sentences = count_tokens(made), len(split_sentences(made))
                    elif "summary" not in done:
                        est.chunks += len(chunks)
                        est.summarize.add(work.calls, work.prompt_tokens, work.completion_tokens)
                claims = _claims_on_disk(output, spec.name, book.key) if "claims" in done else None
                w = judge_work(judge, tokens, sentences, book_tokens, judge_window, overheads, programs, done, claims,
                               book_text=text)
                est.judge.add(w.calls, w.prompt_tokens, w.completion_tokens)
            parts = [(est.judge.calls, price(judge_lm, est.judge.prompt_tokens, est.judge.completion_tokens,
                                             judge_server))]
            if est.summarize_lm is not None:
                parts.append((est.summarize.calls, price(est.summarize_lm, est.summarize.prompt_tokens,
                                                         est.summarize.completion_tokens, summarize_server)))
            # the records' rule: unknown unless every call is priced; no call to make costs nothing
            est.cost_usd = known_cost(parts) if est.calls else 0.0
            estimates.append(est)
    return estimates


ASSUMPTIONS = (f"Estimates: every summary fills its token budget (or, when what it summarizes is shorter, is as "
               f"long as that) and incremental updating compresses every update over the budget (upper bounds), "
               f"a summary sentence is about {TOKENS_PER_SENTENCE} tokens with one claim, no answer is retried "
               "(nor compressed again); "
               "calls answered from the cache cost nothing.")
