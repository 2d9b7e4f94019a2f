"""Reading a closed-set answer as a model may write it when its answer schema is not enforced
(`--structured off`, or a server that ignores the schema): "b" or "(B)" for the option B,
"Tie" for tie, "Faithful" for faithful. `booklens.lm.adapter` applies a field's `BeforeValidator`
when it reads an answer; the prompt and the JSON schema still show the values as declared."""

from __future__ import annotations

from typing import Annotated, Any, Callable, get_args

from pydantic import BeforeValidator

# Wrapping a bare value: spaces, brackets, quotes, a closing period and Markdown emphasis.
_EDGES = " \t\r\n.:()[]\"'*`"


def _key(text: str) -> str:
    # a typographic apostrophe ("can’t verify") read as the straight one the values are declared with
    return " ".join(text.replace("\u2019", "'").strip(_EDGES).lower().split())


def choice_reader(values: tuple[str, ...]) -> Callable[[Any], Any]:
    """A reader mapping text that names one of `values` (whatever its case, spacing or wrapping)
    to that value as declared; anything else is left as written, to be refused and asked again."""
    canonical = {_key(v): v for v in values}

    def read(value: Any) -> Any:
        return canonical.get(_key(value), value) if isinstance(value, str) else value

    return read


def lenient(choices: Any) -> Any:
    """`choices` (a Literal) read with `choice_reader`."""
    return Annotated[choices, BeforeValidator(choice_reader(get_args(choices)))]
