"""Multi-document diverse summarization and its judges (DiverseSumm, seed 003).

`DiverseSummarizer` summarizes what the articles about one event say differently,
either directly from all articles (when they fit the context window) or, as the seed
does for standard-context models, by first extracting the most important sentences of
each article and then summarizing those.

`ReferenceBuilder` writes QA references the way the seed's pipeline starts: questions
over the articles, then answers extracted from each article; identical answers are
grouped and questions answered by too few articles are dropped. (The seed clusters
answers with a trained model and validates them by hand; this does neither.)

The judges are programs too: coverage of one QA pair (binary), coverage of all QA pairs
(Likert 1-10), faithfulness of a summary to one article (binary or Likert 1-10), and
pairwise comparison run in both orders and aggregated. Every rating outside its scale
is re-asked and, if it stays outside, recorded as a failure.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

import dspy

from booklens.errors import BooklensError
from booklens.lm import predict_with_retries
from booklens.metrics.bias import aggregate_both_orders
from booklens.parallel import parallel_map
from booklens.signatures.diverse import (
    CRITERIA,
    CompareSummaries,
    ExtractAnswers,
    ExtractImportantSentences,
    GenerateQuestions,
    JudgeCoverageOfAllQAs,
    JudgeCoverageOfQA,
    JudgeFaithfulnessBinary,
    JudgeFaithfulnessLikert,
    SummarizeDiverse,
    SummarizeExtractedSentences,
)
from booklens.text import split_sentences

DEFAULT_CONTEXT_WINDOW = 8192
BUDGET_MARGIN = 0.8
SUMMARY_RESERVE = 1024
METHODS = ("auto", "direct", "extract")
SCALES = {"binary": (0, 1), "likert": (1, 10)}


def _window(context_window: Optional[int]) -> int:
    if context_window:
        return context_window
    return getattr(dspy.settings.lm, "context_window", None) or DEFAULT_CONTEXT_WINDOW


def _tokens(predictor: dspy.Predict, **inputs: Any) -> int:
    from booklens.programs.qa import prompt_tokens

    return prompt_tokens(predictor, **inputs)


def article_texts(event: Any) -> list[str]:
    """The articles of an event as the summarizer reads them: '[aid] title (domain)' then content."""
    return [f"[{a.aid}] {a.as_text()}" for a in event.articles]


class DiverseSummarizer(dspy.Module):
    """Summarize the diverse and conflicting information in several articles about one event."""

    def __init__(self, method: str = "auto", *, num_sentences: int = 5, context_window: Optional[int] = None,
                 concurrency: int = 1, tries: int = 3):
        super().__init__()
        if method not in METHODS:
            raise BooklensError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
        if num_sentences < 1:
            raise BooklensError("the number of sentences per article must be at least 1")
        self.method = method
        self.num_sentences = num_sentences
        self.context_window = context_window
        self.concurrency = concurrency
        self.tries = tries
        self.summarize = dspy.Predict(SummarizeDiverse)
        self.extract = dspy.Predict(ExtractImportantSentences)
        self.summarize_extracts = dspy.Predict(SummarizeExtractedSentences)

    def budget(self) -> int:
        return int(_window(self.context_window) * BUDGET_MARGIN) - SUMMARY_RESERVE

    def fits_directly(self, articles: list[str]) -> bool:
        return _tokens(self.summarize, articles=articles) <= self.budget()

    def forward(self, articles: list[str]) -> dspy.Prediction:
        if len(articles) < 2:
            raise BooklensError("diverse summarization needs at least two articles")
        method = self.method
        if method == "auto":
            method = "direct" if self.fits_directly(articles) else "extract"
        elif method == "direct" and not self.fits_directly(articles):
            raise BooklensError(f"the articles do not fit the context window ({_window(self.context_window)} tokens) "
                                "for direct summarization; use --method extract")
        if method == "direct":
            attempt = predict_with_retries(self.summarize, tries=self.tries, check=_nonempty("summary"),
                                           articles=articles)
            return dspy.Prediction(summary=attempt.prediction.summary.strip() if attempt.ok else None,
                                   method="direct", extracts=[], error=attempt.error, attempts=attempt.attempts)

        per_article = parallel_map(self.extract_sentences, articles, concurrency=self.concurrency, desc="extract")
        extracts = []
        for article, sentences in zip(articles, per_article):
            head = article.split("\n", 1)[0]
            extracts.append(head + "\n" + "\n".join(f"- {s}" for s in sentences) if sentences else head + "\n- (none)")
        if _tokens(self.summarize_extracts, extracts=extracts) > self.budget():
            raise BooklensError("the extracted sentences do not fit the context window; lower --sentences")
        attempt = predict_with_retries(self.summarize_extracts, tries=self.tries, check=_nonempty("summary"),
                                       extracts=extracts)
        return dspy.Prediction(summary=attempt.prediction.summary.strip() if attempt.ok else None,
                               method="extract", extracts=extracts, error=attempt.error, attempts=attempt.attempts)

    def extract_sentences(self, article: str) -> list[str]:
        """The article's most important sentences, verbatim: the model picks sentence numbers, so
        an extract can never be a paraphrase or an invention. Short articles are taken whole."""
        title, _, body = article.partition("\n")
        sentences = [s.strip() for s in split_sentences(body) if s.strip()]
        if len(sentences) <= self.num_sentences:
            return sentences
        numbered = [f"[{i}] {s}" for i, s in enumerate(sentences, 1)]

        def check(pred: Any) -> Optional[str]:
            picks = getattr(pred, "picks", None) or []
            if not picks:
                return "pick at least one sentence number"
            bad = [n for n in picks if not isinstance(n, int) or not 1 <= n <= len(sentences)]
            if bad:
                return f"sentence numbers run from 1 to {len(sentences)}; {bad[0]} is not one of them"
            return None

        got = predict_with_retries(self.extract, tries=self.tries, check=check, title=title, sentences=numbered,
                                   num_sentences=self.num_sentences)
        if not got.ok:
            return []
        chosen = list(dict.fromkeys(got.prediction.picks))[: self.num_sentences]
        return [sentences[n - 1] for n in sorted(chosen)]  # in the article's order, so they read as text


def _nonempty(field: str):
    def check(pred: Any) -> Optional[str]:
        value = getattr(pred, field, None)
        if value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
            return f"empty {field}"
        return None

    return check


# ---------------------------------------------------------------------------
# QA references


_NORM = re.compile(r"[^a-z0-9]+")


def _norm(text: str) -> str:
    return _NORM.sub(" ", text.lower()).strip()


class ReferenceBuilder(dspy.Module):
    """Questions on which the articles differ, with the answers extracted from each article."""

    def __init__(self, num_questions: int = 5, *, min_answer_share: float = 0.3, context_window: Optional[int] = None,
                 concurrency: int = 1, tries: int = 3):
        super().__init__()
        self.num_questions = num_questions
        self.min_answer_share = min_answer_share
        self.context_window = context_window
        self.concurrency = concurrency
        self.tries = tries
        self.generate = dspy.Predict(GenerateQuestions)
        self.extract_answers = dspy.Predict(ExtractAnswers)

    def forward(self, articles: list[tuple[str, str]]) -> dspy.Prediction:
        """`articles`: (aid, text) pairs. Returns question_answers in the DiverseSumm format."""
        texts = [t for _, t in articles]
        # Questions are asked over as many articles as fit (the seed uses a few representative ones).
        budget = int(_window(self.context_window) * BUDGET_MARGIN) - 512
        shown = list(texts)
        while len(shown) > 1 and _tokens(self.generate, articles=shown, num_questions=self.num_questions) > budget:
            shown.pop()
        got = predict_with_retries(self.generate, tries=self.tries, check=_nonempty("questions"), articles=shown,
                                   num_questions=self.num_questions)
        if not got.ok:
            return dspy.Prediction(question_answers=[], questions=[], error=got.error)
        questions = []
        for q in got.prediction.questions:
            q = str(q).strip()
            if q and _norm(q) not in {_norm(x) for x in questions}:
                questions.append(q)
        questions = questions[: self.num_questions]
        jobs = [(q, aid, text) for q in questions for aid, text in articles]

        def answer(job: tuple[str, str, str]) -> list[str]:
            q, _, text = job
            got = predict_with_retries(self.extract_answers, tries=self.tries, article=text, question=q)
            if not got.ok:
                return []
            return [str(a).strip() for a in (got.prediction.answers or []) if str(a).strip()]

        answers = parallel_map(answer, jobs, concurrency=self.concurrency, desc="answers")
        question_answers = []
        for q in questions:
            groups: dict[str, list[dict[str, str]]] = {}
            answered: set[str] = set()
            for (jq, aid, _), found in zip(jobs, answers):
                if jq != q:
                    continue
                for a in found:
                    groups.setdefault(_norm(a), []).append({"aid": aid, "answer": a})
                    answered.add(aid)
            if len(answered) >= max(1, self.min_answer_share * len(articles)):
                question_answers.append({"question": q, "answer_groups": list(groups.values())})
        return dspy.Prediction(question_answers=question_answers, questions=questions, error=None)


# ---------------------------------------------------------------------------
# Judges


class RatingJudge(dspy.Module):
    """A single-answer grader: an explanation and an integer rating on a closed scale."""

    def __init__(self, signature: type[dspy.Signature], scale: str, tries: int = 3):
        super().__init__()
        if scale not in SCALES:
            raise BooklensError(f"unknown scale {scale!r}: use binary or likert")
        self.scale = scale
        self.judge = dspy.Predict(signature)
        self.tries = tries

    def check(self, pred: Any) -> Optional[str]:
        low, high = SCALES[self.scale]
        rating = getattr(pred, "rating", None)
        if not isinstance(rating, int) or isinstance(rating, bool) or not low <= rating <= high:
            return f"rating {rating!r} is outside the {self.scale} scale {low}-{high}"
        return None

    def forward(self, **inputs: Any) -> dspy.Prediction:
        got = predict_with_retries(self.judge, tries=self.tries, check=self.check, **inputs)
        if not got.ok:
            return dspy.Prediction(rating=None, explanation=None, error=got.error, attempts=got.attempts)
        return dspy.Prediction(rating=got.prediction.rating, explanation=str(got.prediction.explanation),
                               error=None, attempts=got.attempts)


class CoverageJudge(dspy.Module):
    """Coverage of the reference QA pairs: binary per QA pair, or Likert 1-10 over all of them."""

    def __init__(self, protocol: str = "binary", tries: int = 3, concurrency: int = 1):
        super().__init__()
        if protocol not in SCALES:
            raise BooklensError(f"unknown coverage protocol {protocol!r}: use binary or likert")
        self.protocol = protocol
        self.concurrency = concurrency
        self.rate = RatingJudge(JudgeCoverageOfQA if protocol == "binary" else JudgeCoverageOfAllQAs, protocol, tries)

    def forward(self, summary: str, qa_pairs: Sequence[Any]) -> dspy.Prediction:
        if not qa_pairs:
            raise BooklensError("coverage needs reference question_answers")
        if self.protocol == "likert":
            text = "\n\n".join(qa.as_text() for qa in qa_pairs)
            r = self.rate(summary=summary, questions_and_answers=text)
            return dspy.Prediction(score=r.rating, details=[_item(r, "all")], failed=int(r.rating is None))
        results = parallel_map(lambda qa: self.rate(summary=summary, question_and_answers=qa.as_text()),
                               list(qa_pairs), concurrency=self.concurrency, desc="coverage")
        items = [_item(r, qa.question) for r, qa in zip(results, qa_pairs)]
        return dspy.Prediction(score=_mean([r.rating for r in results]), details=items,
                               failed=sum(1 for r in results if r.rating is None))


class FaithfulnessJudge(dspy.Module):
    """Faithfulness of a summary to each article: binary or Likert 1-10; the score is the mean."""

    def __init__(self, protocol: str = "likert", tries: int = 3, concurrency: int = 1):
        super().__init__()
        if protocol not in SCALES:
            raise BooklensError(f"unknown faithfulness protocol {protocol!r}: use binary or likert")
        self.protocol = protocol
        self.concurrency = concurrency
        sig = JudgeFaithfulnessBinary if protocol == "binary" else JudgeFaithfulnessLikert
        self.rate = RatingJudge(sig, protocol, tries)

    def forward(self, summary: str, articles: Sequence[Any]) -> dspy.Prediction:
        results = parallel_map(lambda a: self.rate(summary=summary, article=a.as_text()), list(articles),
                               concurrency=self.concurrency, desc="faithfulness")
        items = [_item(r, a.aid) for r, a in zip(results, articles)]
        return dspy.Prediction(score=_mean([r.rating for r in results]), details=items,
                               failed=sum(1 for r in results if r.rating is None))


class PairwiseJudge(dspy.Module):
    """Compare two summaries on one criterion, in both orders, and aggregate the two verdicts."""

    def __init__(self, criterion: str = "coverage", tries: int = 3):
        super().__init__()
        if criterion not in CRITERIA:
            raise BooklensError(f"unknown criterion {criterion!r}: use {' or '.join(CRITERIA)}")
        self.criterion = criterion
        self.compare = dspy.Predict(CompareSummaries)
        self.tries = tries

    def one_order(self, reference: str, first: str, second: str) -> tuple[Optional[str], Optional[str], Optional[str]]:
        got = predict_with_retries(self.compare, tries=self.tries, criterion=CRITERIA[self.criterion],
                                   reference=reference, summary_a=first, summary_b=second)
        if not got.ok:
            return None, None, got.error
        return got.prediction.verdict, str(got.prediction.explanation), None

    def forward(self, reference: str, summary_1: str, summary_2: str) -> dspy.Prediction:
        v1, why1, err1 = self.one_order(reference, summary_1, summary_2)
        v2, why2, err2 = self.one_order(reference, summary_2, summary_1)
        winner = aggregate_both_orders(v1, v2) if v1 and v2 else None
        return dspy.Prediction(first_order=v1, second_order=v2, winner=winner, explanations=[why1, why2],
                               error=err1 or err2)


def _item(r: Any, key: str) -> dict[str, Any]:
    return {"key": key, "rating": r.rating, "explanation": r.explanation, "error": r.error, "attempts": r.attempts}


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return round(sum(vals) / len(vals), 4) if vals else None


# ---------------------------------------------------------------------------
# Event-level helpers used by the CLI


def pairwise_cases(event: Any, criterion: str, per_qa: bool = False) -> list[tuple[str, str]]:
    """(case id, reference text) the pairwise judge compares on: all QA pairs at once (or each QA
    pair, with `per_qa`) for coverage, each article for faithfulness."""
    if criterion == "coverage":
        if not event.question_answers:
            raise BooklensError(f"event {event.eid} has no question_answers to judge coverage against")
        if per_qa:
            return [(f"qa{i}", qa.as_text()) for i, qa in enumerate(event.question_answers, 1)]
        return [("qa", event.qa_text())]
    return [(a.aid, a.as_text()) for a in event.articles]


def judge_pairs(judge: PairwiseJudge, cases: list[tuple[str, str, str, str]], concurrency: int = 1) -> list[dict]:
    """Run the pairwise judge over (case id, reference, summary 1, summary 2) tuples."""
    def run(case: tuple[str, str, str, str]) -> dict:
        cid, reference, s1, s2 = case
        r = judge(reference=reference, summary_1=s1, summary_2=s2)
        return {"case": cid, "first_order": r.first_order, "second_order": r.second_order, "winner": r.winner,
                "explanations": r.explanations, "error": r.error}

    return parallel_map(run, cases, concurrency=concurrency, desc="pairwise")
