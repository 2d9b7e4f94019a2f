"""Book-length summarization (BooookScore §2 and Appendix A).

Hierarchical merging: level 1 summarizes as many consecutive chunks as fit the
budget W - G_1; each higher level merges as many consecutive summaries as fit
W - G_l, until one summary is left. All calls of one level are independent and
run concurrently. A merge that is not the first of its level also receives the
summary that immediately precedes its inputs as context, so it knows what came
before; because that context comes from the level below, the calls of a level
stay independent.

Incremental updating: summarize the first chunk, then rewrite the running
summary with each next chunk, compressing it whenever it exceeds G_n.

Token counts use cl100k_base (`booklens.text`). Budgets keep a safety margin
because the backend's own tokenizer may count a little differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import dspy

from booklens.errors import BooklensError
from booklens.lm import BooklensAdapter, last_finish_reason, predict_with_retries
from booklens.parallel import parallel_map
from booklens.records import Chunk, SummaryNode
from booklens.signatures.summarize import (
    CompressSummary,
    MergeSummaries,
    MergeSummariesWithContext,
    RemoveArtifacts,
    SummarizeChunk,
    UpdateSummary,
)

WORDS_PER_TOKEN = 0.75
# Share of the context window budgets may fill: room for tokenizer differences
# between cl100k_base and the backend's tokenizer, and for chat-template tokens.
BUDGET_MARGIN = 0.85
# A summary may run this much over its budget in generation before it is judged over budget.
GENERATION_SLACK = 1.5


def prompt_overhead(predictor: dspy.Predict, **empty_inputs: Any) -> int:
    """Tokens of the predictor's prompt (instructions, field layout, demos) with empty inputs."""
    from booklens.text import count_tokens

    adapter = dspy.settings.adapter or BooklensAdapter()
    messages = adapter.format(predictor.signature, predictor.demos, empty_inputs)
    return sum(count_tokens(str(m.get("content", ""))) + 4 for m in messages)


def group_by_budget(sizes: list[int], budget: int, *, min_group: int = 1) -> list[list[int]]:
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
    if min_group > 1 and any(len(g) < min_group for g in groups[:-1]):
        raise BooklensError("the context window cannot hold two summaries at once; raise --context-window "
                            "or lower --max-summary-tokens")
    return groups


def trim_to_budget(text: str, budget: int) -> str:
    """The longest run of whole leading sentences within `budget` tokens (at least one cut sentence)."""
    from booklens.text import count_tokens, sentence_spans, truncate_to_tokens

    kept_end = 0
    for _, end in sentence_spans(text):
        if count_tokens(text[:end]) > budget:
            break
        kept_end = end
    if kept_end == 0:
        return truncate_to_tokens(text, budget).strip()
    return text[:kept_end].strip()


@dataclass
class _Generated:
    text: str
    tokens: int
    attempts: int
    over_budget: bool
    truncated: bool


class _BookSummarizer(dspy.Module):
    method = "base"

    def __init__(
        self,
        *,
        chunk_size: int = 2048,
        context_window: int = 8192,
        max_summary_tokens: int = 900,
        level_budgets: list[int] | None = None,
        max_regenerations: int = 2,
        concurrency: int = 1,
        remove_artifacts: bool = False,
        temperature: float = 0.5,
    ):
        super().__init__()
        if chunk_size < 16:
            raise BooklensError(f"--chunk-size must be at least 16 tokens (got {chunk_size})")
        if max_summary_tokens < 16:
            raise BooklensError(f"--max-summary-tokens must be at least 16 (got {max_summary_tokens})")
        self.chunk_size = chunk_size
        self.context_window = context_window
        self.max_summary_tokens = max_summary_tokens
        self.level_budgets = list(level_budgets or [])
        self.max_regenerations = max_regenerations
        self.concurrency = concurrency
        self.remove_artifacts = remove_artifacts
        self.temperature = temperature
        self.clean = dspy.Predict(RemoveArtifacts)

    # -- budgets ---------------------------------------------------------

    @property
    def usable_window(self) -> int:
        return int(self.context_window * BUDGET_MARGIN)

    def budget(self, level: int) -> int:
        """G_l: the summary budget of a level (the last given budget repeats; default G_n)."""
        if not self.level_budgets:
            return self.max_summary_tokens
        return self.level_budgets[min(level, len(self.level_budgets)) - 1]

    # -- one generation with bounded regeneration ------------------------

    def _generate(self, predictor: dspy.Predict, output: str, budget: int, *, temperature: float | None = None,
                  where: str, **inputs: Any) -> _Generated:
        from booklens.text import count_tokens

        temperature = self.temperature if temperature is None else temperature
        best: _Generated | None = None
        for regeneration in range(self.max_regenerations + 1):
            result = predict_with_retries(
                predictor,
                config={
                    "max_tokens": int(budget * GENERATION_SLACK) + 64,
                    "temperature": temperature if regeneration == 0 else max(temperature, 0.7),
                    "booklens_attempt": 100 * regeneration,
                },
                **inputs,
            )
            if not result.ok:
                continue
            text = str(getattr(result.prediction, output) or "").strip()
            tokens = count_tokens(text)
            cut_off = last_finish_reason() == "length"
            candidate = _Generated(text, tokens, regeneration + 1, tokens > budget, False)
            if text and (best is None or tokens < best.tokens):
                best = candidate
            if text and tokens <= budget and not cut_off:
                return candidate
        if best is None:
            raise BooklensError(f"the model gave no usable summary for {where} after "
                                f"{self.max_regenerations + 1} tries; rerun to resume from the cache")
        if best.over_budget:
            # Keep whole sentences up to the budget rather than fail the whole book.
            text = trim_to_budget(best.text, budget)
            best = _Generated(text, count_tokens(text), self.max_regenerations + 1, True, True)
        best.attempts = self.max_regenerations + 1
        return best

    def _finish(self, final: SummaryNode, nodes: list[SummaryNode]) -> str:
        if not self.remove_artifacts:
            return final.text
        cleaned = self._generate(self.clean, "cleaned", max(final.tokens, 16), temperature=0.0,
                                 where="artifact removal", summary=final.text)
        nodes.append(SummaryNode(id="clean", level=final.level + 1, kind="clean", text=cleaned.text,
                                 tokens=cleaned.tokens, children=[final.id], chunks=final.chunks,
                                 attempts=cleaned.attempts))
        return cleaned.text

    def _chunks(self, book: str) -> list[Chunk]:
        from booklens.text import chunk_text

        chunks = chunk_text(book, self.chunk_size)
        if not chunks:
            raise BooklensError("the book has no text to summarize")
        return chunks


class HierarchicalSummarizer(_BookSummarizer):
    """Summarize chunks, then merge summaries level by level until one remains."""

    method = "hier"

    def __init__(self, **config: Any):
        super().__init__(**config)
        self.summarize_chunk = dspy.Predict(SummarizeChunk)
        self.merge = dspy.Predict(MergeSummaries)
        self.merge_with_context = dspy.Predict(MergeSummariesWithContext)

    def check_budgets(self) -> tuple[int, int, int]:
        """Room for input at level 1, for a merge, and for a context merge; errors when too small."""
        g1 = self.budget(1)
        room_chunks = self.usable_window - g1 - prompt_overhead(self.summarize_chunk, excerpt="", word_limit=0)
        if room_chunks < self.chunk_size:
            raise BooklensError(
                f"a chunk of {self.chunk_size} tokens does not fit the {self.context_window}-token context window "
                f"with a {g1}-token summary and the prompt; lower --chunk-size or --max-summary-tokens, "
                "or raise --context-window"
            )
        g = max(self.budget(level) for level in range(2, max(3, len(self.level_budgets) + 1)))
        room_merge = self.usable_window - g - prompt_overhead(self.merge, summaries=[], word_limit=0)
        room_context = self.usable_window - g - prompt_overhead(
            self.merge_with_context, context="", summaries=[], word_limit=0)
        if room_merge < 2 * max(g1, g) + 32:
            raise BooklensError(
                f"the {self.context_window}-token context window cannot merge two {max(g1, g)}-token summaries; "
                "lower --max-summary-tokens or raise --context-window"
            )
        return room_chunks, room_merge, room_context

    def forward(self, book: str) -> dspy.Prediction:
        room_chunks, room_merge, room_context = self.check_budgets()
        chunks = self._chunks(book)
        nodes: list[SummaryNode] = []

        groups = group_by_budget([c.tokens for c in chunks], room_chunks)
        g1 = self.budget(1)

        def summarize_group(item: tuple[int, list[int]]) -> SummaryNode:
            j, group = item
            excerpt = "".join(chunks[i].text for i in group).strip()
            out = self._generate(self.summarize_chunk, "summary", g1, where=f"level 1 summary {j}",
                                 excerpt=excerpt, word_limit=int(g1 * WORDS_PER_TOKEN))
            return SummaryNode(id=f"L1.{j}", level=1, kind="chunk", text=out.text, tokens=out.tokens,
                               children=[f"c{i}" for i in group], chunks=list(group), attempts=out.attempts,
                               over_budget=out.over_budget, truncated=out.truncated)

        level_nodes = parallel_map(summarize_group, list(enumerate(groups)), concurrency=self.concurrency,
                                   desc=f"level 1 ({len(groups)} calls)")
        nodes.extend(level_nodes)
        level = 1
        while len(level_nodes) > 1:
            level += 1
            level_nodes = self._merge_level(level, level_nodes, nodes, room_merge, room_context)
        final_text = self._finish(level_nodes[0], nodes)
        return dspy.Prediction(summary=final_text, nodes=nodes, chunks=chunks, levels=level)

    def plan_level(self, level_nodes: list[SummaryNode], room_merge: int, room_context: int,
                   budget: int) -> list[tuple[SummaryNode | None, list[SummaryNode]]]:
        """Group consecutive summaries for one level: (context, inputs) per merge call."""
        plan: list[tuple[SummaryNode | None, list[SummaryNode]]] = []
        i = 0
        while i < len(level_nodes):
            context = level_nodes[i - 1] if i > 0 else None
            room = room_merge if context is None else room_context - context.tokens
            group: list[SummaryNode] = []
            used = 0
            while i < len(level_nodes) and (not group or used + level_nodes[i].tokens <= room):
                group.append(level_nodes[i])
                used += level_nodes[i].tokens
                i += 1
            if len(group) == 1 and i < len(level_nodes) and context is not None:
                # Two inputs must fit, or the level would not shrink: give up the context.
                i -= 1
                group, used = [], 0
                while i < len(level_nodes) and (not group or used + level_nodes[i].tokens <= room_merge):
                    group.append(level_nodes[i])
                    used += level_nodes[i].tokens
                    i += 1
                context = None
            plan.append((context, group))
        return plan

    def _merge_level(self, level: int, level_nodes: list[SummaryNode], nodes: list[SummaryNode],
                     room_merge: int, room_context: int) -> list[SummaryNode]:
        budget = self.budget(level)
        plan = self.plan_level(level_nodes, room_merge, room_context, budget)
        if len(plan) == len(level_nodes):
            raise BooklensError("summaries are too long to merge within the context window; "
                                "lower --max-summary-tokens or raise --context-window")

        def merge(item: tuple[int, tuple[SummaryNode | None, list[SummaryNode]]]) -> SummaryNode:
            j, (context, group) = item
            if len(group) == 1:
                return group[0]  # a lone last summary moves up unchanged
            texts = [n.text for n in group]
            if context is None:
                out = self._generate(self.merge, "summary", budget, where=f"level {level} merge {j}",
                                     summaries=texts, word_limit=int(budget * WORDS_PER_TOKEN))
            else:
                out = self._generate(self.merge_with_context, "summary", budget, where=f"level {level} merge {j}",
                                     context=context.text, summaries=texts,
                                     word_limit=int(budget * WORDS_PER_TOKEN))
            return SummaryNode(id=f"L{level}.{j}", level=level, kind="merge", text=out.text, tokens=out.tokens,
                               children=[n.id for n in group], chunks=[c for n in group for c in n.chunks],
                               used_context=context is not None, attempts=out.attempts,
                               over_budget=out.over_budget, truncated=out.truncated)

        calls = sum(1 for _, g in plan if len(g) > 1)
        merged = parallel_map(merge, list(enumerate(plan)), concurrency=self.concurrency,
                              desc=f"level {level} ({calls} calls)")
        nodes.extend(n for n in merged if n.level == level)
        return merged


class IncrementalSummarizer(_BookSummarizer):
    """Keep one running summary, update it chunk by chunk, compress it when over G_n."""

    method = "inc"

    def __init__(self, **config: Any):
        super().__init__(**config)
        self.summarize_chunk = dspy.Predict(SummarizeChunk)
        self.update = dspy.Predict(UpdateSummary)
        self.compress = dspy.Predict(CompressSummary)

    def check_budgets(self) -> None:
        g = self.max_summary_tokens
        overhead = prompt_overhead(self.update, running_summary="", excerpt="", word_limit=0)
        need = self.chunk_size + g + int(g * GENERATION_SLACK) + overhead
        if need > self.usable_window:
            raise BooklensError(
                f"incremental updating needs {need} tokens per call (chunk {self.chunk_size} + running summary "
                f"{g} + output + prompt) but the usable context window is {self.usable_window}; lower "
                "--chunk-size or --max-summary-tokens, or raise --context-window"
            )

    def forward(self, book: str) -> dspy.Prediction:
        self.check_budgets()
        chunks = self._chunks(book)
        g = self.max_summary_tokens
        words = int(g * WORDS_PER_TOKEN)
        nodes: list[SummaryNode] = []
        steps = _progress_bar(len(chunks))
        first = self._generate(self.summarize_chunk, "summary", g, where="the first chunk",
                               excerpt=chunks[0].text.strip(), word_limit=words)
        current = SummaryNode(id="u0", level=1, kind="chunk", text=first.text, tokens=first.tokens,
                              children=["c0"], chunks=[0], attempts=first.attempts,
                              over_budget=first.over_budget, truncated=first.truncated)
        nodes.append(current)
        steps(1)
        for chunk in chunks[1:]:
            i = chunk.index
            # The update may run over G_n; compression brings it back.
            out = self._generate(self.update, "summary", int(g * GENERATION_SLACK), where=f"update {i}",
                                 running_summary=current.text, excerpt=chunk.text.strip(), word_limit=words)
            updated = SummaryNode(id=f"u{i}", level=i + 1, kind="update", text=out.text, tokens=out.tokens,
                                  children=[current.id, f"c{i}"], chunks=list(range(i + 1)), attempts=out.attempts)
            nodes.append(updated)
            current = updated
            if updated.tokens > g:
                comp = self._generate(self.compress, "condensed", g, temperature=1.0, where=f"compression {i}",
                                      summary=updated.text, current_words=len(updated.text.split()),
                                      word_limit=words)
                current = SummaryNode(id=f"u{i}.compressed", level=i + 1, kind="compress", text=comp.text,
                                      tokens=comp.tokens, children=[updated.id], chunks=updated.chunks,
                                      attempts=comp.attempts, over_budget=comp.over_budget,
                                      truncated=comp.truncated)
                nodes.append(current)
            steps(1)
        steps(0, close=True)
        final_text = self._finish(current, nodes)
        return dspy.Prediction(summary=final_text, nodes=nodes, chunks=chunks, levels=len(chunks))


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
