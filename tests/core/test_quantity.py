from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as client_parse_quantity

from infer_ctl.core.quantity import QuantityError, format_bytes, parse_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("40Gi", 40 * 2**30, id="binary suffix Gi multiplies by 2^30"),
        pytest.param("1.5Ki", 1536, id="a decimal number with a binary suffix"),
        pytest.param("500m", Fraction(1, 2), id="milli is a thousandth"),
        pytest.param("2", 2, id="no suffix is the plain number"),
        pytest.param("1e3", 1000, id="a decimal exponent"),
        pytest.param("1E-3", Fraction(1, 1000), id="a negative decimal exponent"),
        pytest.param("20G", 20 * 10**9, id="decimal G is 10^9"),
        pytest.param(".5", Fraction(1, 2), id="a leading dot"),
        pytest.param("-1k", -1000, id="a sign"),
    ],
)
def test_a_valid_quantity_parses_exactly(text: str, expected: Fraction | int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        pytest.param("20Gb", "use G or Gi", id="Gb is a common mistake and gets a hint"),
        pytest.param("20GB", "use G or Gi", id="GB gets the same hint"),
        pytest.param("16GiB", "use Gi", id="GiB is not Kubernetes notation"),
        pytest.param("lots", "not a Kubernetes quantity", id="words are refused"),
        pytest.param("", "not a Kubernetes quantity", id="an empty string is refused"),
        pytest.param("1.2.3", "not a Kubernetes quantity", id="two dots are refused"),
    ],
)
def test_a_malformed_quantity_is_refused_with_a_reason(text: str, hint: str) -> None:
    with pytest.raises(QuantityError, match=hint):
        parse_quantity(text)


def test_memory_is_rounded_up_to_whole_bytes_and_may_not_be_negative() -> None:
    assert parse_bytes("1.0001Ki") == 1025
    with pytest.raises(QuantityError, match="negative"):
        parse_bytes("-1Gi")


@given(
    number=st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False, allow_infinity=False),
    suffix=st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti"]),
)
def test_parsing_agrees_with_the_kubernetes_client(number: object, suffix: str) -> None:
    text = f"{number}{suffix}"
    assert parse_quantity(text) == Fraction(client_parse_quantity(text))


@given(st.integers(min_value=0, max_value=2**50))
def test_formatted_bytes_parse_back_close_to_the_value(n: int) -> None:
    back = parse_bytes(format_bytes(n))
    assert abs(back - n) <= max(1, n * 0.05)
