"""Kubernetes resource quantities (`20Gi`, `1.5`, `500m`, `1e3`), parsed exactly.

The grammar is the one of k8s.io/apimachinery/pkg/api/resource:

    quantity ::= signedNumber suffix
    suffix   ::= binarySI (Ki Mi Gi Ti Pi Ei) | decimalSI (n u m "" k M G T P E) | (e|E) signedNumber

Values are exact `Fraction`s, so `0.1Gi` and `107374182.4` compare equal and nothing is lost to floats.
A common mistake such as `20Gb` or `20GB` is rejected with a hint rather than read as something else.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_QUANTITY_RE = re.compile(
    rf"^(?P<sign>[+-])?(?P<number>{_NUMBER})"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<exp>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]))?$"
)
# Unsigned quantities as the CRD's patterns accept them. Like resource.ParseQuantity (and unlike the looser
# pattern in kube-apiserver's OpenAPI), the exponent must be a whole number.
QUANTITY_PATTERN = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity; the message says why."""


def parse_quantity(text: str) -> Fraction:
    """Parse a quantity exactly. E.g. `40Gi` -> 42949672960, `500m` -> 1/2, `1e3` -> 1000."""
    if not isinstance(text, str):
        raise QuantityError(f"expected a quantity string such as '40Gi', got {type(text).__name__}")
    match = _QUANTITY_RE.match(text)
    if match is None:
        raise QuantityError(_explain_bad_quantity(text))
    value = Fraction(match["number"])
    if match["binary"]:
        value *= _BINARY[match["binary"]]
    elif match["exp"]:
        value *= Fraction(10) ** int(match["exp"][1:])
    else:
        value *= _DECIMAL[match["decimal"] or ""]
    return -value if match["sign"] == "-" else value


def parse_bytes(text: str) -> int:
    """A memory quantity as whole bytes, rounded up as Kubernetes does for byte counts (`1.5Ki` -> 1536)."""
    value = parse_quantity(text)
    if value < 0:
        raise QuantityError(f"{text!r}: a memory size cannot be negative")
    return math.ceil(value)


def format_bytes(n: int) -> str:
    """Bytes in the largest binary unit that keeps a short exact-or-one-decimal value: 42949672960 -> '40Gi'."""
    for unit in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        size = _BINARY[unit]
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if n % size == 0 else f"{value:.1f}{unit}"
    return str(n)


def human_bytes(count: int) -> str:
    """A byte count in binary units, as a person reads it (messages, not manifests: `format_bytes` writes a
    quantity): 42949672960 -> "40 GiB", 1610612736 -> "1.5 GiB", 85521203200 -> "79.6 GiB", 512 -> "512 B"."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} B"


def _explain_bad_quantity(text: str) -> str:
    stripped = text.strip()
    hint = re.match(rf"^[+-]?{_NUMBER}\s*([A-Za-z]+)$", stripped)
    if hint:
        unit = hint.group(1)
        wrong = {"Gb": "G or Gi", "GB": "G or Gi", "gb": "G or Gi", "Mb": "M or Mi", "MB": "M or Mi",
                 "Kb": "k or Ki", "KB": "k or Ki", "kb": "k or Ki", "Tb": "T or Ti", "TB": "T or Ti",
                 "GiB": "Gi", "MiB": "Mi", "KiB": "Ki", "TiB": "Ti", "K": "k or Ki", "g": "G or Gi"}
        if unit in wrong:
            return f"{text!r} is not a Kubernetes quantity: unit {unit!r} is unknown, use {wrong[unit]}"
        return (f"{text!r} is not a Kubernetes quantity: unit {unit!r} is unknown "
                "(binary Ki Mi Gi Ti Pi Ei, decimal n u m k M G T P E)")
    return f"{text!r} is not a Kubernetes quantity (e.g. '40Gi', '500m', '2')"
