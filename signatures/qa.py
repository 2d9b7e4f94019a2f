"""Question answering over a whole book (NovelQA): answering in the multiple-choice and
generative settings, with the book, with retrieved passages or closed-book; judging a
free-text answer against the reference; quoting evidence;
scoring quoted evidence against the annotators' evidence (NovelQA's evidence recall).

Inputs shared by many calls (the book or its passages) come first so that prompt
prefixes are reused between questions about the same book."""

from copy import deepcopy
from typing import Annotated, Literal, Mapping

import dspy
from pydantic import BeforeValidator

from booklens.data.novelqa import OPTION_LETTERS
from booklens.signatures.answers import (
    lenient_rating,
    lenient_texts,
    option_letter,
    option_letter_reader,
    verdict_reader,
)

OptionLetter = option_letter(OPTION_LETTERS)


class AnswerMultipleChoice(dspy.Signature):
    """Answer a question about a novel by choosing one of the lettered options. The context is
    the text of the novel, or the passages of it that are most relevant to the question. Read it
    closely: questions may ask about small details, about how often something happens, or about
    facts spread over several chapters. Base the choice on what the text says, not on what
    adaptations or common summaries of the novel say. Reply with the letter of the best option."""

    context: str = dspy.InputField(desc="the novel, or passages from it in the order they appear")
    question: str = dspy.InputField()
    options: str = dspy.InputField(desc="one option per line, 'LETTER. text'")
    answer: OptionLetter = dspy.OutputField(desc="the letter of the correct option")


class AnswerMultipleChoiceClosedBook(dspy.Signature):
    """Answer a question about a novel by choosing one of the lettered options, without the text
    of the novel: rely on what you remember of the book. Reply with the letter of the best option."""

    book_title: str = dspy.InputField()
    question: str = dspy.InputField()
    options: str = dspy.InputField(desc="one option per line, 'LETTER. text'")
    answer: OptionLetter = dspy.OutputField(desc="the letter of the correct option")


def reading_option_texts(signature: type[dspy.Signature], options: Mapping[str, str]) -> type[dspy.Signature]:
    """A multiple-choice `signature` whose answer is also read as the letter of the one option whose
    text it is (`option_letter_reader` with `options`, each option's text by its letter). Only how the
    answer is read changes: the prompt and the answer's schema are the signature's."""
    fields = deepcopy(signature.fields)
    fields["answer"].metadata = [BeforeValidator(option_letter_reader(OPTION_LETTERS, options))]
    return dspy.Signature(fields, signature.instructions)


class AnswerQuestion(dspy.Signature):
    """Answer a question about a novel in a few words or one short sentence. The context is the
    text of the novel, or the passages of it that are most relevant to the question. Read it
    closely: questions may ask about small details, how many times something happens, or facts
    spread over several chapters; when a number is asked for, give the exact number. Base the
    answer on what the text says."""

    context: str = dspy.InputField(desc="the novel, or passages from it in the order they appear")
    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="a short answer: a few words or one sentence")


class AnswerQuestionClosedBook(dspy.Signature):
    """Answer a question about a novel in a few words or one short sentence, without the text of
    the novel: rely on what you remember of the book. When a number is asked for, give the exact
    number."""

    book_title: str = dspy.InputField()
    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="a short answer: a few words or one sentence")


EVIDENCE_FIELD_DESC = ("sentences copied word for word from the context that support the answer; "
                       "no paraphrase, at most three")


def with_evidence(signature: type[dspy.Signature]) -> type[dspy.Signature]:
    """The same task, also quoting the supporting sentences from the context before answering."""
    instructions = (signature.instructions.rstrip()
                    + " First copy, word for word, the sentences of the context that support the answer.")
    sig = signature.with_instructions(instructions)
    return sig.prepend("evidence", dspy.OutputField(desc=EVIDENCE_FIELD_DESC), type_=lenient_texts())


class JudgeAnswer(dspy.Signature):
    """You are grading a student's short answer to a question about a novel, against the correct
    answer and the passages that support it. The student's answer is correct when it conveys the
    meaning of the correct answer, even in other words. It is incorrect when it states a wrong
    fact, leaves out what the question asks for, hedges between alternatives, or gives a rough
    number where the question asks for an exact one. Explain briefly, then give the verdict."""

    # The title is the same for every question of a book, the student's answer is what differs
    # between systems graded on the same question: shared inputs first, the answer last.
    book_title: str = dspy.InputField()
    question: str = dspy.InputField()
    correct_answer: str = dspy.InputField()
    supporting_evidence: list[str] = dspy.InputField(desc="quotes from the novel or the annotator's reasoning")
    student_answer: str = dspy.InputField()
    reason: str = dspy.OutputField(desc="one or two sentences")
    verdict: Annotated[Literal["correct", "incorrect"],
                       BeforeValidator(verdict_reader(("correct", "incorrect")))] = dspy.OutputField()


class ScoreEvidence(dspy.Signature):
    """You are grading the evidence a student quoted from a novel to support an answer, against
    the evidence an expert annotator gave for the correct answer. Score only the student's
    evidence, not the answer, on three criteria, each from 0 to 100:
    correctness: the student's evidence is the annotator's evidence, or says the same thing;
    relevance: the student's evidence bears on the answer;
    sufficiency: the student's evidence is enough, on its own, to support the answer.
    Evidence that is missing, invented or unrelated scores low on all three."""

    book_title: str = dspy.InputField()
    question: str = dspy.InputField()
    correct_answer: str = dspy.InputField()
    correct_evidence: list[str] = dspy.InputField(desc="the annotator's quotes from the novel or reasoning")
    student_answer: str = dspy.InputField()
    student_evidence: list[str] = dspy.InputField(desc="the sentences the student quoted")
    correctness: lenient_rating(100) = dspy.OutputField(desc="0 to 100")
    relevance: lenient_rating(100) = dspy.OutputField(desc="0 to 100")
    sufficiency: lenient_rating(100) = dspy.OutputField(desc="0 to 100")
