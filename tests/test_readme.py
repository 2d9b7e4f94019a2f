"""README's `booklens ...` command lines against the commands themselves: every command it runs
exists, takes every option the line gives it, and as many arguments. A renamed or removed option
breaks this test, not a reader's first try."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _shell_lines(text: str) -> list[str]:
    """Lines of README's fenced shell blocks (and of its unmarked ones, which show a transcript),
    continuation lines (`\\`) joined."""
    lines, fence, pending = [], None, ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip()
            pending = ""
            continue
        if fence is None or fence not in ("", "bash", "sh", "shell", "console"):
            continue
        line = pending + " " + stripped if pending else stripped
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        pending = ""
        lines.append(line)
    return lines


def _code_spans(text: str) -> list[str]:
    """README's inline code spans outside its fenced blocks, a span broken over lines joined."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [" ".join(span.split()) for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", prose)]


def _words(line: str) -> list[str] | None:
    """The words of a command line, up to a pipe or redirection and without a trailing comment or
    the usage notation of prose (`[--a | --b]`, `x|y`)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    kept = []
    for at, word in enumerate(words):
        piped = word == "|" and at + 1 < len(words) and not words[at + 1].strip("[").startswith("-")
        if piped or word in ("&&", "||", ";") or re.fullmatch(r"\d*[<>].*", word):
            break
        if word.strip("[]") not in ("", "|"):
            kept.append(word.strip("[]"))
    return kept


def readme_command_lines() -> list[tuple[str, list[str], bool]]:
    """(line, words after `booklens`, whether the line is a whole command) for each command line
    in README: the shell lines of its fenced blocks, inline `booklens ...` spans, and the spans of
    prose that name a command by its name alone with an option (`score --tries`) or a
    subcommand (`judges build`). Only a shell line is held to the number of arguments."""
    text = README.read_text(encoding="utf-8")
    commands = _root().commands
    found = []
    for line in _shell_lines(text):
        words = _words(line.removeprefix("$ "))
        for at, word in enumerate(words or []):
            if word == "booklens" or word.endswith("/booklens"):
                found.append((line, words[at + 1:], True))
                break
    for span in _code_spans(text):
        words = _words(span)
        if not words:
            continue
        if words[0] == "booklens":
            found.append((span, words[1:], False))
        elif words[0] in commands and len(words) > 1 and (
                words[1].startswith("-") or hasattr(commands[words[0]], "commands")):
            found.append((span, words, False))
    return found


@functools.cache  # the command tree is built once, not per README line
def _root():
    from typer.main import get_command

    from booklens.cli import app

    return get_command(app)


def _options(command, name: str) -> dict[str, tuple | None]:
    """Every name of every option of `command` -> None for a flag, else the values its --help
    lists (`--method <hier|inc>`: ("hier", "inc")), or () for a value of any kind."""
    ctx = command.context_class(command, info_name=name)
    options: dict[str, tuple | None] = {"--help": None}
    for param in command.params:
        if param.param_type_name != "option":
            continue
        listed = re.search(r"<([^<>|]+(?:\|[^<>|]+)+)>", (param.get_help_record(ctx) or ("",))[0])
        for opt in (*param.opts, *param.secondary_opts):
            options[opt] = None if param.is_flag or param.count else (
                tuple(listed.group(1).split("|")) if listed else ())
    return options


def _placeholder(value: str) -> bool:
    """A value README writes for the reader to fill in: N, X, THAT_MODEL, $H."""
    return value.startswith("$") or not re.search(r"[a-z]", value)


def problems(words: list[str], *, whole: bool = True, root=None) -> list[str]:
    """What is wrong with `booklens WORDS`: an unknown command or option, a value the option does
    not list (`hier|inc` is either value; a placeholder such as X or N is any) and, for a `whole`
    line, a required option left out or more or fewer arguments than the command takes. A command
    named alone (`booklens run` in prose), a line that asks for help or one cut short with `...` is
    not held to the command's arguments."""
    command, path, wrong = root or _root(), ["booklens"], []
    whole = whole and "..." not in words and "--help" not in words
    words, arguments, given = [w for w in words if w != "..."], [], set()
    while words:
        word = words.pop(0)
        options = _options(command, path[-1])
        if word.startswith("-") and word != "-":
            name, equals, value = word.partition("=")
            if name not in options:
                wrong.append(f"{' '.join(path)} has no option {name}")
                continue
            given.add(name)
            if options[name] is None or not (equals or words):
                continue
            value = value if equals else words.pop(0)
            listed = options[name]
            if listed and not _placeholder(value):
                wrong += [f"{' '.join(path)} {name} takes no value {v!r}" for v in value.split("|")
                          if v not in listed]
        elif hasattr(command, "commands"):
            if word not in command.commands:
                return wrong + [f"{' '.join(path)} has no command {word!r}"]
            path.append(word)
            command = command.commands[word]
            whole = whole and bool(words)  # `booklens run` in prose names the command only
        else:
            arguments.append(word)
    if hasattr(command, "commands"):
        if whole and not command.invoke_without_command:
            wrong.append(f"{' '.join(path)} names no command")
        return wrong
    expected = [p for p in command.params if p.param_type_name == "argument"]
    least = sum(1 for p in expected if p.required)
    most = None if any(p.nargs == -1 for p in expected) else sum(p.nargs for p in expected)
    if whole and (len(arguments) < least or (most is not None and len(arguments) > most)):
        wrong.append(f"{' '.join(path)} takes {least}" + ("" if most == least else f" to {most}")
                     + f" arguments, not {len(arguments)}: {arguments}")
    if whole:
        wrong += [f"{' '.join(path)} needs {p.opts[-1]}" for p in command.params
                  if p.param_type_name == "option" and p.required and not given & {*p.opts}]
    return wrong


def test_readme_has_command_lines_to_check():
    lines = readme_command_lines()
    # The quick start, the fenced examples of each section, and the commands named in prose.
    assert len(lines) >= 40
    assert any(words[:1] == ["summarize"] and whole for _, words, whole in lines)
    assert any(words[:3] == ["data", "stats", "fables"] and whole for _, words, whole in lines)
    assert any(words == ["score", "--tries"] for _, words, _ in lines)


@pytest.mark.parametrize("line, words, whole", readme_command_lines(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_readme_command_line_is_one_the_command_takes(line, words, whole):
    assert problems(words, whole=whole) == [], line


@pytest.mark.parametrize("words, wrong", [
    (["summarize", "book.txt", "--chunk-size", "2048", "--bogus"], ["booklens summarize has no option --bogus"]),
    (["summarise", "book.txt"], ["booklens has no command 'summarise'"]),
    (["data", "stats", "nope"], ["booklens data stats has no command 'nope'"]),
    (["check", "book.txt"], ["booklens check takes 2 arguments, not 1: ['book.txt']"]),
    (["check", "book.txt", "summary.json", "extra"],
     ["booklens check takes 2 arguments, not 3: ['book.txt', 'summary.json', 'extra']"]),
    (["check"], []),
    (["run", "book.txt"], ["booklens run needs --output"]),
    (["compile", "coherence", "--data=h", "-o", "c.json"], ["booklens compile needs --optimizer"]),
    (["data", "stats", "--help"], []),
    (["judges", "--lm", "local", "--bogus"], ["booklens judges has no option --bogus"]),
    (["report", "runs/x", "--table=latex"], []),
    (["report", "runs/x", "--table=html"], ["booklens report --table takes no value 'html'"]),
    (["summarize", "b.txt", "--method", "hier|flat"], ["booklens summarize --method takes no value 'flat'"]),
    (["run", "b.txt", "-o", "r", "--evidence", "given"], ["booklens run --evidence takes no value 'given'"]),
    (["judge", "e.json", "s.json", "--protocol", "X", "--lm", "openai/gpt-4o-mini"], []),
    (["summarize", "b.txt", "--keep-artifacts", "-o", "s.json"], []),
])
def test_a_wrong_line_is_named(words, wrong):
    assert problems(words) == wrong
