"""Faithfulness steps (FABLES §2 and §4): break a summary into atomic claims, then judge
each claim against evidence from the book.

Verification comes in two label sets: the four FABLES judgments (`VerifyClaim`), and the binary
faithful / unfaithful judgment of the seed's automatic raters (`VerifyClaimBinary`, Table 5: its
rater answers whether the statement is true or false given the context). Both put the evidence
and the claim after the instructions and demos, so the calls of one judge share that prefix.
"""

from typing import Annotated

import dspy
from pydantic import BeforeValidator

from booklens.signatures.answers import lenient_numbers, verdict_reader
from booklens.vocabulary import BINARY_LABELS, CLAIM_LABELS, FABLES_LABEL_NAMES, BinaryLabel, ClaimLabel

# A label as a model writes it without the schema: also after a label name or in a phrase ("Label:
# Unfaithful", "The claim is unfaithful"), or in other words for the same judgment ("Partially
# supported", "Cannot verify"). "not faithful" is unfaithful only where no partial support or
# can't verify could be meant: in the binary rater's two labels.
_FAITHFUL, _UNFAITHFUL, _PARTIAL_SUPPORT, _CANT_VERIFY = CLAIM_LABELS
_LABEL_SUBJECTS = ("label", "verdict", "answer", "claim", "this claim", "it")
_CLAIM_WORDINGS = {
    **dict.fromkeys(("partial", "partially supported", "partly supported", "supported in part"),
                    _PARTIAL_SUPPORT),
    **dict.fromkeys(("cannot verify", "can not verify", "cannot be verified", "can not be verified",
                     "can't be verified", "unverifiable", "not verifiable"), _CANT_VERIFY)}
# The binary rater's prompt defines faithful as the claim being true: "True" and "False" answer it.
_BINARY_WORDINGS = {"not faithful": _UNFAITHFUL, "true": _FAITHFUL, "false": _UNFAITHFUL}

ClaimLabelAnswer = Annotated[ClaimLabel, BeforeValidator(verdict_reader(CLAIM_LABELS, subjects=_LABEL_SUBJECTS,
                                                                        wordings=_CLAIM_WORDINGS))]
BinaryLabelAnswer = Annotated[BinaryLabel, BeforeValidator(verdict_reader(BINARY_LABELS, subjects=_LABEL_SUBJECTS,
                                                                          wordings=_BINARY_WORDINGS))]
# Passage numbers as a model writes them without the schema: "Passage 2", a bare 2, null.
PassageNumbers = lenient_numbers()

# The dataset's names of the four judgments, onto booklens' (`booklens.vocabulary.CLAIM_LABELS`).
FABLES_LABELS = dict(zip(FABLES_LABEL_NAMES, CLAIM_LABELS))
LABEL_TO_FABLES = {v: k for k, v in FABLES_LABELS.items()}


class DecomposeSummary(dspy.Signature):
    """Split a summary of a book into atomic claims, so that a person who has read the book can
    check each claim on its own.

    An atomic claim states a single fact that the summary asserts. Every claim must make sense
    without the rest of the summary: call people, places and things by their names instead of
    pronouns or phrases like "the protagonist" or "she". Where the summary gives it, keep the time,
    the place and the cause or consequence that go with the fact. Use one sentence, two at most.
    Cover everything the summary asserts, in the order it says it, and add nothing it does not say."""

    summary: str = dspy.InputField(desc="a summary of a book")
    claims: list[str] = dspy.OutputField(desc="the atomic claims, each a self-contained statement, in summary order")


class VerifyClaim(dspy.Signature):
    """Judge whether a claim taken from a summary of a book is true to the book, using the
    numbered passages quoted from the book as evidence.

    Labels:
    - faithful: the passages support the whole claim, directly or by plain inference.
    - unfaithful: the passages contradict the claim or an essential part of it.
    - partial support: some of the claim is supported, but another part is wrong or goes beyond
      what the passages show.
    - can't verify: the passages neither support nor contradict the claim.
    Judge only by the passages, not by what a story like this usually contains. Give a one-sentence
    reason, then the numbers of the passages that support the claim and of those that contradict it
    (empty lists when none do)."""

    evidence: str = dspy.InputField(desc="numbered passages from the book: [1] ..., [2] ...; may be empty")
    claim: str = dspy.InputField(desc="the claim to judge")
    label: ClaimLabelAnswer = dspy.OutputField(desc="faithful, unfaithful, partial support or can't verify")
    reason: str = dspy.OutputField(desc="one short sentence explaining the label")
    supporting_passages: PassageNumbers = dspy.OutputField(desc="numbers of the passages that support the claim")
    refuting_passages: PassageNumbers = dspy.OutputField(desc="numbers of the passages that contradict the claim")


class VerifyClaimWithoutEvidence(dspy.Signature):
    """Judge whether a claim taken from a summary of a book is true to that book, from what you
    know about the book (no passages are given).

    Labels:
    - faithful: the claim matches the book.
    - unfaithful: the claim contradicts the book or gets an essential part wrong.
    - partial support: part of the claim is right and another part is wrong or unsupported.
    - can't verify: you cannot tell whether the claim is true to the book.
    Give a one-sentence reason."""

    claim: str = dspy.InputField(desc="the claim to judge")
    label: ClaimLabelAnswer = dspy.OutputField(desc="faithful, unfaithful, partial support or can't verify")
    reason: str = dspy.OutputField(desc="one short sentence explaining the label")


class VerifyClaimBinary(dspy.Signature):
    """Judge whether a claim taken from a summary of a book is true or false, using the numbered
    passages quoted from the book as evidence.

    Labels:
    - faithful: the claim is true: the passages support it, directly or by plain inference.
    - unfaithful: the claim is false: the passages contradict it, or it gets an essential part wrong.
    Judge only by the passages, not by what a story like this usually contains. Give a one-sentence
    reason, then the numbers of the passages that support the claim and of those that contradict it
    (empty lists when none do)."""

    evidence: str = dspy.InputField(desc="numbered passages from the book: [1] ..., [2] ...; may be empty")
    claim: str = dspy.InputField(desc="the claim to judge")
    label: BinaryLabelAnswer = dspy.OutputField(desc="faithful or unfaithful")
    reason: str = dspy.OutputField(desc="one short sentence explaining the label")
    supporting_passages: PassageNumbers = dspy.OutputField(desc="numbers of the passages that support the claim")
    refuting_passages: PassageNumbers = dspy.OutputField(desc="numbers of the passages that contradict the claim")


class VerifyClaimBinaryWithoutEvidence(dspy.Signature):
    """Judge whether a claim taken from a summary of a book is true or false to that book, from what
    you know about the book (no passages are given).

    Labels:
    - faithful: the claim is true to the book.
    - unfaithful: the claim is false: it contradicts the book or gets an essential part wrong.
    Give a one-sentence reason."""

    claim: str = dspy.InputField(desc="the claim to judge")
    label: BinaryLabelAnswer = dspy.OutputField(desc="faithful or unfaithful")
    reason: str = dspy.OutputField(desc="one short sentence explaining the label")
