"""Field errors: every problem with an input names the field (as a path) and says what is wrong.

Paths use the notation of kube-apiserver's field causes: `spec.scaling.maxReplicas`,
`spec.runtime.env[2].name`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem with one field. `kind` follows kube-apiserver's cause types (FieldValueRequired, ...)."""

    path: str
    message: str
    kind: str = "FieldValueInvalid"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """An input was rejected; `errors` lists every problem found, not just the first."""

    def __init__(self, errors: Iterable[FieldError], *, subject: str = "") -> None:
        self.errors: tuple[FieldError, ...] = tuple(errors)
        self.subject = subject
        head = f"{subject}: " if subject else ""
        super().__init__(head + "; ".join(str(e) for e in self.errors))
