"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""
import contextvars
import os
import re


class BooklensError(Exception):
    """A problem with the input, the configuration or the backend that the user can fix."""


# True while a command runs (set by the root callback of `booklens.cli.app`): an error names a
# setting as the command's option there, and as the library's keyword elsewhere (`setting_name`).
command_line: contextvars.ContextVar[bool] = contextvars.ContextVar("booklens_command_line", default=False)


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message cut to its first line (and `limit` characters), for one-line
    errors and the error fields of records; the exception's type when it has no message."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__


# The user and password of any URL in a text ('scheme://user:password@'), which `redacted` takes out.
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#@]*@")
# Environment variables whose value is a secret (OPENAI_API_KEY, HF_TOKEN, AWS_SECRET, ...).
_SECRET_VARIABLE = re.compile(r"(KEY|TOKEN|SECRET)$")


# Secrets this process was handed other than in the environment (a server URL's password, kept by
# the LM backend that was given it), so that a line about a failure elsewhere leaves them out too.
_KEPT_SECRETS: set[str] = set()


def keep_secret(values: set[str]) -> None:
    """Have `redacted` take `values` out of every line from now on."""
    _KEPT_SECRETS.update(v for v in values if v)


def redacted(text: str) -> str:
    """`text` without the keys of the environment, the secrets kept with `keep_secret` and the user
    and password of any URL, for a line that may be printed, recorded or shared. A key shorter than
    8 characters stays: taking it out would garble the line more than it hides."""
    # Each value as set and without the spaces or line end around it (a message may quote it without them).
    values = [v for k, v in os.environ.items() if _SECRET_VARIABLE.search(k)]
    found = {s for v in values for s in (v, v.strip()) if len(s) >= 8} | _KEPT_SECRETS
    for secret in sorted(found, key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    return _USERINFO.sub(r"\1", text)


def internal_error(exc: BaseException) -> str:
    """The one line an unexpected exception (a bug, not the user's input) is printed and recorded as:
    its type and first line, without secrets (`redacted`): a library underneath may quote the URL or
    the key it was given."""
    lines = redacted(str(exc)).strip().splitlines()  # before the line is cut: a cut secret would not match
    said = f": {lines[0][:300]}" if lines else ""
    return f"internal error: {type(exc).__name__}{said}"


def clipped(text: str, limit: int = 60) -> str:
    """`text` as an error line quotes a value from a file: cut to `limit` characters, "..." marking
    the cut (a passage pasted where a name goes would make the one line pages long)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def kind_of(value: object) -> str:
    """How an error names a value of the wrong kind: a string by itself (a model or method name
    handed where an object goes is the usual slip), anything else by its type."""
    return f"the string {value!r}" if isinstance(value, str) else type(value).__name__


def check_flag(name: str, value: object) -> None:
    """A yes-or-no setting a library caller handed over: True or False, or one line (a string such
    as 'no' would otherwise be taken as true)."""
    if not isinstance(value, bool):
        raise BooklensError(f"{name} must be True or False, not {value!r}")


def validation_problem(exc: Exception) -> str:
    """The problems of a pydantic `ValidationError` as one line: the first as a short phrase
    (`missing field 'x'`, or `field.path: message (got value)`), then where the others are
    (`(and 2 more problems: lm, method)`), so fixing one does not only reveal the next."""
    problems = exc.errors()
    first = problems[0]
    where = _problem_place(first)
    if first.get("type") == "missing":
        text = f"missing field {where!r}"
    else:
        message = first.get("msg", "invalid").removeprefix("Value error, ")
        text = f"{where}: {message}" if where else message
        given = first.get("input")
        # the value, as a command's range errors show it; not for an unknown key (its value is no reason)
        if first.get("type") != "extra_forbidden" and isinstance(given, (int, float, str)):
            shown = repr(given)
            # a message that quotes the value already ("'E' is not one of the options") says it once
            quoted = message.startswith(f"{shown} ") or isinstance(given, str) and shown in message
            if not quoted:
                text += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"  # a JSON text is input too
    if len(problems) > 1:
        from booklens.vocabulary import counted

        places = ", ".join(dict.fromkeys(_problem_place(p) or "the record" for p in problems[1:]))
        text += f" (and {counted(len(problems) - 1, 'more problem')}: {places})"
    return text


def _problem_place(problem: dict) -> str:
    return ".".join(str(p) for p in problem.get("loc", ()) if p != "__root__")


def setting_name(option: str, as_keys: bool | str | None = None, keyword: str | None = None) -> str:
    """How an error names a setting the command line spells `option` (`--passage-tokens`): by default
    as its caller spelled it, that option within a command (`command_line`) and the library's keyword
    elsewhere (`passage_tokens`, or `keyword` where that is not the option's own spelling). A caller
    that knows its words says so: `as_keys=False` the option, `as_keys=True` the key (`keyword`, else
    the option's), `as_keys` the name of the manifest section that holds it ("judge") its path there
    (`judge.passage_tokens`). A name that is no option (`max_claims`) is a key already."""
    if as_keys is None:
        if command_line.get() or not option.startswith("--"):
            return option
        as_keys = True
    if not as_keys:
        return option
    key = keyword or option.lstrip("-").replace("-", "_")
    return f"{as_keys}.{key}" if isinstance(as_keys, str) else key


class ConfigError(BooklensError, ValueError):
    """A library config record (`booklens.pipeline.SystemConfig`, `JudgeConfig`) built with a bad
    value: one line naming the field, and still the ValueError pydantic's error was."""


class LMError(BooklensError):
    """A permanent backend failure: bad key, unknown model, prompt larger than the context."""


class CacheError(LMError):
    """The LM call cache cannot be read or written (locked, full disk, not a database). Permanent
    for the call: an answer that cannot be kept is not asked again, as an unreadable one would be."""
