"""Reading a closed-set answer as a model may write it when its answer schema is not enforced
(`--structured off`, or a server that ignores the schema): "b" or "(B)" for the option B,
"Tie" for tie, "Faithful" for faithful. `booklens.lm.adapter` applies a field's `BeforeValidator`
when it reads an answer; the prompt and the JSON schema still show the values as declared."""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any, Callable, Literal, Mapping

from pydantic import BeforeValidator

# Wrapping a bare value: spaces, brackets, quotes, a closing period and Markdown emphasis.
_EDGES = " \t\r\n.:()[]\"'*_`"
_STRAIGHT_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def _plain_quotes(text: str) -> str:
    """Typographic quotes as the straight ones: an apostrophe in "can’t verify" as the values are
    declared, and “B” or ‘The Marigold’ wrapped as "B" is."""
    return text.translate(_STRAIGHT_QUOTES)


def _key(text: str) -> str:
    """How two values are compared: whatever their case, spacing, wrapping and quotation marks, and
    in NFKC form (an accent composed or combining, a full-width letter as its plain one)."""
    text = unicodedata.normalize("NFKC", _plain_quotes(text))
    return " ".join(text.strip(_EDGES).lower().split())


def choice_reader(values: tuple[str, ...]) -> Callable[[Any], Any]:
    """A reader mapping text that names one of `values` (whatever its case, spacing or wrapping)
    to that value as declared; anything else is left as written, to be refused and asked again."""
    canonical = {_key(v): v for v in values}

    def read(value: Any) -> Any:
        return canonical.get(_key(value), value) if isinstance(value, str) else value

    return read


def read_texts(value: Any) -> list[Any]:
    """A list of texts as models write it without the schema enforced: `null` (or nothing) for none,
    "" for none, a lone text without its list; an item that is no text is dropped."""
    if value is None or value == "":
        return []
    return [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]


def lenient_texts() -> Any:
    """A list of texts read with `read_texts`; the prompt and schema show `list[str]`."""
    return Annotated[list[str], BeforeValidator(read_texts)]


# Markdown emphasis around a label name or its colon ("**Verdict:** confusion", "**Answer**: B"),
# as chat models format a labelled answer.
_EMPHASIS = r"[*_]*"


# A verdict after a label or in a phrase ("Verdict: correct", "The answer is incorrect"), or followed by
# its reason ("Incorrect - it names the wrong ship"). `subjects` are the nouns a phrase may start with.
def _verdict_lead(subjects: tuple[str, ...]) -> str:
    nouns = "|".join(r"\s+".join(map(re.escape, s.split())) for s in subjects)
    return (rf"(?:{_EMPHASIS}(?:the\s+)?(?:student'?s\s+)?(?:{nouns})(?:\s+is|{_EMPHASIS}\s*[:=])"
            rf"{_EMPHASIS}\s*)?")


_VERDICT_SUBJECTS = ("answer", "verdict", "grade")
# "Yes, it is confusing": a yes or no before a verdict, read only where it agrees with that verdict.
# The yes or no may be in bold or italics ("**Yes**, it is confusing"), as chat models stress it.
_YES_OR_NO = re.compile(rf"{_EMPHASIS}(?P<word>yes|no){_EMPHASIS}\s*[,.!:;\u2013\u2014-]\s*(?P<rest>\S.*)",
                        re.IGNORECASE | re.DOTALL)


def verdict_reader(values: tuple[str, ...], *, subjects: tuple[str, ...] = _VERDICT_SUBJECTS,
                   wordings: Mapping[str, str] | None = None,
                   yes_no: Mapping[str, str] | None = None) -> Callable[[Any], Any]:
    """`choice_reader` that also reads a verdict after a label or in a phrase, or followed by its
    reason; a reason that names one of `values` ("correct - though partly incorrect") leaves
    the answer as written, as does anything before the verdict ("not correct").

    `wordings` maps other ways of naming a value ("partially supported") to it, `subjects` are the
    nouns of a phrase ("The claim is ..."), and `yes_no` the value a leading "yes" or "no" says: the
    answer is read only when the verdict after it is that value ("No, it is not confusing")."""
    wordings = {_key(k): v for k, v in (wordings or {}).items()}
    yes_no = {k.lower(): v for k, v in (yes_no or {}).items()}
    if not set(wordings.values()) | set(yes_no.values()) <= set(values):
        raise ValueError(f"wordings and yes_no must name values of {values}")
    exact = choice_reader(values)
    names = "|".join(re.escape(v) for v in sorted((*values, *wordings), key=len, reverse=True))
    pattern = re.compile(_verdict_lead(subjects)
                         + rf"\**(?P<v>{names})\**(?:\s*(?:[.:!]|\s[-\u2013\u2014])\s*(?P<rest>.*))?",
                         re.IGNORECASE | re.DOTALL)
    # Each name with the value it names: a reason naming the same value again ("Faithful. The claim is
    # true") is no second verdict.
    others = [(re.compile(rf"\b{re.escape(v)}\b", re.IGNORECASE), wordings.get(_key(v), v))
              for v in (*values, *wordings)]

    def read_phrase(text: str) -> Any:
        found = pattern.fullmatch(text)
        if not found:
            return None
        got = exact(wordings.get(_key(found["v"]), found["v"]))
        if any(name != got and other.search(found["rest"] or "") for other, name in others):
            return None
        return got

    def read(value: Any) -> Any:
        got = exact(value)
        if got in values or not isinstance(value, str):
            return got
        text = " ".join(_plain_quotes(value).split()).strip(" *`\"'")
        got = read_phrase(text)
        if got is None and yes_no and (found := _YES_OR_NO.fullmatch(text)):
            got = read_phrase(found["rest"].strip(" *`\"'"))
            got = got if got == yes_no[found["word"].lower()] else None
        return value if got is None else got

    return read


# An option letter with its option's text after it ("B. The ship", "(B) The ship", "B - The ship"), or
# after a phrase ("The answer is B", "Answer: (b)", "Option B"): how chat models answer a multiple
# choice when the schema is not enforced, the same way on every re-ask.
_LETTER_WITH_TEXT = re.compile(r"[\s*_`\"'\[]*"
                               r"(?:\((?P<a>[A-Za-z])\)|(?P<b>[A-Za-z])\**(?:[.):]|\s+[-\u2013\u2014]\s))"
                               r"\**\s*(?P<rest>\S.*)", re.DOTALL)
_LETTER_IN_PHRASE = re.compile(rf"{_EMPHASIS}(?:the\s+)?(?:(?:correct|right|best)\s+)?(?:answer|option|choice)"
                               rf"(?:\s+is)?{_EMPHASIS}\s*:?{_EMPHASIS}\s*[*_\"']*"
                               r"(?P<letter>\([A-Za-z]\)|[A-Za-z])(?P<rest>(?:[\s.):,;*\"']+.*)?)",
                               re.IGNORECASE | re.DOTALL)
# A lone capital as the rest names it ("B. or C.", 'B or "C"'): another option's letter there names two options.
_OTHER_LETTER = re.compile(r"(?<![\w'])[\"']?([A-Z])[\"'*]*(?:[.):]|$)")


def option_letter_reader(letters: tuple[str, ...], texts: Mapping[str, str] | None = None) -> Callable[[Any], Any]:
    """`choice_reader` for option letters that also reads a letter given with its option's text or
    after a phrase; an answer that names a second letter, or none, is left as written.

    With `texts` (each option's text by its letter), an answer that is the text of one option alone
    ("The Marigold", "the marigold." for "B. The Marigold"), compared as `choice_reader` compares
    values, is read as that option's letter (before any letter it starts with: option C's text may be
    "A. Lincoln"); one that is the text of several options is left as written."""
    exact = choice_reader(letters)
    by_text: dict[str, list[str]] = {}
    text_of: dict[str, str] = {}
    for letter, text in (texts or {}).items():
        # A blank option's text names nothing: an answer with no words is not its letter.
        if exact(letter) in letters and _key(text):
            by_text.setdefault(_key(text), []).append(exact(letter))
            text_of[exact(letter)] = _key(text)

    def read_letter(value: str) -> Any:
        text = _plain_quotes(value).strip()
        found = _LETTER_WITH_TEXT.fullmatch(text)
        if found:
            letter, rest = (found["a"] or found["b"]), found["rest"]
        else:
            found = _LETTER_IN_PHRASE.fullmatch(text)
            if not found:
                return None
            letter, rest = found["letter"].strip("()"), found["rest"]
            # "the answer is a ship": a lower-case letter counts only bracketed or standing alone
            if letter.islower() and not found["letter"].startswith("(") and rest.strip(" .*\"'"):
                return None
        letter = exact(letter)
        if text_of.get(letter) == _key(rest):  # the letter and its own option's text, whatever that holds
            return letter
        if any(other in letters and other != letter for other in _OTHER_LETTER.findall(rest.strip())):
            return None
        return letter

    def read(value: Any) -> Any:
        got = exact(value)
        if got in letters or not isinstance(value, str):
            return got
        # One option's whole text first: "A. Lincoln" as option C's text is C, not A with words after it.
        named = by_text.get(_key(value), [])
        if len(named) == 1:
            return named[0]
        got = read_letter(value)
        return value if got is None else got

    return read


def option_letter(letters: tuple[str, ...]) -> Any:
    """The Literal of `letters` read with `option_letter_reader`."""
    return Annotated[Literal[letters], BeforeValidator(option_letter_reader(letters))]


# A pairwise verdict naming its summary ("Summary A", "Summary B is better") or the tie ("It is a tie",
# "Tie: neither is better"); nothing may follow a summary's letter, which could name the other one.
_SUMMARY_VERDICT = re.compile(r"(?:summary\s+)?(?P<v>[ab])(?:\s+is\s+(?:the\s+)?better(?:\s+one)?)?[.!]?",
                              re.IGNORECASE)
_TIE_VERDICT = re.compile(r"(?:it(?:'s|\s+is)\s+)?(?:a\s+)?tie(?:\s*[.!]|\s*[:,\u2013\u2014-]\s*\D*)?",
                          re.IGNORECASE | re.DOTALL)


def pairwise_verdict_reader(summaries: tuple[str, str], tie: str) -> Callable[[Any], Any]:
    """`choice_reader` for a pairwise verdict (`summaries` the two letters, `tie` the tie) that also
    reads a verdict naming its summary or the tie; anything else is left as written."""
    exact = choice_reader((*summaries, tie))

    def read(value: Any) -> Any:
        got = exact(value)
        if got in (*summaries, tie) or not isinstance(value, str):
            return got
        text = " ".join(_plain_quotes(value).strip(_EDGES).split())
        found = _SUMMARY_VERDICT.fullmatch(text)
        if found:
            return exact(found["v"])
        if _TIE_VERDICT.fullmatch(text):
            return tie
        return value

    return read


# A rating as judges write it without the schema enforced: "7", "7/10", "7 out of 10", "Rating: 7",
# "**7**", "Rating: [[7]]" (DiverseSumm's prompts ask for that), "7 (mostly covered)", "70%" on a
# scale to 100. A label before it, the scale after it and words after a bracket, dash or colon are
# allowed; a second number after it ("7-8", "7 or 8") is not.
_RATING = re.compile(r"(?:[^\W\d_][^\W\d]{0,20}(?: [^\W\d]{1,20}){0,2}\s*[:=]\s*)?\[*(?P<n>\d+)(?:\.0*)?\]*"
                     r"(?:\s*(?:/|out\s+of)\s*(?P<of>\d+)|\s*(?P<percent>%))?\.?"
                     r"(?P<rest>\s*[-(:\u2013\u2014][^\d]*)?",
                     re.IGNORECASE | re.DOTALL)
_RATING_EDGES = " \t\r\n*`[]\"'"


def rating_reader(top: int) -> Callable[[Any], Any]:
    """A reader mapping text that names one whole-number rating (on a scale up to `top`, when the
    text names its scale) to that number; anything else is left as written, to be refused."""

    def read(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        found = _RATING.fullmatch(value.strip(_RATING_EDGES))
        if not found or (found["of"] is not None and int(found["of"]) != top):
            return value
        if found["percent"] and top != 100:  # a percentage is a rating only on a scale to 100
            return value
        return int(found["n"])

    return read


def lenient_rating(top: int) -> Any:
    """An integer rating read with `rating_reader(top)`; the prompt and schema show `int`."""
    return Annotated[int, BeforeValidator(rating_reader(top))]


# A number, or a range of them ("2-4", "2 to 4"); a fraction is caught so that "2.0" reads as 2, not 2 and 0.
_NUMBERS = re.compile(r"(\d+)(\.\d+)?(?:\s*(?:-|\u2013|\u2014|to)\s*(\d+)(\.\d+)?)?")
_LONGEST_RANGE = 100  # "1-1000" is no list of passages anyone shows a judge: read as its two ends


def read_numbers(value: Any) -> Any:
    """A list of numbers as a model may write it without its schema enforced: `null` for none, a
    lone number without its list, items such as "Passage 2" or "[2]" (the numbers in them), a
    whole number written as 2.0. Items with no number in them ("none") are nothing; anything else
    is left as written, to be refused."""
    items = [] if value is None else value if isinstance(value, list) else [value]
    numbers: list[Any] = []
    for item in items:
        if isinstance(item, str):
            numbers.extend(_numbers_in(item))
        elif isinstance(item, float) and item.is_integer():
            numbers.append(int(item))
        else:
            numbers.append(item)
    return numbers


def _numbers_in(text: str) -> list[Any]:
    """The whole numbers `text` names, ranges spelled out ("2-4": 2, 3, 4); `[text]` (to be refused)
    when it names a number with a fraction, which is no passage number."""
    found: list[int] = []
    for start, start_fraction, end, end_fraction in _NUMBERS.findall(text):
        if any(f and float(f) for f in (start_fraction, end_fraction)):
            return [text]
        first = int(start)
        if not end:
            found.append(first)
        elif first <= int(end) <= first + _LONGEST_RANGE:
            found.extend(range(first, int(end) + 1))
        else:
            found.extend([first, int(end)])
    return found


def lenient_numbers() -> Any:
    """A list of whole numbers read with `read_numbers`; the prompt and schema show `list[int]`."""
    return Annotated[list[int], BeforeValidator(read_numbers)]


def read_number_groups(value: Any) -> Any:
    """A list of groups of numbers, each group read with `read_numbers` ('[1]', '[3]' are 1 and 3);
    `null` is no group. A bare number where a group belongs is left as written, to be refused: one
    group or one group per number would be a guess."""
    items = [] if value is None else value if isinstance(value, list) else [value]
    return [read_numbers(g) if isinstance(g, (list, str)) else g for g in items]


def lenient_number_groups() -> Any:
    """Groups of whole numbers read with `read_number_groups`; the prompt and schema show `list[list[int]]`."""
    return Annotated[list[list[int]], BeforeValidator(read_number_groups)]
