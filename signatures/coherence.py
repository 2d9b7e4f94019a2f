"""Confusion detection for BooookScore: does a summary sentence leave a reader confused?

Two signatures share one set of instructions (the two conditions of a confusion and
the eight error types): `DetectConfusion` judges one target sentence, the paper's
setting; `DetectConfusionBatch` judges several numbered sentences in one call. Both
take the whole summary first so that calls on the same summary share a prompt prefix.
"""

import inspect
from typing import Annotated, Any, Literal, Optional, get_args

import dspy
from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema, model_validator

from booklens.records import COHERENCE_ERROR_TYPES, CoherenceErrorType
from booklens.signatures.answers import choice_reader, read_texts, verdict_reader

NO_CONFUSION = "no confusion"
CONFUSION = "confusion"
Verdict = Literal["no confusion", "confusion"]


def _as_list(value: Any) -> list:
    """A list answer as models write it: `null` (or nothing) for none, a lone item without its list."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


# A verdict or kind as a model may write it without its schema enforced ("No Confusion",
# "**Entity omission**"), read as the allowed value it names: the rule every closed-set answer follows.
# A verdict may also come after a label or in a phrase ("Verdict: confusion", "The sentence is not
# confusing", "Yes, it is confusing"); with two verdicts, "not confusing" can only mean the other one.
_verdict = verdict_reader(get_args(Verdict), subjects=("verdict", "answer", "sentence", "target sentence",
                                                       "this sentence", "it"),
                          wordings={"confusing": CONFUSION, "not confusing": NO_CONFUSION},
                          yes_no={"yes": CONFUSION, "no": NO_CONFUSION})
_kind = choice_reader(COHERENCE_ERROR_TYPES)


# Questions: an item that is no text is no question, and dropping it leaves the rest readable.
_text_list = read_texts


# Kinds that say there is none: BooookScore's own annotations write "Types: no confusion" for a clean
# sentence, and models write "none" or "" alike.
_NO_KINDS = ("", "none", NO_CONFUSION, "n/a")
_no_kind = choice_reader(_NO_KINDS)


def _named_list(value: Any) -> list[str]:
    """Kinds: a `null` item, or one that names no kind ("none", "no confusion", ""), is nothing, as a
    `null` list is; any other item that is no text is kept as text, so that it is refused as an unknown
    kind (a number may mean a place in the list: a guess)."""
    return [_kind(v if isinstance(v, str) else str(v)) for v in _as_list(value)
            if v is not None and not (isinstance(v, str) and _no_kind(v) in _NO_KINDS)]


def unknown_kinds(kinds: list[Any]) -> str | None:
    """The complaint about the kinds of an answer that are none of the eight, or None: one wording
    for both modes' records."""
    unknown = [k for k in kinds if k not in COHERENCE_ERROR_TYPES]
    return f"unknown error type(s) {', '.join(repr(k) for k in unknown)}" if unknown else None


def _known_kinds(value: Any) -> list[str]:
    """Kinds read as `_named_list` reads them; an unknown one refuses the answer naming it (left to
    the field's type, the refusal named only the type: "1 validation error for list[literal[...]]")."""
    kinds = _named_list(value)
    complaint = unknown_kinds(kinds)
    if complaint:
        raise ValueError(complaint)
    return kinds


# The prompt and the JSON schema show the plain list types; only the answer is read leniently
# (`booklens.lm.adapter` applies a field's `BeforeValidator` when it reads an answer).
Questions = Annotated[list[str], BeforeValidator(_text_list)]
ErrorTypes = Annotated[list[CoherenceErrorType], BeforeValidator(_known_kinds)]
VerdictAnswer = Annotated[Verdict, BeforeValidator(_verdict)]

GUIDE = """\
A sentence counts as confusing only when both of these are true:
1. A reader who never gets an answer to the confusion would have real trouble following the main
   storyline, or the summary would read as incoherent because of it.
2. The summary itself does not clear it up: nothing before or after the sentence answers it.
Passing curiosity, details a reader can do without, and anything explained elsewhere in the
summary are not confusions. Judge the summary as a text of its own: you have not read the book.

The kinds of confusion (use these exact names):
- entity omission: a person, place, object, group or idea appears without the context needed to
  know who or what it is.
- event omission: an event is referred to, but what happened, or a key part of it, is left out or
  unclear.
- causal omission: why something happens, or why someone acts as they do, is missing or unclear.
- salience: the sentence spends words on details that do not matter to the main storyline.
- discontinuity: the flow of the narrative breaks: an abrupt jump in time, place or point of view,
  a missing transition, or a sentence that is out of place or in an illogical order.
- duplication: the sentence repeats information the summary has already given.
- inconsistency: the sentence contradicts another part of the summary.
- language: grammar mistakes, or wording so vague or awkward that the meaning is unclear.
A confusing sentence can have several kinds at once."""


def _with_guide(signature: type[dspy.Signature]) -> type[dspy.Signature]:
    signature.__doc__ = inspect.cleandoc(signature.__doc__ or "") + "\n\n" + GUIDE
    return signature


@_with_guide
class DetectConfusion(dspy.Signature):
    """You check a book summary for coherence, one sentence at a time. Read the whole summary,
    then decide whether the target sentence (a sentence of that summary) confuses a reader.
    If it does, answer "confusion", write the clarifying question or questions a reader would
    ask, and name every kind of confusion that applies. If it does not, answer "no confusion"
    with no questions and no kinds."""

    summary: str = dspy.InputField(desc="the whole summary")
    sentence: str = dspy.InputField(desc="the target sentence, taken from the summary")
    verdict: VerdictAnswer = dspy.OutputField(desc='"confusion" or "no confusion"')
    questions: Questions = dspy.OutputField(desc="the clarifying questions a reader would ask; empty for no confusion")
    error_types: ErrorTypes = dspy.OutputField(
        desc="the kinds of confusion, one or more; empty for no confusion"
    )


# Batched answers are parsed leniently (plain strings, with the allowed values in the JSON
# schema so grammar-constrained decoders stay inside them) and validated one by one by the
# program, so that one bad answer costs a re-ask of that sentence only, not of the batch.
VerdictText = Annotated[str, Field(json_schema_extra={"enum": [NO_CONFUSION, CONFUSION]})]
ErrorTypeText = Annotated[str, Field(json_schema_extra={"enum": list(COHERENCE_ERROR_TYPES)})]


class SentenceVerdict(BaseModel):
    """The answer for one numbered sentence."""

    # None when the model wrote no whole number (the schema it is shown still asks for an integer):
    # 0 is a number a model writes when it counts from 0, which the program must see as such.
    number: Annotated[Optional[int], WithJsonSchema({"type": "integer"})] = Field(
        description="the number of the sentence this answer is about")
    verdict: VerdictText = Field(description='"confusion" or "no confusion"')
    questions: list[str] = Field(default_factory=list, description="clarifying questions; empty for no confusion")
    error_types: list[ErrorTypeText] = Field(default_factory=list,
                                             description="kinds of confusion, one or more; empty for no confusion")

    @model_validator(mode="before")
    @classmethod
    def _read_leniently(cls, data: Any) -> Any:
        """Any item reads as an answer, so that a malformed one costs a re-ask of its own sentence only:
        a number that is no whole number becomes None (the answer is for no sentence), a
        missing verdict "" (the program refuses it); the lists are read as in `DetectConfusion`.
        The JSON schema the model is asked for stays as declared."""
        if isinstance(data, BaseModel):
            data = data.model_dump()
        data = dict(data) if isinstance(data, dict) else {}
        data["number"] = _whole_number(data.get("number"))
        verdict = _verdict(data.get("verdict"))
        data["verdict"] = verdict if isinstance(verdict, str) else ""
        data["questions"] = _text_list(data.get("questions"))
        data["error_types"] = _named_list(data.get("error_types"))
        return data


def _whole_number(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    return None


@_with_guide
class DetectConfusionBatch(dspy.Signature):
    """You check a book summary for coherence, a few sentences at a time. Read the whole summary,
    then judge each of the numbered sentences (sentences of that summary) on its own: does it
    confuse a reader? Give exactly one answer per numbered sentence, carrying that sentence's
    number. For a confusing sentence answer "confusion", write the clarifying question or
    questions a reader would ask, and name every kind of confusion that applies; otherwise
    answer "no confusion" with no questions and no kinds."""

    summary: str = dspy.InputField(desc="the whole summary")
    sentences: str = dspy.InputField(desc='the sentences to judge, one per line as "number: sentence"')
    answers: list[SentenceVerdict] = dspy.OutputField(desc="one answer per numbered sentence, in the order given")
