"""Reading typed fields out of untrusted dicts (manifests, policy files), collecting every error with its path.

`Prop` declares a field of a wire form once (OpenAPI type, bounds, pattern, default, description, CEL rules):
`FieldReader.read` checks a value against it, and `infer_ctl.core.crdgen` writes it as a CRD's OpenAPI schema.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any, TypeVar

from infer_ctl.core.duration import DurationError
from infer_ctl.core.errors import FieldError
from infer_ctl.core.quantity import QuantityError

E = TypeVar("E", bound=StrEnum)


@dataclass(frozen=True, slots=True)
class Rule:
    """An `x-kubernetes-validations` CEL rule; the parser implements it in Python, with the numbers."""

    rule: str
    message: str


@dataclass(frozen=True, slots=True)
class Prop:
    """One field of a wire form, as OpenAPI v3 (structural) describes it. `default` None: no default; an
    `enum` field's default is a member of it. `pattern` is RE2 and Python `re` alike."""

    json_type: str  # string | integer | number | boolean | object | array
    description: str = ""
    default: Any = None
    enum: type[StrEnum] | None = None
    minimum: int | float | None = None
    exclusive_minimum: bool = False
    maximum: int | float | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    format: str | None = None
    max_items: int | None = None
    list_type: str | None = None  # x-kubernetes-list-type: set | map
    list_map_keys: tuple[str, ...] = ()
    items: Prop | None = None
    properties: Mapping[str, Prop] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.properties)

    def __getitem__(self, key: str) -> Prop:
        return self.properties[key]


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


@dataclass
class FieldReader:
    """Reads typed fields out of untrusted dicts, collecting errors instead of raising."""

    errors: list[FieldError] = field(default_factory=list)

    def error(self, path: str, message: str, kind: str = "FieldValueInvalid") -> None:
        self.errors.append(FieldError(path, message, kind))

    def sub(self, parent: Mapping[str, Any], schema: Prop, key: str, path: str) -> Mapping[str, Any]:
        """The object `key` of `parent` (whose `Prop` is `schema`), at `path.key`; see `obj`."""
        prop = schema[key]
        return self.obj(parent, key, _join(path, key), prop.keys, required=key in schema.required)

    def read(self, parent: Mapping[str, Any], schema: Prop, key: str, path: str, *, what: str = "") -> Any:
        """The scalar (or list of strings) `key` of `parent`, checked against its `Prop` in `schema` (the
        parent's): type, enum, bounds, lengths, pattern, list type; absent or invalid: its default."""
        prop, where, required = schema[key], _join(path, key), key in schema.required
        if prop.enum is not None:
            return self.enum(parent, key, where, prop.enum, prop.default)
        if prop.json_type == "string":
            return self.string(parent, key, where, required=required, default=prop.default,
                               pattern=None if prop.pattern is None else _compiled(prop.pattern), what=what,
                               min_length=prop.min_length or 0, max_length=prop.max_length)
        if prop.json_type == "integer":
            return self.integer(parent, key, where, default=prop.default, required=required,
                                minimum=None if prop.minimum is None else int(prop.minimum),
                                maximum=None if prop.maximum is None else int(prop.maximum))
        if prop.json_type == "number":
            low = None if prop.minimum is None else float(prop.minimum)
            return self.number(parent, key, where, default=prop.default, required=required,
                               exclusive_minimum=low if prop.exclusive_minimum else None,
                               minimum=None if prop.exclusive_minimum else low,
                               maximum=None if prop.maximum is None else float(prop.maximum))
        if prop.json_type == "boolean":
            return self.boolean(parent, key, where, default=bool(prop.default))
        if prop.json_type == "array" and prop.items is not None and prop.items.json_type == "string":
            values = self.string_list(parent, key, where, unique=prop.list_type == "set", max_items=prop.max_items)
            for i, value in enumerate(values):
                if prop.items.min_length and len(value) < prop.items.min_length:
                    self.error(f"{where}[{i}]", "must not be empty" if prop.items.min_length == 1
                               else f"must be at least {prop.items.min_length} characters")
            return values
        raise TypeError(f"{where}: read takes scalars and lists of strings, not {prop.json_type}")

    def read_parsed(self, parent: Mapping[str, Any], schema: Prop, key: str, path: str,
                    parse: Callable[[str], Any]) -> Any:
        """A string field that `parse` turns into a value (a quantity, a duration...), checked by `parse`
        rather than by the `Prop`'s pattern (whose refusals `parse` explains)."""
        if schema[key].json_type != "string":
            raise TypeError(f"{_join(path, key)} is not a string field")
        return self.parsed(parent, key, _join(path, key), parse, required=key in schema.required)

    def obj(self, parent: Mapping[str, Any], key: str, path: str, known: tuple[str, ...],
            *, required: bool = False) -> Mapping[str, Any]:
        """A nested object (empty when absent), with unknown fields reported as kube-apiserver does."""
        value = parent.get(key)
        if value is None:
            if required:
                self.error(path, "Required value", "FieldValueRequired")
            return {}
        if not isinstance(value, Mapping):
            self.error(path, f"must be an object, got {type_name(value)}", "FieldValueTypeInvalid")
            return {}
        self.unknown(value, path, known)
        return value

    def unknown(self, value: Mapping[str, Any], path: str, known: tuple[str, ...]) -> None:
        for key in value:
            if key not in known:
                hint = _close_match(str(key), known)
                message = "unknown field" + (f" (did you mean {hint!r}?)" if hint else "")
                self.error(f"{path}.{key}" if path else str(key), message, "FieldValueNotSupported")

    def string(self, parent: Mapping[str, Any], key: str, path: str, *, required: bool = False,
               default: str | None = None, pattern: re.Pattern[str] | None = None, what: str = "",
               min_length: int = 0, max_length: int | None = None) -> str | None:
        value = parent.get(key)
        if value is None:
            if required:
                self.error(path, "Required value", "FieldValueRequired")
            return default
        if not isinstance(value, str):
            self.error(path, f"must be a string, got {type_name(value)}", "FieldValueTypeInvalid")
            return default
        if len(value) < min_length:
            self.error(path, "must not be empty" if min_length == 1 else f"must be at least {min_length} characters")
            return default
        if max_length is not None and len(value) > max_length:
            self.error(path, f"must be at most {max_length} characters")
            return default
        if pattern is not None and not pattern.match(value):
            self.error(path, f"{value!r} is not {what or 'valid'}")
            return default
        return value

    def enum(self, parent: Mapping[str, Any], key: str, path: str, kind: type[E], default: E) -> E:
        value = parent.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.error(path, f"must be a string, got {type_name(value)}", "FieldValueTypeInvalid")
            return default
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(f'"{m.value}"' for m in kind)
            self.error(path, f'Unsupported value: "{value}": supported values: {allowed}', "FieldValueNotSupported")
            return default

    def integer(self, parent: Mapping[str, Any], key: str, path: str, *, default: int | None,
                minimum: int | None = None, maximum: int | None = None, required: bool = False) -> int | None:
        value = parent.get(key)
        if value is None:
            if required:
                self.error(path, "Required value", "FieldValueRequired")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            # 3.0 is refused as kube-apiserver refuses it: JSON numbers with a fraction part are not integers.
            self.error(path, f"must be an integer, got {type_name(value)} {value!r}", "FieldValueTypeInvalid")
            return default
        if minimum is not None and value < minimum:
            self.error(path, f"must be greater than or equal to {minimum}, got {value}")
            return default
        if maximum is not None and value > maximum:
            self.error(path, f"must be less than or equal to {maximum}, got {value}")
            return default
        number: int = value
        return number

    def number(self, parent: Mapping[str, Any], key: str, path: str, *, default: float | None,
               exclusive_minimum: float | None = None, minimum: float | None = None,
               maximum: float | None = None, required: bool = False) -> float | None:
        value = parent.get(key)
        if value is None:
            if required:
                self.error(path, "Required value", "FieldValueRequired")
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(path, f"must be a number, got {type_name(value)} {value!r}", "FieldValueTypeInvalid")
            return default
        number = float(value)
        if not math.isfinite(number):
            self.error(path, "must be a finite number")
            return default
        if exclusive_minimum is not None and number <= exclusive_minimum:
            self.error(path, f"must be greater than {exclusive_minimum:g}, got {number:g}")
            return default
        if minimum is not None and number < minimum:
            self.error(path, f"must be greater than or equal to {minimum:g}, got {number:g}")
            return default
        if maximum is not None and number > maximum:
            self.error(path, f"must be less than or equal to {maximum:g}, got {number:g}")
            return default
        return number

    def boolean(self, parent: Mapping[str, Any], key: str, path: str, *, default: bool) -> bool:
        value = parent.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.error(path, f"must be a boolean (true or false), got {type_name(value)} {value!r}",
                       "FieldValueTypeInvalid")
            return default
        return value

    def parsed(self, parent: Mapping[str, Any], key: str, path: str, parse: Callable[[str], Any],
               *, required: bool = False) -> Any:
        text = self.string(parent, key, path, required=required)
        if text is None:
            return None
        try:
            return parse(text)
        except (QuantityError, DurationError, ValueError) as exc:
            self.error(path, str(exc))
            return None

    def string_list(self, parent: Mapping[str, Any], key: str, path: str, *,
                    unique: bool = False, max_items: int | None = None) -> tuple[str, ...]:
        value = parent.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            self.error(path, f"must be a list, got {type_name(value)}", "FieldValueTypeInvalid")
            return ()
        if max_items is not None and len(value) > max_items:
            self.error(path, f"must have at most {max_items} items", "FieldValueTooMany")
            return ()
        out: list[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.error(f"{path}[{i}]", f"must be a string, got {type_name(item)}", "FieldValueTypeInvalid")
            elif unique and item in out:
                self.error(f"{path}[{i}]", f'Duplicate value: "{item}"', "FieldValueDuplicate")
            else:
                out.append(item)
        return tuple(out)


def type_name(value: object) -> str:
    return {dict: "object", list: "list", str: "string", int: "integer", float: "number", bool: "boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _close_match(word: str, known: tuple[str, ...]) -> str | None:
    matches = difflib.get_close_matches(word, known, n=1, cutoff=0.75)
    return matches[0] if matches else None
