"""`CoherenceScorer`: BooookScore of a summary by confusion detection on its sentences.

Per-sentence mode (`batch_size=1`, the paper's setting) asks about one sentence per
call; batched mode asks about `batch_size` numbered sentences per call and checks
that every sentence got exactly one valid answer under its own number. A sentence
whose answer is missing, duplicated with a different content, or invalid (an
unknown error type, a "confusion" without a question or a type, a "no confusion"
with error types; stray questions next to "no confusion" are dropped) is asked again, alone with the other unanswered sentences of its batch,
with a fresh sample. After `tries` rounds it is recorded as a parse failure
(`status="failed"`, `confusing=None`): never retried forever, never silently
"no confusion". Sentences (or batches) of a summary run concurrently.
"""

from __future__ import annotations

from typing import Any, Sequence

import dspy

from booklens.errors import LMError
from booklens.lm import predict_with_retries
from booklens.parallel import chunked, parallel_map
from booklens.records import COHERENCE_ERROR_TYPES, SentenceAnnotation
from booklens.signatures.coherence import CONFUSION, NO_CONFUSION, DetectConfusion, DetectConfusionBatch

DEFAULT_TRIES = 3
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
    unknown = [t for t in types if t not in COHERENCE_ERROR_TYPES]
    if unknown:
        return f"unknown error type(s) {', '.join(repr(t) for t in unknown)}"
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


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__


def number_sentences(sentences: Sequence[str], indices: Sequence[int]) -> str:
    """The batched prompt's sentence list: "number: sentence" lines, numbers 1-based in the summary."""
    return "\n".join(f"{i + 1}: {' '.join(sentences[i].split())}" for i in indices)


class CoherenceScorer(dspy.Module):
    """Confusion detection on every sentence of a summary, and its BooookScore (Eq. 1)."""

    def __init__(self, batch_size: int = 1, concurrency: int = 4, tries: int = DEFAULT_TRIES,
                 tokens_per_sentence: int | None = DEFAULT_TOKENS_PER_SENTENCE):
        super().__init__()
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if tries < 1:
            raise ValueError("tries must be at least 1")
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.tries = tries
        self.tokens_per_sentence = tokens_per_sentence
        self.detect = dspy.Predict(DetectConfusion)
        self.detect_batch = dspy.Predict(DetectConfusionBatch)

    @property
    def mode(self) -> str:
        return "per-sentence" if self.batch_size == 1 else "batched"

    def forward(self, summary: str, sentences: Sequence[str] | None = None) -> dspy.Prediction:
        from booklens.metrics.booookscore import booookscore

        if sentences is None:
            from booklens.text import split_sentences

            sentences = split_sentences(summary)
        sentences = list(sentences)
        if self.batch_size == 1:
            annotations = parallel_map(
                lambda i: self._judge_one(summary, i, sentences[i]),
                range(len(sentences)),
                concurrency=self.concurrency,
                desc="sentences",
            )
        else:
            batches = chunked(list(range(len(sentences))), self.batch_size)
            per_batch = parallel_map(
                lambda idxs: self._judge_batch(summary, sentences, list(idxs)),
                batches,
                concurrency=self.concurrency,
                desc="sentence batches",
            )
            annotations = [a for batch in per_batch for a in batch]
        return dspy.Prediction(
            annotations=annotations,
            score=booookscore(annotations),
            n_failed=sum(1 for a in annotations if a.status == "failed"),
            sentences=sentences,
        )

    def _budget(self, n_sentences: int) -> dict[str, Any]:
        if self.tokens_per_sentence is None:
            return {}
        return {"max_tokens": 64 + self.tokens_per_sentence * n_sentences}

    # -- per-sentence mode -------------------------------------------------

    def _judge_one(self, summary: str, index: int, sentence: str) -> SentenceAnnotation:
        outcome = predict_with_retries(
            self.detect,
            tries=self.tries,
            check=lambda p: check_answer(p.verdict, p.questions, p.error_types),
            config=self._budget(1),
            summary=summary,
            sentence=sentence,
        )
        if not outcome.ok:
            return _failure(index, sentence, outcome.error or "no valid answer", outcome.attempts)
        p = outcome.prediction
        return _annotation(index, sentence, p.verdict, p.questions, p.error_types, outcome.attempts)

    # -- batched mode ------------------------------------------------------

    def _judge_batch(self, summary: str, sentences: Sequence[str], indices: list[int]) -> list[SentenceAnnotation]:
        done: dict[int, SentenceAnnotation] = {}
        errors: dict[int, str] = {}
        attempts = {i: 0 for i in indices}
        pending = list(indices)
        for attempt in range(self.tries):
            if not pending:
                break
            config: dict[str, Any] = self._budget(len(pending))
            if attempt:
                config.update({"booklens_attempt": attempt, "temperature": 0.7})
            for i in pending:
                attempts[i] += 1
            try:
                prediction = self.detect_batch(summary=summary, sentences=number_sentences(sentences, pending),
                                               config=config)
                answers = list(prediction.answers or [])
            except LMError:
                raise
            except Exception as exc:  # the whole answer did not parse: every pending sentence is re-asked
                for i in pending:
                    errors[i] = f"unparseable answer: {_first_line(exc)}"
                continue
            wanted = set(pending)
            got: dict[int, Any] = {}
            conflicting: set[int] = set()
            for answer in answers:
                number = getattr(answer, "number", None)
                index = number - 1 if isinstance(number, int) else None
                if index not in wanted:
                    continue  # an answer for a sentence that was not asked about: ignored
                if index in got:
                    previous = got[index]
                    if (previous.verdict, previous.error_types) != (answer.verdict, answer.error_types):
                        conflicting.add(index)
                    continue
                got[index] = answer
            for i in pending:
                if i in conflicting:
                    errors[i] = f"two different answers for sentence {i + 1}"
                elif i not in got:
                    errors[i] = f"no answer for sentence {i + 1}"
                else:
                    a = got[i]
                    complaint = check_answer(a.verdict, a.questions, a.error_types)
                    if complaint:
                        errors[i] = f"sentence {i + 1}: {complaint}"
                    else:
                        done[i] = _annotation(i, sentences[i], a.verdict, a.questions, a.error_types, attempts[i])
            pending = [i for i in pending if i not in done]
        for i in pending:
            done[i] = _failure(i, sentences[i], errors.get(i, "no valid answer"), attempts[i])
        return [done[i] for i in indices]


def build_scorer(batch_size: int = 1, concurrency: int = 4, tries: int = DEFAULT_TRIES,
                 tokens_per_sentence: int | None = DEFAULT_TOKENS_PER_SENTENCE) -> CoherenceScorer:
    """The coherence program every command uses; a compiled artifact is loaded into this object."""
    return CoherenceScorer(batch_size=batch_size, concurrency=concurrency, tries=tries,
                           tokens_per_sentence=tokens_per_sentence)
