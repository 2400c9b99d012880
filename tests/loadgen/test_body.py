from __future__ import annotations

import json

import pytest

from loadgen.body import DEFAULT_TRACE_BODY, TemplateError, parse_template


def test_the_default_trace_body_is_json_with_the_token_counts() -> None:
    body = parse_template(DEFAULT_TRACE_BODY).render(4808, 10, 0)
    assert json.loads(body) == {"prompt_tokens": 4808, "max_tokens": 10}


def test_placeholders_are_filled_and_dollars_escaped() -> None:
    t = parse_template('{"n": ${seq}, "cost": "$$5", "p": ${ context_tokens }}')
    assert t.render(7, 1, 42) == b'{"n": 42, "cost": "$5", "p": 7}'


def test_a_template_without_placeholders_is_constant() -> None:
    t = parse_template('{"a": 1}')
    assert t.is_constant and t.render(1, 2, 3) == b'{"a": 1}'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"x": ${prompt}}', "column 7: unknown placeholder ${prompt}"),
        ("cost: $5", "column 7: a lone $"),
    ],
    ids=["an unknown placeholder is named with its column", "a lone dollar sign is named with its column"],
)
def test_bad_templates_are_refused_with_the_position(text: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message.replace("$", r"\$").replace("{", r"\{").replace("}", r"\}")):
        parse_template(text)
