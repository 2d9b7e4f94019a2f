"""Multi-document diverse summarization and its judges (DiverseSumm, seed 003).

`DiverseSummarizer` summarizes what the articles about one event say differently,
either directly from all articles (when they fit the context window) or, as the seed
does for standard-context models, by first extracting the most important sentences of
each article and then summarizing those.

`ReferenceBuilder` writes QA references the way the seed's pipeline does: questions
over the articles, answers extracted from each article, equivalent answers clustered,
then a filter that removes invalid answers and keeps the questions that enough articles
answer with diverse answers. (The seed clusters answers with a trained RoBERTa model, which
it found no worse than GPT-3.5 at this, and validates the result by hand; here an LLM
clusters and nobody validates.)

The judges are programs too: coverage of one QA pair (binary), coverage of all QA pairs
(Likert 1-10), faithfulness of a summary to one article (binary or Likert 1-10), and
pairwise comparison run in both orders and aggregated. Every rating outside its scale
is re-asked and, if it stays outside, recorded as a failure.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import dspy

from booklens.data.diversesumm import (
    Article,
    Event,
    QuestionAnswers,
    parse_events,
    require_question_answers,
    split_article_text,
    wording_key,
)
from booklens.errors import BooklensError, check_flag, first_line, setting_name, validation_problem
from booklens.lm import ContextWindowExceeded, filter_stopped, last_stop, predict_with_retries
from booklens.lm.base import planned_window_advice
from booklens.metrics.bias import aggregate_both_orders
from booklens.parallel import parallel_map
from booklens.programs.base import Module, Predict, prompt_tokens
from booklens.signatures.diverse import (
    CRITERION_DESCRIPTIONS,
    CompareSummaries,
    ExtractAnswers,
    ExtractImportantSentences,
    FilterAnswers,
    GenerateQuestions,
    GroupEquivalentAnswers,
    JudgeCoverageOfAllQAs,
    JudgeCoverageOfQA,
    JudgeFaithfulnessBinary,
    JudgeFaithfulnessLikert,
    SummarizeDiverse,
    SummarizeExtractedSentences,
)
from booklens.text import has_words, split_sentences
from booklens.vocabulary import (
    ANSWER_CLUSTERINGS,
    CRITERIA,
    DEFAULT_CONTEXT_WINDOW,
    DIVERSE_METHODS,
    MIN_QA_CONTEXT_WINDOW,
    RATING_SCALES,
    counted,
)

BUDGET_MARGIN = 0.8
SUMMARY_RESERVE = 1024
# Sentences the extract-then-summarize method takes from each article (the seed's Figure 14 asks for 10).
EXTRACT_SENTENCES = 10


def _check_window(context_window: Any) -> None:
    """The `diverse` command's floor on --context-window, for a library caller who skips it."""
    from booklens.parallel import check_at_least

    if context_window is not None:
        check_at_least("--context-window", context_window, MIN_QA_CONTEXT_WINDOW)


def _window(context_window: Optional[int]) -> int:
    if context_window:
        return context_window
    return getattr(dspy.settings.lm, "context_window", None) or DEFAULT_CONTEXT_WINDOW


def _listed(value: Any, name: str, what: str, kinds: tuple[type, ...]) -> list[Any]:
    """`value` as a list whose items are all of `kinds`, or one line naming `name` and `what` it takes
    (a string would be read a character at a time, a path or a number fail deep inside)."""
    if isinstance(value, str):
        raise BooklensError(f"{name} must be {what}, not one string")
    if isinstance(value, (dict, bytes)) or not isinstance(value, Iterable):
        raise BooklensError(f"{name} must be {what}, not {type(value).__name__}")
    items = list(value)
    odd = [type(item).__name__ for item in items if not isinstance(item, kinds)]
    if odd:
        raise BooklensError(f"{name} must be {what}, not a list holding {odd[0]}")
    return items


def _validated(items: list[Any], model: Any, name: str) -> list[Any]:
    """The dicts among `items` validated as `model` (as the DiverseSumm file holds them), in one line
    when one is not."""
    from pydantic import ValidationError

    out = []
    for n, item in enumerate(items, 1):
        try:
            out.append(model.model_validate(item) if isinstance(item, dict) else item)
        except ValidationError as exc:
            raise BooklensError(f"{name}: item {n}: {validation_problem(exc)}") from None
    return out


def qa_pair_list(value: Any) -> list[QuestionAnswers]:
    """Reference QA pairs as the judges take them: `QuestionAnswers`, or dicts in the DiverseSumm format."""
    what = "a list of reference QA pairs ({question, answer_groups})"
    return _validated(_listed(value, "qa_pairs", what, (QuestionAnswers, dict)), QuestionAnswers, "qa_pairs")


def article_list(value: Any) -> list[Article]:
    """Articles as the faithfulness judge takes them: `Article`, or dicts in the DiverseSumm format."""
    what = "a list of articles ({aid, content, ...})"
    return _validated(_listed(value, "articles", what, (Article, dict)), Article, "articles")


def event_list(value: Any) -> list[Event]:
    """Events as `summarize_events` takes them: `Event`s (`load_events`), or dicts validated as a
    DiverseSumm file's are."""
    items = _listed(value, "events", "a list of events (load_events(path))", (Event, dict))
    if any(isinstance(item, dict) for item in items):
        return parse_events([e.model_dump() if isinstance(e, Event) else e for e in items], "events")
    return items


class EventTooLarge(BooklensError):
    """An event whose articles, or whose extracts, do not fit the context window: that event gets
    no summary (the reason is its error); the other events go on. `method` is the one that failed
    (direct or extract), which `auto` alone does not say."""

    def __init__(self, message: str, method: Optional[str] = None):
        super().__init__(message)
        self.method = method


def article_texts(event: Any) -> list[str]:
    """The articles of an event as the summarizer reads them: a heading line, '[aid] title (domain)'
    (or '[aid]' alone), then the content (`Article.summarizer_text`)."""
    return [a.summarizer_text() for a in event.articles]


def extract_text(heading: str, sentences: Sequence[str]) -> str:
    """An article's extract as the summarizer reads it: its heading line, then a line per sentence
    ('- (none)' when nothing was picked)."""
    return heading + "\n" + ("\n".join(f"- {s}" for s in sentences) if sentences else "- (none)")


class DiverseSummarizer(Module):
    """Summarize the diverse and conflicting information in several articles about one event."""

    def __init__(self, method: str = "auto", *, num_sentences: int = EXTRACT_SENTENCES, context_window: Optional[int] = None,
                 concurrency: int = 1, tries: int = 3):
        super().__init__()
        if method not in DIVERSE_METHODS:
            raise BooklensError(f"unknown method {method!r}: use one of {', '.join(DIVERSE_METHODS)}")
        if isinstance(num_sentences, bool) or not isinstance(num_sentences, int) or num_sentences < 1:
            raise BooklensError(f"the number of sentences per article must be at least 1 (got {num_sentences!r})")
        _check_window(context_window)
        self.method = method
        self.num_sentences = num_sentences
        self.context_window = context_window
        self.concurrency = concurrency
        self.tries = tries
        self.summarize = Predict(SummarizeDiverse)
        self.extract = Predict(ExtractImportantSentences)
        self.summarize_extracts = Predict(SummarizeExtractedSentences)

    def budget(self) -> int:
        budget = int(_window(self.context_window) * BUDGET_MARGIN) - SUMMARY_RESERVE
        if budget <= 0:
            raise BooklensError(f"the context window ({_window(self.context_window)} tokens) leaves no room for the "
                                f"articles beside the {SUMMARY_RESERVE} tokens kept for the summary")
        return budget

    def fits_directly(self, articles: list[str]) -> bool:
        return prompt_tokens(self.summarize, articles=articles) <= self.budget()

    def forward(self, articles: list[str]) -> dspy.Prediction:
        """`articles`: each a heading line ('[aid] title (domain)', or '[aid]'), then its content, as
        `article_texts` writes them; or the articles (`Article`, or dicts as the events file holds them)."""
        what = "article texts (article_texts(event)) or articles"
        articles = [a.summarizer_text() if isinstance(a, Article) else a
                    for a in _validated(_listed(articles, "articles", what, (str, Article, dict)), Article, "articles")]
        if len(articles) < 2:
            raise BooklensError("diverse summarization needs at least two articles")
        headings = [split_article_text(text, n)[0] for n, text in enumerate(articles, 1)]
        method = self.method
        if method == "auto":
            method = "direct" if self.fits_directly(articles) else "extract"
        elif method == "direct" and not self.fits_directly(articles):
            extract = setting_name("--method extract", keyword="method='extract'")
            raise EventTooLarge(f"the articles do not fit the context window ({_window(self.context_window)} tokens) "
                                f"for direct summarization; use {extract}", method="direct")
        try:
            return self._run(method, articles, headings)
        except ContextWindowExceeded as exc:  # the server's window is smaller than counted: this event's size
            # A server that states no window (llama-cpp-python's) names it when it refuses: the window to plan for.
            told = planned_window_advice(exc, _window(self.context_window), "diverse summarization")
            raise EventTooLarge(first_line(told), method=method) from exc

    def _run(self, method: str, articles: list[str], headings: list[str]) -> dspy.Prediction:
        if method == "direct":
            attempt = predict_with_retries(self.summarize, tries=self.tries, check=_nonempty("summary"),
                                           articles=articles)
            return self._summary(attempt, "direct", [])

        # Before the calls that pick the sentences: where no pick of --sentences could fit, none is asked.
        if not self._extracts_fit(self.bounding_extracts(articles, headings, self.num_sentences, longest=False)):
            raise EventTooLarge(self._extracts_misfit(articles, headings, picked=False), method="extract")
        per_article = parallel_map(self.pick_sentences, articles, concurrency=self.concurrency, desc="extract")
        # An article nothing valid was picked from is shown as '- (none)'; the record says which.
        failures = [f"{head}: {error}" for head, (_, error, _) in zip(headings, per_article) if error]
        notes = [note for _, _, note in per_article if note]
        if not any(sentences for sentences, _, _ in per_article):
            return dspy.Prediction(summary=None, method="extract", extracts=[], extract_errors=failures,
                                   extract_notes=notes,
                                   error=f"no sentence was picked from any of the {len(articles)} articles "
                                         f"(first: {failures[0] if failures else 'none picked'})",
                                   attempts=0, cut_off=False)
        extracts = [extract_text(head, sentences) for head, (sentences, _, _) in zip(headings, per_article)]
        if not self._extracts_fit(extracts):
            raise EventTooLarge(self._extracts_misfit(articles, headings, picked=True), method="extract")
        attempt = predict_with_retries(self.summarize_extracts, tries=self.tries, check=_nonempty("summary"),
                                       extracts=extracts)
        return self._summary(attempt, "extract", extracts, failures, notes)

    def _extracts_fit(self, extracts: list[str]) -> bool:
        return prompt_tokens(self.summarize_extracts, extracts=extracts) <= self.budget()

    @staticmethod
    def bounding_extracts(articles: list[str], headings: list[str], n: int, *, longest: bool) -> list[str]:
        """The longest (or shortest) extracts any pick of `n` sentences per article makes: each article's
        `n` longest (shortest) sentences, in its order; an article of `n` or fewer, whole."""
        from booklens.text import count_tokens

        extracts = []
        for article, head in zip(articles, headings):
            sentences = [s.strip() for s in split_sentences(split_article_text(article)[1]) if s.strip()]
            if len(sentences) > n:
                ranked = sorted(range(len(sentences)), key=lambda i: count_tokens(sentences[i]), reverse=longest)
                sentences = [sentences[i] for i in sorted(ranked[:n])]
            extracts.append(extract_text(head, sentences))
        return extracts

    def _extracts_misfit(self, articles: list[str], headings: list[str], *, picked: bool) -> str:
        """Why an event's extracts do not fit the summarizer's prompt (`picked`: the sentences picked;
        else every pick of --sentences), and what does: the most --sentences whose every pick fits, else
        the window in which every pick of one sentence per article fits beside the room kept for the
        summary."""
        window = _window(self.context_window)
        what = "the extracted sentences do not" if picked else \
            f"no pick of {self.num_sentences} sentences per article can"
        fitting = next((n for n in range(self.num_sentences - 1, 0, -1)
                        if self._extracts_fit(self.bounding_extracts(articles, headings, n, longest=True))), 0)
        if fitting:
            return (f"{what} fit the context window ({window} tokens); lower {setting_name('--sentences')} to "
                    f"{fitting}" + (" or less" if fitting > 1 else ""))
        longest = prompt_tokens(self.summarize_extracts,
                                extracts=self.bounding_extracts(articles, headings, 1, longest=True))
        needed = math.ceil((longest + SUMMARY_RESERVE) / BUDGET_MARGIN)
        while int(needed * BUDGET_MARGIN) - SUMMARY_RESERVE < longest:  # as `budget` rounds
            needed += 1
        return (f"{what} fit the context window ({window} tokens) beside the {SUMMARY_RESERVE} tokens kept for the "
                f"summary, and one sentence from each of the {len(articles)} articles needs a window of {needed:,} "
                "tokens or more")

    @staticmethod
    def _summary(attempt: Any, method: str, extracts: list[str], extract_errors: Sequence[str] = (),
                 extract_notes: Sequence[str] = ()) -> dspy.Prediction:
        """The prediction of a summarize call; `cut_off` when the answer ran into the output token
        limit (kept, since the seed lets summaries run long, but flagged)."""
        return dspy.Prediction(summary=attempt.prediction.summary.strip() if attempt.ok else None, method=method,
                               extracts=extracts, extract_errors=list(extract_errors),
                               extract_notes=list(extract_notes), error=attempt.error,
                               attempts=attempt.attempts, cut_off=attempt.ok and last_stop() == "length")

    def extract_sentences(self, article: str) -> list[str]:
        """The article's most important sentences, verbatim: the model picks sentence numbers, so
        an extract can never be a paraphrase or an invention. Short articles are taken whole."""
        return self.pick_sentences(article)[0]

    def pick_sentences(self, article: str) -> tuple[list[str], Optional[str], Optional[str]]:
        """`extract_sentences`, with why nothing was picked (the last refusal) when no valid pick came,
        and a note when the article was too long to offer whole: its sentences are then offered as
        far as the window holds them (one long article no longer costs its event the summary)."""
        title, body = split_article_text(article)
        sentences = [s.strip() for s in split_sentences(body) if s.strip()]
        if len(sentences) <= self.num_sentences:
            return sentences, None, None
        numbered = [f"[{i}] {s}" for i, s in enumerate(sentences, 1)]
        note = None
        shown = self._sentences_that_fit(title, numbered)
        if shown < len(numbered):
            if shown == 0:  # not even the first sentence fits: the server would refuse the call
                tokens = prompt_tokens(self.extract, title=title, sentences=numbered[:1],
                                       num_sentences=self.num_sentences)
                raise EventTooLarge(f"an article ({title.strip()[:80]!r}) is too long to pick sentences from: the "
                                    f"prompt with its first sentence is {tokens} tokens, the context window "
                                    f"({_window(self.context_window)} tokens) leaves {self.budget()}",
                                    method="extract")
            note = (f"{title}: picked from the first {shown} of {len(sentences)} sentences (the rest do not fit the "
                    f"context window)")
            sentences, numbered = sentences[:shown], numbered[:shown]
            if shown <= self.num_sentences:
                return sentences, None, note

        def check(pred: Any) -> Optional[str]:
            picks = getattr(pred, "picks", None) or []
            if not picks:
                return "pick at least one sentence number"
            bad = [n for n in picks if not isinstance(n, int) or not 1 <= n <= len(sentences)]
            if bad:
                return f"sentence numbers run from 1 to {len(sentences)}; {bad[0]} is not one of them"
            return filter_stopped("picks")

        got = predict_with_retries(self.extract, tries=self.tries, check=check, title=title, sentences=numbered,
                                   num_sentences=self.num_sentences)
        if not got.ok:
            return [], got.error or "no valid pick", note
        chosen = list(dict.fromkeys(got.prediction.picks))[: self.num_sentences]
        return [sentences[n - 1] for n in sorted(chosen)], None, note  # in the article's order, so they read as text

    def _sentences_that_fit(self, title: str, numbered: list[str]) -> int:
        """How many of the numbered sentences, from the first, fit the picking prompt in the budget."""
        def fits(n: int) -> bool:
            return prompt_tokens(self.extract, title=title, sentences=numbered[:n],
                                 num_sentences=self.num_sentences) <= self.budget()

        if fits(len(numbered)):
            return len(numbered)
        low, high = 0, len(numbered)  # low sentences fit (none, to begin with), high do not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return low


def _nonempty(field: str):
    def check(pred: Any) -> Optional[str]:
        value = getattr(pred, field, None)
        if value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
            return f"empty {field}"
        if isinstance(value, str) and not has_words(value):  # '...': judged, it would be faithful to every article
            return f"the {field} has no words"
        # What the filter withheld may be most of the answer: not kept as if finished.
        return filter_stopped(field)

    return check


# ---------------------------------------------------------------------------
# QA references


def is_question(text: str) -> bool:
    """Whether a generated item can be a question: it has a letter. A small model breaks the JSON of
    its list into items ("2", "]", " ,"), each of which would be answered by every article."""
    return any(ch.isalpha() for ch in text)


def _has_questions(pred: Any) -> Optional[str]:
    """`_nonempty` for the list of questions, which also needs one item that can be a question."""
    problem = _nonempty("questions")(pred)
    if problem is None and not any(is_question(str(q)) for q in pred.questions):
        return "write the questions as text: no item of the list has a letter"
    return problem


def _numbered(answers: Sequence[tuple[str, str]]) -> list[str]:
    return [f"[{n}] ({aid}) {text}" for n, (aid, text) in enumerate(answers, 1)]


def _numbers_in_range(values: Any, count: int, field: str) -> Optional[str]:
    bad = [v for v in (values or []) if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= count]
    if bad:
        return f"{field}: answer numbers run from 1 to {count}; {bad[0]!r} is not one of them"
    return None


def exact_groups(answers: Sequence[tuple[str, str]]) -> list[list[int]]:
    """Answers grouped when they are the same text up to case and punctuation (0-based indices)."""
    groups: dict[str, list[int]] = {}
    for i, (_, text) in enumerate(answers):
        groups.setdefault(wording_key(text), []).append(i)
    return list(groups.values())


class ReferenceBuilder(Module):
    """Questions on which the articles differ, with the answers extracted from each article,
    built the way the seed's pipeline builds DiverseSumm's references (§3.1):

    1. questions about the event, asked over as many articles as fit the window;
    2. answers extracted from each article for each question (verbatim sentences, at most five
       words changed, every answer the article holds);
    3. equivalent answers grouped into clusters (`clustering="llm"`; `"exact"` groups only
       identical wording);
    4. the post-processing filter: invalid answers removed, and a question kept only when at
       least `min_answer_share` of the articles still answer it and its answers are diverse,
       i.e. the answers the filter names as conflicting or different fall in at least two
       clusters (`diversity_filter=False` keeps every question answered by enough articles).

    The seed's references were then validated by people; generated references are not.
    """

    def __init__(self, num_questions: int = 5, *, min_answer_share: float = 0.3, clustering: str = "llm",
                 diversity_filter: bool = True, context_window: Optional[int] = None, concurrency: int = 1,
                 tries: int = 3):
        super().__init__()
        from booklens.parallel import check_at_least

        if clustering not in ANSWER_CLUSTERINGS:
            raise BooklensError(f"unknown answer clustering {clustering!r}: use {' or '.join(ANSWER_CLUSTERINGS)}")
        check_at_least("--generate-questions", num_questions)
        _check_window(context_window)
        self.num_questions = num_questions
        self.min_answer_share = min_answer_share
        self.clustering = clustering
        self.diversity_filter = diversity_filter
        self.context_window = context_window
        self.concurrency = concurrency
        self.tries = tries
        self.generate = Predict(GenerateQuestions)
        self.extract_answers = Predict(ExtractAnswers)
        self.group = Predict(GroupEquivalentAnswers)
        self.filter = Predict(FilterAnswers)

    def budget(self) -> int:
        return int(_window(self.context_window) * BUDGET_MARGIN) - 512

    def forward(self, articles: list[tuple[str, str]]) -> dspy.Prediction:
        """`articles`: (aid, text) pairs. Returns `question_answers` in the DiverseSumm format, the
        generated `questions`, and per question the `screening` that kept or dropped it."""
        articles = _listed(articles, "articles", "(aid, text) pairs", (tuple, list))
        if any(len(pair) != 2 or not all(isinstance(x, str) for x in pair) for pair in articles):
            raise BooklensError("articles must be (aid, text) pairs, both text")
        texts = [t for _, t in articles]
        # Questions are asked over as many articles as fit (the seed uses a few representative ones).
        shown = list(texts)
        while len(shown) > 1 and prompt_tokens(self.generate, articles=shown, num_questions=self.num_questions) > self.budget():
            shown.pop()
        try:
            got = predict_with_retries(self.generate, tries=self.tries, check=_has_questions, articles=shown,
                                       num_questions=self.num_questions)
        except ContextWindowExceeded as exc:  # even the first article is too long: this event gets none
            return dspy.Prediction(question_answers=[], questions=[], screening=[], error=first_line(exc))
        if not got.ok:
            return dspy.Prediction(question_answers=[], questions=[], screening=[], error=got.error)
        questions: list[str] = []
        for q in got.prediction.questions:
            q = str(q).strip()
            if is_question(q) and wording_key(q) not in {wording_key(x) for x in questions}:
                questions.append(q)
        questions = questions[: self.num_questions]
        failed: dict[str, list[str]] = {q: [] for q in questions}
        answers = self.extract_all(articles, questions, failed)
        clusters = parallel_map(lambda q: self.cluster(q, answers[q]), questions, concurrency=self.concurrency,
                                desc="cluster")
        if self.diversity_filter:
            shown = self.articles_for_filter(texts, questions, answers)
            verdicts = parallel_map(lambda q: self.screen(shown, q, answers[q]), questions,
                                    concurrency=self.concurrency, desc="filter")
        else:
            verdicts = [None] * len(questions)
        question_answers, screening = [], []
        for q, groups, verdict in zip(questions, clusters, verdicts):
            qa, record = self.decide(q, answers[q], groups, verdict, len(articles), failed[q])
            screening.append(record)
            if qa is not None:
                question_answers.append(qa)
        return dspy.Prediction(question_answers=question_answers, questions=questions, screening=screening, error=None)

    def extract_all(self, articles: list[tuple[str, str]], questions: list[str],
                    failed: Optional[dict[str, list[str]]] = None) -> dict[str, list[tuple[str, str]]]:
        """{question: [(aid, answer), ...]} over every article. Calls about one article follow each
        other, so a backend that keeps the prompt prefix reads each article once. An extraction
        without a valid answer adds 'aid: error' to `failed[question]`."""
        jobs = [(aid, text, q) for aid, text in articles for q in questions]

        def answer(job: tuple[str, str, str]) -> tuple[list[str], Optional[str]]:
            _, text, q = job
            try:
                got = predict_with_retries(self.extract_answers, tries=self.tries, article=text, question=q,
                                           check=lambda p: filter_stopped("answers"))
            except ContextWindowExceeded as exc:  # this article is too long to read whole: it gives no answer
                return [], first_line(exc)
            if not got.ok:
                return [], got.error or "no valid answer"
            return [str(a).strip() for a in (got.prediction.answers or []) if str(a).strip()], None

        found = parallel_map(answer, jobs, concurrency=self.concurrency, desc="answers")
        by_question: dict[str, list[tuple[str, str]]] = {q: [] for q in questions}
        for (aid, _, q), (texts, error) in zip(jobs, found):  # in article order, whatever the concurrency
            by_question[q].extend((aid, a) for a in texts)
            if error and failed is not None:
                failed.setdefault(q, []).append(f"{aid}: {error}")
        return by_question

    def cluster(self, question: str, answers: list[tuple[str, str]]) -> dict[str, Any]:
        """{groups: 0-based answer indices per cluster, error}. Answers the model leaves out become
        clusters of their own; if it never gives valid numbers, identical wording is grouped."""
        if self.clustering == "exact" or len(answers) < 2:
            return {"groups": exact_groups(answers), "error": None}
        try:
            got = predict_with_retries(
                self.group, tries=self.tries, question=question, answers=_numbered(answers),
                check=lambda p: (None if getattr(p, "groups", None) else "no groups")
                or _numbers_in_range([n for g in p.groups for n in (g or [])], len(answers), "groups")
                or filter_stopped("groups"))
            error = None if got.ok else (got.error or "no valid groups")
        except ContextWindowExceeded as exc:  # too many answers to show at once: grouped by wording
            error = first_line(exc)
        if error is not None:
            return {"groups": exact_groups(answers), "error": f"clustering failed ({error}); identical answers "
                                                               "grouped instead"}
        seen: set[int] = set()
        groups: list[list[int]] = []
        for group in got.prediction.groups:
            members = [n - 1 for n in dict.fromkeys(group or []) if n - 1 not in seen]
            seen.update(members)
            if members:
                groups.append(members)
        groups += [[i] for i in range(len(answers)) if i not in seen]
        return {"groups": groups, "error": None}

    def articles_for_filter(self, texts: list[str], questions: list[str],
                            answers: dict[str, list[tuple[str, str]]]) -> list[str]:
        """The articles the filter reads: as many as fit next to the longest answer list, the same
        for every question of the event so that its calls share the articles as a prefix."""
        if not questions:
            return []
        longest = max(questions, key=lambda q: sum(len(a) for _, a in answers[q]))
        shown = list(texts)
        numbered = _numbered(answers[longest])
        while len(shown) > 1 and prompt_tokens(self.filter, articles=shown, question=longest, answers=numbered) > self.budget():
            shown.pop()
        return shown

    def screen(self, shown: list[str], question: str, answers: list[tuple[str, str]]) -> dict[str, Any]:
        """The filter's verdict on one question: {invalid, diverse (0-based indices), error}."""
        if not answers:
            return {"invalid": [], "diverse": [], "error": None}

        def check(p: Any) -> Optional[str]:
            return (_numbers_in_range(getattr(p, "invalid", None), len(answers), "invalid")
                    or _numbers_in_range(getattr(p, "diverse", None), len(answers), "diverse")
                    or filter_stopped("screening"))

        try:
            got = predict_with_retries(self.filter, tries=self.tries, check=check, articles=shown, question=question,
                                       answers=_numbered(answers))
        except ContextWindowExceeded as exc:  # this question's answers are too many to show: it is dropped
            return {"invalid": [], "diverse": [], "error": first_line(exc)}
        if not got.ok:
            return {"invalid": [], "diverse": [], "error": got.error}
        invalid = sorted({n - 1 for n in got.prediction.invalid or []})
        diverse = sorted({n - 1 for n in got.prediction.diverse or []} - set(invalid))
        return {"invalid": invalid, "diverse": diverse, "error": None}

    def decide(self, question: str, answers: list[tuple[str, str]], clusters: dict[str, Any],
               verdict: Optional[dict[str, Any]], n_articles: int, failed: Sequence[str] = ()
               ) -> tuple[Optional[dict[str, Any]], dict[str, Any]]:
        """The question in the DiverseSumm format (or None when dropped) and the record of why;
        `failed`: the articles whose extraction gave no valid answer ('aid: error'), counted apart
        from the articles that do not answer."""
        invalid = set(verdict["invalid"]) if verdict else set()
        groups = [[i for i in g if i not in invalid] for g in clusters["groups"]]
        groups = [g for g in groups if g]
        answering = {answers[i][0] for g in groups for i in g}
        needed = articles_needed(self.min_answer_share, n_articles)
        record: dict[str, Any] = {
            "question": question, "answers": len(answers), "invalid_answers": len(invalid), "clusters": len(groups),
            "articles_answering": len(answering), "clustering_error": clusters["error"],
            "extraction_failures": len(failed), "extraction_error": failed[0] if failed else None,
        }
        reason = None
        if verdict is not None:
            cluster_of = {i: c for c, g in enumerate(groups) for i in g}
            diverse_clusters = {cluster_of[i] for i in verdict["diverse"] if i in cluster_of}
            record["diverse_clusters"] = len(diverse_clusters)
            record["filter_error"] = verdict["error"]
            if verdict["error"]:
                reason = f"the diversity filter gave no valid verdict ({verdict['error']})"
        if reason is None and len(answering) < needed:
            reason = f"answered by {len(answering)} of {n_articles} articles (needs at least {needed})"
            if failed:
                reason += f"; {counted(len(failed), 'article')} gave no valid answer"
        if reason is None and verdict is not None and record["diverse_clusters"] < 2:
            reason = "the answers are not diverse (fewer than two clusters of conflicting or different answers)"
        record["kept"] = reason is None
        record["reason"] = reason
        if reason is not None:
            return None, record
        answer_groups = [[{"aid": answers[i][0], "answer": answers[i][1]} for i in g] for g in groups]
        return {"question": question, "answer_groups": answer_groups}, record


def articles_needed(share: float, n_articles: int) -> int:
    """The fewest articles that must answer a kept question: `share` of them (at least one), rounded
    up, since a count of articles reaches a fraction only at the next whole number."""
    return math.ceil(max(1, share * n_articles))


# ---------------------------------------------------------------------------
# Judges

# The run's check of a window a server named in refusing a judge's prompt (`refused_windows`).
_refused: ContextVar[Optional[Callable[[int], Optional[str]]]] = ContextVar("refused_windows", default=None)


@contextmanager
def refused_windows(misfit: Callable[[int], Optional[str]]) -> Iterator[None]:
    """Within this block, the first refusal of a judge's prompt at a window the server names (as
    llama-cpp-python's, which states no window beforehand, names it only there) for which
    `misfit(window)` gives a line (`judgments_misfit`: no judgment of one of the run's figures fits
    it) ends the run in that line, a `BooklensError` as a stated window gives it before any call,
    rather than after a refused call for every other judgment. Other refusals fail their judgment."""
    token = _refused.set(misfit)  # `parallel_map` runs each judgment in a copy of this context
    try:
        yield
    finally:
        _refused.reset(token)


def _refused_judgment(exc: ContextWindowExceeded) -> str:
    """The error line a judgment the server refused as too long keeps, or the line that ends the
    run when none of a figure's judgments fits the window it named (`refused_windows`)."""
    misfit = _refused.get()
    line = misfit(exc.window) if misfit is not None and exc.window else None
    if line:
        raise BooklensError(line) from None
    return first_line(exc)


class RatingJudge(Module):
    """A single-answer grader: an explanation and an integer rating on a closed scale."""

    def __init__(self, signature: type[dspy.Signature], scale: str, tries: int = 3):
        super().__init__()
        if scale not in RATING_SCALES:
            raise BooklensError(f"unknown scale {scale!r}: use binary or likert")
        self.scale = scale
        self.judge = Predict(signature)
        self.tries = tries

    def check(self, pred: Any) -> Optional[str]:
        low, high = RATING_SCALES[self.scale]
        rating = getattr(pred, "rating", None)
        if not isinstance(rating, int) or isinstance(rating, bool) or not low <= rating <= high:
            return f"rating {rating!r} is outside the {self.scale} scale {low}-{high}"
        return filter_stopped("rating")

    def forward(self, **inputs: Any) -> dspy.Prediction:
        try:
            got = predict_with_retries(self.judge, tries=self.tries, check=self.check, **inputs)
        except ContextWindowExceeded as exc:  # this article (or reference) is too long: one judgment fails
            return dspy.Prediction(rating=None, explanation=None, error=_refused_judgment(exc), attempts=1)
        if not got.ok:
            return dspy.Prediction(rating=None, explanation=None, error=got.error, attempts=got.attempts)
        return dspy.Prediction(rating=got.prediction.rating, explanation=str(got.prediction.explanation),
                               error=None, attempts=got.attempts)


class CoverageJudge(Module):
    """Coverage of the reference QA pairs: binary per QA pair, or Likert 1-10 over all of them."""

    def __init__(self, protocol: str = "binary", tries: int = 3, concurrency: int = 1):
        super().__init__()
        if protocol not in RATING_SCALES:
            raise BooklensError(f"unknown coverage protocol {protocol!r}: use binary or likert")
        self.protocol = protocol
        self.concurrency = concurrency
        self.rate = RatingJudge(JudgeCoverageOfQA if protocol == "binary" else JudgeCoverageOfAllQAs, protocol, tries)

    def forward(self, summary: str, qa_pairs: Sequence[Any]) -> dspy.Prediction:
        from booklens.inputs import summary_text

        summary, qa_pairs = summary_text(summary), qa_pair_list(qa_pairs)
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


class FaithfulnessJudge(Module):
    """Faithfulness of a summary to each article: binary or Likert 1-10; the score is the mean."""

    def __init__(self, protocol: str = "likert", tries: int = 3, concurrency: int = 1):
        super().__init__()
        if protocol not in RATING_SCALES:
            raise BooklensError(f"unknown faithfulness protocol {protocol!r}: use binary or likert")
        self.protocol = protocol
        self.concurrency = concurrency
        sig = JudgeFaithfulnessBinary if protocol == "binary" else JudgeFaithfulnessLikert
        self.rate = RatingJudge(sig, protocol, tries)

    def forward(self, summary: str, articles: Sequence[Any]) -> dspy.Prediction:
        from booklens.inputs import summary_text

        summary, articles = summary_text(summary), article_list(articles)
        results = parallel_map(lambda a: self.rate(summary=summary, article=a.as_text()), list(articles),
                               concurrency=self.concurrency, desc="faithfulness")
        items = [_item(r, a.aid) for r, a in zip(results, articles)]
        return dspy.Prediction(score=_mean([r.rating for r in results]), details=items,
                               failed=sum(1 for r in results if r.rating is None))


class PairwiseJudge(Module):
    """Compare two summaries on one criterion, in both orders, and aggregate the two verdicts."""

    def __init__(self, criterion: str = "coverage", tries: int = 3):
        super().__init__()
        if criterion not in CRITERIA:
            raise BooklensError(f"unknown criterion {criterion!r}: use {' or '.join(CRITERIA)}")
        self.criterion = criterion
        self.compare = Predict(CompareSummaries)
        self.tries = tries

    def one_order(self, reference: str, first: str, second: str) -> tuple[Optional[str], Optional[str], Optional[str]]:
        try:
            got = predict_with_retries(self.compare, tries=self.tries, check=lambda p: filter_stopped("verdict"),
                                       criterion=CRITERION_DESCRIPTIONS[self.criterion],
                                       reference=reference, summary_a=first, summary_b=second)
        except ContextWindowExceeded as exc:  # this case is too long: it fails, the others go on
            return None, None, _refused_judgment(exc)
        if not got.ok:
            return None, None, got.error
        return got.prediction.verdict, str(got.prediction.explanation), None

    def forward(self, reference: str, summary_1: str, summary_2: str) -> dspy.Prediction:
        from booklens.inputs import summary_text

        summary_1, summary_2 = summary_text(summary_1), summary_text(summary_2)
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
# Over events (the `booklens diverse`, `judge` and `bias` runs are in booklens.diverse_runs)


def pairwise_cases(event: Any, criterion: str, per_qa: bool = False,
                   max_articles: Optional[int] = None) -> list[tuple[str, str]]:
    """(case id, reference text) the pairwise judge compares on: all QA pairs at once (or each QA
    pair, with `per_qa`) for coverage, each article (the first `max_articles`) for faithfulness."""
    if criterion == "coverage":
        require_question_answers([event])
        if per_qa:
            return [(f"qa{i}", qa.as_text()) for i, qa in enumerate(event.question_answers, 1)]
        return [("qa", event.qa_text())]
    return [(a.aid, a.as_text()) for a in _articles(event, max_articles)]


def judge_pairs(judge: PairwiseJudge, cases: list[tuple[str, str, str, str]], concurrency: int = 1) -> list[dict]:
    """Run the pairwise judge over (case id, reference, summary 1, summary 2) tuples."""
    def run(case: tuple[str, str, str, str]) -> dict:
        cid, reference, s1, s2 = case
        r = judge(reference=reference, summary_1=s1, summary_2=s2)
        return {"case": cid, "first_order": r.first_order, "second_order": r.second_order, "winner": r.winner,
                "explanations": r.explanations, "error": r.error}

    return parallel_map(run, cases, concurrency=concurrency, desc="pairwise")


def _articles(event: Any, max_articles: Optional[int]) -> list[Any]:
    return event.articles[:max_articles] if max_articles else list(event.articles)


def rate_event(criterion: str, protocol: str, event: Any, summary: str, *, max_articles: Optional[int] = None,
               concurrency: int = 1, qa_pairs: Optional[Sequence[Any]] = None) -> dict[str, Any]:
    """One single-answer judgment of a summary: {score, judgments, failed}."""
    if criterion not in CRITERIA:  # anything else was judged as faithfulness
        raise BooklensError(f"unknown criterion {criterion!r}: use {' or '.join(CRITERIA)}")
    if criterion == "coverage":
        r = CoverageJudge(protocol, concurrency=concurrency)(summary=summary,
                                                             qa_pairs=qa_pairs or event.question_answers)
    else:
        r = FaithfulnessJudge(protocol, concurrency=concurrency)(summary=summary,
                                                                 articles=_articles(event, max_articles))
    return {"score": r.score, "judgments": r.details, "failed": r.failed}


# Room a judge's answer (a few sentences and a rating or verdict) is given when its prompt is checked
# against a window. Not the whole answer budget: llama.cpp's servers write as far as the window goes,
# and the strict ones are asked again with the room it leaves (`booklens.lm.remote`).
JUDGE_ANSWER_ROOM = 128

_RATED_PROMPTS = {("coverage", "binary"): (JudgeCoverageOfQA, "question_and_answers"),
                  ("coverage", "likert"): (JudgeCoverageOfAllQAs, "questions_and_answers"),
                  ("faithfulness", "binary"): (JudgeFaithfulnessBinary, "article"),
                  ("faithfulness", "likert"): (JudgeFaithfulnessLikert, "article")}


def judgment_tokens(criterion: str, protocol: str, reference: str, summaries: Sequence[str]) -> int:
    """Tokens of the prompt one judgment sends: a rating (`protocol` binary or likert) of
    `summaries[0]` against `reference`, or a pairwise comparison of the two `summaries` (either order:
    the same size)."""
    if protocol == "pairwise":
        return prompt_tokens(Predict(CompareSummaries), criterion=CRITERION_DESCRIPTIONS[criterion],
                             reference=reference, summary_a=summaries[0], summary_b=summaries[-1])
    signature, field = _RATED_PROMPTS[(criterion, protocol)]
    return prompt_tokens(Predict(signature), summary=summaries[0], **{field: reference})


def _references(event: Any, criterion: str, protocol: str, per_qa: bool,
                max_articles: Optional[int]) -> list[tuple[str, str]]:
    """(case id, reference text) of each judgment of `event`, as the judges send them: a binary
    coverage rating is one per QA pair, a Likert one all QA pairs at once."""
    if criterion == "coverage" and protocol != "pairwise":
        per_qa = protocol == "binary"
    return pairwise_cases(event, criterion, per_qa, max_articles)


def _shown(case: str) -> str:
    if case == "qa":
        return "its reference QA pairs"
    return f"reference QA pair {case[2:]}" if case.startswith("qa") else f"article [{case}]"


def check_judgments_fit(jobs: Sequence[tuple[str, Any, str, str, Sequence[str]]], window: Optional[int], *,
                        per_qa: bool = False, max_articles: Optional[int] = None,
                        protocol_option: bool = False, window_option: Optional[str] = None,
                        summary_room: int = 0) -> None:
    """A one-line `BooklensError`, before any call, when no judgment of one of a run's figures fits a
    `window`-token context beside its answer (`judgments_misfit`): the server would refuse every one, and
    the run would end in a line that names no setting."""
    misfit = judgments_misfit(jobs, window, per_qa=per_qa, max_articles=max_articles,
                              protocol_option=protocol_option, window_option=window_option,
                              summary_room=summary_room)
    if misfit:
        raise BooklensError(misfit)


def judgments_misfit(jobs: Sequence[tuple[str, Any, str, str, Sequence[str]]], window: Optional[int], *,
                     per_qa: bool = False, max_articles: Optional[int] = None,
                     protocol_option: bool = False, window_option: Optional[str] = None,
                     summary_room: int = 0) -> Optional[str]:
    """Why no judgment of one of a run's figures fits a `window`-token context beside its answer, and
    what does, in one line; None when each figure has one that fits (those that do not fail alone, as a
    server's refusal makes them). For coverage of all QA pairs at once it names one QA pair at a time
    (`--per-qa` for pairwise, `--protocol binary` where `protocol_option`, as `judge` has it) when each
    pair fits with `BUDGET_MARGIN` to spare (a server's tokenizer may count more).
    `jobs`: (figure, event, criterion, protocol, summaries) as the run judges them, `figure` named as
    the run's output names it ('coverage likert'); `window_option`: the option that gave the window, named
    with the least window that holds the prompt and, where `summary_room` (the tokens a summary not yet
    written may take, left out of `jobs`), the window that holds it with such a summary. No window, no check."""
    if not window:
        return None
    room = window - JUDGE_ANSWER_ROOM
    first: dict[str, tuple[Any, str, str, Sequence[str], str, int]] = {}  # figure: its first misfit
    fitting: set[str] = set()  # figures with a judgment that fits
    for figure, event, criterion, protocol, summaries in jobs:
        if figure in fitting:
            continue
        for case, reference in _references(event, criterion, protocol, per_qa, max_articles):
            tokens = judgment_tokens(criterion, protocol, reference, summaries)
            if tokens <= room:
                fitting.add(figure)
                break
            first.setdefault(figure, (event, criterion, protocol, summaries, case, tokens))
    refused = [(figure, misfit) for figure, misfit in first.items() if figure not in fitting]
    if not refused:
        return None
    figure, (event, criterion, protocol, summaries, case, tokens) = refused[0]
    fix = ""
    if case == "qa" and (protocol == "pairwise" or protocol_option):
        advised = int(room * BUDGET_MARGIN)
        each = "pairwise" if protocol == "pairwise" else "binary"
        if all(judgment_tokens(criterion, each, reference, summaries) <= advised
               for _, reference in pairwise_cases(event, criterion, True)):
            fix = ("compare on each QA pair with --per-qa, or " if protocol == "pairwise" else
                   "judge each QA pair alone with --protocol binary, or ")
    if not fix and window_option:  # the window was given: name the least that holds the prompt
        least = tokens + JUDGE_ANSWER_ROOM
        with_summary = f" ({least + summary_room} holds a summary of the {summary_room} tokens kept for it)"
        fix = f"set {window_option} to {least} or more{with_summary if summary_room else ''}, or "
    return (f"the {criterion} judge's prompt for event {event.eid} with {_shown(case)} is {tokens} tokens, more "
            f"than the {room} the {window}-token context window holds beside its answer, and no {figure} judgment "
            f"fits; {fix}use a model or server with a larger context window")


# What `summarize_events` takes for a setting not given (None). A setting given where it does
# nothing is refused, its default value too: the record would list it as if it had applied.
EVENT_DEFAULTS: dict[str, Any] = {"sentences": EXTRACT_SENTENCES, "clustering": "llm", "diversity_filter": True,
                                  "faithfulness": ("likert",)}


def check_event_options(events: list[Any], *, method: str, sentences: Optional[int], generate_questions: int,
                        clustering: Optional[str], diversity_filter: Optional[bool], judge: bool,
                        faithfulness: Optional[Sequence[str]], max_articles: Optional[int],
                        context_window: Optional[int], concurrency: int) -> None:
    """The settings of `summarize_events`, checked before any call (and before `run_diverse` sets
    up its LM): a count of the wrong type or out of the commands' bounds, and a setting given that
    would do nothing, are one line. None is a setting not given (`EVENT_DEFAULTS`)."""
    from booklens.parallel import check_at_least

    if sentences is not None:
        check_at_least("--sentences", sentences)
    check_at_least("--generate-questions", generate_questions, 0)
    check_at_least("--concurrency", concurrency)
    if max_articles is not None:
        check_at_least("--max-articles", max_articles)
    _check_window(context_window)
    check_flag("judge", judge)
    if diversity_filter is not None:
        check_flag("diversity_filter", diversity_filter)
    what = f"a list of protocols ({', '.join(RATING_SCALES)})"
    for protocol in _listed(faithfulness, "faithfulness", what, (str,)) if faithfulness is not None else []:
        if protocol not in RATING_SCALES:
            raise BooklensError(f"unknown faithfulness protocol {protocol!r}: use {' or '.join(RATING_SCALES)}")
    # Settings that would do nothing: refused, not recorded as if they had applied.
    if method == "direct" and sentences is not None:
        method_name = setting_name("--method")
        raise BooklensError(f"{setting_name('--sentences')} sets what {method_name} extract takes from each article; "
                            f"{method_name} direct reads the articles whole")
    if not generate_questions and (clustering is not None or diversity_filter is not None):
        raise BooklensError(f"{setting_name('--answer-clustering', keyword='clustering')} and "
                            f"{setting_name('--diversity-filter/--no-diversity-filter', keyword='diversity_filter')} "
                            f"shape generated references: add {setting_name('--generate-questions')} N")
    if not judge and (max_articles is not None or faithfulness):
        raise BooklensError(f"{setting_name('--faithfulness')} and {setting_name('--max-articles')} set how "
                            f"summaries are judged, and {setting_name('--no-judge', keyword='judge=False')} judges "
                            "none")
    if max_articles is not None and faithfulness is not None and not faithfulness:
        raise BooklensError(f"{setting_name('--max-articles')} limits the articles faithfulness is judged against; "
                            f"{setting_name('--faithfulness')} none judges none")
    if generate_questions and all(event.question_answers for event in events):
        raise BooklensError(f"{setting_name('--generate-questions')} N builds references only for events without "
                            "question_answers, and every event has its own")


def event_settings(**given: Any) -> dict[str, Any]:
    """`summarize_events`' settings with those not given (None) at their defaults."""
    return {name: EVENT_DEFAULTS[name] if name in EVENT_DEFAULTS and value is None else value
            for name, value in given.items()}


def _judging_jobs(events: list[Any], faithfulness: Sequence[str]) -> list[tuple[str, Any, str, str, Sequence[str]]]:
    """The judgments `summarize_events` will make, as `judgments_misfit` takes them, with an empty
    summary: the summaries are not written yet, and a prompt that overflows without one overflows with
    it. Coverage only of events with their own references (generated ones are not known yet)."""
    jobs = []
    for event in events:
        if event.question_answers:
            jobs.extend((f"coverage {protocol}", event, "coverage", protocol, ("",)) for protocol in RATING_SCALES)
        jobs.extend((f"faithfulness {protocol}", event, "faithfulness", protocol, ("",)) for protocol in faithfulness)
    return jobs


def summarize_events(events: list[Any], *, method: str = "auto", sentences: Optional[int] = None,
                     generate_questions: int = 0, clustering: Optional[str] = None,
                     diversity_filter: Optional[bool] = None, judge: bool = True,
                     faithfulness: Optional[Sequence[str]] = None, max_articles: Optional[int] = None,
                     context_window: Optional[int] = None, concurrency: int = 1) -> list[dict[str, Any]]:
    """Per event: the diverse summary, QA references generated for an event without its own (with
    `generate_questions`), and the judges' scores (coverage binary and Likert against the event's
    references, own or generated, as its `references` says; faithfulness to each article with each
    of the `faithfulness` protocols). A setting left None takes its default (`EVENT_DEFAULTS`: 10
    sentences, llm clustering, the diversity filter, likert faithfulness); one given where it does
    nothing is refused."""
    from booklens.lm import usage_step

    events = event_list(events)
    check_event_options(events, method=method, sentences=sentences, generate_questions=generate_questions,
                        clustering=clustering, diversity_filter=diversity_filter, judge=judge,
                        faithfulness=faithfulness, max_articles=max_articles, context_window=context_window,
                        concurrency=concurrency)
    chosen = event_settings(sentences=sentences, clustering=clustering, diversity_filter=diversity_filter,
                            faithfulness=faithfulness)
    sentences, clustering, diversity_filter = chosen["sentences"], chosen["clustering"], chosen["diversity_filter"]
    faithfulness = chosen["faithfulness"]
    summarizer = DiverseSummarizer(method, num_sentences=sentences, context_window=context_window,
                                   concurrency=concurrency)
    refs = (ReferenceBuilder(generate_questions, clustering=clustering, diversity_filter=diversity_filter,
                             context_window=context_window, concurrency=concurrency)
            if generate_questions else None)
    summarizer.budget()  # a window with no room for the articles is the first thing to say
    if judge:  # before any call, as `judge` and `bias` do: a window no judgment fits would refuse them all
        check_judgments_fit(_judging_jobs(events, faithfulness),
                            context_window or getattr(dspy.settings.lm, "context_window", None),
                            max_articles=max_articles, summary_room=SUMMARY_RESERVE,
                            window_option=setting_name("--context-window") if context_window else None)
    results = []
    for event in events:
        row: dict[str, Any] = {"eid": event.eid}
        try:
            with usage_step("summarize"):
                pred = summarizer(articles=article_texts(event))
        except (EventTooLarge, ContextWindowExceeded) as exc:  # this event's size, not the run's setup
            pred = dspy.Prediction(summary=None, method=getattr(exc, "method", None) or method, extracts=[],
                                   extract_errors=[], extract_notes=[],
                                   error=first_line(exc), cut_off=False)
        row.update(summary=pred.summary, method=pred.method, extracts=pred.extracts,
                   extract_errors=pred.extract_errors, extract_notes=pred.extract_notes, error=pred.error,
                   summary_cut_off=pred.cut_off)
        # An event's own references are what coverage is judged against: building others for it
        # would spend many calls on references nothing uses.
        row["references"] = "own" if event.question_answers else None
        row["reference_qa_pairs"] = len(event.question_answers)
        if refs is not None and not event.question_answers and not pred.summary:
            # references only serve to judge this event's summary: none, so no calls for them
            row["references_skipped"] = "the event has no summary to judge against them"
        elif refs is not None and not event.question_answers:
            with usage_step("reference"):
                ref = refs(articles=[(a.aid, a.summarizer_text()) for a in event.articles])
            row.update(generated_question_answers=ref.question_answers, generated_questions=ref.questions,
                       reference_screening=ref.screening, reference_error=ref.error)
            if ref.question_answers:
                row.update(references="generated", reference_qa_pairs=len(ref.question_answers))
        scores: dict[str, Any] = {}
        judgments: dict[str, Any] = {}
        if judge and pred.summary:
            qa_pairs = event.question_answers
            if row["references"] == "generated":
                qa_pairs = [QuestionAnswers.model_validate(q) for q in row["generated_question_answers"]]
            if qa_pairs:
                for protocol in RATING_SCALES:
                    with usage_step(f"coverage-{protocol}"):
                        r = rate_event("coverage", protocol, event, pred.summary, qa_pairs=qa_pairs,
                                       concurrency=concurrency)
                    scores[f"coverage_{protocol}"] = r["score"]
                    judgments[f"coverage_{protocol}"] = r["judgments"]
            else:  # said, so a missing coverage score is not read as a skipped or failed judge
                row["coverage_not_judged"] = "no reference question_answers" + (
                    "; --generate-questions N builds them" if refs is None else
                    f", and no questions were generated ({row['reference_error']})" if row["reference_error"] else
                    " and none of the generated questions was kept")
            for protocol in faithfulness:
                with usage_step(f"faithfulness-{protocol}"):
                    r = rate_event("faithfulness", protocol, event, pred.summary, max_articles=max_articles,
                                   concurrency=concurrency)
                scores[f"faithfulness_{protocol}"] = r["score"]
                judgments[f"faithfulness_{protocol}"] = r["judgments"]
        row["scores"] = scores
        row["judgments"] = judgments
        results.append(row)
    return results
