"""Book-length summarization (BooookScore §2 and Appendix A).

Hierarchical merging: level 1 summarizes as many consecutive chunks as fit the
budget W - G_1; each higher level merges as many consecutive summaries as fit
W - G_l, until one summary is left. A merge that is not the first of its level
also receives a context summary: by default the summary the previous merge of
the same level wrote (the paper's App. A.1 and its published code), which
chains the merges of a level; `merge_context="lower-level"` gives it instead
the lower-level summary just before its inputs, so the merges of a level are
independent. The hierarchy is pipelined: a merge starts as soon as its inputs
exist, while the rest of the level below is still being written.

Incremental updating: summarize the first chunk, then rewrite the running
summary with each next chunk, compressing it whenever it exceeds G_n.

Token counts use cl100k_base (`booklens.text`). Budgets keep a safety margin
because the backend's own tokenizer may count a little differently.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import dspy

from booklens.errors import BooklensError, setting_name
from booklens.lm import forget_answers, fresh_try, hearing_calls, last_stop, predict_with_retries
from booklens.programs.base import Module, Predict, prompt_tokens
from booklens.records import Chunk, SummaryNode
from booklens.vocabulary import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_GENERATION_ALLOWANCE,
    DEFAULT_GENERATION_SLACK,
    DEFAULT_MAX_REGENERATIONS,
    DEFAULT_MERGE_CONTEXT,
    DEFAULT_SUMMARY_TOKENS,
    DEFAULT_WORDS_PER_TOKEN,
    MERGE_CONTEXTS,
    MIN_CHUNK_SIZE,
    MIN_CONTEXT_WINDOW,
    MIN_SUMMARY_TOKENS,
    check_retries,
    check_words_per_token,
)
from booklens.signatures.summarize import (
    CompressSummary,
    MergeSummaries,
    MergeSummariesWithContext,
    RemoveArtifacts,
    SummarizeChunk,
    UpdateSummary,
)

# Share of the context window budgets may fill: room for tokenizer differences
# between cl100k_base and the backend's tokenizer, and for chat-template tokens.
BUDGET_MARGIN = 0.85
# Without given level budgets, each level below the top gets this share of the budget of the
# level above (G_l = G_n * 0.65^(L - l)), as the published BooookScore code does.
LEVEL_BUDGET_RATIO = 0.65
# A regeneration asks for this much less of the first word limit per try (90%, then 80% of it), so
# a summary that ran long has a better chance to fit. The published code instead keeps the limit on
# its first retry and compounds the cut after (90%, 72%, 50% ...); changing this would change prompts.
REGENERATION_SHRINK = 0.1
# Regenerations past this many ask for as few words as this many did: a tenth of the first limit.
MAX_SHRINKS = 9
# A summary with no fallback whose every answer so far has no word gets at least this many tries,
# whatever --max-regenerations says: such an answer cannot stand in as a summary, and the embedded
# model, which trims instead of regenerating, answered a level-1 call of Pride and Prejudice with
# bare numbers (its weights stored as Q8_0) and ended a half-hour run there. Each try is a new
# sample (`fresh_try`).
WORDLESS_TRIES = 3
# Incremental updating lets the running summary grow to this share of G_n before compressing it.
UPDATE_ALLOWANCE = 1.5
# The least share of a summary's words its artifact-removal rewrite keeps: the pass removes phrases
# and the odd sentence about the text, never most of what the summary says.
CLEANUP_MIN_WORDS_KEPT = 0.5


def group_by_budget(sizes: list[int], budget: int) -> list[list[int]]:
    """Consecutive groups of item indices whose sizes sum to at most `budget` (greedy)."""
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, size in enumerate(sizes):
        if current and used + size > budget:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += size
    if current:
        groups.append(current)
    return groups


def trim_to_budget(text: str, budget: int) -> str:
    """The longest run of whole leading sentences within `budget` tokens (at least one cut sentence)."""
    from booklens.text import count_tokens, sentence_spans, truncate_to_words

    kept_end = 0
    for _, end in sentence_spans(text):
        if count_tokens(text[:end]) > budget:
            break
        kept_end = end
    if kept_end == 0:  # the first sentence alone is over: cut at its last whole word within the budget
        return truncate_to_words(text, budget).strip()
    return text[:kept_end].strip()


def without_unfinished_sentence(text: str) -> str:
    """`text` without a last sentence that has no closing punctuation (kept when it is the only one)."""
    from booklens.text import ends_sentence, sentence_spans

    text = text.strip()
    spans = sentence_spans(text)
    if len(spans) < 2 or ends_sentence(text):
        return text
    return text[:spans[-1][0]].strip()


# A model declining the task ("I'm sorry, but I can't help with that."): its first sentence has the
# model say it cannot do the work asked of it (a narrator who cannot go north is no refusal). Such an
# answer has words but is no summary, and as an incremental update it would replace the story so far.
_REFUSAL = re.compile(
    r"^\W*(?:(?:I|Sorry|As an AI|Unfortunately)\b[^.!?]*?)?\bI\s*(?:can['\u2019]?t|cannot|can not|won['\u2019]?t|"
    r"will not|am unable to|['\u2019]m unable to|am not able to|['\u2019]m not able to)\s+(?:be able to\s+)?"
    r"(?:(?:help|assist)(?: you)?(?: with\b|[.!?]|$)|assist\b|comply\b|fulfil|summari[sz]e|condense|compress|"
    r"merge|(?:provide|create|write|generate|produce|update|continue)\b[^.!?]*?\b(?:summary|summaries|request|task)"
    r"|do (?:that|this)\b|complete (?:this|that|the|your) (?:task|request))", re.IGNORECASE)
# A refusal is short: a longer answer that starts like one goes on to say something about the story.
REFUSAL_MAX_WORDS = 80


def looks_like_refusal(text: str) -> bool:
    """Whether an answer declines the task instead of doing it (see `_REFUSAL`)."""
    return len(text.split()) <= REFUSAL_MAX_WORDS and bool(_REFUSAL.match(text.strip()))


def words_kept(original: str, rewrite: str) -> float:
    """The share of `original`'s words (lower-cased, counted with repeats, in any script: see
    `booklens.retrieval.words`) that `rewrite` still has."""
    from collections import Counter

    from booklens.retrieval import words

    before = Counter(words(original))
    if not before:
        return 1.0
    return sum((before & Counter(words(rewrite))).values()) / sum(before.values())


class BudgetMisfit(BooklensError):
    """A summarizer's chunk and summary budgets that do not fit its context window (`check_budgets`).
    `settings` names what to set so that they fit it ("--chunk-size to 151 or less", or in a library
    call "chunk_size to 151 or less"), empty when no setting does: only a larger window helps."""

    def __init__(self, message: str, settings: str = ""):
        super().__init__(message)
        self.settings = settings


def _raise_window(settings: str) -> str:
    """The advice a `BudgetMisfit` line ends in."""
    window = setting_name("--context-window")
    return f"set {settings}, or raise {window}" if settings else f"raise {window}"


@dataclass
class _Generated:
    text: str
    tokens: int
    attempts: int
    over_budget: bool
    truncated: bool  # trimmed to the budget by booklens
    cut_off: bool = False  # the model's answer stopped at the token cap
    fallback: bool = False  # no answer had words: the given fallback text stands in
    filtered: bool = False  # the provider's content filter stopped this answer (or, with fallback, the answers)
    whole: str | None = None  # an answer cut to `keep` tokens: what it was before the cut


class _BookSummarizer(Module):
    method = "base"

    def __init__(
        self,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        max_summary_tokens: int = DEFAULT_SUMMARY_TOKENS,
        level_budgets: list[int] | None = None,
        max_regenerations: int = DEFAULT_MAX_REGENERATIONS,
        concurrency: int = 1,
        remove_artifacts: bool = False,
        temperature: float = 0.5,
        words_per_token: float = DEFAULT_WORDS_PER_TOKEN,
        generation_slack: float = DEFAULT_GENERATION_SLACK,
        generation_allowance: int = DEFAULT_GENERATION_ALLOWANCE,
        shrink_on_regeneration: bool = True,
    ):
        super().__init__()
        if context_window is None:  # as `booklens.steps` takes it: the default window
            context_window = DEFAULT_CONTEXT_WINDOW
        # The commands' own bounds (`booklens.vocabulary`), checked again for library callers.
        for option, value, least in (("--chunk-size", chunk_size, MIN_CHUNK_SIZE),
                                     ("--context-window", context_window, MIN_CONTEXT_WINDOW),
                                     ("--max-summary-tokens", max_summary_tokens, MIN_SUMMARY_TOKENS),
                                     *(("--level-budget", b, MIN_SUMMARY_TOKENS) for b in level_budgets or [])):
            # A str, float or None from a caller's own config would fail further on, in arithmetic.
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                name = setting_name(option, keyword="each of level_budgets" if option == "--level-budget" else None)
                raise BooklensError(f"{name} must be at least {least} tokens (got {value!r})")
        from booklens.parallel import check_at_least

        check_at_least("--concurrency", concurrency)
        check_retries("--max-regenerations", max_regenerations)
        check_words_per_token(words_per_token)
        self.chunk_size = chunk_size
        self.context_window = context_window
        self.max_summary_tokens = max_summary_tokens
        self.level_budgets = list(level_budgets or [])
        self.max_regenerations = max_regenerations
        self.concurrency = concurrency
        self.remove_artifacts = remove_artifacts
        self.temperature = temperature
        self.words_per_token = words_per_token
        self.generation_slack = generation_slack
        self.generation_allowance = generation_allowance
        self.shrink_on_regeneration = shrink_on_regeneration
        self.clean = Predict(RemoveArtifacts)

    # -- budgets ---------------------------------------------------------

    @property
    def usable_window(self) -> int:
        return int(self.context_window * BUDGET_MARGIN)

    def budget(self, level: int, budgets: list[int] | None = None) -> int:
        """G_l: the summary budget of a level in `budgets` (default: the given level budgets; the
        last one repeats; G_n when none are given)."""
        budgets = budgets if budgets is not None else self.level_budgets
        if not budgets:
            return self.max_summary_tokens
        return budgets[min(level, len(budgets)) - 1]

    def token_cap(self, budget: int) -> int:
        """The most tokens one generation for a `budget`-token summary may write."""
        return int(budget * self.generation_slack) + self.generation_allowance

    def call_cap(self, budget: int, predictor: dspy.Predict, inputs: dict[str, Any], grow: int = 1) -> int:
        """The token cap of one call: `token_cap` (times `grow`), less what the window lacks after the
        call's prompt.

        The budget checks leave room in the window for a summary of `budget` tokens, not for the cap's
        slack above it, and a server refuses a request whose prompt and max_tokens exceed its window.
        The prompt is counted with the margin the budgets keep for the backend's own tokenizer; the
        cap never drops below the budget, which the checks make room for."""
        cap = self.token_cap(budget) * grow
        left = self.context_window - math.ceil(prompt_tokens(predictor, **inputs) / BUDGET_MARGIN)
        return min(cap, max(left, budget))

    @property
    def final_budget(self) -> int:
        """G_n, the budget of the book's summary: the last level budget when they are given."""
        return self.level_budgets[-1] if self.level_budgets else self.max_summary_tokens

    @property
    def budget_option(self) -> str:
        """The setting that set the summary budgets, for the messages that ask to lower them (the option
        within a command, the keyword elsewhere: `setting_name`)."""
        return setting_name("--level-budget", keyword="level_budgets") if self.level_budgets \
            else setting_name("--max-summary-tokens")

    def word_limit(self, budget: int) -> int:
        """The word limit a prompt states for a budget of `budget` tokens."""
        return max(1, int(budget * self.words_per_token))

    # -- one generation with bounded regeneration ------------------------

    def _generate(self, predictor: dspy.Predict, output: str, budget: int, *, temperature: float | None = None,
                  where: str, trim: bool = True, keep: int | None = None, fallback: str | None = None,
                  **inputs: Any) -> _Generated:
        """One summary within `budget` tokens, regenerated up to `max_regenerations` times when it is
        over budget, cut off or without words. When every try fails, the shortest answer with words is
        trimmed to whole leading sentences within `keep` tokens (default: the budget; `trim`), or kept
        whole; either way it is flagged over budget when longer than the budget. When no answer has
        words (or every one that has is a refusal, or was stopped by the provider's content filter),
        `fallback` (trimmed the same way) stands in if given; without one, tries go on to
        `WORDLESS_TRIES`, and if none has a word that is a one-line error, never an answer of bare
        numbers, a refusal or a filtered fragment passed off as a summary."""
        from booklens.text import count_tokens, has_letters  # an answer of bare numbers is no summary

        def usable(text: str) -> bool:
            return has_letters(text) and not looks_like_refusal(text)

        def good(answer: _Generated) -> bool:
            # A fragment the content filter left is no summary: what it stopped may be most of it.
            return usable(answer.text) and not answer.filtered

        temperature = self.temperature if temperature is None else temperature
        keep = budget if keep is None else keep
        best: _Generated | None = None
        tried = 0
        wordless: list = []  # the calls of answers without a word
        unread: list[str] = []  # why each try whose answers did not parse failed
        filtered = 0  # the tries whose answer the provider's content filter stopped
        # An answer the cap stopped before it had any text: a model that reasons before it answers may
        # have spent the cap on reasoning, and under the same cap does so again. Each such answer
        # doubles the next try's cap, as far as the window has room.
        grow, capped_empty, cap = 1, 0, 0
        for regeneration in range(self._tries(fallback)):
            if regeneration > self.max_regenerations and best is not None and good(best):
                break  # the tries past --max-regenerations are only for a summary with no word yet
            tried += 1
            asked = dict(inputs)
            if regeneration and self.shrink_on_regeneration and "word_limit" in asked:
                # The tenth regeneration, the most the option allows, asks as the ninth did (a tenth of the
                # first limit), not for none of it.
                shrink = REGENERATION_SHRINK * min(regeneration, MAX_SHRINKS)
                asked["word_limit"] = max(1, int(asked["word_limit"] * (1 - shrink)))
            cap = self.call_cap(budget, predictor, asked, grow)
            with hearing_calls() as heard:
                result = predict_with_retries(
                    predictor,
                    config={
                        "max_tokens": cap,
                        "temperature": temperature if regeneration == 0 else max(temperature, 0.7),
                        **fresh_try(100 * regeneration, getattr(predictor, "lm", None)),
                    },
                    **asked,
                )
            if not result.ok:
                unread.append(result.error or "unparseable answer")
                continue
            text = str(getattr(result.prediction, output) or "").strip()
            tokens = count_tokens(text)
            stop = last_stop()
            candidate = _Generated(text, tokens, regeneration + 1, tokens > budget, False, stop == "length",
                                   filtered=stop == "content_filter")
            filtered += candidate.filtered
            if not text and candidate.cut_off:
                grow, capped_empty = grow * 2, capped_empty + 1
            if not good(candidate):
                wordless.extend(heard)
            # (of answers that are no summary, one the filter did not stop says more of why in an error)
            if text and (best is None or (good(candidate), not candidate.filtered, -tokens)
                         > (good(best), not best.filtered, -best.tokens)):
                best = candidate
            if good(candidate) and tokens <= budget and not candidate.cut_off:
                return candidate
        if fallback is not None and (best is None or not good(best)):
            text = trim_to_budget(fallback, keep) if trim else fallback
            tokens = count_tokens(text)
            return _Generated(text, tokens, tried, tokens > budget, text != fallback, fallback=True,
                              filtered=filtered == tried)
        if best is None or not good(best):
            forget_answers(wordless)  # not kept: a rerun asks again
            raise BooklensError(self._no_summary(where, best, unread, filtered, cap if capped_empty == tried else 0))
        if best.cut_off and trim:
            # The cap stopped the answer mid-sentence: a dangling half sentence would read as confusing.
            text = without_unfinished_sentence(best.text)
            if text != best.text:
                tokens = count_tokens(text)
                best = _Generated(text, tokens, best.attempts, tokens > budget, True, True)
        if best.tokens > keep and trim:
            # Keep whole sentences up to the budget (or `keep`) rather than fail the whole book.
            text = trim_to_budget(best.text, keep)
            tokens = count_tokens(text)
            best = _Generated(text, tokens, tried, tokens > budget, True, best.cut_off, whole=best.text)
        best.attempts = tried
        return best

    def _tries(self, fallback: str | None) -> int:
        """How many tries a summary gets when none of its answers has a word."""
        return self.max_regenerations + 1 if fallback is not None else max(self.max_regenerations + 1, WORDLESS_TRIES)

    def _no_summary(self, where: str, best: _Generated | None, unread: Sequence[str] = (), filtered: int = 0,
                    capped: int = 0) -> str:
        """The error when no try gave a summary with words: what the tries got instead (answers
        without a word, refusals, empty ones (`capped`: every one cut off at the token cap, the last
        at that many tokens), `filtered` stopped by the provider's content filter, or, `unread`, the
        errors of those that did not parse). Those
        answers are not kept in the cache (empty ones never are), so a plain rerun asks again; more
        regenerations or another model are what change the odds."""
        tries = self._tries(None)
        # the parser's words can run long; the first of them say what was wrong
        why = unread[-1][:160].rstrip(" .") if unread else ""
        if filtered == tries:
            got = "the provider's content filter stopped every answer"
        elif best is not None:
            from booklens.text import has_letters

            kind = ("answers the provider's content filter stopped" if best.filtered
                    else "refusals" if has_letters(best.text) else "answers without a word")
            got = f"{kind}, such as {best.text[:40]!r}"
            if unread:
                got += f"; {len(unread)} could not be read ({why})"
        elif len(unread) == tries:
            got = f"no answer could be read ({why})"
        elif unread:
            got = f"{len(unread)} answers could not be read ({why}) and the others were empty"
        elif capped:
            got = (f"only empty answers, each cut off at its token cap (the last at {capped} tokens): a model that "
                   "reasons before it answers may spend the whole cap on reasoning")
        else:
            got = "only empty answers"
        if 0 < filtered < tries and not (best is not None and best.filtered):
            got += f"; the provider's content filter stopped {filtered}"
        return (f"the model gave no usable summary for {where} in {tries} tries ({got}, not kept: a rerun asks "
                f"again); raise {setting_name('--max-regenerations')} above {tries - 1} or use another model")

    def _finish(self, final: SummaryNode, nodes: list[SummaryNode]) -> str:
        if not self.remove_artifacts:
            return final.text
        budget = final.tokens  # removing phrases never lengthens a summary, however short
        cleaned = self._generate(self.clean, "cleaned", budget, temperature=0.0, trim=False,
                                 where="artifact removal", fallback=final.text, summary=final.text)
        dropped = None
        if not cleaned.fallback and (cleaned.over_budget or cleaned.cut_off
                                     or words_kept(final.text, cleaned.text) < CLEANUP_MIN_WORDS_KEPT):
            # Removing phrases never lengthens a summary: a longer rewrite wrote more than it removed, and
            # cutting it (or taking one the cap or the repetition guard stopped) would drop the summary's end.
            # Nor does it remove most of the summary's words: such an answer is about the summary ("it has
            # no artifacts") or a shorter summary of it, and would stand as the book's summary.
            # The summary stands as it was, and the node says why.
            dropped = cleaned.tokens
            cleaned = _Generated(final.text, final.tokens, cleaned.attempts, False, False, cleaned.cut_off,
                                 fallback=True)
        nodes.append(SummaryNode(id="clean", level=final.level + 1, kind="clean", text=cleaned.text,
                                 tokens=cleaned.tokens, budget=budget, children=[final.id], chunks=final.chunks,
                                 attempts=cleaned.attempts, over_budget=cleaned.over_budget,
                                 truncated=cleaned.truncated, cut_off=cleaned.cut_off, fallback=cleaned.fallback,
                                 filtered=cleaned.filtered, dropped_rewrite_tokens=dropped))
        return cleaned.text

    def _chunks(self, book: str) -> list[Chunk]:
        from booklens.text import chunk_text

        chunks = chunk_text(book, self.chunk_size)
        if not chunks:
            raise BooklensError("the book has no text to summarize")
        return chunks


class HierarchicalSummarizer(_BookSummarizer):
    """Summarize chunks, then merge summaries level by level until one remains.

    The hierarchy is pipelined: a merge starts as soon as its inputs exist (and the summary
    after them, which decides where its group ends), without waiting for the rest of its level.
    Groups and prompts are the same as when levels run one after another (`pipelined=False`),
    so the output is too.
    """

    method = "hier"

    def __init__(self, *, merge_context: str = DEFAULT_MERGE_CONTEXT, pipelined: bool = True, **config: Any):
        super().__init__(**config)
        if merge_context not in MERGE_CONTEXTS:
            raise BooklensError(f"unknown merge context '{merge_context}': use {', '.join(MERGE_CONTEXTS)}")
        self.merge_context = merge_context
        self.pipelined = pipelined
        self.summarize_chunk = Predict(SummarizeChunk)
        self.merge = Predict(MergeSummaries)
        self.merge_with_context = Predict(MergeSummariesWithContext)

    def check_budgets(self) -> tuple[int, int, int]:
        """Room for input at level 1, for a merge, and for a context merge; errors when too small.

        The rooms hold for the largest budget of any level, so any merge may write G_n tokens."""
        g1 = self.budget(1)
        room_chunks = self.room_for_chunks(g1)
        if self.level_budgets:
            g = max(self.budget(level) for level in range(2, max(3, len(self.level_budgets) + 1)))
        else:
            g = self.max_summary_tokens  # the schedule's top level, and its largest budget
        merge_overhead = prompt_tokens(self.merge, summaries=[], word_limit=0)
        room_merge = self.usable_window - g - merge_overhead
        room_context = self.usable_window - g - prompt_tokens(
            self.merge_with_context, context="", summaries=[], word_limit=0)
        merges = room_merge >= 2 * max(g1, g) + 32
        if room_chunks >= self.chunk_size and merges:
            return room_chunks, room_merge, room_context
        # The settings that fit, so that one line ends the search: a budget at which two summaries merge
        # beside a third (the merge's own), and the chunk that fits beside a level-1 summary of it.
        fit = (self.usable_window - merge_overhead - 32) // 3
        budgets = self.budget_option
        if self.level_budgets:
            budgets = f"every {budgets}" if budgets.startswith("--") else f"each of {budgets}"
        changes = [] if merges else [f"{budgets} to {fit} or less"]
        chunk_room = room_chunks if merges else self.room_for_chunks(min(g1, fit))
        if self.chunk_size > chunk_room:
            changes.append(f"{setting_name('--chunk-size')} to {chunk_room} or less")
        settings = "" if fit < MIN_SUMMARY_TOKENS or chunk_room < MIN_CHUNK_SIZE else " and ".join(changes)
        advice = _raise_window(settings)
        if room_chunks < self.chunk_size:
            raise BudgetMisfit(
                f"a chunk of {self.chunk_size} tokens does not fit the {self.context_window}-token context window "
                f"with a {g1}-token summary and the prompt; {advice}", settings
            )
        raise BudgetMisfit(
            f"the {self.context_window}-token context window cannot merge two {max(g1, g)}-token summaries; {advice}",
            settings)

    def room_for_chunks(self, g1: int) -> int:
        """Tokens of book text a level-1 call holds when its summary may take `g1` tokens."""
        return self.usable_window - g1 - prompt_tokens(self.summarize_chunk, excerpt="", word_limit=0)

    def plan_budgets(self, chunks: list[Chunk], room_merge: int) -> tuple[list[list[int]], list[int]]:
        """The level-1 groups of chunks and the budget G_l of every level.

        Given level budgets are used as they are, except that the book's summary gets the last one
        even when the book fits one level-1 call beside the first (a book of one chunk that does not
        fit beside the last gets the most of it the window leaves beside the chunk). Otherwise, as in
        the published BooookScore code, the tree's depth L is estimated and G_l = G_n * 0.65^(L - l): the smallest
        L for which a tree of summaries at those budgets reaches one summary in L levels (level 1
        grouping as many chunks as fit beside a G_1 summary). Levels beyond the estimate get G_n, and
        so does the book's summary: a book that fits one level-1 call beside G_1 but not beside G_n is
        split for a merge to write it."""
        sizes = [c.tokens for c in chunks]
        if self.level_budgets:
            budgets = list(self.level_budgets)
            groups = group_by_budget(sizes, self.room_for_chunks(budgets[0]))
            if len(groups) == 1 and budgets[0] != self.final_budget:
                # That one call would write the book's summary, which gets G_n however few levels the
                # book needs: beside G_n the book fits one call, or level 1 splits it for a merge to write.
                # A book of one chunk too long to sit beside G_n cannot be split: its one call gets as much
                # of G_n as the window leaves beside the chunk (at least G_1, beside which it fits).
                if sum(sizes) <= self.room_for_chunks(self.final_budget):
                    budgets = [self.final_budget]
                elif len(sizes) > 1:
                    groups = group_by_budget(sizes, self.room_for_chunks(self.final_budget))
                else:
                    budgets = [max(budgets[0], min(self.final_budget, self.room_for_chunks(0) - sizes[0]))]
            return groups, budgets
        g = self.max_summary_tokens
        for levels in range(1, 32):
            budgets = [max(MIN_SUMMARY_TOKENS, int(g * LEVEL_BUDGET_RATIO ** (levels - level)))
                       for level in range(1, levels + 1)]
            groups = group_by_budget(sizes, self.room_for_chunks(budgets[0]))
            if len(groups) == 1 and levels > 1:
                # That one call would write the book's summary at G_1: as with given level budgets, the
                # book is split so that a merge writes it at G_n (each chunk fits beside G_n: `check_budgets`).
                groups = group_by_budget(sizes, self.room_for_chunks(g))
            count, level = len(groups), 1
            while count > 1:  # merge the summaries of `level` (each at its budget) into the next level
                per_merge = max(2, room_merge // self.budget(level, budgets))
                count = -(-count // per_merge)
                level += 1
            if level <= levels:
                return groups, budgets
        raise BooklensError(f"the book needs too deep a merge tree; raise {setting_name('--chunk-size')} or "
                            f"{setting_name('--context-window')}")

    @staticmethod
    def chunk_summary(j: int, group: list[int], budget: int, text: str, tokens: int, **outcome: Any) -> SummaryNode:
        """The node of the `j`th level-1 summary, of the chunks in `group`."""
        return SummaryNode(id=f"L1.{j}", level=1, kind="chunk", text=text, tokens=tokens, budget=budget,
                           children=[f"c{i}" for i in group], chunks=list(group), **outcome)

    @staticmethod
    def merged_summary(level: int, j: int, context: SummaryNode | None, group: list[SummaryNode], budget: int,
                       text: str, tokens: int, **outcome: Any) -> SummaryNode:
        """The node of the `j`th summary of `level`, merging `group` (with `context`, when not None)."""
        return SummaryNode(id=f"L{level}.{j}", level=level, kind="merge", text=text, tokens=tokens, budget=budget,
                           children=[n.id for n in group], chunks=[c for n in group for c in n.chunks],
                           used_context=context is not None, context=context.id if context else None, **outcome)

    def summarize_group(self, chunks: list[Chunk], groups: list[list[int]], j: int, budget: int) -> SummaryNode:
        """The level-1 summary of the chunks of `groups[j]`."""
        group = groups[j]
        excerpt = "".join(chunks[i].text for i in group).strip()
        out = self._generate(self.summarize_chunk, "summary", budget, where=f"level 1 summary {j}",
                             excerpt=excerpt, word_limit=self.word_limit(budget))
        return self.chunk_summary(j, group, budget, out.text, out.tokens, attempts=out.attempts,
                                  over_budget=out.over_budget, truncated=out.truncated, cut_off=out.cut_off)

    def forward(self, book: str) -> dspy.Prediction:
        _, room_merge, room_context = self.check_budgets()
        chunks = self._chunks(book)
        groups, budgets = self.plan_budgets(chunks, room_merge)
        g1 = self.budget(1, budgets)
        tree = _MergeTree(self, budgets, room_merge, room_context)
        for j in range(len(groups)):
            tree.add_task(1, j, lambda j=j: self.summarize_group(chunks, groups, j, g1))
        root = tree.run()
        nodes = tree.nodes_in_order()
        final_text = self._finish(root, nodes)
        return dspy.Prediction(summary=final_text, nodes=nodes, chunks=chunks, levels=root.level,
                               level_budgets=budgets)

    def plan(self, chunks: list[Chunk]) -> tuple[list[PlannedCall], SummaryNode]:
        """The calls `forward` makes on these chunks, in the order a one-call-at-a-time run makes them,
        and the book's summary, if every summary is as long as its budget, or as the book text under it
        when that is shorter (a summary's length is not known before the model writes it), and every
        same-level context cut to its cap keeps all of it (not the whole sentences within it). The
        level-1 groups, the budgets and the merge tree are the run's own, so a run whose summaries have
        those lengths makes exactly these calls, and budgets a run would refuse are refused. No model
        is called; the summaries have no text."""
        _, room_merge, room_context = self.check_budgets()
        if not chunks:
            raise BooklensError("the book has no text to summarize")
        groups, budgets = self.plan_budgets(chunks, room_merge)
        tree = _PlannedTree(self, budgets, room_merge, room_context, chunks)
        g1 = self.budget(1, budgets)
        for j, group in enumerate(groups):
            tree.add_task(1, j, lambda j=j, group=group: tree.summarize_group(j, group, g1))
        root = tree.run()
        return tree.calls, root

    def context_for(self, lower: list[SummaryNode | None],
                    start: int, upper: list[SummaryNode | None]) -> tuple[bool, SummaryNode | None]:
        """The context of the next merge of a level, whose first input is `lower[start]`:
        (known yet, node). `same-level` waits for the previous summary of the level."""
        if self.merge_context == "none" or (self.merge_context == "lower-level" and start == 0):
            return True, None
        if self.merge_context == "lower-level":
            return True, lower[start - 1]
        if not upper:
            return True, None
        return upper[-1] is not None, upper[-1]

    def context_cap(self, room_context: int) -> int:
        """The most tokens a same-level context keeps: a fifth of the room (as the published code
        does), so the merge still has room for its inputs."""
        return room_context // 5

    def trimmed_context(self, text: str, room_context: int) -> str:
        """A same-level context longer than its cap (`context_cap`), cut to its leading sentences."""
        from booklens.text import count_tokens

        cap = self.context_cap(room_context)
        return trim_to_budget(text, cap) if count_tokens(text) > cap else text

    def merge_node(self, level: int, j: int, context: SummaryNode | None, context_text: str | None,
                   group: list[SummaryNode], budget: int) -> SummaryNode:
        texts = [n.text for n in group]
        where = f"level {level} merge {j}"
        if context is None:
            out = self._generate(self.merge, "summary", budget, where=where, summaries=texts,
                                 word_limit=self.word_limit(budget))
        else:
            out = self._generate(self.merge_with_context, "summary", budget, where=where, context=context_text,
                                 summaries=texts, word_limit=self.word_limit(budget))
        return self.merged_summary(level, j, context, group, budget, out.text, out.tokens, attempts=out.attempts,
                                   over_budget=out.over_budget, truncated=out.truncated, cut_off=out.cut_off)


class _Level:
    """The summaries of one level in story order; None marks a merge still running."""

    def __init__(self, level: int, size: int | None = None):
        self.level = level
        self.slots: list[SummaryNode | None] = [None] * (size or 0)
        self.complete = size is not None  # every slot of the level is planned
        self.cursor = 0  # the first slot the next level has not grouped yet


class _MergeTree:
    """Runs the calls of a hierarchical summary as their inputs become available.

    Each step plans every merge whose inputs are known, then runs ready calls (higher levels
    first, then story order) with at most `concurrency` in flight. The grouping rule is the
    level-by-level one: greedy, consecutive, within the room left by the context. It is the one
    rule: `HierarchicalSummarizer.plan` (the sweep's estimate) runs this tree too, without a model."""

    def __init__(self, program: HierarchicalSummarizer, budgets: list[int], room_merge: int, room_context: int):
        self.program = program
        self.budgets = budgets
        self.room_merge = room_merge
        self.room_context = room_context
        self.levels: list[_Level] = []
        self.ready: list[tuple[int, int, Callable[[], SummaryNode]]] = []
        self.calls_planned = 0
        self._contexts: dict[str, tuple[str, int]] = {}

    def add_task(self, level: int, j: int, fn: Callable[[], SummaryNode]) -> None:
        while len(self.levels) < level:
            self.levels.append(_Level(len(self.levels) + 1))
        lvl = self.levels[level - 1]
        if len(lvl.slots) <= j:
            lvl.slots.extend([None] * (j + 1 - len(lvl.slots)))
        if level == 1:
            lvl.complete = True
        self.ready.append((level, j, fn))
        self.calls_planned += 1

    # -- planning ----------------------------------------------------------

    def root(self) -> SummaryNode | None:
        """The summary of the whole book once it exists: the one summary of a complete level."""
        for lvl in self.levels:
            if lvl.complete and len(lvl.slots) == 1:
                return lvl.slots[0]
        return None

    def plan(self) -> None:
        """Group every run of finished summaries whose group is decided; submit their merges."""
        k = 0
        while k < len(self.levels):
            lower = self.levels[k]
            if not lower.slots or (lower.complete and len(lower.slots) == 1):
                break  # nothing planned at this level yet, or the top: nothing to merge
            if not self.program.pipelined and not (lower.complete and all(s is not None for s in lower.slots)):
                break  # level by level: wait for the whole level
            if k + 1 == len(self.levels):
                self.levels.append(_Level(lower.level + 1))
            upper = self.levels[k + 1]
            while self._plan_one(lower, upper):
                pass
            if lower.complete and lower.cursor == len(lower.slots) and not upper.complete:
                upper.complete = True
                if len(upper.slots) == len(lower.slots):
                    raise BooklensError("summaries are too long to merge within the context window; lower "
                                        f"{setting_name('--max-summary-tokens')} or raise "
                                        f"{setting_name('--context-window')}")
            k += 1

    def _context(self, node: SummaryNode) -> tuple[str, int]:
        """The context text of a node and its tokens (a same-level context may be trimmed)."""
        if node.id not in self._contexts:
            from booklens.text import count_tokens

            text = node.text
            if self.program.merge_context == "same-level":
                text = self.program.trimmed_context(text, self.room_context)
            self._contexts[node.id] = (text, count_tokens(text))
        return self._contexts[node.id]

    def _group(self, lower: _Level, start: int, room: int) -> list[SummaryNode] | None:
        """The greedy group from `start`, or None while a summary that decides it is missing."""
        group: list[SummaryNode] = []
        used = 0
        i = start
        while True:
            if i >= len(lower.slots):
                return group if lower.complete else None
            node = lower.slots[i]
            if node is None:
                return None
            if group and used + node.tokens > room:
                return group
            group.append(node)
            used += node.tokens
            i += 1

    def _plan_one(self, lower: _Level, upper: _Level) -> bool:
        start = lower.cursor
        if start >= len(lower.slots):
            return False
        program = self.program
        known, context = program.context_for(lower.slots, start, upper.slots)
        if not known:
            return False
        context_text = None
        room = self.room_merge
        if context is not None:
            context_text, context_tokens = self._context(context)
            room = self.room_context - context_tokens
        group = self._group(lower, start, room)
        if group is None:
            return False
        if len(group) == 1 and start + 1 < len(lower.slots) and context is not None:
            # Two inputs must fit, or the level would not shrink: give up the context.
            group = self._group(lower, start, self.room_merge)
            if group is None:
                return False
            context = context_text = None
        lower.cursor = start + len(group)
        j = len(upper.slots)
        if len(group) == 1:
            upper.slots.append(group[0])  # a lone summary moves up unchanged
            return True
        budget = program.budget(upper.level, self.budgets)
        if start == 0 and lower.cursor == len(lower.slots) and lower.complete:
            budget = program.final_budget  # the last merge writes the book's summary
        upper.slots.append(None)
        self.ready.append((upper.level, j, self._merge_call(upper.level, j, context, context_text, group, budget)))
        self.calls_planned += 1
        return True

    def _merge_call(self, level: int, j: int, context: SummaryNode | None, context_text: str | None,
                    group: list[SummaryNode], budget: int) -> Callable[[], SummaryNode]:
        """The call that writes the `j`th summary of `level`."""
        return lambda: self.program.merge_node(level, j, context, context_text, group, budget)

    # -- running -----------------------------------------------------------

    def _next_ready(self) -> tuple[int, int, Callable[[], SummaryNode]]:
        best = min(range(len(self.ready)), key=lambda i: (-self.ready[i][0], self.ready[i][1]))
        return self.ready.pop(best)

    def _store(self, level: int, j: int, node: SummaryNode) -> None:
        self.levels[level - 1].slots[j] = node

    def run(self) -> SummaryNode:
        concurrency = max(1, self.program.concurrency)
        bar = _call_bar()
        try:
            if concurrency == 1:
                return self._run_serial(bar)
            return self._run_threads(concurrency, bar)
        finally:
            bar(self.calls_planned, close=True)

    def _run_serial(self, bar: Callable[..., None]) -> SummaryNode:
        while True:
            self.plan()
            root = self.root()
            if root is not None:
                return root
            if not self.ready:
                raise BooklensError("the merge tree stalled with no call to run")  # a planning bug
            level, j, fn = self._next_ready()
            self._store(level, j, fn())
            bar(self.calls_planned)

    def _run_threads(self, concurrency: int, bar: Callable[..., None]) -> SummaryNode:
        import contextvars
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        running: dict[Any, tuple[int, int]] = {}
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            try:
                while True:
                    self.plan()
                    root = self.root()
                    if root is not None:
                        return root
                    while self.ready and len(running) < concurrency:
                        level, j, fn = self._next_ready()
                        running[pool.submit(contextvars.copy_context().run, fn)] = (level, j)
                    if not running:
                        raise BooklensError("the merge tree stalled with no call to run")  # a planning bug
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        level, j = running.pop(future)
                        self._store(level, j, future.result())
                        bar(self.calls_planned)
            except BaseException:
                for future in running:
                    future.cancel()
                raise

    def nodes_in_order(self) -> list[SummaryNode]:
        """Every LM-written summary, level by level in story order (carried summaries once)."""
        nodes: list[SummaryNode] = []
        for lvl in self.levels:
            nodes.extend(n for n in lvl.slots if n is not None and n.level == lvl.level)
        return nodes


@dataclass(frozen=True)
class PlannedCall:
    """One call of a hierarchical summary as `HierarchicalSummarizer.plan` foresees it."""

    summary: SummaryNode  # what it writes: no text, as many tokens as assumed
    input_tokens: int  # what it reads: the book text at level 1, the summaries it merges above
    context_tokens: int | None = None  # its context summary's; None: it has none


class _PlannedTree(_MergeTree):
    """The merge tree run without a model (`HierarchicalSummarizer.plan`): each call it plans writes at
    once a summary without text, as long as its budget or as the book text under it when shorter,
    and is recorded."""

    def __init__(self, program: HierarchicalSummarizer, budgets: list[int], room_merge: int, room_context: int,
                 chunks: list[Chunk]):
        super().__init__(program, budgets, room_merge, room_context)
        self.chunks = chunks
        self.calls: list[PlannedCall] = []

    def _covered(self, indices: list[int]) -> int:
        return sum(self.chunks[i].tokens for i in indices)

    def summarize_group(self, j: int, group: list[int], budget: int) -> SummaryNode:
        covered = self._covered(group)
        node = self.program.chunk_summary(j, group, budget, "", min(budget, covered))
        self.calls.append(PlannedCall(node, covered))
        return node

    def _context(self, node: SummaryNode) -> tuple[str, int]:
        # No text to cut: a same-level context longer than its cap is taken as keeping the cap.
        tokens = node.tokens
        if self.program.merge_context == "same-level":
            tokens = min(tokens, self.program.context_cap(self.room_context))
        return "", tokens

    def _merge_call(self, level: int, j: int, context: SummaryNode | None, context_text: str | None,
                    group: list[SummaryNode], budget: int) -> Callable[[], SummaryNode]:
        def write() -> SummaryNode:
            node = self.program.merged_summary(level, j, context, group, budget, "",
                                               min(budget, self._covered([c for n in group for c in n.chunks])))
            self.calls.append(PlannedCall(node, sum(n.tokens for n in group),
                                          None if context is None else self._context(context)[1]))
            return node

        return write

    def run(self) -> SummaryNode:
        return self._run_serial(lambda planned, close=False: None)  # no model: no progress to show


class IncrementalSummarizer(_BookSummarizer):
    """Keep one running summary, update it chunk by chunk, compress it when over G_n."""

    method = "inc"

    def __init__(self, **config: Any):
        super().__init__(**config)
        self.summarize_chunk = Predict(SummarizeChunk)
        self.update = Predict(UpdateSummary)
        self.compress = Predict(CompressSummary)

    def check_budgets(self) -> None:
        g = self.max_summary_tokens
        update_need, compress_need = self._needs()
        need = update_need(self.chunk_size, g)
        if need > self.usable_window:
            settings = self._fitting_settings(update_need, compress_need)
            raise BudgetMisfit(
                f"incremental updating needs {need} tokens per call (chunk {self.chunk_size} + running summary "
                f"{g} + output + prompt) but the usable context window is {self.usable_window}; "
                f"{_raise_window(settings)}", settings
            )
        if compress_need(g) > self.usable_window:
            # the update fits beside this chunk, so it does at any smaller G_n
            budget = self._largest_budget(self.chunk_size, update_need, compress_need)
            settings = f"{setting_name('--max-summary-tokens')} to {budget} or less" if budget >= MIN_SUMMARY_TOKENS \
                else ""
            raise BudgetMisfit(
                f"compressing an update needs {compress_need(g)} tokens per call but the usable context window is "
                f"{self.usable_window}; {_raise_window(settings)}", settings
            )

    def _needs(self) -> tuple[Callable[[int, int], int], Callable[[int], int]]:
        """The tokens an update needs for a chunk and a budget G_n, and a compression for G_n."""
        update_overhead = prompt_tokens(self.update, running_summary="", excerpt="", word_limit=0)
        compress_overhead = prompt_tokens(self.compress, summary="", current_words=0, word_limit=0)

        def update_need(chunk: int, g: int) -> int:
            return chunk + g + int(g * UPDATE_ALLOWANCE) + update_overhead

        def compress_need(g: int) -> int:
            # An update over its budget is compressed whole, so the compression prompt must hold the
            # longest update the token cap allows.
            return self.token_cap(int(g * UPDATE_ALLOWANCE)) + self.token_cap(g) + compress_overhead

        return update_need, compress_need

    def _fitting_settings(self, update_need: Callable[[int, int], int], compress_need: Callable[[int], int]) -> str:
        """What to set when an update does not fit (empty when nothing does): the settings named pass
        both checks, so that one line ends the search. A smaller chunk first, then a smaller G_n beside
        the chunk, then beside the smallest chunk."""
        window, g = self.usable_window, self.max_summary_tokens
        chunk, summary = setting_name("--chunk-size"), setting_name("--max-summary-tokens")
        room = window - update_need(0, g)
        if room >= MIN_CHUNK_SIZE and compress_need(g) <= window:
            return f"{chunk} to {room} or less"
        budget = self._largest_budget(self.chunk_size, update_need, compress_need)
        if budget >= MIN_SUMMARY_TOKENS:
            return f"{summary} to {budget} or less"
        budget = self._largest_budget(MIN_CHUNK_SIZE, update_need, compress_need)
        if budget >= MIN_SUMMARY_TOKENS:
            return f"{summary} to {budget} or less and {chunk} to {window - update_need(0, budget)} or less"
        return ""

    def _largest_budget(self, chunk: int, update_need: Callable[[int, int], int],
                        compress_need: Callable[[int], int]) -> int:
        """The largest G_n below the current one at which an update beside a `chunk`-token chunk and its
        compression both fit (both needs grow with G_n); 0 if none."""
        low, high = 0, self.max_summary_tokens
        while high - low > 1:
            mid = (low + high) // 2
            if update_need(chunk, mid) <= self.usable_window and compress_need(mid) <= self.usable_window:
                low = mid
            else:
                high = mid
        return low

    def running_room(self) -> int:
        """The most tokens a running summary may have for the next update's prompt to hold it beside a
        chunk and the update's budget: at least G_n (`check_budgets`)."""
        g = self.max_summary_tokens
        overhead = prompt_tokens(self.update, running_summary="", excerpt="", word_limit=0)
        return self.usable_window - self.chunk_size - int(g * UPDATE_ALLOWANCE) - overhead

    def final_room(self) -> int:
        """The most tokens the book's summary may have for the artifact-removal prompt to hold it
        and a rewrite as long (kept whether or not that pass runs, so both give the same summary)."""
        overhead = prompt_tokens(self.clean, summary="")
        return max(self.max_summary_tokens, (self.usable_window - overhead) // 2)

    def forward(self, book: str) -> dspy.Prediction:
        from booklens.text import count_tokens, count_words

        self.check_budgets()
        chunks = self._chunks(book)
        g = self.max_summary_tokens
        words = self.word_limit(g)
        nodes: list[SummaryNode] = []
        steps = _progress_bar(len(chunks))
        first = self._generate(self.summarize_chunk, "summary", g, where="the first chunk",
                               excerpt=chunks[0].text.strip(), word_limit=words)
        current = SummaryNode(id="u0", level=1, kind="chunk", text=first.text, tokens=first.tokens, budget=g,
                              children=["c0"], chunks=[0], attempts=first.attempts,
                              over_budget=first.over_budget, truncated=first.truncated, cut_off=first.cut_off)
        nodes.append(current)
        steps(1)
        for chunk in chunks[1:]:
            i = chunk.index
            # The update may run over G_n (up to 1.5 G_n); compression brings it back. An update that
            # is longer still is kept whole, never trimmed: its end tells the newest chunk, and
            # compression condenses all of it.
            out = self._generate(self.update, "summary", int(g * UPDATE_ALLOWANCE), where=f"update {i}",
                                 trim=False, running_summary=current.text, excerpt=chunk.text.strip(),
                                 word_limit=words)
            text, tokens = out.text, out.tokens
            if out.cut_off and tokens <= g:
                # No compression follows: this is the running summary (at the last chunk, the book's),
                # so the half sentence the cap or the repetition guard left goes, as from any other summary.
                text = without_unfinished_sentence(text)
                tokens = count_tokens(text)
            updated = SummaryNode(id=f"u{i}", level=i + 1, kind="update", text=text, tokens=tokens,
                                  budget=int(g * UPDATE_ALLOWANCE), children=[current.id, f"c{i}"],
                                  chunks=list(range(i + 1)), attempts=out.attempts, over_budget=out.over_budget,
                                  truncated=text != out.text, cut_off=out.cut_off)
            nodes.append(updated)
            current = updated
            if updated.tokens > g:
                # A compression still over G_n is kept whole as far as the next call has room for it: in
                # story order, its end tells the newest chunk, which a cut to leading sentences drops.
                room = self.running_room() if i + 1 < len(chunks) else self.final_room()
                # Standing in for a compression, an update the cap stopped loses its half sentence.
                stand_in = without_unfinished_sentence(updated.text) if updated.cut_off else updated.text
                comp = self._generate(self.compress, "condensed", g, temperature=1.0, where=f"compression {i}",
                                      keep=room, fallback=stand_in, summary=updated.text,
                                      current_words=count_words(updated.text, self.words_per_token), word_limit=words)
                current = SummaryNode(id=f"u{i}.compressed", level=i + 1, kind="compress", text=comp.text,
                                      tokens=comp.tokens, budget=g, children=[updated.id], chunks=updated.chunks,
                                      attempts=comp.attempts, over_budget=comp.over_budget,
                                      truncated=comp.truncated or (comp.fallback and stand_in != updated.text),
                                      cut_off=comp.cut_off, fallback=comp.fallback, filtered=comp.filtered)
                if comp.whole is not None:
                    # Even the shortest compression is longer than the room, and a cut would drop its end, the
                    # newest chunk: it is compressed in turn (a shorter input is condensed shorter), and only
                    # what that still leaves over the room is cut; the cut compression stands in for no answer.
                    whole = comp.whole
                    nodes.append(current.model_copy(update={"text": whole, "tokens": count_tokens(whole),
                                                            "over_budget": True, "truncated": False}))
                    again = self._generate(self.compress, "condensed", g, temperature=1.0,
                                           where=f"compression {i} again", keep=room, fallback=comp.text,
                                           summary=whole, current_words=count_words(whole, self.words_per_token),
                                           word_limit=words)
                    current = SummaryNode(id=f"u{i}.compressed.again", level=i + 1, kind="compress", text=again.text,
                                          tokens=again.tokens, budget=g, children=[current.id],
                                          chunks=updated.chunks, attempts=again.attempts,
                                          over_budget=again.over_budget, truncated=again.truncated or again.fallback,
                                          cut_off=again.cut_off, fallback=again.fallback, filtered=again.filtered)
                nodes.append(current)
            steps(1)
        steps(0, close=True)
        final_text = self._finish(current, nodes)
        return dspy.Prediction(summary=final_text, nodes=nodes, chunks=chunks, levels=len(chunks))


def _call_bar() -> Callable[..., None]:
    """A progress bar of summary calls whose total grows as merges are planned."""
    from booklens.parallel import progress_enabled

    if not progress_enabled():
        return lambda planned, close=False: None
    import sys

    from tqdm import tqdm

    bar = tqdm(total=0, desc="summary calls", unit="call", file=sys.stderr, leave=False)

    def step(planned: int, close: bool = False) -> None:
        bar.total = planned
        if close:
            bar.close()
        else:
            bar.update(1)

    return step


def _progress_bar(total: int) -> Callable[..., None]:
    from booklens.parallel import progress_enabled

    if not progress_enabled():
        return lambda n, close=False: None
    import sys

    from tqdm import tqdm

    bar = tqdm(total=total, desc="chunks", unit="chunk", file=sys.stderr, leave=False)

    def step(n: int, close: bool = False) -> None:
        bar.update(n)
        if close:
            bar.close()

    return step


def make_summarizer(method: str, **config: Any) -> _BookSummarizer:
    if method == "hier":
        return HierarchicalSummarizer(**config)
    if method == "inc":
        return IncrementalSummarizer(**config)
    raise BooklensError(f"unknown summarization method '{method}': use hier or inc")
