"""CEL with the Kubernetes library, over cel-python (`celpy`): the project's one CEL evaluator.

kube-apiserver evaluates CRD `x-kubernetes-validations` rules (variables `self`, `oldSelf`) and
kube-scheduler evaluates DRA DeviceClass and request selectors (variable `device`) with cel-go plus
Kubernetes' own CEL libraries. cel-python parses and evaluates the CEL language itself; this module adds what
Kubernetes adds on top:

- quantities: `quantity('40Gi')`, `isQuantity(s)`, `q.compareTo(q2)`, `q.isLessThan(q2)`,
  `q.isGreaterThan(q2)`, `q.add(q2|int)`, `q.sub(q2|int)`, `q.sign()`, `q.isInteger()`, `q.asInteger()`,
  `q.asApproximateFloat()`,
  and `==` between quantities (by value: `quantity('1Gi') == quantity('1024Mi')`);
- semantic versions: `semver('1.2.3')`, `semver(s, true)` (normalize `v1.2` -> `1.2.0`),
  `isSemver(s[, bool])`,
  `v.major()`, `v.minor()`, `v.patch()`, `v.compareTo(v2)`, `v.isLessThan(v2)`, `v.isGreaterThan(v2)`, `==`;
- the cel-go strings extension: `charAt`, `indexOf`, `lastIndexOf`, `lowerAscii`, `upperAscii`, `replace`,
  `split`, `substring`, `trim`, `join`, `reverse`, `strings.quote`;
- the Kubernetes lists library: `isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf`;
- the Kubernetes regex library: `find`, `findAll`.

Not provided (yet): the URL, IP/CIDR and authorizer libraries, `format`, optional types. An expression
that uses them fails to compile with a CelCompileError naming the function.

Usage::

    program = compile_expression("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
                                 variables=("device",))
    program.evaluate({"device": {"capacity": {"gpu.nvidia.com": {"memory": Quantity.parse("80Gi")}}}})  # True

`evaluate` takes plain JSON-like values (dict, list, str, int, float, bool, None) plus `Quantity` and `Semver`
values (DRA exposes capacity as quantities and `version` attributes as semvers), and returns plain values.
Every runtime problem, including a bug in a library function, surfaces as CelEvalError, never as another
exception type, so a long-running loop can exclude the offending object and carry on.

Compilation is cached (`compile_expression` is memoised), so callers can compile in a hot path.
For many evaluations of one activation (one device against many selectors), convert it once with
`prepare_activation` and pass the result to `evaluate`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import celpy
import celpy.celtypes as ct
import lark
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError as _CelpyEvalError
from celpy.evaluation import base_functions

from infer_ctl.core.quantity import QuantityError, parse_quantity

__all__ = [
    "CelCompileError",
    "CelError",
    "CelEvalError",
    "CelProgram",
    "PreparedActivation",
    "Quantity",
    "Semver",
    "compile_expression",
    "prepare_activation",
]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class CelError(ValueError):
    """Base class of this module's errors; `expression` is the CEL source."""

    def __init__(self, expression: str, message: str) -> None:
        self.expression = expression
        self.message = message
        super().__init__(message)


class CelCompileError(CelError):
    """The expression does not parse, or calls a function / names a variable that is not declared.

    `line` and `column` are 1-based when known. str() reads like kube-apiserver's compile errors:
    `compilation failed: ERROR: <input>:1:5: Syntax error: ...`.
    """

    def __init__(
        self, expression: str, message: str, line: int | None = None, column: int | None = None
    ) -> None:
        self.line = line
        self.column = column
        where = f"<input>:{line}:{column}: " if line is not None and column is not None else "<input>: "
        super().__init__(
            expression, f"compilation failed: ERROR: {where}{message} (expression: {expression!r})"
        )
        self.message = message


class CelEvalError(CelError):
    """The expression failed at runtime (missing key, no such overload, overflow, ...)."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(expression, f"evaluation failed: {message} (expression: {expression!r})")
        self.message = message


# ----------------------------------------------------------------------------------------------------
# Kubernetes value types


@dataclass(frozen=True, slots=True)
class Quantity:
    """A Kubernetes resource quantity as CEL sees it: an exact value; `text` is how it was written."""

    value: Fraction
    text: str

    @staticmethod
    def parse(text: str) -> Quantity:
        """`Quantity.parse('40Gi')`; raises QuantityError (a ValueError) on a malformed quantity."""
        return Quantity(parse_quantity(text), text)

    @staticmethod
    def of(value: int | Fraction) -> Quantity:
        return Quantity(Fraction(value), _format_fraction(Fraction(value)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Semver:
    """A semantic version (major.minor.patch[-pre][+build]) with SemVer 2.0 precedence."""

    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: str = ""

    _RE = re.compile(
        r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
        r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
        r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
    )

    @staticmethod
    def parse(text: str, *, normalize: bool = False) -> Semver:
        """Parse strictly, or with `normalize` as Kubernetes' `semver(s, true)`: strip a leading `v`, fill in
        missing minor/patch with 0 and drop leading zeros (`v01.2` -> `1.2.0`)."""
        candidate = text
        if normalize:
            candidate = _normalize_semver(text)
        match = Semver._RE.match(candidate)
        if match is None:
            raise ValueError(f"{text!r} is not a semantic version (expected MAJOR.MINOR.PATCH, e.g. '1.2.3')")
        pre = tuple(match[4].split(".")) if match[4] else ()
        return Semver(int(match[1]), int(match[2]), int(match[3]), pre, match[5] or "")

    def _key(self) -> tuple[Any, ...]:
        # A release sorts after its pre-releases; numeric identifiers sort before alphanumeric ones.
        pre_key: tuple[Any, ...] = tuple(
            (0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.prerelease
        )
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, pre_key)

    def compare(self, other: Semver) -> int:
        a, b = self._key(), other._key()
        return (a > b) - (a < b)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + self.build
        return text


def _normalize_semver(text: str) -> str:
    core, sep, rest = text.removeprefix("v").partition("-")
    core, plus, build = core.partition("+")
    parts = core.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return text
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    out = ".".join(parts)
    if sep:
        out += "-" + rest
    if plus:
        out += "+" + build
    return out


def _format_fraction(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return str(float(value))


# ----------------------------------------------------------------------------------------------------
# Library functions. celpy calls a receiver-style function `x.f(y)` as `functions['f'](x, y)`.
# A function signals a CEL error by raising celpy's CELEvalError (which the evaluator propagates as a CEL
# error value, so `||` and `&&` still short-circuit over it as CEL requires).


def _err(message: str) -> _CelpyEvalError:
    return _CelpyEvalError(message)


def _as_quantity(value: Any, fn: str) -> Quantity:
    if isinstance(value, Quantity):
        return value
    raise _err(f"no such overload: {fn} applied to {type(value).__name__}")


def _quantity(text: Any) -> Quantity:
    if not isinstance(text, str):
        raise _err(f"no such overload: quantity({type(text).__name__})")
    try:
        return Quantity.parse(str(text))
    except QuantityError as exc:
        raise _err(f"quantity(): {exc}") from None


def _is_quantity(text: Any) -> ct.BoolType:
    if not isinstance(text, str):
        raise _err(f"no such overload: isQuantity({type(text).__name__})")
    try:
        parse_quantity(str(text))
    except QuantityError:
        return ct.BoolType(False)
    return ct.BoolType(True)


def _semver(text: Any, normalize: Any = False) -> Semver:
    if not isinstance(text, str):
        raise _err(f"no such overload: semver({type(text).__name__})")
    try:
        return Semver.parse(str(text), normalize=bool(normalize))
    except ValueError as exc:
        raise _err(f"semver(): {exc}") from None


def _is_semver(text: Any, normalize: Any = False) -> ct.BoolType:
    if not isinstance(text, str):
        raise _err(f"no such overload: isSemver({type(text).__name__})")
    try:
        Semver.parse(str(text), normalize=bool(normalize))
    except ValueError:
        return ct.BoolType(False)
    return ct.BoolType(True)


def _compare_to(a: Any, b: Any) -> ct.IntType:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return ct.IntType((a.value > b.value) - (a.value < b.value))
    if isinstance(a, Semver) and isinstance(b, Semver):
        return ct.IntType(a.compare(b))
    raise _err(f"no such overload: compareTo({type(a).__name__}, {type(b).__name__})")


def _is_less_than(a: Any, b: Any) -> ct.BoolType:
    return ct.BoolType(int(_compare_to(a, b)) < 0)


def _is_greater_than(a: Any, b: Any) -> ct.BoolType:
    return ct.BoolType(int(_compare_to(a, b)) > 0)


def _q_operand(value: Any, fn: str) -> Fraction:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(int(value))
    raise _err(f"no such overload: {fn} applied to {type(value).__name__}")


def _q_add(a: Any, b: Any) -> Quantity:
    return Quantity.of(_as_quantity(a, "add").value + _q_operand(b, "add"))


def _q_sub(a: Any, b: Any) -> Quantity:
    return Quantity.of(_as_quantity(a, "sub").value - _q_operand(b, "sub"))


def _q_sign(a: Any) -> ct.IntType:
    v = _as_quantity(a, "sign").value
    return ct.IntType((v > 0) - (v < 0))


def _q_is_integer(a: Any) -> ct.BoolType:
    v = _as_quantity(a, "isInteger").value
    return ct.BoolType(v.denominator == 1 and _INT64_MIN <= v.numerator <= _INT64_MAX)


def _q_as_integer(a: Any) -> ct.IntType:
    v = _as_quantity(a, "asInteger").value
    if v.denominator != 1 or not _INT64_MIN <= v.numerator <= _INT64_MAX:
        raise _err(f"cannot convert quantity {a} to an int64 without loss of precision")
    return ct.IntType(v.numerator)


def _q_as_float(a: Any) -> ct.DoubleType:
    return ct.DoubleType(float(_as_quantity(a, "asApproximateFloat").value))


def _major(a: Any) -> ct.IntType:
    if not isinstance(a, Semver):
        raise _err(f"no such overload: major applied to {type(a).__name__}")
    return ct.IntType(a.major)


def _minor(a: Any) -> ct.IntType:
    if not isinstance(a, Semver):
        raise _err(f"no such overload: minor applied to {type(a).__name__}")
    return ct.IntType(a.minor)


def _patch(a: Any) -> ct.IntType:
    if not isinstance(a, Semver):
        raise _err(f"no such overload: patch applied to {type(a).__name__}")
    return ct.IntType(a.patch)


def _string(value: Any, fn: str) -> str:
    if isinstance(value, str):
        return str(value)
    raise _err(f"no such overload: {fn} applied to {type(value).__name__}")


def _int(value: Any, fn: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise _err(f"no such overload: {fn} applied to {type(value).__name__}")


def _char_at(s: Any, i: Any) -> ct.StringType:
    text, index = _string(s, "charAt"), _int(i, "charAt")
    if not 0 <= index <= len(text):
        raise _err(f"index out of range: {index}")
    return ct.StringType(text[index : index + 1])


def _index_of(s: Any, sub: Any, start: Any = 0) -> ct.IntType:
    if isinstance(s, list):
        for i, item in enumerate(s):
            if item == sub:
                return ct.IntType(i)
        return ct.IntType(-1)
    text, needle, offset = _string(s, "indexOf"), _string(sub, "indexOf"), _int(start, "indexOf")
    if not 0 <= offset <= len(text):
        raise _err(f"index out of range: {offset}")
    return ct.IntType(text.find(needle, offset))


def _last_index_of(s: Any, sub: Any, end: Any = None) -> ct.IntType:
    if isinstance(s, list):
        for i in range(len(s) - 1, -1, -1):
            if s[i] == sub:
                return ct.IntType(i)
        return ct.IntType(-1)
    text, needle = _string(s, "lastIndexOf"), _string(sub, "lastIndexOf")
    if end is None:
        return ct.IntType(text.rfind(needle))
    last = _int(end, "lastIndexOf")
    if not 0 <= last < max(len(text), 1):
        raise _err(f"index out of range: {last}")
    return ct.IntType(text.rfind(needle, 0, last + len(needle)))


def _lower_ascii(s: Any) -> ct.StringType:
    text = _string(s, "lowerAscii")
    return ct.StringType("".join(c.lower() if c.isascii() else c for c in text))


def _upper_ascii(s: Any) -> ct.StringType:
    text = _string(s, "upperAscii")
    return ct.StringType("".join(c.upper() if c.isascii() else c for c in text))


def _replace(s: Any, old: Any, new: Any, n: Any = -1) -> ct.StringType:
    text, a, b, count = (
        _string(s, "replace"),
        _string(old, "replace"),
        _string(new, "replace"),
        _int(n, "replace"),
    )
    return ct.StringType(text.replace(a, b, count) if count >= 0 else text.replace(a, b))


def _split(s: Any, sep: Any, n: Any = -1) -> ct.ListType:
    text, separator, limit = _string(s, "split"), _string(sep, "split"), _int(n, "split")
    if limit == 0:
        return ct.ListType([])
    parts = list(text) if separator == "" else text.split(separator, limit - 1 if limit > 0 else -1)
    if separator == "" and limit > 0 and len(parts) > limit:
        parts = [*parts[: limit - 1], "".join(parts[limit - 1 :])]
    return ct.ListType([ct.StringType(p) for p in parts])


def _substring(s: Any, start: Any, end: Any = None) -> ct.StringType:
    text = _string(s, "substring")
    a = _int(start, "substring")
    b = len(text) if end is None else _int(end, "substring")
    if not 0 <= a <= b <= len(text):
        raise _err(f"substring: index out of range: [{a}, {b}) of a string of length {len(text)}")
    return ct.StringType(text[a:b])


def _trim(s: Any) -> ct.StringType:
    return ct.StringType(_string(s, "trim").strip())


def _join(items: Any, sep: Any = "") -> ct.StringType:
    if not isinstance(items, list):
        raise _err(f"no such overload: join applied to {type(items).__name__}")
    return ct.StringType(_string(sep, "join").join(_string(i, "join") for i in items))


def _reverse(s: Any) -> ct.StringType:
    return ct.StringType(_string(s, "reverse")[::-1])


def _list_arg(items: Any, fn: str) -> list[Any]:
    if isinstance(items, list):
        return list(items)
    raise _err(f"no such overload: {fn} applied to {type(items).__name__}")


def _is_sorted(items: Any) -> ct.BoolType:
    values = _list_arg(items, "isSorted")
    try:
        return ct.BoolType(all(values[i] <= values[i + 1] for i in range(len(values) - 1)))
    except TypeError:
        raise _err("isSorted: list elements are not comparable") from None


def _sum(items: Any) -> Any:
    values = _list_arg(items, "sum")
    if not values:
        return ct.IntType(0)
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


def _min(items: Any) -> Any:
    values = _list_arg(items, "min")
    if not values:
        raise _err("min called on an empty list")
    return min(values)


def _max(items: Any) -> Any:
    values = _list_arg(items, "max")
    if not values:
        raise _err("max called on an empty list")
    return max(values)


def _regex(pattern: Any) -> re.Pattern[str]:
    try:
        return re.compile(_string(pattern, "find"))
    except re.error as exc:
        raise _err(f"invalid regular expression {pattern!r}: {exc}") from None


def _find(s: Any, pattern: Any) -> ct.StringType:
    match = _regex(pattern).search(_string(s, "find"))
    return ct.StringType(match.group(0) if match else "")


def _find_all(s: Any, pattern: Any, n: Any = -1) -> ct.ListType:
    limit = _int(n, "findAll")
    found = [m.group(0) for m in _regex(pattern).finditer(_string(s, "findAll"))]
    if limit >= 0:
        found = found[:limit]
    return ct.ListType([ct.StringType(f) for f in found])


def _quote(s: Any) -> ct.StringType:
    text = _string(s, "strings.quote")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return ct.StringType(f'"{escaped}"')


_LIBRARY: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": _compare_to,
    "isLessThan": _is_less_than,
    "isGreaterThan": _is_greater_than,
    "add": _q_add,
    "sub": _q_sub,
    "sign": _q_sign,
    "isInteger": _q_is_integer,
    "asInteger": _q_as_integer,
    "asApproximateFloat": _q_as_float,
    "major": _major,
    "minor": _minor,
    "patch": _patch,
    "charAt": _char_at,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": _lower_ascii,
    "upperAscii": _upper_ascii,
    "replace": _replace,
    "split": _split,
    "substring": _substring,
    "trim": _trim,
    "join": _join,
    "reverse": _reverse,
    "isSorted": _is_sorted,
    "sum": _sum,
    "min": _min,
    "max": _max,
    "find": _find,
    "findAll": _find_all,
}

# `strings.quote(s)` parses as a call of `quote` on the identifier `strings`: bind it to a marker.
_STRINGS_NAMESPACE = ct.MapType({ct.StringType("__namespace__"): ct.StringType("strings")})


def _quote_dispatch(receiver: Any, s: Any = None) -> ct.StringType:
    if s is None:
        raise _err("no such overload: quote expects strings.quote(string)")
    return _quote(s)


_LIBRARY["quote"] = _quote_dispatch

_MACROS = frozenset({"has", "all", "exists", "exists_one", "map", "filter", "dyn"})
_KNOWN_FUNCTIONS = frozenset(base_functions) | frozenset(_LIBRARY) | _MACROS
_BINDING_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_BUILTIN_IDENTIFIERS = frozenset(
    {
        "strings",
        "null_type",
        "google",
        "int",
        "uint",
        "double",
        "bool",
        "string",
        "bytes",
        "list",
        "map",
        "type",
        "duration",
        "timestamp",
    }
)


# ----------------------------------------------------------------------------------------------------
# Conversion between plain Python values and CEL values


@dataclass(frozen=True, slots=True)
class PreparedActivation:
    """Variables converted to CEL values once (`prepare_activation`), for many evaluations."""

    values: Mapping[str, Any]


def _to_cel(value: object) -> Any:
    if isinstance(value, bool):
        return ct.BoolType(value)
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"integer {value} does not fit CEL's int64")
        return ct.IntType(value)
    if isinstance(value, float):
        return ct.DoubleType(value)
    if isinstance(value, str):
        return ct.StringType(value)
    if value is None:
        return None
    if isinstance(value, Quantity | Semver):
        return value
    if isinstance(value, Fraction):
        return Quantity.of(value)
    if isinstance(value, Mapping):
        return ct.MapType({_to_cel(k): _to_cel(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return ct.ListType([_to_cel(v) for v in value])
    if isinstance(value, bytes):
        return ct.BytesType(value)
    raise ValueError(f"cannot convert a {type(value).__name__} to a CEL value")


def _from_cel(value: Any) -> object:
    if isinstance(value, ct.BoolType):
        return bool(value)
    if isinstance(value, ct.IntType | ct.UintType):
        return int(value)
    if isinstance(value, ct.DoubleType):
        return float(value)
    if isinstance(value, ct.StringType):
        return str(value)
    if isinstance(value, ct.MapType):
        return {_from_cel(k): _from_cel(v) for k, v in value.items()}
    if isinstance(value, ct.ListType):
        return [_from_cel(v) for v in value]
    return value


def prepare_activation(variables: Mapping[str, object]) -> PreparedActivation:
    """Convert variables to CEL values once. Raises CelEvalError (expression '') on an unconvertible value."""
    try:
        return PreparedActivation({name: _to_cel(v) for name, v in variables.items()})
    except (ValueError, RecursionError) as exc:
        raise CelEvalError("", f"bad variable value: {exc}") from None


# ----------------------------------------------------------------------------------------------------
# Compilation and evaluation

_ENV = celpy.Environment()


@dataclass(frozen=True, slots=True)
class CelProgram:
    """A compiled expression; evaluate it any number of times. Build with `compile_expression`."""

    expression: str
    _runner: Any
    identifiers: frozenset[str]
    functions: frozenset[str]

    def evaluate(self, activation: Mapping[str, object] | PreparedActivation) -> object:
        """Evaluate with variables bound to plain values (or a PreparedActivation); return a plain value.

        Raises CelEvalError for any runtime problem.
        """
        if isinstance(activation, PreparedActivation):
            values = dict(activation.values)
        else:
            try:
                values = {name: _to_cel(v) for name, v in activation.items()}
            except (ValueError, RecursionError) as exc:
                raise CelEvalError(self.expression, f"bad variable value: {exc}") from None
        values.setdefault("strings", _STRINGS_NAMESPACE)
        try:
            result = self._runner.evaluate(values)
        except _CelpyEvalError as exc:
            raise CelEvalError(self.expression, _describe(exc)) from None
        except RecursionError:
            raise CelEvalError(self.expression, "expression nests too deeply") from None
        except (
            Exception
        ) as exc:  # a library or celpy defect must not escape as another type (module contract)
            raise CelEvalError(self.expression, f"{type(exc).__name__}: {exc}") from None
        if isinstance(result, _CelpyEvalError):
            raise CelEvalError(self.expression, _describe(result))
        return _from_cel(result)

    def evaluate_bool(self, activation: Mapping[str, object] | PreparedActivation) -> bool:
        """Evaluate a predicate (a selector, a validation rule); a non-bool result is a CelEvalError."""
        result = self.evaluate(activation)
        if not isinstance(result, bool):
            raise CelEvalError(
                self.expression, f"expected a bool result, got {type(result).__name__} {result!r}"
            )
        return result


def _describe(exc: BaseException) -> str:
    args = exc.args
    if not args:
        return type(exc).__name__
    head = str(args[0])
    if head.startswith("undeclared reference to"):
        head = head.split(" (in activation", 1)[0]
    if len(args) >= 3 and isinstance(args[2], tuple) and args[2]:
        detail = str(args[2][0])
        if detail and detail not in head and len(detail) < 200:
            head = f"{head}: {detail}"
    return head


def _walk_names(tree: lark.Tree[Any]) -> tuple[set[str], set[str], set[str]]:
    """Free identifiers, called function names, and macro-bound variable names of a parse tree."""
    identifiers: set[str] = set()
    functions: set[str] = set()
    bound: set[str] = set()
    for node in tree.iter_subtrees():
        if node.data == "ident" and node.children:
            identifiers.add(str(node.children[0]))
        elif node.data == "ident_arg" and node.children:
            functions.add(str(node.children[0]))
        elif node.data == "member_dot_arg" and len(node.children) >= 2:
            name = str(node.children[1])
            functions.add(name)
            if name in _BINDING_MACROS and len(node.children) >= 3:
                exprlist = node.children[2]
                if isinstance(exprlist, lark.Tree) and exprlist.children:
                    first = exprlist.children[0]
                    if isinstance(first, lark.Tree):
                        for sub in first.iter_subtrees():
                            if sub.data == "ident" and sub.children:
                                bound.add(str(sub.children[0]))
    return identifiers - bound, functions, bound


@functools.lru_cache(maxsize=4096)
def _compile_cached(expression: str, variables: frozenset[str] | None) -> CelProgram:
    if not isinstance(expression, str) or not expression.strip():
        raise CelCompileError(str(expression), "empty expression")
    try:
        ast = _ENV.compile(expression)
    except CELParseError as exc:
        message = str(exc.args[0]).splitlines()[0] if exc.args else "syntax error"
        raise CelCompileError(expression, f"Syntax error: {message}", exc.line, exc.column) from None
    except Exception as exc:  # lark can raise its own errors on pathological input
        raise CelCompileError(expression, f"Syntax error: {exc}") from None
    identifiers, functions, _bound = _walk_names(ast)
    unknown = sorted(functions - _KNOWN_FUNCTIONS)
    if unknown:
        raise CelCompileError(expression, f"undeclared reference to '{unknown[0]}' (no such function)")
    if variables is not None:
        undeclared = sorted(identifiers - variables - _BUILTIN_IDENTIFIERS)
        if undeclared:
            raise CelCompileError(
                expression,
                f"undeclared reference to '{undeclared[0]}'"
                f" (declared variables: {', '.join(sorted(variables))})",
            )
    runner = _ENV.program(ast, functions=_LIBRARY)
    return CelProgram(expression, runner, frozenset(identifiers), frozenset(functions))


def compile_expression(expression: str, variables: Iterable[str] | None = None) -> CelProgram:
    """Compile once (memoised). With `variables`, a reference to any other variable is a compile error, as in
    Kubernetes (`("device",)` for DRA selectors, `("self", "oldSelf")` for CRD rules).

    Raises CelCompileError with the expression and the position of the problem.
    """
    declared = None if variables is None else frozenset(variables)
    return _compile_cached(expression, declared)
