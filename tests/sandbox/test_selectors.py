"""Label and field selectors as kube-apiserver parses them."""

from __future__ import annotations

import pytest

from infer_ctl.sandbox.selectors import SelectorError, parse_field_selector, parse_label_selector

LABELS = {"app": "web", "tier": "front", "gpus": "4"}


@pytest.mark.parametrize(("selector", "matches"), [
    ("app=web", True), ("app==web", True), ("app!=web", False), ("app in (web, db)", True),
    ("app notin (web)", False), ("missing notin (x)", True), ("tier", True), ("!tier", False),
    ("!missing", True), ("gpus>3", True), ("gpus<4", False), ("app=web,tier=back", False), ("", True),
], ids=lambda v: str(v) if isinstance(v, str) else "")
def test_label_selectors_match_like_kube_apiserver(selector: str, matches: bool) -> None:
    assert parse_label_selector(selector).matches(LABELS) is matches


@pytest.mark.parametrize("selector", ["app in (web", "app=we b", "Bad Key!=x", "gpus>many", "a,,b"],
                         ids=["an unclosed set", "a space in a value", "an invalid key", "a non-integer bound",
                              "an empty requirement"])
def test_a_malformed_label_selector_is_an_error_naming_it(selector: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse_label_selector(selector)
    assert selector in str(caught.value)


def test_field_selectors_support_the_kinds_fields_and_refuse_others() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert parse_field_selector("spec.nodeName=n1,status.phase!=Failed", "Pod")(pod)
    assert not parse_field_selector("spec.nodeName=", "Pod")(pod)
    with pytest.raises(SelectorError, match=r"field label not supported: spec\.nodeName"):
        parse_field_selector("spec.nodeName=n1", "ConfigMap")
