"""Question answering over a whole book (NovelQA, seed 004).

`BookQA` answers one question about a book in the multiple-choice (`mc`) or
generative (`gen`) setting. What the model reads depends on the evidence mode
(`booklens.retrieval.EVIDENCE_MODES`):

- ``book``: the whole book when it fits the model's context window next to the
  prompt; otherwise the budget is filled with the most relevant stretches of the
  book (`BookIndex.book_context`), in book order;
- ``bm25`` / ``dense`` / ``hybrid``: the `k` best passages for the question (and
  its options) from that retriever, in book order;
- ``given``: the gold evidence that comes with the question (an oracle setting); a question
  without any is asked closed-book, and counted so;
- ``none``: closed-book, the question alone (what the model remembers of the book).

The ``book`` mode is the whole book only when the book fits: for a novel and an 8K window
it is retrieval of about 6K tokens around the best passages, not the whole book. Every
prediction records which it was (`context_mode`).

`AnswerJudge` grades a free-text answer against the reference answer, as the seed
does with GPT-4. `EvidenceJudge` scores the evidence a model quoted against the
annotators' evidence for correctness, relevance and sufficiency (0-100 each), the
seed's LLM-scored evidence recall (its Table 5). `answer_questions` runs a question
set and scores it, recording where the gold evidence lies and whether the context
held it (`booklens.qa_runs.run_book_qa` is the whole `booklens qa` run).
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import dspy

from booklens.errors import BooklensError, first_line, kind_of
from booklens.lm import ContextWindowExceeded, filter_stopped, predict_with_retries
from booklens.programs.base import Module, Predict, prompt_tokens
from booklens.signatures.qa import (
    AnswerMultipleChoice,
    AnswerMultipleChoiceClosedBook,
    AnswerQuestion,
    AnswerQuestionClosedBook,
    JudgeAnswer,
    ScoreEvidence,
    reading_option_texts,
    with_evidence,
)
from booklens.retrieval import DEFAULT_K, DEFAULT_PASSAGE_TOKENS, QA_BOOK_RANK_MODE
from booklens.vocabulary import DEFAULT_CONTEXT_WINDOW, QA_SETTINGS

# Share of the window the prompt may fill: the backend's tokenizer may count more tokens than
# cl100k_base does, and chat templates add some.
BUDGET_MARGIN = 0.8
ANSWER_RESERVE = {"mc": 48, "gen": 128}
EVIDENCE_RESERVE = 320
EVIDENCE_CRITERIA = ("correctness", "relevance", "sufficiency")


class _BookCache:
    """Per-book token counts and retrieval indexes, shared by copies of a program."""

    def __init__(self, index_cache_dir: Any = None, passage_tokens: int = DEFAULT_PASSAGE_TOKENS):
        self.index_cache_dir = index_cache_dir
        self.passage_tokens = passage_tokens
        self._tokens: dict[str, int] = {}
        self._indexes: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __deepcopy__(self, memo):  # optimizers copy programs; the cache is a shared resource
        return self

    @staticmethod
    def key(book: str) -> str:
        return hashlib.sha256(book.encode("utf-8")).hexdigest()

    def tokens(self, book: str) -> int:
        from booklens.text import count_tokens

        key = self.key(book)
        with self._lock:
            if key not in self._tokens:
                self._tokens[key] = count_tokens(book)
            return self._tokens[key]

    def index(self, book: str):
        from booklens.retrieval import BookIndex

        key = self.key(book)
        with self._lock:
            if key not in self._indexes:
                self._indexes[key] = BookIndex.build(book, cache_dir=self.index_cache_dir,
                                                     passage_tokens=self.passage_tokens)
            return self._indexes[key]


def _text(value: Any, name: str, hint: str = "") -> str:
    """A text input of a program (the question, an answer), or a one-line error naming it: None or a
    number would be asked about as the words 'None' or '7'."""
    if not isinstance(value, str):
        raise BooklensError(f"{name} must be text, not {type(value).__name__}{hint}")
    return value


def _quotes(value: Any, name: str) -> list[str]:
    """Quotes as the programs take them, a list of texts: one text alone is one quote (as the question
    files' `Evidences` are read), None is none. A text iterated as a list would be its characters."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        wrong = [v for v in value if not isinstance(v, str)]
        if not wrong:
            return list(value)
        raise BooklensError(f"{name} must be a list of quotes (text), not {type(value).__name__} holding "
                            f"{type(wrong[0]).__name__}")
    raise BooklensError(f"{name} must be a list of quotes (text), not {type(value).__name__}")


def join_passages(passages: Sequence[Any]) -> str:
    """Passages in book order; a gap between non-adjacent passages is marked with '[...]'."""
    parts: list[str] = []
    previous = None
    for p in sorted(passages, key=lambda p: p.start):
        if previous is not None:
            parts.append("\n\n" if p.index == previous.index + 1 else "\n\n[...]\n\n")
        parts.append(p.text)
        previous = p
    return "".join(parts)


class BookQA(Module):
    """Answer a question about a book, reading the whole book, retrieved passages, the gold
    evidence or nothing, depending on the evidence mode and on what fits the context window."""

    def __init__(self, setting: str = "mc", evidence: str = "book", *, k: int = DEFAULT_K,
                 passage_tokens: int = DEFAULT_PASSAGE_TOKENS,
                 context_window: Optional[int] = None, quote_evidence: bool = False, rank_mode: str = QA_BOOK_RANK_MODE,
                 index_cache_dir: Any = None, tries: int = 3):
        super().__init__()
        from booklens.retrieval import EVIDENCE_MODES, SEARCH_MODES

        if setting not in QA_SETTINGS:
            raise BooklensError(f"unknown setting {setting!r}: use mc or gen")
        if evidence not in EVIDENCE_MODES:
            raise BooklensError(f"unknown evidence mode {evidence!r}: use one of {', '.join(EVIDENCE_MODES)}")
        if rank_mode not in SEARCH_MODES:
            raise BooklensError(f"unknown ranking mode {rank_mode!r}: use one of {', '.join(SEARCH_MODES)}")
        from booklens.parallel import check_at_least

        check_at_least("k", k)
        check_at_least("passage_tokens", passage_tokens)
        check_at_least("tries", tries)
        if context_window is not None:
            check_at_least("context_window", context_window)
        self.setting = setting
        self.evidence = evidence
        self.k = k
        self.context_window = context_window
        self.quote_evidence = quote_evidence and evidence != "none"
        self.rank_mode = rank_mode
        self.tries = tries
        self.books = _BookCache(index_cache_dir, passage_tokens)
        if setting == "mc":
            open_sig, closed_sig = AnswerMultipleChoice, AnswerMultipleChoiceClosedBook
        else:
            open_sig, closed_sig = AnswerQuestion, AnswerQuestionClosedBook
        self.answer = Predict(with_evidence(open_sig) if self.quote_evidence else open_sig)
        self.answer_closed_book = Predict(closed_sig)

    # -- context -------------------------------------------------------------------

    def window(self) -> int:
        if self.context_window:
            return self.context_window
        lm = dspy.settings.lm
        return getattr(lm, "context_window", None) or DEFAULT_CONTEXT_WINDOW

    def context_budget(self, question: str, options: Optional[str], book_title: str = "") -> int:
        """Tokens left for the book or passages once the prompt and the answer are counted. A one-line
        error when none are left (closed-book, with evidence none: when the question's prompt alone
        does not fit)."""
        closed_book = self.evidence == "none"
        if closed_book:
            predictor = self.answer_closed_book
            inputs: dict[str, Any] = {"book_title": book_title or "(untitled)", "question": question}
        else:
            predictor, inputs = self.answer, {"context": "", "question": question}
        if self.setting == "mc":
            inputs["options"] = options or ""
        reserve = ANSWER_RESERVE[self.setting] + (EVIDENCE_RESERVE if self.quote_evidence else 0)
        prompt = prompt_tokens(predictor, **inputs)
        room = int(self.window() * BUDGET_MARGIN)
        budget = room - prompt - reserve
        if budget < 0 or budget == 0 and not closed_book:
            raise BooklensError(f"the prompt ({prompt} tokens" + (" with its options" if self.setting == "mc" else "")
                                + f") and its answer ({reserve}) "
                                + ("do not fit" if closed_book else "leave no room for the book in")
                                + f" the {room} tokens of the {self.window()}-token context window a prompt may fill")
        return budget

    def check_fits(self, questions: Sequence[Any], book_title: str = "") -> None:
        """Refuse, before any call, a question (a NovelQA record) whose prompt leaves no room in the
        window: one line naming it. Found by its own call, it stopped the run after the questions
        asked before it (and closed-book, its prompt went to the model whole)."""
        for q in questions:
            try:
                self.context_budget(q.question, q.options_text() if self.setting == "mc" else None, book_title)
            except BooklensError as exc:
                raise BooklensError(f"question {q.qid}: {exc}") from None

    def prepare(self, book: str) -> None:
        """Build what the questions about `book` will search (its index, and its embeddings where
        the ranking reads them) here, before the questions go to workers: built by the first
        question's worker, it held the others back, and Ctrl-C waited for it as for a call in flight."""
        from booklens.retrieval import DENSE_MODES, SEARCH_MODES

        if self.evidence in SEARCH_MODES:
            rank_mode = self.evidence
        elif self.evidence == "book" and self.books.tokens(book) > int(self.window() * BUDGET_MARGIN):
            rank_mode = self.rank_mode  # no question's budget holds the whole book
        else:
            return  # no index, or (a book near the window's size) one only some questions may need
        index = self.books.index(book)
        if rank_mode in DENSE_MODES:
            index.ensure_dense()

    def select_context(self, book: str, question: str, options: Optional[str] = None,
                       gold_evidence: Optional[Sequence[str]] = None, book_title: str = "") -> dict[str, Any]:
        """What the model reads: {mode, text, passages [(index, start, end)], tokens}."""
        from booklens.metrics.qa import shown_shares
        from booklens.retrieval.index import cut_passage
        from booklens.text import count_tokens, truncate_to_words

        budget = self.context_budget(question, options, book_title)
        if self.evidence == "none":
            return {"mode": "closed-book", "text": "", "passages": [], "tokens": 0}
        if self.evidence == "given":
            quotes = [e.strip() for e in (gold_evidence or []) if e and e.strip()]
            text = "\n\n".join(quotes)
            if not text:  # a question without annotated evidence: asked, and counted, closed-book
                return {"mode": "closed-book", "text": "", "passages": [], "tokens": 0}
            if count_tokens(text) > budget:  # cut at its last whole word: not a fragment of one
                text = truncate_to_words(text, budget)
            return {"mode": "given", "text": text, "passages": [], "tokens": count_tokens(text),
                    "shown": shown_shares(quotes, len(text))}
        dropped = 0  # of the top k, left out so that the others fit (the search modes)
        # The passages are fitted as the model reads them: joined, with the blank lines and '[...]'
        # marks between them, which their own token counts leave out.
        if self.evidence == "book":
            book_tokens = self.books.tokens(book)
            if book_tokens <= budget:
                return {"mode": "whole-book", "text": book, "passages": [(0, 0, len(book))], "tokens": book_tokens}
            index = self.books.index(book)
            passages = index.book_context_as(self._query(question, options), budget, join_passages,
                                             seeds=self.k, mode=self.rank_mode)
            text = join_passages(passages)
        else:
            index = self.books.index(book)
            hits = index.search(self._query(question, options), mode=self.evidence, k=self.k)
            passages = [p for p, _ in hits]
            while passages and sum(p.tokens for p in passages) > budget:
                passages.pop()  # drop the lowest-ranked passage until they fit
            while len(passages) > 1 and count_tokens(join_passages(passages)) > budget:
                passages.pop()  # and until the marks between them fit too
            if not passages and hits:
                # the best passage alone is larger than the budget: read as much of it as fits
                piece = cut_passage(hits[0][0], budget)
                passages = [piece] if piece is not None else []
            dropped = len(hits) - len(passages)
            text = join_passages(passages)
        return {"mode": "retrieval", "text": text, "passages": [(p.index, p.start, p.end) for p in passages],
                "tokens": count_tokens(text), "dropped": dropped}

    def _query(self, question: str, options: Optional[str]) -> str:
        if self.setting == "mc" and options:
            # The options' words, not their letters: 'b' and 'c' are rare in a book, so as search
            # terms they ranked up passages that happen to hold them.
            texts = _option_texts(options)
            return "\n".join([question, *texts.values()]) if texts else f"{question}\n{options}"
        return question

    # -- answering -----------------------------------------------------------------

    def forward(self, book: str, question: str, options: Optional[str] = None,
                gold_evidence: Optional[Sequence[str]] = None, book_title: str = "") -> dspy.Prediction:
        if not isinstance(book, str):
            raise BooklensError(f"book must be the book's text, not {type(book).__name__} (booklens.text.read_book "
                                "reads a file)")
        question = _text(question, "question")
        if options is not None:
            _text(options, "options", ": one 'LETTER. text' line per option (NovelQAQuestion.options_text writes "
                                      "them)")
        gold_evidence = _quotes(gold_evidence, "gold_evidence")
        book_title = _text(book_title or "", "book_title")
        if self.setting == "mc" and not (options and options.strip()):
            raise BooklensError("the multiple-choice setting needs the options of the question")
        context = self.select_context(book, question, options, gold_evidence, book_title)
        if context["mode"] == "closed-book":
            predictor = self.answer_closed_book
            inputs: dict[str, Any] = {"book_title": book_title or "(untitled)", "question": question}
        else:
            predictor = self.answer
            inputs = {"context": context["text"], "question": question}
        letters: list[str] = []
        if self.setting == "mc":
            inputs["options"] = options
            texts = _option_texts(options)
            letters = list(texts)
            # an answer that is one option's text alone ("The Marigold") is read as its letter
            inputs["signature"] = reading_option_texts(predictor.signature, texts)
        attempt = predict_with_retries(predictor, tries=self.tries, check=self._checker(letters), **inputs)
        pred = attempt.prediction
        answer = None
        quotes: list[str] = []
        if attempt.ok:
            answer = str(pred.answer).strip()
            quotes = [str(q) for q in (getattr(pred, "evidence", None) or []) if str(q).strip()]
        return dspy.Prediction(answer=answer, evidence=quotes, error=attempt.error, attempts=attempt.attempts,
                               context_mode=context["mode"], passages=context["passages"],
                               context_tokens=context["tokens"], evidence_shown=context.get("shown"),
                               passages_dropped=context.get("dropped", 0))

    def _checker(self, letters: list[str]):
        def check(pred: Any) -> Optional[str]:
            answer = str(getattr(pred, "answer", "") or "").strip()
            if not answer:
                return "empty answer"
            if self.setting == "mc" and letters and answer not in letters:
                return f"answer {answer!r} is not one of the options {', '.join(letters)}"
            return filter_stopped("answer")

        return check


def _option_texts(options: Optional[str]) -> dict[str, str]:
    """Each option's text by its letter, from the options as the model reads them ('B. The Marigold')."""
    texts: dict[str, str] = {}
    for line in (options or "").splitlines():
        line = line.strip()
        if len(line) >= 2 and line[0].isalpha() and line[1] in ".):":
            texts.setdefault(line[0].upper(), line[2:].strip())
    return texts


class AnswerJudge(Module):
    """Grade a free-text answer against the reference answer: correct or not, with a reason."""

    def __init__(self, tries: int = 3):
        super().__init__()
        self.judge = Predict(JudgeAnswer)
        self.tries = tries

    def forward(self, question: str, correct_answer: str, student_answer: str,
                evidence: Optional[Sequence[str]] = None, book_title: str = "") -> dspy.Prediction:
        for name, value in (("question", question), ("correct_answer", correct_answer),
                            ("student_answer", student_answer), ("book_title", book_title or "")):
            _text(value, name)
        evidence = _quotes(evidence, "evidence")
        try:
            attempt = predict_with_retries(self.judge, tries=self.tries, check=lambda p: filter_stopped("verdict"),
                                           book_title=book_title or "(untitled)",
                                           question=question, correct_answer=correct_answer,
                                           supporting_evidence=list(evidence or []), student_answer=student_answer)
        except ContextWindowExceeded as exc:  # this question's evidence is too long: its verdict fails
            return dspy.Prediction(correct=None, reason=None, error=first_line(exc), attempts=1)
        if not attempt.ok:
            return dspy.Prediction(correct=None, reason=None, error=attempt.error, attempts=attempt.attempts)
        p = attempt.prediction
        return dspy.Prediction(correct=p.verdict == "correct", reason=str(p.reason), error=None,
                               attempts=attempt.attempts)


class EvidenceJudge(Module):
    """Score quoted evidence against the annotators' evidence: correctness, relevance and
    sufficiency, 0-100 each, and their mean (NovelQA's evidence recall). No quotes score 0
    without a call; a score outside 0-100 is re-asked, then recorded as a failure."""

    def __init__(self, tries: int = 3):
        super().__init__()
        self.score = Predict(ScoreEvidence)
        self.tries = tries

    @staticmethod
    def check(pred: Any) -> Optional[str]:
        for name in EVIDENCE_CRITERIA:
            value = getattr(pred, name, None)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100:
                return f"{name} {value!r} is not an integer from 0 to 100"
        return filter_stopped("scores")

    def forward(self, question: str, correct_answer: str, correct_evidence: Sequence[str], student_answer: str,
                student_evidence: Sequence[str], book_title: str = "") -> dspy.Prediction:
        for name, value in (("question", question), ("correct_answer", correct_answer),
                            ("student_answer", student_answer or ""), ("book_title", book_title or "")):
            _text(value, name)
        correct_evidence = _quotes(correct_evidence, "correct_evidence")
        quotes = [q for q in _quotes(student_evidence, "student_evidence") if q.strip()]
        if not quotes:
            return dspy.Prediction(scores={name: 0 for name in EVIDENCE_CRITERIA}, mean=0.0, error=None, attempts=0)
        try:
            got = predict_with_retries(self.score, tries=self.tries, check=self.check,
                                       book_title=book_title or "(untitled)", question=question,
                                       correct_answer=correct_answer, correct_evidence=list(correct_evidence),
                                       student_answer=student_answer or "(no answer)", student_evidence=quotes)
        except ContextWindowExceeded as exc:  # the evidence is too long to show: this question's scores fail
            return dspy.Prediction(scores=None, mean=None, error=first_line(exc), attempts=1)
        if not got.ok:
            return dspy.Prediction(scores=None, mean=None, error=got.error, attempts=got.attempts)
        scores = {name: getattr(got.prediction, name) for name in EVIDENCE_CRITERIA}
        return dspy.Prediction(scores=scores, mean=round(sum(scores.values()) / len(scores), 2), error=None,
                               attempts=got.attempts)


# ---------------------------------------------------------------------------
# Running a question set


def _question_list(questions: Any) -> list[Any]:
    """The questions `answer_questions` was handed, as a list (any iterable of them: a generator
    too), or a one-line error: a file's path, one question, or records not yet parsed."""
    from booklens.data.novelqa import NovelQAQuestion

    hint = "read a question file with booklens.data.novelqa.load_questions(path)"
    if isinstance(questions, NovelQAQuestion):
        raise BooklensError("questions must be a list of NovelQA questions, not one question: put it in a list")
    if isinstance(questions, (str, bytes, Path, Mapping)) or not isinstance(questions, Iterable):
        shown = "a path" if isinstance(questions, Path) else type(questions).__name__
        raise BooklensError(f"questions must be a list of NovelQA questions, not {shown}: {hint}")
    questions = list(questions)
    for n, question in enumerate(questions, 1):
        if not isinstance(question, NovelQAQuestion):
            raise BooklensError(f"question {n} is {type(question).__name__}, not a NovelQA question: {hint} "
                                "(or booklens.data.novelqa.parse_questions(records))")
    return questions


def answer_questions(program: BookQA, book: str, questions: Iterable[Any], *, judge: Optional[AnswerJudge] = None,
                     concurrency: int = 1, book_title: str = "", desc: str = "questions",
                     evidence_recall: str = "llm", evidence_judge: Optional[EvidenceJudge] = None) -> list[Any]:
    """Answer and score NovelQA questions about `book`; returns `QAPrediction` records in order.

    When the program quotes evidence, the quotes are scored by word overlap with the located
    gold quotes (free) and, with `evidence_recall="llm"` (the seed's method), by an LLM judge."""
    from booklens.data.novelqa import QAPrediction, check_evidence_recall, gold_for
    from booklens.inputs import book_text
    from booklens.lm import usage_step
    from booklens.metrics.qa import locate_evidence, quote_recall, share_in_context, share_shown, token_positions
    from booklens.parallel import check_at_least, parallel_map
    from booklens.retrieval import QuoteLocator

    # Everything handed over is checked before the book is indexed or any question asked.
    if not isinstance(program, BookQA):
        raise BooklensError(f"program must be a BookQA, not {kind_of(program)}: "
                            "build one with BookQA(setting, evidence)")
    book = book_text(book)  # without words, every answer would be a guess, every score the chance level
    for name, given, kind in (("judge", judge, AnswerJudge), ("evidence_judge", evidence_judge, EvidenceJudge)):
        if given is not None and not isinstance(given, kind):
            raise BooklensError(f"{name} must be an {kind.__name__}, not {kind_of(given)}")
    questions = _question_list(questions)  # read twice below (gold evidence, then the calls): a generator too
    check_at_least("concurrency", concurrency)
    setting = program.setting
    check_evidence_recall(evidence_recall)
    if setting == "gen" and judge is None:
        judge = AnswerJudge()
    if program.quote_evidence and evidence_recall == "llm" and evidence_judge is None:
        evidence_judge = EvidenceJudge()
    locator = QuoteLocator(book)
    spans = {q.qid: locate_evidence(locator, q.evidences) for q in questions}
    positions = token_positions(book, [s.start for ss in spans.values() for s in ss])
    for ss in spans.values():
        for s in ss:
            s.start_token = positions[s.start]

    def run(q: Any) -> QAPrediction:
        gold = gold_for(q, setting)
        with usage_step("answer"):
            pred = program(book=book, question=q.question, options=q.options_text() if setting == "mc" else None,
                           gold_evidence=q.evidences, book_title=book_title)
        located = spans[q.qid]
        if pred.context_mode == "whole-book":
            in_context = 1.0 if located else None
        elif pred.context_mode == "given":  # the given evidence may have been cut to fit the window
            shown = getattr(pred, "evidence_shown", None)  # None: a program that says nothing of a cut
            in_context = share_shown(located, shown) if shown is not None else (1.0 if located else None)
        elif pred.context_mode == "retrieval":
            in_context = share_in_context(located, [(s, e) for _, s, e in pred.passages])
        else:
            in_context = None
        record = QAPrediction(
            qid=q.qid, aspect=q.aspect, complexity=q.complexity, setting=setting,
            context_mode=pred.context_mode, evidence_mode=program.evidence, prediction=pred.answer, gold=gold,
            error=pred.error, quoted_evidence=pred.evidence,
            passages=[{"index": i, "start": s, "end": e} for i, s, e in pred.passages
                      if pred.context_mode == "retrieval"],
            context_tokens=pred.context_tokens, passages_dropped=getattr(pred, "passages_dropped", None) or 0,
            gold_evidence_start_token=min((s.start_token for s in located), default=None),
            gold_evidence_quotes=sum(1 for e in q.evidences if e.strip()),
            gold_evidence_located=len(located), gold_evidence_in_context=in_context,
            quote_recall=quote_recall(located, pred.evidence, locator) if program.quote_evidence and located
            else None,
            attempts=pred.attempts,
        )
        if gold is not None and pred.answer is None:
            record.correct = False  # no valid answer after the re-asks: counted wrong
        elif gold is not None and setting == "mc":
            record.correct = pred.answer == gold
        return record

    # All answers first, then all verdicts: calls about the same book then follow each other,
    # so a backend that reuses the prompt prefix (the book) keeps it between questions.
    by_qid = {q.qid: q for q in questions}
    if questions:
        program.check_fits(questions, book_title)
        program.prepare(book)
    records = parallel_map(run, list(questions), concurrency=concurrency, desc=desc)
    to_judge = [r for r in records if setting == "gen" and r.gold is not None and r.prediction is not None]

    def grade(record: QAPrediction) -> QAPrediction:
        q = by_qid[record.qid]
        with usage_step("judge"):
            verdict = judge(question=q.question, correct_answer=record.gold, student_answer=record.prediction,
                            evidence=q.evidences, book_title=book_title)
        record.correct = verdict.correct
        record.judge_reason = verdict.reason
        if verdict.error:
            record.error = f"judge: {verdict.error}"
        return record

    parallel_map(grade, to_judge, concurrency=concurrency, desc="judge")

    def score_evidence(record: QAPrediction) -> QAPrediction:
        q = by_qid[record.qid]
        with usage_step("evidence"):
            scored = evidence_judge(question=q.question, correct_answer=_answer_text(q, setting, record.gold),
                                    correct_evidence=q.evidences, book_title=book_title,
                                    student_answer=_answer_text(q, setting, record.prediction),
                                    student_evidence=record.quoted_evidence)
        record.evidence_scores = scored.scores
        record.evidence_score = scored.mean
        if scored.error:
            record.evidence_error = scored.error
        return record

    if evidence_judge is not None and program.quote_evidence:
        to_score = [r for r in records if r.gold is not None and by_qid[r.qid].evidences]
        parallel_map(score_evidence, to_score, concurrency=concurrency, desc="evidence")
    return records


def _answer_text(q: Any, setting: str, answer: Optional[str]) -> str:
    """An answer as the evidence judge reads it: a letter with its option text in the mc setting."""
    if answer is None:
        return ""
    if setting == "mc" and q.options and answer in q.options:
        return f"{answer}. {q.options[answer]}"
    return answer
