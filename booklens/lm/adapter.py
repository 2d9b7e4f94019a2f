"""How DSPy signatures become prompts for booklens' backends, and answers become outputs."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from dspy.adapters.chat_adapter import ChatAdapter
from dspy.adapters.json_adapter import JSONAdapter, _get_structured_outputs_response_format

from booklens.text import has_letters


def plain_output_field(signature: Any) -> str | None:
    """The output field of a signature whose only output is free text, else None."""
    outputs = signature.output_fields
    if len(outputs) == 1:
        name, info = next(iter(outputs.items()))
        if info.annotation is str:
            return name
    return None


# A line that is only a field header, exact or garbled by a small model: "[[ ## summary ## ]]",
# "[## summary ## ]", "## Summary", "[Summary]", "Summary:", or in markdown bold, "**Summary:**".
_HEADER_LINE = re.compile(r"^\[*\s*#*\s*[*_]*\s*([A-Za-z][A-Za-z _]*?)\s*:?\s*[*_]*\s*#*\s*\]*\s*:?$")
# An answer that is one JSON object (in a code fence or not) whose first key is quoted.
_JSON_OBJECT = re.compile(r"^(?:```(?:json)?\s*)?(\{\s*\".*\})\s*(?:```)?$", re.DOTALL)
# A chat model's lead-in line before the answer it was asked for: "Sure! Here is the updated summary:".
_LEAD_IN = re.compile(r"^(?:(?:sure|certainly|of course|okay|ok|absolutely)\b\W*)?"
                      r"(?:here(?:'s|\u2019s| is| are)|below is)\b"
                      r"[^\n]*\b(?:summary|summaries|version|rewrite|text)\b[^\n]*:$", re.IGNORECASE)
# A chat model's sign-off line after the answer: "I hope this helps!", "Let me know if ...".
_SIGN_OFF = re.compile(r"^(?:I hope (?:this|that|the summary)\b|Let me know\b|Feel free to\b|Would you like me\b|"
                       r"If you(?:'d| would) like me\b|If you need (?:any|more)\b)[^\n]*$", re.IGNORECASE)
# A markdown heading line: "## The story so far", "# Title #".
_MD_HEADING = re.compile(r"^#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
# A title is short, and it does not end as a sentence does ("# He walls him in." is prose).
_TITLE_MAX_WORDS = 12
# A list item with nothing after its marker: "6.", "6)", "-".
_LIST_MARKER = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])\s*$")


def _is_header(line: str, names: set[str]) -> bool:
    found = _HEADER_LINE.match(line.strip())
    return bool(found) and found.group(1).strip().lower().replace(" ", "_") in names


def _is_title(lines: list[str], i: int) -> bool:
    """Whether `lines[i]` is a markdown title of the answer: a short heading that does not end like a
    sentence, with no other heading after it (headings that divide the answer are its structure)."""
    found = _MD_HEADING.match(lines[i].strip())
    if not found:
        return False
    words = found.group(1).strip(" *_").split()
    return (0 < len(words) <= _TITLE_MAX_WORDS and not words[-1].endswith((".", "!", "?"))
            and not any(_MD_HEADING.match(line.strip()) for line in lines[i + 1:]))


def _json_prose(text: str, field: str) -> str | None:
    """The prose of an answer written as a JSON object, as a model used to JSON answers may write
    even when asked for plain text: the value of `field` (any case), else the object's one value;
    a list of strings is paragraphs. None when the answer is no such object."""
    found = _JSON_OBJECT.match(text)
    if not found:
        return None
    import json_repair  # as DSPy reads JSON answers: a trailing comma is no failure

    try:
        data = json_repair.loads(found.group(1))
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not data:
        return None
    named = [v for k, v in data.items() if str(k).strip().lower() == field]
    value = named[0] if named else (next(iter(data.values())) if len(data) == 1 else None)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        value = "\n\n".join(v.strip() for v in value)
    return value if isinstance(value, str) and has_letters(value) else None


def plain_answer(text: str, field: str, other_fields: Iterable[str] = ()) -> str:
    """The prose a model wrote for the free-text output `field`, without the scaffolding small
    models echo: a chat lead-in line ("Here is the summary:"), a markdown title ("## The story so
    far", `_is_title`), headers (exact or garbled) of
    `field`, of the signature's `other_fields` (a model asked to condense a `summary` may head its
    answer with that name) or of the end marker before it, lines without a letter before the
    prose, whatever follows such a header after the prose (a copy of an input), a chat sign-off
    line ("I hope this helps!") and an empty list item at the end, and line breaks written as the
    two characters backslash and n, as if inside a JSON string. An answer that is a JSON object is read
    as the prose it holds (`_json_prose`)."""
    names = {field, "completed", *other_fields}
    text = text.strip()
    text = _json_prose(text, field) or text
    marker = f"[[ ## {field} ## ]]"
    if marker in text:
        text = text.split(marker, 1)[1]
    text = text.split("[[ ## completed ## ]]", 1)[0]
    if "\\n" in text:  # prose about a book has no literal backslash-n; a model imitating JSON does
        text = text.replace("\\r\\n", "\n").replace("\\n", "\n")
    lines = text.strip().splitlines()
    # Before the prose: headers, a markdown title, and lines without a letter (the word limit echoed,
    # a bare "1"). (An answer with no prose at all stays as it is, for the caller to judge.)
    while (lines and (not has_letters(lines[0]) or _is_header(lines[0], names) or _LEAD_IN.match(lines[0].strip())
                      or _is_title(lines, 0))
           and any(map(has_letters, lines[1:]))):
        lines.pop(0)
    # Past the prose, a bracketed header of an input or of the end marker starts a copy of the
    # prompt (a markdown heading there may be the answer's own structure).
    enders = names - {field}
    ends = [i for i, line in enumerate(lines) if line.lstrip().startswith("[") and _is_header(line, enders)]
    lines = lines[:ends[0]] if ends else lines
    while lines and (not lines[-1].strip() or _is_header(lines[-1], names) or _LIST_MARKER.match(lines[-1])
                     or (_SIGN_OFF.match(lines[-1].strip()) and any(map(has_letters, lines[:-1])))):
        lines.pop()  # an empty list item ("6.") is where an answer that was cut off stopped
    return "\n".join(lines).strip()


# Inputs that differ from call to call while the inputs before them are shared: many claims are
# verified against the same evidence (the whole story in the `book` mode). The answer's format
# reminder, the same in every call, goes before such an input instead of after it, so that
# consecutive calls share their prompt up to the input itself.
PER_CALL_INPUTS = ("claim",)


def per_call_input(signature: Any) -> str | None:
    """The last input of `signature` when it is a per-call input that follows shared ones, else None."""
    names = list(signature.input_fields)
    if len(names) >= 2 and names[-1] in PER_CALL_INPUTS:
        return names[-1]
    return None


def ends_inside_string(completion: str) -> bool:
    """Whether the JSON object the answer opens is still inside a string where the answer ends, as
    in `{"claims": ["Anna sails.", "Bob ru`: its last value was cut off mid-word. DSPy's reader would
    close the string and keep the fragment as a value (a claim "Bob ru"). An answer that ends as an
    object or list does is not cut off: a stray quote inside a value only miscounts its strings."""
    start = completion.find("{")
    if start < 0 or completion.rstrip().rstrip("`").rstrip().endswith(("}", "]")):
        return False
    depth, in_string, escaped = 0, False, False
    for ch in completion[start:]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return False  # the object closed: what follows is not its value
    return in_string


def lenient_answer(signature: Any, completion: str) -> str:
    """The JSON answer with the `BeforeValidator`s of the signature's output fields applied (a field
    missing from the answer is given to them as None). DSPy reads each field by its bare type, without
    the validators a field declares; a field that declares none is left as it is, and an answer that
    is no JSON object is left to DSPy's own reading."""
    from pydantic import BeforeValidator

    readers = {name: [m.func for m in info.metadata if isinstance(m, BeforeValidator)]
               for name, info in signature.output_fields.items()}
    readers = {name: funcs for name, funcs in readers.items() if funcs}
    if not readers or "{" not in completion or "}" not in completion:
        return completion
    import json_repair  # what DSPy's JSONAdapter reads answers with: a trailing comma is no failure here either

    try:
        data = json_repair.loads(completion[completion.index("{"):completion.rindex("}") + 1])
    except (ValueError, RecursionError):
        return completion
    if not isinstance(data, dict):
        return completion
    for name, funcs in readers.items():
        value = data.get(name)
        for func in funcs:
            value = func(value)
        data[name] = value
    return json.dumps(data, ensure_ascii=False)


def empty_answer_complaint(reasoning_tokens: int = 0) -> str:
    """Why an answer without text failed. A model that thinks first may spend the whole answer
    budget on thinking, which a server that splits it off sends apart: the re-asks grow the budget
    only so far (and no command sets it), turning the thinking off is what helps."""
    if not reasoning_tokens:
        return "the answer is empty"
    # (short: a command quotes the first failure's first 200 characters, behind its own words)
    return (f"the model sent only reasoning ({reasoning_tokens} tokens), no answer: turn its thinking off or use "
            "a non-reasoning model")


class BooklensAdapter(JSONAdapter):
    """Inputs as `[[ ## field ## ]]` sections; outputs in one of two forms.

    - A signature whose only output is free text (a summary) is answered in plain text:
      small local models write much better prose without a JSON wrapper.
    - Anything structured (labels, lists, several fields) is a JSON object, and every backend
      receives its output schema: the embedded model decodes under it as a grammar, LiteLLM
      backends send it in the dialect their server takes (`booklens.lm.remote`).
    """

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        plain = plain_output_field(signature)
        if plain is not None:
            if getattr(lm, "takes_output_schema", False):  # a booklens LM; another LM would send the key on
                lm_kwargs = {**lm_kwargs, "booklens_plain_output": plain}
            return ChatAdapter.__call__(self, lm, lm_kwargs, signature, demos, inputs)
        if not getattr(lm, "takes_output_schema", False):
            # Another DSPy LM (a library user's dspy.LM): DSPy's own check of what the model takes.
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)
        try:
            response_format = _get_structured_outputs_response_format(signature)
        except Exception:  # an open-ended mapping has no schema to state: JSON mode only
            response_format = {"type": "json_object"}
        lm_kwargs = {**lm_kwargs, "response_format": response_format}
        return ChatAdapter.__call__(self, lm, lm_kwargs, signature, demos, inputs)

    def _call_postprocess(self, processed_signature, original_signature, outputs, lm):
        # DSPy reads an empty completion as every output None (it expects tool calls there), which a
        # program would take for its answer (the QA judge graded it 'incorrect'): for structured
        # outputs it is an answer that does not parse, so the caller re-asks. Free text is left to
        # the programs, which judge an empty summary or answer themselves.
        if plain_output_field(original_signature) is None:
            for output in outputs:
                text = output.get("text") if isinstance(output, dict) else output
                if not str(text or "").strip() and not (isinstance(output, dict) and output.get("tool_calls")):
                    from dspy.utils.exceptions import AdapterParseError

                    from booklens.lm.model import last_reasoning_only

                    raise AdapterParseError(type(self).__name__, original_signature, str(text or ""),
                                            message=empty_answer_complaint(last_reasoning_only()))
        return super()._call_postprocess(processed_signature, original_signature, outputs, lm)

    def format_field_description(self, signature):
        plain = plain_output_field(signature)
        if plain is None:
            return super().format_field_description(signature)
        from dspy.adapters.utils import get_field_description_string

        info = signature.output_fields[plain]
        desc = info.json_schema_extra.get("desc", "") if info.json_schema_extra else ""
        return (f"Your input fields are:\n{get_field_description_string(signature.input_fields)}\n"
                f"You answer with the `{plain}`{': ' + desc if desc and not desc.startswith('${') else ''}.")

    def format_field_structure(self, signature):
        if plain_output_field(signature) is None:
            return super().format_field_structure(signature)
        return "Each input comes in a section that starts with a header like [[ ## name ## ]]."

    def format_task_description(self, signature):
        if plain_output_field(signature) is None:
            return super().format_task_description(signature)
        import textwrap

        return "Your task: " + " ".join(textwrap.dedent(signature.instructions).split())

    def format_user_message_content(self, signature, inputs, prefix="", suffix="", main_request=False):
        last = per_call_input(signature) if main_request else None
        if last is None or last not in inputs:
            return super().format_user_message_content(signature, inputs, prefix, suffix, main_request)
        from dspy.adapters.utils import format_field_value

        parts = [prefix]
        for name, info in signature.input_fields.items():
            if name == last:
                parts.append(self.user_message_output_requirements(signature))
            if name in inputs:
                parts.append(f"[[ ## {name} ## ]]\n{format_field_value(field_info=info, value=inputs[name])}")
        parts.append(suffix)
        return "\n\n".join(p for p in parts if p is not None).strip()

    def user_message_output_requirements(self, signature):
        plain = plain_output_field(signature)
        if plain is None:
            return super().user_message_output_requirements(signature)
        return f"Write the {plain.replace('_', ' ')} now, as plain text without headers or labels."

    def format_assistant_message_content(self, signature, outputs, missing_field_message=None):
        plain = plain_output_field(signature)
        if plain is None:
            return super().format_assistant_message_content(signature, outputs, missing_field_message)
        return str(outputs.get(plain, missing_field_message or ""))

    def parse(self, signature, completion):
        plain = plain_output_field(signature)
        if plain is None:
            from booklens.lm.model import last_stop

            # A finished answer cut inside a string is broken, not short: asked again. One the token
            # limit cut off is left to the program's check (a verdict keeps a label that parsed).
            if last_stop() != "length" and ends_inside_string(completion):
                from dspy.utils.exceptions import AdapterParseError

                raise AdapterParseError(type(self).__name__, signature, completion,
                                        message="the answer ends inside a JSON string (its last value is cut off)")
            return super().parse(signature, lenient_answer(signature, completion))
        return {plain: plain_answer(completion, plain, signature.input_fields)}


@contextmanager
def adapter_unless_configured() -> Iterator[None]:
    """booklens's adapter for the DSPy calls made inside, when the caller configured none (DSPy's
    default would ask in its chat format, and a model that answers in JSON fails its parse and is
    asked again: every call made twice). An adapter the caller set (`dspy.configure`, `dspy.context`)
    is used as it is. Only this thread's context changes, for the block (and the work it hands on)."""
    import dspy

    if dspy.settings.adapter is not None:
        yield
        return
    with dspy.context(adapter=BooklensAdapter()):
        yield
