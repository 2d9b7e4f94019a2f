"""DiverseSumm events: loading, validation and records.

A DiverseSumm file is a JSON list of events. Each event has an `eid`, its
`articles` ({aid, title, url, domain, content}; ten per event in the release)
and `question_answers`: reference questions, each with `answer_groups`, a list
of clusters of equivalent answers ({aid, answer}) taken from different articles.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from booklens.errors import BooklensError, validation_problem
from booklens.records import read_json_file
from booklens.text import has_words
from booklens.vocabulary import counted

MIN_ARTICLES = 2

# Anything but letters and digits, of any script: an ASCII-only class would erase Cyrillic or
# Chinese wording entirely and make every such answer (or question) the same.
_NOT_WORD = re.compile(r"[\W_]+")


def wording_key(text: str) -> str:
    """What two questions or answers share when they are the same wording up to case and punctuation."""
    return _NOT_WORD.sub(" ", text.casefold()).strip()


def _id_text(value: Any) -> Any:
    """An event or article id as text (a number is its digits); a blank one names nothing, and an
    output, a summaries file or a judgment would be matched to it by that blank."""
    value = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be blank")
    return value


class Article(BaseModel):
    model_config = ConfigDict(extra="ignore")

    aid: str
    title: str = ""
    url: str = ""
    domain: str = ""
    content: str = Field(min_length=1)

    @field_validator("aid", mode="before")
    @classmethod
    def _aid_text(cls, value: Any) -> Any:
        return _id_text(value)

    @field_validator("content")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("article content is empty")
        if not has_words(value):  # nothing to summarize or to judge a summary against
            raise ValueError("article content has no words (only punctuation, symbols or invisible characters)")
        return value

    def heading(self) -> str:
        """'title (domain)', the title or the domain alone, or '' when the article has neither;
        on one line, since the summarizer's article text takes its first line as the heading."""
        head = " ".join(self.title.split())
        domain = " ".join(self.domain.split())
        if domain:
            head = f"{head} ({domain})" if head else domain
        return head

    def as_text(self) -> str:
        """Title and content, as shown to a judge."""
        head = self.heading()
        return f"{head}\n{self.content.strip()}" if head else self.content.strip()

    def summarizer_text(self) -> str:
        """The article as the summarizer reads it: the heading line '[aid] title (domain)' ('[aid]'
        alone when the article has neither title nor domain), then the content. The heading line
        is always there, so `split_article_text` always takes it apart the same way."""
        return f"{f'[{self.aid}] {self.heading()}'.rstrip()}\n{self.content.strip()}"


def split_article_text(text: str, number: Optional[int] = None) -> tuple[str, str]:
    """(heading line, content) of an article text as `Article.summarizer_text` writes it: the
    first line is the heading, whatever metadata the article has. `number` names the article
    in the error about a text with no content after its heading line."""
    heading, _, content = text.partition("\n")
    if not content.strip():
        which = f"article {number}" if number is not None else "an article"
        raise BooklensError(f"{which} has no content after its heading line: an article text is a heading "
                            "line ('[aid] title (domain)', or '[aid]'), then the content")
    return heading.strip(), content


class Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    aid: str
    answer: str

    @field_validator("aid", mode="before")
    @classmethod
    def _aid_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value

    @field_validator("answer")
    @classmethod
    def _answer_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("an answer is empty")
        if not has_words(value):  # a judge asked whether a summary covers '...' is asked nothing
            raise ValueError("an answer has no words")
        return value


class QuestionAnswers(BaseModel):
    """A reference question and its clusters of equivalent answers from different articles."""

    model_config = ConfigDict(extra="ignore")

    question: str = Field(min_length=1)
    # validated when left out too: a question without answers is as unjudgeable as one with []
    answer_groups: list[list[Answer]] = Field(default_factory=list, validate_default=True)

    # A judge asked whether a summary covers a blank question, or answers there are none of,
    # would be scored on nothing.
    @field_validator("question")
    @classmethod
    def _question_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a question is blank")
        return value

    @field_validator("answer_groups")
    @classmethod
    def _some_answers(cls, value: list[list[Answer]]) -> list[list[Answer]]:
        if not value or any(not group for group in value):
            raise ValueError("a question needs answer groups, each with at least one answer")
        return value

    def as_text(self) -> str:
        """The question and one line per answer cluster, as shown to a judge."""
        lines = [f"Question: {self.question}"]
        for i, group in enumerate(self.answer_groups, 1):
            answers: list[str] = []
            for a in group:
                if a.answer not in answers:
                    answers.append(a.answer)
            sources = ", ".join(sorted({a.aid for a in group}))
            lines.append(f"Answer {i} ({sources}): " + " / ".join(answers))
        return "\n".join(lines)


class Event(BaseModel):
    model_config = ConfigDict(extra="ignore")

    eid: str
    articles: list[Article]
    question_answers: list[QuestionAnswers] = Field(default_factory=list)

    @field_validator("eid", mode="before")
    @classmethod
    def _eid_text(cls, value: Any) -> Any:
        return _id_text(value)

    def article(self, aid: str) -> Optional[Article]:
        return next((a for a in self.articles if a.aid == aid), None)

    def qa_text(self) -> str:
        return "\n\n".join(qa.as_text() for qa in self.question_answers)


def parse_events(payload: Any, source: str = "events") -> list[Event]:
    """Validate a decoded DiverseSumm file: a list of events (one event object is also accepted)."""
    if isinstance(payload, dict) and "articles" in payload:
        payload = [payload]
    if not isinstance(payload, list):
        raise BooklensError(f"{source}: expected a JSON list of DiverseSumm events, got {type(payload).__name__}")
    if not payload:
        raise BooklensError(f"{source}: the event list is empty")
    events: list[Event] = []
    seen: set[str] = set()
    for i, item in enumerate(payload):
        where = f"{source}: event {i + 1}"
        if not isinstance(item, dict):
            raise BooklensError(f"{where} is {type(item).__name__}, not an object with eid, articles, ...")
        if "eid" in item:
            where += f" ({item['eid']})"
        try:
            event = Event.model_validate(item)
        except ValidationError as exc:
            raise BooklensError(f"{where}: {validation_problem(exc)}") from None
        if len(event.articles) < MIN_ARTICLES:
            raise BooklensError(
                f"{where} has {len(event.articles)} article(s); diverse summarization needs at least {MIN_ARTICLES}")
        aids = [a.aid for a in event.articles]
        twice = next((aid for n, aid in enumerate(aids) if aid in aids[:n]), None)
        if twice is not None:
            raise BooklensError(f"{where}: article ids (aid) are not unique: article id {twice!r} is given twice")
        asked: set[str] = set()
        for qa in event.question_answers:
            if wording_key(qa.question) in asked:  # rated twice, it would weigh double in the coverage score
                raise BooklensError(f"{where}: question_answers: the question {qa.question!r} is given twice")
            asked.add(wording_key(qa.question))
            for group in qa.answer_groups:
                for ans in group:
                    if ans.aid not in aids:
                        raise BooklensError(f"{where}: an answer to {qa.question!r} cites unknown article {ans.aid!r}")
        if event.eid in seen:
            raise BooklensError(f"{where}: duplicate eid {event.eid}")
        seen.add(event.eid)
        events.append(event)
    return events


def load_events(path: str | Path) -> list[Event]:
    return parse_events(read_json_file(path, "events file"), source=str(path))


def load_summaries(path: str | Path, events: Optional[list[Event]] = None, what: str = "summaries file", *,
                   failed: Optional[dict[str, str]] = None) -> dict[str, str]:
    """{eid: summary} from a summaries file (see `parse_summaries`); with `events`, every event
    must have a summary. With `failed`, an event whose summary a `booklens diverse` run recorded as
    failed is put there (eid: why it has none) rather than refused, and counts as given."""
    errors: dict[str, str] = {}
    summaries = parse_summaries(read_json_file(path, what), source=str(path),
                                failed=errors if failed is not None else None)
    for eid, error in errors.items():
        failed.setdefault(eid, f"its summary in {path} failed: {error}")  # the first file's reason, if both
    missing = [e.eid for e in events or [] if e.eid not in summaries and e.eid not in errors]
    if missing:
        raise BooklensError(f"{path}: no summary for event(s) {', '.join(missing)}")
    return summaries


def parse_summaries(payload: Any, source: str = "summaries", failed: Optional[dict[str, str]] = None
                    ) -> dict[str, str]:
    """Summaries per event id from {eid: summary}, [{eid, summary}, ...] or a `booklens diverse` result.
    A diverse result's event whose summary failed is refused, or with `failed` put there with its
    error's first line."""
    kind = payload.get("kind") if isinstance(payload, dict) else None
    if isinstance(kind, str) and kind.startswith("booklens.") and kind != "booklens.diverse":
        # another command's record: its fields are no event ids, and its rows carry no summary
        raise BooklensError(f"{source} is a {kind} record, not summaries: give {{eid: summary}}, "
                            "[{eid, summary}, ...] or a `booklens diverse` result")
    if isinstance(payload, dict) and isinstance(payload.get("events"), list):
        payload = payload["events"]
    out: dict[str, str] = {}
    if isinstance(payload, dict):
        for eid, summary in payload.items():
            if not isinstance(summary, str):
                raise BooklensError(f"{source}: the summary of event {eid!r} is not text")
            out[str(eid)] = summary
    elif isinstance(payload, list):
        for i, item in enumerate(payload):
            if isinstance(item, dict) and "eid" in item and item.get("summary") is None and item.get("error"):
                # A `booklens diverse` result whose summary failed: say so, not that the shape is wrong.
                error = str(item["error"]).strip().splitlines()[0][:200]
                if failed is None:
                    raise BooklensError(f"{source}: event {item['eid']!r} has no summary (it failed: {error})")
                if str(item["eid"]) in out or str(item["eid"]) in failed:
                    raise BooklensError(f"{source}: item {i + 1}: duplicate eid {item['eid']!r}")
                failed[str(item["eid"])] = error
                continue
            if not isinstance(item, dict) or "eid" not in item or not isinstance(item.get("summary"), str):
                raise BooklensError(f"{source}: item {i + 1} is not an object with 'eid' and 'summary' text")
            if str(item["eid"]) in out or str(item["eid"]) in (failed or {}):  # one would be judged, unseen
                raise BooklensError(f"{source}: item {i + 1}: duplicate eid {item['eid']!r}")
            out[str(item["eid"])] = item["summary"]
    else:
        raise BooklensError(f"{source}: expected {{eid: summary}} or a list of {{eid, summary}} objects")
    if not out and not failed:
        raise BooklensError(f"{source}: no summaries")
    from booklens.inputs import wordless

    for eid, summary in out.items():
        # Judged, a summary of punctuation alone would be faithful to every article: nothing in it is false.
        if wordless(summary):
            raise BooklensError(f"{source}: the summary of event {eid!r} {wordless(summary)}")
    return out


REFERENCES = "question_answers to judge coverage against"
NO_REFERENCES = f"no {REFERENCES}"


def require_question_answers(events: list[Event]) -> None:
    """Coverage is judged against the reference QA pairs: every event needs some."""
    for e in events:
        if not e.question_answers:
            raise BooklensError(f"event {e.eid} has {NO_REFERENCES}")


def coverage_events(events: list[Event]) -> tuple[list[Event], list[dict[str, str]]]:
    """The events coverage can be judged on (those with reference QA pairs) and the others as
    {eid, reason}: one event without references does not cost the rest their judgments, as it
    does not in `diverse`. Refused when no event has any, since nothing would be judged."""
    judged = [e for e in events if e.question_answers]
    if not judged:
        raise BooklensError(f"no event has {REFERENCES} ({counted(len(events), 'event')} given); faithfulness is "
                            "judged against the articles and needs none")
    return judged, [{"eid": e.eid, "reason": NO_REFERENCES} for e in events if not e.question_answers]


def generated_references(path: str | Path, events: list[Event], what: str = "summaries file"
                         ) -> dict[str, list[QuestionAnswers]]:
    """The QA references a `booklens diverse --generate-questions` record built for its events that
    had none of their own (`references: generated`), by eid, for the `events` without their own
    (an event's own references always win, as in `diverse`); {} for summaries given another way.
    Each is checked as the events file's are: a record made from other events cites other articles."""
    payload = read_json_file(path, what)
    if not isinstance(payload, dict) or payload.get("kind") != "booklens.diverse" \
            or not isinstance(payload.get("events"), list):
        return {}
    bare = {e.eid: e for e in events if not e.question_answers}
    out: dict[str, list[QuestionAnswers]] = {}
    for row in payload["events"]:
        if not isinstance(row, dict) or row.get("references") != "generated" or str(row.get("eid")) not in bare:
            continue
        event = bare[str(row["eid"])]
        where = f"{path}: the references generated for event {event.eid!r}"
        items = row.get("generated_question_answers")
        if not isinstance(items, list) or not items:
            raise BooklensError(f"{where} are missing ('generated_question_answers' is not a list of QA pairs)")
        try:
            pairs = [QuestionAnswers.model_validate(item) for item in items]
        except ValidationError as exc:
            raise BooklensError(f"{where}: {validation_problem(exc)}") from None
        aids = {a.aid for a in event.articles}
        unknown = sorted({ans.aid for qa in pairs for group in qa.answer_groups for ans in group} - aids)
        if unknown:
            raise BooklensError(f"{where} cite article {unknown[0]!r}, which that event of the events file does not "
                                "have: was the record made from other events?")
        out[event.eid] = pairs
    return out


def with_references(events: list[Event], generated: dict[str, tuple[list[QuestionAnswers], str]]
                    ) -> tuple[list[Event], dict[str, dict[str, Any]]]:
    """The events, each without its own references given the `generated` ones ({eid: (QA pairs, the
    file that holds them)}), and for those {eid: {file, questions}}: what coverage is judged against."""
    out, used = [], {}
    for e in events:
        if not e.question_answers and e.eid in generated:
            pairs, source = generated[e.eid]
            e = e.model_copy(update={"question_answers": pairs})
            used[e.eid] = {"file": source, "questions": len(pairs)}
        out.append(e)
    return out, used


def to_examples(events: list[Event]) -> list:
    """dspy.Examples with the summarizer's input (the articles) and the reference QA pairs."""
    import dspy

    return [dspy.Example(articles=[a.summarizer_text() for a in e.articles], eid=e.eid,
                         question_answers=[qa.model_dump() for qa in e.question_answers]).with_inputs("articles")
            for e in events]
