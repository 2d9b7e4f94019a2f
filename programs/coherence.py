"""`CoherenceScorer`: BooookScore of a summary by confusion detection on its sentences.

Per-sentence mode (`batch_size=1`, the paper's setting) asks about one sentence per
call; batched mode asks about `batch_size` numbered sentences per call and checks
that every sentence got exactly one valid answer under its own number. A reply that
numbers any answer with a number that was not asked is not trusted at all (its
numbering is off: see `_judge_batch`). A sentence whose answer is missing,
duplicated with a different content, or invalid (an unknown error type, a
"confusion" without a question or a type, a "no confusion" with error types; stray
questions next to "no confusion" are dropped) is asked again, alone with the other
unanswered sentences of its batch, with a fresh sample (after a reply cut off at the
token limit: with twice the answer budget, as every call re-asks). After `tries` rounds it is
recorded as a parse failure (`status="failed"`, `confusing=None`): never retried
forever, never silently "no confusion". Sentences (or batches) of a summary run
concurrently.

Prompt layout. Every call of one summary shares its prompt up to the target sentence: the
instructions (system message), the demos, then the summary; only the sentence (or the numbered
sentences) and the answer differ. Demos are whole summaries with some of their sentences
labelled, as in the paper: the per-sentence predictor (`SharedSummaryPredict`) shows the demos
of one summary as one conversation, the summary in the first turn only and each further labelled
sentence as a turn of its own, so a summary is never repeated per demo sentence. The demos stay
ordinary per-sentence `dspy.Example`s on an ordinary predictor, so artifacts save, load and
compile as every DSPy program does; only their rendering is grouped.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from types import MethodType
from typing import Any, Sequence

import dspy

from booklens.errors import BooklensError, LMError, first_line
from booklens.lm import (ContextWindowExceeded, Reasks, filter_stopped, forget_answers, hearing_calls,
                         predict_with_retries)
from booklens.parallel import chunked, parallel_map
from booklens.programs.base import Module, Predict
from booklens.records import SentenceAnnotation
from booklens.signatures.coherence import (CONFUSION, NO_CONFUSION, DetectConfusion, DetectConfusionBatch,
                                           unknown_kinds)
from booklens.vocabulary import DEFAULT_CONTEXT_WINDOW, DEFAULT_TRIES, check_retries

# Completion budget per judged sentence: a verdict, a few questions and types fit easily; the
# bound stops a small model that keeps adding questions from generating for a minute.
DEFAULT_TOKENS_PER_SENTENCE = 192


def _clean_questions(questions: Any) -> list[str]:
    if questions is None:
        return []
    if isinstance(questions, str):
        questions = [questions]
    return [q.strip() for q in questions if isinstance(q, str) and q.strip()]


def _dedupe(items: Sequence[str]) -> list[str]:
    seen: list[str] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def check_answer(verdict: Any, questions: Any, error_types: Any) -> str | None:
    """A complaint about one answer, or None when it is a valid annotation."""
    if verdict not in (NO_CONFUSION, CONFUSION):
        return f"verdict {verdict!r} is neither 'confusion' nor 'no confusion'"
    types = list(error_types or [])
    unknown = unknown_kinds(types)
    if unknown:
        return unknown
    questions = _clean_questions(questions)
    if verdict == CONFUSION:
        if not types:
            return "a confusion needs at least one error type"
        if not questions:
            return "a confusion needs at least one clarifying question"
    elif types:
        return "'no confusion' must come without error types"
    # Questions next to an explicit "no confusion" are dropped: the verdict is what Eq. 1 counts.
    return None


def _annotation(index: int, sentence: str, verdict: str, questions: Any, error_types: Any,
                attempts: int) -> SentenceAnnotation:
    confusing = verdict == CONFUSION
    return SentenceAnnotation(
        index=index,
        sentence=sentence,
        confusing=confusing,
        questions=_clean_questions(questions) if confusing else [],
        types=_dedupe(list(error_types or [])) if confusing else [],
        attempts=attempts,
    )


def _failure(index: int, sentence: str, error: str, attempts: int) -> SentenceAnnotation:
    return SentenceAnnotation(index=index, sentence=sentence, confusing=None, status="failed",
                              attempts=attempts, error=error)


def occurrence_targets(sentences: Sequence[str]) -> list[str]:
    """The target of each per-sentence prompt: the sentence itself, and for a sentence the summary
    has more than once, which occurrence it is. Identical prompts got one verdict for every copy,
    so a copy written again could not be told apart as a duplication; a sentence written once is
    asked exactly as before."""
    from collections import Counter

    # Copies that differ only in spacing or line breaks (a hard-wrapped summary) are one sentence to a reader.
    counts = Counter(" ".join(s.split()) for s in sentences)
    seen: Counter = Counter()
    targets = []
    for sentence in sentences:
        key = " ".join(sentence.split())
        seen[key] += 1
        if counts[key] > 1:
            sentence = f"{sentence}\n(This sentence occurs {counts[key]} times in the summary; judge occurrence {seen[key]}.)"
        targets.append(sentence)
    return targets


def _sentence_list(value: Any, name: str) -> list[str]:
    """`value` as a list of sentences, or a one-line error: a string would be judged a character at a
    time, one call each."""
    if isinstance(value, str):
        raise BooklensError(f"{name} must be a list of sentences, not one string")
    try:
        items = list(value)
    except TypeError:
        raise BooklensError(f"{name} must be a list of sentences, not {type(value).__name__}") from None
    odd = [type(item).__name__ for item in items if not isinstance(item, str)]
    if odd:
        raise BooklensError(f"{name} must be a list of sentences, not a list holding {odd[0]}")
    return items


def number_sentences(sentences: Sequence[str], indices: Sequence[int]) -> str:
    """The batched prompt's sentence list: "number: sentence" lines, numbers 1-based in the summary."""
    return "\n".join(f"{i + 1}: {' '.join(sentences[i].split())}" for i in indices)


# ---------------------------------------------------------------------------
# Demos that share a summary


SHARED_FIELD = "summary"
SAME_SUMMARY_NOTE = "The same summary as in the previous example. Another sentence of it:"


def group_demos(demos: Sequence[Any], field: str = SHARED_FIELD) -> list[list[Any]]:
    """Demos grouped by the value of `field`, groups in order of first appearance, demos in their
    order within a group (a demo without the field is a group of its own)."""
    groups: list[list[Any]] = []
    by_value: dict[str, list[Any]] = {}
    for demo in demos:
        value = demo.get(field) if hasattr(demo, "get") else None
        if not isinstance(value, str):
            groups.append([demo])
            continue
        if value not in by_value:
            by_value[value] = []
            groups.append(by_value[value])
        by_value[value].append(demo)
    return groups


def _format_shared_demos(adapter: Any, signature: type[dspy.Signature], demos: list[Any],
                         field: str = SHARED_FIELD) -> list[dict[str, Any]]:
    """The demos as chat turns, each summary given once: the first demo of a summary shows every input
    field, the following ones every input field but the summary. Demos without any input or output
    field of the signature are left out, as DSPy's own rendering does."""
    usable = [d for d in demos
              if any(k in d for k in signature.input_fields) and any(k in d for k in signature.output_fields)]
    messages: list[dict[str, Any]] = []
    for group in group_demos(usable, field):
        for position, demo in enumerate(group):
            if position == 0:
                shown, prefix = demo, ""
            else:
                shown = {k: demo[k] for k in demo.keys() if k != field}
                prefix = SAME_SUMMARY_NOTE
            messages.append({"role": "user", "content": adapter.format_user_message_content(signature, shown,
                                                                                            prefix=prefix)})
            messages.append({"role": "assistant", "content": adapter.format_assistant_message_content(
                signature, demo, missing_field_message="Not given for this example.")})
    return messages


def shared_summary_adapter(adapter: Any, field: str = SHARED_FIELD) -> Any:
    """A copy of `adapter` (any DSPy adapter) that renders demos sharing a summary as one conversation."""
    adapted = copy.copy(adapter)
    adapted.format_demos = MethodType(lambda self, signature, demos: _format_shared_demos(self, signature, demos,
                                                                                         field), adapted)
    return adapted


class SharedSummaryPredict(Predict):
    """`dspy.Predict` whose demos that share a summary are shown as one conversation (see the module
    docstring). State, saving, loading and compiling are those of `dspy.Predict`."""

    def forward(self, **kwargs):
        from dspy.adapters.chat_adapter import ChatAdapter

        adapter = shared_summary_adapter(dspy.settings.adapter or ChatAdapter())
        with dspy.context(adapter=adapter):
            return super().forward(**kwargs)


# Tokens of the model per cl100k token, with a margin (SmolLM2 measures 1.06 on this text).
MODEL_TOKENS_PER_CL100K = 1.10
PER_MESSAGE_TOKENS = 6  # chat-template markers around each message
PROMPT_FRAME_TOKENS = 120  # the asked turn's field headers and the closing output reminder
_PROMPT_TOKENS: dict[tuple, int] = {}


def instructions_and_demos_tokens(predictor: dspy.Predict, demos: Sequence[Any]) -> int:
    """cl100k tokens of the system message and the demo turns, as the predictor renders them."""
    from booklens.lm.adapter import BooklensAdapter
    from booklens.text import count_tokens

    import hashlib
    import json

    text = json.dumps([predictor.signature.instructions, [dict(d.items()) for d in demos]], sort_keys=True,
                      default=str)
    key = (type(predictor).__name__, hashlib.sha256(text.encode("utf-8")).hexdigest())
    if key not in _PROMPT_TOKENS:
        adapter = BooklensAdapter()
        if isinstance(predictor, SharedSummaryPredict):
            adapter = shared_summary_adapter(adapter)
        inputs = {name: "" for name in predictor.signature.input_fields}
        messages = adapter.format(predictor.signature, list(demos), inputs)[:-1]
        _PROMPT_TOKENS[key] = sum(count_tokens(str(m.get("content", ""))) + PER_MESSAGE_TOKENS for m in messages)
    return _PROMPT_TOKENS[key]


def demo_token_limit(window: int, *, summary_tokens: int, judged_tokens: int, answer_tokens: int) -> int:
    """cl100k tokens the instructions and demos may take in a `window`-token context beside a summary of
    `summary_tokens`, `judged_tokens` of judged sentence(s) and the answer budget: the one rule by which
    every call fits its demos (`fitting_demos`) and `judges build` sizes the default demo set."""
    return int((window - answer_tokens) / MODEL_TOKENS_PER_CL100K - summary_tokens - judged_tokens
               - PROMPT_FRAME_TOKENS)


def judged_room(summary: str, batch_size: int = 1, targets: Sequence[str] = ()) -> int:
    """cl100k tokens kept free for what one call of `summary` judges when its demos are fitted to the
    window: the summary's longest sentence as the prompt shows it (per-sentence: its occurrence target;
    batched: times `batch_size`). The room depends on the summary alone, so every call of it keeps the
    same demos (and shares its prompt prefix) whichever sentence it asks, whether the summary is judged
    whole (`score`, `calibrate`) or one annotated sentence at a time (`compile`, `evaluate`): these
    measure the prompts `score` sends. `targets`, what this call asks, count too, should a caller pass
    sentences that are not the summary's own."""
    from booklens.text import count_tokens

    longest = max([_longest_sentence_tokens(summary, batch_size == 1), *(count_tokens(s) for s in targets)])
    return longest * batch_size


@functools.lru_cache(maxsize=64)
def _longest_sentence_tokens(summary: str, per_sentence: bool) -> int:
    # Cached: compile and evaluate ask about one sentence of the same summary many times over.
    from booklens.text import count_tokens, split_sentences

    sentences = split_sentences(summary)
    asked = occurrence_targets(sentences) if per_sentence else sentences
    return max((count_tokens(s) for s in asked), default=0)


def demo_room(window: int, summary: str, *, batch_size: int, answer_tokens: int, targets: Sequence[str] = ()) -> int:
    """cl100k tokens left for the instructions and demos of a call judging `summary` in a `window`-token
    context (`demo_token_limit` with the summary's own sizes)."""
    from booklens.text import count_tokens

    return demo_token_limit(window, summary_tokens=count_tokens(summary),
                            judged_tokens=judged_room(summary, batch_size, targets), answer_tokens=answer_tokens)


def fitting_demos(predictor: dspy.Predict, summary: str, *, batch_size: int, answer_tokens: int,
                  targets: Sequence[str] = ()) -> list[Any] | None:
    """None when the predictor's demos, the summary, the room `judged_room` keeps for the judged
    sentence(s) and the answer fit the LM's context window (or the window is unknown); else the demos
    that do: whole summaries' demos are dropped from the end. A summary longer than the default demos
    leave room for is then judged with fewer demos, not refused."""
    from booklens.text import count_tokens

    window = getattr(dspy.settings.lm, "context_window", None)
    demos = list(predictor.demos)
    if not window or not demos:
        return None
    limit = demo_room(window, summary, batch_size=batch_size, answer_tokens=answer_tokens, targets=targets)

    def fits(shown: list[Any]) -> bool:
        return instructions_and_demos_tokens(predictor, shown) <= limit

    if fits(demos):
        return None
    groups = group_demos(demos)
    while groups:
        groups.pop()
        shown = [d for group in groups for d in group]
        if fits(shown):
            return shown
    return []


def answer_budget(n_sentences: int, tokens_per_sentence: int = DEFAULT_TOKENS_PER_SENTENCE) -> int:
    """The answer tokens a call judging `n_sentences` may write: 64, and `tokens_per_sentence` each."""
    return 64 + tokens_per_sentence * n_sentences


def labelled_sentences(demos: Sequence[Any], *, batched: bool) -> int:
    """The labelled sentences `demos` show, the unit a judge's demos are counted in everywhere: one
    per per-sentence demo; a batched demo's stored answers (a list, or the JSON text of one; not
    the lenient reading of a model's answer, where a lone string is one item)."""
    if not batched:
        return len(demos)
    total = 0
    for demo in demos:
        answers = demo.get("answers")
        if isinstance(answers, str):
            try:
                answers = json.loads(answers)
            except ValueError:
                answers = []
        total += len(list(answers or []))
    return total


# Full stops of other scripts, at which the split (Punkt's . ? !, and Chinese and Japanese stops)
# ends no sentence, when text follows.
_OTHER_STOPS = re.compile(r"([।॥۔؟])[\s\"'”’)]*(?=\w)")


# A line that starts a list item: a bullet, or a number with its dot or parenthesis.
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+•]|\d+[.)])[ \t]+\S", re.MULTILINE)


# A sentence that is, or ends in, a number alone: Punkt ends a sentence after a list item's "1." (and
# after "No. 1." in "Chopin's Ballade No. 1.", the number then a sentence of its own).
_LIST_NUMBER = re.compile(r"(?:^|\n)[ \t]*(\d+[.)])\s*$")


def split_notes(sentences: Sequence[str]) -> list[str]:
    """What to say of sentences the split leaves other than a reader would (none for ordinary
    prose): ones that run on past another script's full stop (a Hindi summary is one sentence, so
    its score can only be 0 or 100) or over list items with no . ? ! between them, and numbers
    alone ("1." of a numbered list) judged as sentences. Apart from Chinese and Japanese stops the
    split stays NLTK's, which the released annotations and the paper's figures rest on."""
    def said(held: list[str], singular: str, plural: str, judged: str = "judged whole") -> str:
        one = len(held) == 1
        return (f"{len(held)} of the summary's {len(sentences)} sentences {singular if one else plural}, and "
                f"{'was' if one else 'were'} {judged}")

    notes = []
    held = [s for s in sentences if _OTHER_STOPS.search(s)]
    if held:
        marks = ", ".join(repr(m) for m in dict.fromkeys(m.group(1) for s in held for m in _OTHER_STOPS.finditer(s)))
        notes.append("sentences are split at . ? ! and 。 ！ ？ ． only: " + said(
            held, f"holds another full stop inside ({marks})", f"hold another full stop inside ({marks})"))
    listed = [s for s in sentences if len(_LIST_ITEM.findall(s)) > 1]
    if listed:
        notes.append("NLTK's Punkt does not split sentences at line breaks: " + said(
            listed, "runs over several list items with no . ? ! between them",
            "run over several list items with no . ? ! between them"))
    numbered = [s for s in sentences if _LIST_NUMBER.search(s)]
    if numbered:
        first = _LIST_NUMBER.search(numbered[0]).group(1)
        notes.append("NLTK's Punkt ends sentences after a number and its stop: " + said(
            numbered, f"is or ends in a number alone ({first!r})", f"are or end in a number alone ({first!r})",
            "judged as sentences" if len(numbered) > 1 else "judged as a sentence"))
    return notes


def own_demo_sentences(demos: Sequence[Any], summary: str, *, batched: bool) -> int:
    """The labelled sentences `demos` show of `summary` itself (spacing aside): a summary judged with
    its own labels in the prompt gets them back, whatever the judge makes of it."""
    key = " ".join(summary.split())
    summaries = [d.get(SHARED_FIELD) if hasattr(d, "get") else None for d in demos]
    own = [d for d, text in zip(demos, summaries) if isinstance(text, str) and " ".join(text.split()) == key]
    return labelled_sentences(own, batched=batched)


def own_demos_note(prediction: Any) -> str | None:
    """What to say of a judgment whose summary is one of the demos it was shown (None when it is not)."""
    own = getattr(prediction, "own_demos", 0) or 0
    if not own:
        return None
    return (f"this summary is one of the judge's demos, with {own} of its sentences labelled: its verdicts on "
            "them repeat those labels, not the judge's reading")


def demos_note(prediction: Any) -> str | None:
    """What to say of a judgment for which `fitting_demos` left demos out (None when it left none):
    the one wording `score`, `evaluate` and `calibrate` give it, so that a judge shipped few-shot is
    never shown as such while it judged a summary with fewer demos, or none."""
    dropped = getattr(prediction, "demos_dropped", 0) or 0
    if not dropped:
        return None
    return (f"{dropped} of the judge's {dropped + prediction.demos_shown} demos were left out: with all of them "
            "the prompt would not fit the model's context window")


def check_window_holds_a_summary(scorer: Any, window: int | None) -> None:
    """A one-line error when `scorer`'s instructions and answer alone fill a `window`-token context,
    so that no summary fits (`CoherenceScorer.least_window` of an empty one): checked where the
    summaries are still to be written (`run`, a sweep), which `refuse_misfits` would refuse only after
    the calls that write them. A caller's own scorer may not say."""
    least_window = getattr(scorer, "least_window", None)
    if least_window is None or not window:
        return
    least = least_window("")
    if least > window:
        raise BooklensError(f"the judge's {window}-token context window holds no summary beside its answer and its "
                            f"prompt's instructions: the coherence judge needs a window of more than {least:,} tokens; "
                            "use a model or server with a larger context window")


def refuse_misfits(scorer: Any, summaries: Any, window: int | None, *, option: str | None = None,
                   model_window: int | None = None) -> None:
    """Refuse, before the first call, the first of `summaries` ((name as shown, text) pairs) that
    `scorer` cannot judge in a `window`-token context even with no demo (`CoherenceScorer.misfit`),
    so that the summaries before it are not judged in vain. A caller's own scorer may not say.
    `option`: the setting that set `window` below the model's (`model_window`, None when unknown),
    which the line then names with the window that fits, where the model's holds it."""
    from booklens.lm.base import SETTING_ADVICE

    misfit = getattr(scorer, "misfit", None)
    if misfit is None or not window:
        return
    for name, text in summaries:
        reason = misfit(text, window)
        if reason and option and hasattr(scorer, "least_window"):
            needed = scorer.least_window(text)
            if not model_window or needed <= model_window:
                reason = misfit(text, window, advice=f"{SETTING_ADVICE}{option} to {needed} or more")
        if reason:
            raise BooklensError(f"the summary {name} {reason}")


class CoherenceScorer(Module):
    """Confusion detection on every sentence of a summary, and its BooookScore (Eq. 1)."""

    def __init__(self, batch_size: int = 1, concurrency: int = 4, tries: int = DEFAULT_TRIES,
                 tokens_per_sentence: int | None = DEFAULT_TOKENS_PER_SENTENCE):
        super().__init__()
        from booklens.parallel import check_at_least

        check_at_least("--batch-size", batch_size)
        check_retries("--tries", tries)
        check_at_least("--concurrency", concurrency)
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.tries = tries
        self.tokens_per_sentence = tokens_per_sentence
        self.detect = SharedSummaryPredict(DetectConfusion)
        self.detect_batch = Predict(DetectConfusionBatch)

    @property
    def mode(self) -> str:
        return "per-sentence" if self.batch_size == 1 else "batched"

    def forward(self, summary: str, sentences: Sequence[str] | None = None,
                targets: Sequence[str] | None = None) -> dspy.Prediction:
        """Judge `sentences` (default: the summary's sentences). `targets`, one per sentence, is what
        each per-sentence prompt asks about (default `occurrence_targets(sentences)`): sentences taken
        out of their summary (compile's examples, one annotated sentence each) pass the target they
        have in the whole summary, so they are asked as a run of that summary asks them. The batched
        prompt numbers its sentences instead and does not use it."""
        from booklens.inputs import summary_text
        from booklens.metrics.booookscore import booookscore

        summary = summary_text(summary)  # as the claim decomposer checks it: no score to give
        if sentences is None:
            from booklens.text import split_sentences

            sentences = split_sentences(summary)
        sentences = _sentence_list(sentences, "sentences")
        if targets is not None:
            targets = _sentence_list(targets, "targets")
        if targets is not None and len(targets) != len(sentences):
            from booklens.vocabulary import counted

            raise BooklensError(f"{counted(len(targets), 'prompt target')} for {counted(len(sentences), 'sentence')}: "
                                "give one per sentence")
        per_sentence = self.batch_size == 1
        predictor = self.detect if per_sentence else self.detect_batch
        if not per_sentence:
            targets = sentences
        elif targets is None:
            targets = occurrence_targets(sentences)
        targets = list(targets)
        demos = fitting_demos(predictor, summary, batch_size=self.batch_size, targets=targets,
                              answer_tokens=self._budget(self.batch_size).get("max_tokens", 0))
        override = {} if demos is None else {"demos": demos}
        if per_sentence:
            annotations = parallel_map(
                lambda i: self._judge_one(summary, i, sentences[i], override, target=targets[i]),
                range(len(sentences)),
                concurrency=self.concurrency,
                desc="sentences",
            )
        else:
            batches = chunked(list(range(len(sentences))), self.batch_size)
            per_batch = parallel_map(
                lambda idxs: self._judge_batch(summary, sentences, list(idxs), override),
                batches,
                concurrency=self.concurrency,
                desc="sentence batches",
            )
            annotations = [a for batch in per_batch for a in batch]
        # Counted in labelled sentences, as the judge line counts the demos (`booklens.judges.demo_count`).
        shown_demos = predictor.demos if demos is None else demos
        shown = labelled_sentences(shown_demos, batched=not per_sentence)
        return dspy.Prediction(
            annotations=annotations,
            score=booookscore(annotations),
            n_failed=sum(1 for a in annotations if a.status == "failed"),
            sentences=sentences,
            demos_shown=shown,
            demos_dropped=labelled_sentences(predictor.demos, batched=not per_sentence) - shown,
            own_demos=own_demo_sentences(shown_demos, summary, batched=not per_sentence),
        )

    def misfit(self, summary: str, window: int | None, advice: str | None = None) -> str | None:
        """Why `summary` cannot be judged in a `window`-token context even with every demo left out,
        by the rule its calls fit their demos by (`fitting_demos`); None when it can, or when the
        window is unknown. Checked before the first call, so that no summary is judged in vain.
        `advice` ends the line instead of the model-agnostic one: a caller's settings that would fit it
        (`booklens.pipeline.coherence_misfit`)."""
        if not window:
            return None
        from booklens.text import count_tokens

        answer, instructions = self._fit_terms()
        if instructions <= demo_room(window, summary, batch_size=self.batch_size, answer_tokens=answer):
            return None  # the usual case, every summary of a run: one count, not the search below
        needed = self.least_window(summary)
        if advice is None:
            # Where the instructions and answer alone fill the window, no shorter summary would fit either.
            shorten = "shorten it, or " if self.least_window("") <= window else ""
            advice = f": {shorten}judge it with a model of a window of {needed:,} tokens or more"
        return (f"({count_tokens(summary):,} tokens) does not fit the model's {window:,}-token context window even "
                f"with none of the judge's demos{advice}")

    def summary_room(self, summary: str, window: int) -> int:
        """The most cl100k tokens a summary whose sentences are no longer than `summary`'s may have to
        be judged in a `window`-token context with none of the demos, by the rule of `least_window`:
        the summary budget that would have fitted it (below 0 when none would)."""
        answer, instructions = self._fit_terms()
        judged = judged_room(summary, self.batch_size)
        return demo_token_limit(window, summary_tokens=0, judged_tokens=judged, answer_tokens=answer) - instructions

    def _fit_terms(self) -> tuple[int, int]:
        """The answer budget of a call and the tokens of its instructions without demos."""
        predictor = self.detect if self.batch_size == 1 else self.detect_batch
        return self._budget(self.batch_size).get("max_tokens", 0), instructions_and_demos_tokens(predictor, [])

    def least_window(self, summary: str) -> int:
        """The smallest context window in which `summary` is judged with none of the demos, by the
        rule its calls fit their demos by (`fitting_demos`)."""
        from booklens.text import count_tokens

        answer, instructions = self._fit_terms()
        summary_tokens, judged = count_tokens(summary), judged_room(summary, self.batch_size)  # once, not per size

        def room(size: int) -> int:  # `demo_room` of the summary
            return demo_token_limit(size, summary_tokens=summary_tokens, judged_tokens=judged, answer_tokens=answer)

        # The room grows by one token per MODEL_TOKENS_PER_CL100K of window: start from that estimate
        # and settle it by the rule itself.
        start = DEFAULT_CONTEXT_WINDOW
        needed = max(1, start + int((instructions - room(start)) * MODEL_TOKENS_PER_CL100K))
        while room(needed) < instructions:
            needed += 1
        while needed > 1 and room(needed - 1) >= instructions:
            needed -= 1
        return needed

    def _budget(self, n_sentences: int) -> dict[str, Any]:
        if self.tokens_per_sentence is None:
            return {}
        return {"max_tokens": answer_budget(n_sentences, self.tokens_per_sentence)}

    # -- per-sentence mode -------------------------------------------------

    def _judge_one(self, summary: str, index: int, sentence: str, override: dict[str, Any],
                   target: str | None = None) -> SentenceAnnotation:
        outcome = predict_with_retries(
            self.detect,
            tries=self.tries,
            check=lambda p: check_answer(p.verdict, p.questions, p.error_types) or filter_stopped("verdict"),
            config=self._budget(1),
            summary=summary,
            sentence=sentence if target is None else target,
            **override,
        )
        if not outcome.ok:
            return _failure(index, sentence, outcome.error or "no valid answer", outcome.attempts)
        p = outcome.prediction
        return _annotation(index, sentence, p.verdict, p.questions, p.error_types, outcome.attempts)

    # -- batched mode ------------------------------------------------------

    def _judge_batch(self, summary: str, sentences: Sequence[str], indices: list[int],
                     override: dict[str, Any]) -> list[SentenceAnnotation]:
        done: dict[int, SentenceAnnotation] = {}
        errors: dict[int, str] = {}
        attempts = {i: 0 for i in indices}
        pending = list(indices)
        unused: list = []  # answers from which no sentence was taken
        # Tries as every other call makes them: a reply cut off at the token limit is asked again with
        # twice the budget, any other rejected one as a fresh sample.
        reasks = Reasks(self.detect_batch, self._budget(len(pending)))
        for attempt in range(self.tries):
            if not pending:
                break
            config = reasks.config(attempt, self._budget(len(pending)))
            for i in pending:
                attempts[i] += 1
            try:
                with hearing_calls() as heard:
                    prediction = self.detect_batch(summary=summary, sentences=number_sentences(sentences, pending),
                                                   config=config, **override)
                answers = list(prediction.answers or [])
            except ContextWindowExceeded:
                if not reasks.grown:
                    raise
                for i in pending:
                    errors[i] = (f"{errors.get(i, 'no valid answer')}; a larger answer budget ({reasks.budget} "
                                 "tokens) does not fit the context window")
                break
            except LMError:
                raise
            except Exception as exc:  # the whole answer did not parse: every pending sentence is re-asked
                failed = {i: f"unparseable answer: {first_line(exc, limit=200)}" for i in pending}
            else:
                unfinished = filter_stopped("verdicts")
                if unfinished:
                    # What the filter withheld may be any sentence's verdict, questions or kinds: no answer
                    # of the reply is taken, as no filtered verdict is in per-sentence mode.
                    failed = {i: unfinished for i in pending}
                else:
                    settled, failed = self._read_reply(answers, pending, sentences, attempts)
                    done.update(settled)
            if not any(i in done for i in pending):
                unused.extend(heard)
            if failed:
                why = reasks.rejected()  # why the reply was unfinished, and the next try set up for it
                errors.update({i: why + complaint for i, complaint in failed.items()})
            pending = [i for i in pending if i not in done]
        if pending:
            forget_answers(unused)  # a rerun asks again for the sentences no answer settled
        for i in pending:
            done[i] = _failure(i, sentences[i], errors.get(i, "no valid answer"), attempts[i])
        return [done[i] for i in indices]

    @staticmethod
    def _read_reply(answers: list, pending: list[int], sentences: Sequence[str], attempts: dict[int, int]
                    ) -> tuple[dict[int, SentenceAnnotation], dict[int, str]]:
        """The pending sentences a parsed batched reply settles, and the complaint about each other one."""
        # A number that was not asked (0 for sentence 1, one past the last, or an extra one beside
        # all the asked ones) shows the reply numbers its answers its own way: which answer belongs
        # to which sentence is then a guess, and a wrong guess gives a sentence its neighbour's
        # verdict silently. No answer of such a reply is taken; the pending sentences are asked
        # again. An unreadable number (None) says nothing of the numbering: that answer alone is lost.
        wanted = set(pending)
        numbers = [a.number for a in answers if isinstance(getattr(a, "number", None), int)]
        stray = sorted({n for n in numbers if n - 1 not in wanted})
        if stray:
            shown = ", ".join(str(n) for n in stray)
            return {}, {i: (f"the reply numbered answers {shown}, which were not asked: its numbering "
                            f"cannot be trusted, so none of its answers was taken") for i in pending}
        got: dict[int, Any] = {}
        conflicting: set[int] = set()
        for answer in answers:
            number = getattr(answer, "number", None)
            if not isinstance(number, int):
                continue  # no readable number: an answer for no sentence
            index = number - 1
            if index in got:
                previous = got[index]
                if (previous.verdict, set(previous.error_types)) != (answer.verdict, set(answer.error_types)):
                    conflicting.add(index)  # the same verdict and kinds, in any order, are one answer
                continue
            got[index] = answer
        settled: dict[int, SentenceAnnotation] = {}
        failed: dict[int, str] = {}
        for i in pending:
            if i in conflicting:
                failed[i] = f"two different answers for sentence {i + 1}"
            elif i not in got:
                failed[i] = f"no answer for sentence {i + 1}"
            else:
                a = got[i]
                complaint = check_answer(a.verdict, a.questions, a.error_types)
                if complaint:
                    failed[i] = f"sentence {i + 1}: {complaint}"
                else:
                    settled[i] = _annotation(i, sentences[i], a.verdict, a.questions, a.error_types, attempts[i])
        return settled, failed


def build_scorer(batch_size: int = 1, concurrency: int = 4, tries: int = DEFAULT_TRIES,
                 tokens_per_sentence: int | None = DEFAULT_TOKENS_PER_SENTENCE) -> CoherenceScorer:
    """The coherence program every command uses; a compiled artifact is loaded into this object."""
    return CoherenceScorer(batch_size=batch_size, concurrency=concurrency, tries=tries,
                           tokens_per_sentence=tokens_per_sentence)
