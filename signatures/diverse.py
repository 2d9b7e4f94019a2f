"""Multi-document diverse summarization (DiverseSumm, seed 003): questions on which news
sources are likely to differ, answers extracted from one article, equivalent answers
grouped, invalid answers and questions without diverse answers filtered out, summaries of
what the articles say differently (directly, or from sentences extracted per article first), and
the judges of coverage and faithfulness (binary, Likert 1-10 and pairwise).

What many calls share (the summary being judged, the article being read, the articles
of the event) comes before what changes between calls (the question, the answers)."""

from typing import Annotated, Literal

import dspy
from pydantic import BeforeValidator

from booklens.signatures.answers import (
    lenient_number_groups,
    lenient_numbers,
    lenient_rating,
    lenient_texts,
    pairwise_verdict_reader,
)
from booklens.vocabulary import RATING_SCALES


class GenerateQuestions(dspy.Signature):
    """Several news articles report the same event. Write questions about the event that most of
    the articles answer, but answer differently: questions about causes, consequences, numbers
    and estimates, responsibility, opinions and predictions on which the sources disagree or
    give different perspectives. Include a few central factual questions as well. Each question
    must be short (at most 14 words) and answerable from the articles."""

    articles: list[str] = dspy.InputField(desc="the articles, each headed by its title and source")
    num_questions: int = dspy.InputField(desc="how many questions to write")
    questions: lenient_texts() = dspy.OutputField()


class ExtractAnswers(dspy.Signature):
    """Answer the question from this one news article only. Copy the sentences of the article
    that answer it, changing at most five words in each; give every distinct answer the article
    contains. If the article does not answer the question, return an empty list."""

    article: str = dspy.InputField()
    question: str = dspy.InputField()
    answers: lenient_texts() = dspy.OutputField(desc="answers found in the article; empty when there is none")


class GroupEquivalentAnswers(dspy.Signature):
    """Answers to one question were extracted from different news articles about the same event.
    Group the answers that give the same information: the same fact, figure, cause, opinion or
    prediction, even when worded differently. Answers that differ in substance (another figure,
    another cause, another opinion) belong to different groups. Every answer number appears in
    exactly one group; an answer unlike all the others is a group of its own."""

    question: str = dspy.InputField()
    answers: list[str] = dspy.InputField(desc="numbered answers: '[n] (article id) answer'")
    groups: lenient_number_groups() = dspy.OutputField(desc="groups of answer numbers")


class FilterAnswers(dspy.Signature):
    """Several news articles report the same event. Answers to one question were extracted from
    them. First, find the invalid answers: those that make no sense, do not answer the question,
    or only say that the article does not answer it. Then, among the remaining answers, find
    those that contradict one another or give different information, opinions or perspectives
    on the question. Refer to answers by their numbers."""

    articles: list[str] = dspy.InputField(desc="the articles, each headed by its id, title and source")
    question: str = dspy.InputField()
    answers: list[str] = dspy.InputField(desc="numbered answers: '[n] (article id) answer'")
    invalid: lenient_numbers() = dspy.OutputField(desc="numbers of the invalid answers; empty when none")
    diverse: lenient_numbers() = dspy.OutputField(
        desc="numbers of the valid answers that conflict or differ from one another; empty when they all agree")


class SummarizeDiverse(dspy.Signature):
    """Several news articles report the same event. Write a summary of what they say differently:
    the points where sources disagree, give conflicting figures or explanations, or offer
    different perspectives, opinions and predictions. Leave out what all the articles agree on.
    For each point, say which sources say what and how their accounts differ, rather than only
    naming the topic on which they differ. The summary may be long if the differences need it."""

    articles: list[str] = dspy.InputField(desc="the articles, each headed by its title and source")
    summary: str = dspy.OutputField()


class ExtractImportantSentences(dspy.Signature):
    """Pick the most important sentences of a news article: the ones a reader comparing several
    reports of the same event would most need. Answer with their numbers, the most important
    first."""

    num_sentences: int = dspy.InputField(desc="how many sentences to pick")
    title: str = dspy.InputField(desc="the article's title and source")
    sentences: list[str] = dspy.InputField(desc="the article's sentences, each starting with its number in brackets")
    picks: lenient_numbers() = dspy.OutputField(desc="numbers of the chosen sentences")


class SummarizeExtractedSentences(dspy.Signature):
    """The sentences below were taken from several news articles about the same event, grouped by
    article. Write a summary of what the articles say differently: the points where sources
    disagree, give conflicting figures or explanations, or offer different perspectives,
    opinions and predictions. Leave out what all of them agree on. For each point, say which
    sources say what and how their accounts differ. The summary may be long if the differences
    need it."""

    extracts: list[str] = dspy.InputField(desc="per article: its title and source, then its key sentences")
    summary: str = dspy.OutputField()


# ---------------------------------------------------------------------------
# Judges


class JudgeCoverageOfQA(dspy.Signature):
    """You are an impartial judge of a summary of several news articles. Decide whether the summary
    covers the reference question and its answers: it covers them when a reader of the summary
    would learn the different answers the articles give to that question. Explain briefly, then
    rate 1 when the summary covers the question and its answers, 0 when it does not."""

    summary: str = dspy.InputField()
    question_and_answers: str = dspy.InputField(desc="a reference question and the answers different articles give")
    explanation: str = dspy.OutputField(desc="one or two sentences")
    rating: lenient_rating(RATING_SCALES["binary"][1]) = dspy.OutputField(desc="1 = covered, 0 = not covered")


class JudgeCoverageOfAllQAs(dspy.Signature):
    """You are an impartial judge of a summary of several news articles. Rate how much of the
    information in the reference questions and answers the summary covers, from 1 (almost none
    of it) to 10 (all of it, including how the sources' answers differ). Explain briefly, then
    give the rating."""

    summary: str = dspy.InputField()
    questions_and_answers: str = dspy.InputField(desc="reference questions with the answers different articles give")
    explanation: str = dspy.OutputField(desc="one or two sentences")
    rating: lenient_rating(RATING_SCALES["likert"][1]) = dspy.OutputField(desc="an integer from 1 to 10")


class JudgeFaithfulnessBinary(dspy.Signature):
    """You are an impartial judge of a summary. Decide whether the summary is factually consistent
    with the news article: nothing in it contradicts the article or states as the article's
    account something the article does not say. Explain briefly, then rate 1 for faithful,
    0 for unfaithful."""

    summary: str = dspy.InputField()
    article: str = dspy.InputField()
    explanation: str = dspy.OutputField(desc="one or two sentences")
    rating: lenient_rating(RATING_SCALES["binary"][1]) = dspy.OutputField(desc="1 = faithful, 0 = unfaithful")


class JudgeFaithfulnessLikert(dspy.Signature):
    """You are an impartial judge of a summary. Rate how factually consistent the summary is with
    the news article, from 1 (largely contradicts it or makes things up) to 10 (entirely
    consistent with it). Explain briefly, then give the rating."""

    summary: str = dspy.InputField()
    article: str = dspy.InputField()
    explanation: str = dspy.OutputField(desc="one or two sentences")
    rating: lenient_rating(RATING_SCALES["likert"][1]) = dspy.OutputField(desc="an integer from 1 to 10")


PairwiseVerdict = Annotated[Literal["A", "B", "tie"], BeforeValidator(pairwise_verdict_reader(("A", "B"), "tie"))]


class CompareSummaries(dspy.Signature):
    """You are an impartial judge comparing two summaries, A and B, on one criterion against a
    reference. Judge only the criterion. The order in which the summaries appear must not
    influence you, nor their length, nor their labels. Compare them, explain briefly, then give
    the verdict: A if summary A is better, B if summary B is better, tie if neither is."""

    criterion: str = dspy.InputField(desc="what makes a summary better here")
    reference: str = dspy.InputField(desc="the article, or the reference questions and answers")
    summary_a: str = dspy.InputField()
    summary_b: str = dspy.InputField()
    explanation: str = dspy.OutputField(desc="one to three sentences")
    verdict: PairwiseVerdict = dspy.OutputField()


# What the pairwise judge is told each criterion of `booklens.vocabulary.CRITERIA` means.
CRITERION_DESCRIPTIONS = {
    "coverage": ("coverage: how much of the information in the reference questions and answers the summary "
                 "conveys, including how the sources' answers differ"),
    "faithfulness": ("faithfulness: whether the summary is factually consistent with the reference article, "
                     "without contradicting it or adding what it does not say"),
}
