"""NovelQA question files: loading, validation and records.

A NovelQA file holds the questions about one book as a JSON list. Each item has
`QID`, `Question`, `Options` ({"A": ..., "B": ..., "C": ..., "D": ...}),
`Answer` (free text), `Gold` (the option letter), `Evidences` (quotes from the
book or the annotator's reasoning), `Aspect` (times, meaning, span, setting,
relation, character, plot) and `Complexity` (mh, sh, dtl). The book is a
separate plain-text file.

The loader accepts a few harmless variants (options as a list, abbreviated
aspect names such as `chara`, a dict keyed by QID) and rejects anything else
with one-line `BooklensError`s naming the file and the item.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from booklens.errors import BooklensError, clipped, validation_problem
from booklens.records import read_json_file
from booklens.vocabulary import EVIDENCE_RECALL_MODES, QA_SETTINGS

ASPECTS = ("character", "meaning", "plot", "relation", "setting", "span", "times")
COMPLEXITIES = ("mh", "sh", "dtl")
OPTION_LETTERS = ("A", "B", "C", "D")  # the letters a multiple-choice answer takes (signatures.qa)
# Column and row labels of the seed's per-type tables.
ASPECT_LABELS = {"character": "chara", "meaning": "mean", "plot": "plot", "relation": "relat",
                 "setting": "settg", "span": "span", "times": "times"}

_ASPECT_ALIASES = {
    "chara": "character", "characters": "character", "char": "character",
    "mean": "meaning", "relat": "relation", "relationship": "relation", "settg": "setting",
    "time": "times",
}
_COMPLEXITY_ALIASES = {
    "multi-hop": "mh", "multihop": "mh", "multi_hop": "mh",
    "single-hop": "sh", "singlehop": "sh", "single_hop": "sh",
    "detail": "dtl", "details": "dtl",
}

Aspect = Literal["character", "meaning", "plot", "relation", "setting", "span", "times"]
Complexity = Literal["mh", "sh", "dtl"]


def _shown(value: Any) -> str:
    """A value from the file as an error line quotes it: its repr, `clipped`."""
    return clipped(repr(value))


def _short(value: Any) -> str:
    """A question's QID as an error line names it (unquoted), `clipped`."""
    return clipped(str(value))


def _option_text(value: Any) -> Any:
    """An option or a reference answer as written: a number ("A": 1862, a year or a count) is its
    text; other values are left to be refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


class NovelQAQuestion(BaseModel):
    """One NovelQA question. Field names follow the dataset (aliases) and Python style."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    qid: str = Field(alias="QID")
    question: str = Field(alias="Question")
    options: Optional[dict[str, str]] = Field(default=None, alias="Options")
    answer: Optional[str] = Field(default=None, alias="Answer")
    gold: Optional[str] = Field(default=None, alias="Gold")
    evidences: list[str] = Field(default_factory=list, alias="Evidences")
    aspect: Aspect = Field(alias="Aspect")
    complexity: Complexity = Field(alias="Complexity")

    @field_validator("question")
    @classmethod
    def _question_text(cls, value: str) -> str:
        if not value.strip():  # a blank question would still be asked, and its answer scored
            raise ValueError("must not be blank")
        return value

    @field_validator("qid", mode="before")
    @classmethod
    def _qid_text(cls, value: Any) -> Any:
        if isinstance(value, bool):  # `true` is an int to Python, and no name of a question
            raise ValueError(f"must be text or a number, not {str(value).lower()}")
        value = str(value) if isinstance(value, int) else value
        if isinstance(value, str) and not value.strip():  # a prediction could not be matched to its question
            raise ValueError("must not be blank")
        # "T-1 " is "T-1": one QID, whatever spaces a spreadsheet left around it
        return value.strip() if isinstance(value, str) else value

    @field_validator("options", mode="before")
    @classmethod
    def _options(cls, value: Any) -> Any:
        if value is None or value == {} or value == []:
            return None
        if isinstance(value, list):
            value = [_option_text(v) for v in value]
            if not all(isinstance(v, str) for v in value):
                raise ValueError("options must be text")
            out = {chr(ord("A") + i): v for i, v in enumerate(value)}
        elif isinstance(value, dict):
            out, keys = {}, {}
            for key, text in value.items():
                letter = str(key).strip().upper()
                if len(letter) != 1 or not letter.isalpha():
                    raise ValueError(f"option keys must be letters such as A-D, got {_shown(key)}")
                if letter in keys:  # keeping one of the two would drop an option unseen
                    raise ValueError(f"option keys {_shown(keys[letter])} and {_shown(key)} are the same letter {letter}")
                text = _option_text(text)
                if not isinstance(text, str):
                    raise ValueError(f"option {key} must be text")
                keys[letter] = key
                out[letter] = text
            out = dict(sorted(out.items()))
        else:
            raise ValueError("Options must be an object {A: ..., B: ...} or a list")
        if not any(text.strip() for text in out.values()):
            raise ValueError("every option is blank")
        # Options a reader cannot tell apart leave the answer unscorable: a blank one names no
        # choice, and of two equal texts only one letter is the gold.
        blank = [letter for letter, text in out.items() if not text.strip()]
        if blank:
            raise ValueError(f"option {blank[0]} is blank")
        first_with: dict[str, str] = {}
        for letter, text in out.items():
            same = " ".join(text.split()).casefold()
            if same in first_with:
                raise ValueError(f"options {first_with[same]} and {letter} have the same text {_shown(text.strip())}")
            first_with[same] = letter
        beyond = sorted(set(out) - set(OPTION_LETTERS))
        if beyond:  # the answer field takes these letters only: a right answer E would be refused as unparseable
            raise ValueError(f"options are {OPTION_LETTERS[0]}-{OPTION_LETTERS[-1]} (NovelQA's four choices), "
                             f"got {', '.join(beyond)}")
        return out

    @field_validator("answer", mode="before")
    @classmethod
    def _answer_number(cls, value: Any) -> Any:
        return _option_text(value)  # "Answer": 7, the count a times question asks for

    @field_validator("answer")
    @classmethod
    def _answer_text(cls, value: Optional[str]) -> Optional[str]:
        # A blank reference is none (as a blank Gold is): the gen judge would grade against nothing.
        return value if value is not None and value.strip() else None

    @field_validator("evidences", mode="before")
    @classmethod
    def _evidences(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        return value

    @field_validator("aspect", mode="before")
    @classmethod
    def _aspect(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = value.strip().lower()
            return _ASPECT_ALIASES.get(key, key)
        return value

    @field_validator("complexity", mode="before")
    @classmethod
    def _complexity(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = value.strip().lower()
            return _COMPLEXITY_ALIASES.get(key, key)
        return value

    @field_validator("gold", mode="before")
    @classmethod
    def _gold(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or value == "":
            return None
        # bool is an int to Python, but `true` in a file is no option index
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"{json.dumps(value)[:60]} is not an option letter such as B or an index from 0")
        if isinstance(value, int):  # some releases index the options 0-3
            gold = chr(ord("A") + value) if 0 <= value < 26 else None
        else:
            gold = value.strip().upper()
        options = info.data.get("options")  # validated before Gold (declared first); None without Options
        # the messages quote the file's value, not the letter it was read as
        if isinstance(value, int) and (gold is None or options is not None and gold not in options):
            indices = [ord(k) - ord("A") for k in options] if options is not None else list(range(26))
            valid = (f"0 to {indices[-1]}" if indices == list(range(len(indices)))
                     else ", ".join(map(str, indices)))
            raise ValueError(f"{value} is not the index of an option ({valid})")
        if options is not None and gold not in options:
            raise ValueError(f"{_shown(value)} is not one of the options {', '.join(options)}")
        return gold

    def options_text(self) -> str:
        """The options as lines 'A. text', one line each: a line break inside an option's text
        would show a line that reads as an option of its own."""
        return "\n".join(f"{k}. {' '.join(v.split())}" for k, v in (self.options or {}).items())


def parse_questions(payload: Any, source: str = "questions") -> list[NovelQAQuestion]:
    """Validate a decoded NovelQA file (a list of questions, or a dict keyed by QID)."""
    if isinstance(payload, dict):
        if all(isinstance(v, dict) for v in payload.values()) and payload:
            for key, value in payload.items():
                # the key names the question; an entry naming another would be matched to the wrong one
                if "QID" in value and str(value["QID"]).strip() != str(key).strip():
                    raise BooklensError(f"{source}: question {_short(key)} carries another QID, {_shown(value['QID'])}: "
                                        "give each question one QID")
            payload = [{"QID": k, **v} for k, v in payload.items()]
        else:
            raise BooklensError(f"{source}: expected a JSON list of NovelQA questions, got an object")
    if not isinstance(payload, list):
        raise BooklensError(f"{source}: expected a JSON list of NovelQA questions, got {type(payload).__name__}")
    if not payload:
        raise BooklensError(f"{source}: the question list is empty")
    questions: list[NovelQAQuestion] = []
    seen: set[str] = set()
    for i, item in enumerate(payload):
        where = f"{source}: question {i + 1}"
        if not isinstance(item, dict):
            raise BooklensError(f"{where} is {type(item).__name__}, not an object with QID, Question, Aspect, ...")
        if "QID" in item:
            where += f" ({_short(item['QID'])})"
        try:
            q = NovelQAQuestion.model_validate(item)
        except ValidationError as exc:
            raise BooklensError(f"{where}: {_first_problem(exc)}") from None
        if q.qid in seen:
            raise BooklensError(f"{where}: duplicate QID {_short(q.qid)}")
        seen.add(q.qid)
        questions.append(q)
    return questions


def load_questions(path: str | Path) -> list[NovelQAQuestion]:
    """Read and validate a NovelQA question file."""
    return parse_questions(read_json_file(path, "question file"), source=str(path))


def check_setting(questions: list[NovelQAQuestion], setting: str, source: str = "questions") -> None:
    """Fail early when the questions lack what a setting needs.

    Multiple choice needs at least two options per question; the gold letter and
    the free-text answer are optional (questions without them are answered but
    not scored)."""
    if setting not in QA_SETTINGS:
        raise BooklensError(f"unknown setting {setting!r}: use mc (multiple choice) or gen (generative)")
    if setting == "mc":
        for q in questions:
            if not q.options:
                raise BooklensError(
                    f"{source}: question {_short(q.qid)} has no Options; the multiple-choice setting (--setting mc) needs "
                    "them (use --setting gen for free-text answers)")
            if len(q.options) < 2:
                raise BooklensError(
                    f"{source}: question {_short(q.qid)} has one option ({next(iter(q.options))}); the multiple-choice "
                    "setting (--setting mc) needs two or more (use --setting gen for free-text answers)")


def check_evidence_recall(mode: str) -> None:
    if mode not in EVIDENCE_RECALL_MODES:
        raise BooklensError(f"unknown evidence recall {mode!r}: use {' or '.join(EVIDENCE_RECALL_MODES)}")


# The question file's field each setting scores against.
REFERENCE_FIELD = {"mc": "Gold", "gen": "Answer"}


def gold_for(q: NovelQAQuestion, setting: str) -> Optional[str]:
    """What a prediction is scored against: the letter (mc) or the reference answer (gen)."""
    return q.gold if setting == "mc" else q.answer


def to_examples(questions: list[NovelQAQuestion], book: str, setting: str = "mc") -> list:
    """dspy.Examples with the inputs of `BookQA` (book, question, options, and the gold evidence its
    `given` mode reads) and the gold label."""
    import dspy

    examples = []
    for q in questions:
        ex = dspy.Example(book=book, question=q.question, options=q.options_text() if setting == "mc" else None,
                          gold=gold_for(q, setting), gold_evidence=q.evidences, qid=q.qid,
                          aspect=q.aspect, complexity=q.complexity)
        examples.append(ex.with_inputs("book", "question", "options", "gold_evidence"))
    return examples


class QAPrediction(BaseModel):
    """The outcome of one question: the answer, how the context was chosen, and the score."""

    qid: str
    aspect: str
    complexity: str
    setting: Literal["mc", "gen"]
    context_mode: Literal["whole-book", "retrieval", "closed-book", "given"]
    evidence_mode: str
    prediction: Optional[str] = None
    gold: Optional[str] = None
    correct: Optional[bool] = Field(default=None, description="None when there is no gold label or the judge failed")
    error: Optional[str] = Field(default=None, description="why no valid answer (or verdict) was obtained")
    judge_reason: Optional[str] = None
    quoted_evidence: list[str] = Field(default_factory=list)
    passages: list[dict[str, int]] = Field(default_factory=list, description="index, start, end of passages shown")
    context_tokens: int = 0
    passages_dropped: int = Field(
        default=0, description="retrieved passages (of the top k) left out so that the others fit the window")
    gold_evidence_start_token: Optional[int] = Field(
        default=None, description="token index where the first located gold evidence quote starts")
    gold_evidence_quotes: int = Field(default=0, description="the question's gold evidence entries (Evidences)")
    gold_evidence_located: int = 0
    gold_evidence_in_context: Optional[float] = Field(
        default=None, description="share of located gold evidence quotes that the context contained")
    quote_recall: Optional[float] = Field(
        default=None, description="share of located gold quotes the model's quotes overlap (word overlap)")
    evidence_scores: Optional[dict[str, int]] = Field(
        default=None, description="LLM-scored evidence recall: correctness, relevance, sufficiency (0-100)")
    evidence_score: Optional[float] = Field(default=None, description="mean of the three evidence scores")
    evidence_error: Optional[str] = Field(default=None, description="why the evidence could not be scored")
    attempts: int = 1


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    if err.get("type") == "literal_error" and loc in ("Aspect", "Complexity"):
        allowed = ", ".join(ASPECTS if loc == "Aspect" else COMPLEXITIES)
        return f"{loc} must be one of {allowed} (got {_shown(err.get('input'))})"
    return validation_problem(exc)
