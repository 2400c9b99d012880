"""Request body templates: text with `${name}` placeholders filled per request.

`${...}` rather than `{...}` so that JSON bodies need no escaping:
    {"model": "m", "prompt_tokens": ${context_tokens}, "max_tokens": ${generated_tokens}}
Placeholders: context_tokens, generated_tokens (from the trace, or --tokens), seq (0, 1, 2, ... in schedule
order). `$$` is a literal `$`. The template is split once; rendering is a join of prepared parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PLACEHOLDERS = ("context_tokens", "generated_tokens", "seq")
_TOKEN = re.compile(r"\$\$|\$\{([^}]*)\}|\$")

# OpenAI-style names, so that servers that scale work by `max_tokens` (vLLM-like servers, the sandbox's model
# server) do so without a template; `prompt_tokens` carries the context length.
DEFAULT_TRACE_BODY = '{"prompt_tokens": ${context_tokens}, "max_tokens": ${generated_tokens}}'


class TemplateError(ValueError):
    """A body template that cannot be rendered; the message names the placeholder and its position."""


@dataclass(frozen=True, slots=True)
class BodyTemplate:
    """Literal parts interleaved with placeholder indices into (context_tokens, generated_tokens, seq)."""

    literals: tuple[str, ...]
    fields: tuple[int, ...]

    @property
    def is_constant(self) -> bool:
        return not self.fields

    def render(self, context_tokens: int, generated_tokens: int, seq: int) -> bytes:
        if not self.fields:
            return self.literals[0].encode()
        values = (context_tokens, generated_tokens, seq)
        parts = [self.literals[0]]
        for field, literal in zip(self.fields, self.literals[1:], strict=True):
            parts.append(str(values[field]))
            parts.append(literal)
        return "".join(parts).encode()


def parse_template(text: str) -> BodyTemplate:
    literals: list[str] = []
    fields: list[int] = []
    current: list[str] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        current.append(text[pos : m.start()])
        pos = m.end()
        if m.group(0) == "$$":
            current.append("$")
        elif m.group(0) == "$":
            raise TemplateError(f"body template column {m.start() + 1}: a lone $ (write $$ for a literal $)")
        else:
            name = m.group(1).strip()
            if name not in PLACEHOLDERS:
                raise TemplateError(
                    f"body template column {m.start() + 1}: unknown placeholder ${{{m.group(1)}}} "
                    f"(known: {', '.join('${' + p + '}' for p in PLACEHOLDERS)})"
                )
            literals.append("".join(current))
            current = []
            fields.append(PLACEHOLDERS.index(name))
    current.append(text[pos:])
    literals.append("".join(current))
    return BodyTemplate(tuple(literals), tuple(fields))
