"""The Kubernetes CEL layer: DRA selectors, CRD-style rules, the Kubernetes library, and errors as values."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.core.cel import (
    CelCompileError,
    CelEvalError,
    Quantity,
    Semver,
    compile_expression,
    prepare_activation,
)


def a_gpu(product: str = "NVIDIA A100-SXM4-80GB", memory: str = "80Gi", cc: str = "8.0") -> dict[str, object]:
    """A device as the DRA CEL environment exposes it, with NVIDIA's attribute names."""
    return {
        "driver": "gpu.nvidia.com",
        "attributes": {
            "gpu.nvidia.com": {
                "type": "gpu",
                "productName": product,
                "architecture": "Ampere",
                "cudaComputeCapability": Semver.parse(cc, normalize=True),
                "uuid": "GPU-1234",
            }
        },
        "capacity": {"gpu.nvidia.com": {"memory": Quantity.parse(memory)}},
    }


SELECTORS = [
    ("device.driver == 'gpu.nvidia.com'", True),
    ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0", True),
    ("device.capacity['gpu.nvidia.com'].memory.isLessThan(quantity('40Gi'))", False),
    ("device.capacity['gpu.nvidia.com'].memory == quantity('81920Mi')", True),
    ("device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('7.5.0'))", True),
    ("device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('9.0.0')) >= 0", False),
    ("device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('a100')", True),
    (
        "device.attributes['gpu.nvidia.com'].productName"
        " in ['NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-80GB']",
        True,
    ),
    ("has(device.attributes['gpu.nvidia.com'].profile)", False),
    (
        "device.attributes['gpu.nvidia.com'].type == 'mig'"
        " && device.attributes['gpu.nvidia.com'].profile == 'x'",
        False,
    ),
]


@pytest.mark.parametrize(("expression", "expected"), SELECTORS, ids=[e for e, _ in SELECTORS])
def test_a_dra_selector_evaluates_against_an_nvidia_device_as_kube_scheduler_would(
    expression: str, expected: bool
) -> None:
    program = compile_expression(expression, variables=("device",))
    assert program.evaluate_bool({"device": a_gpu()}) is expected


LIBRARY = [
    ("quantity('1.5Gi').asApproximateFloat()", 1.5 * 2**30),
    ("quantity('2k').asInteger()", 2000),
    ("quantity('1Gi').add(quantity('1Gi')).compareTo(quantity('2Gi'))", 0),
    ("quantity('1Gi').sub(1).isLessThan(quantity('1Gi'))", True),
    ("quantity('-5m').sign()", -1),
    ("quantity('500m').isInteger()", False),
    ("isQuantity('20Gb')", False),
    ("isQuantity('20G')", True),
    ("semver('1.2.3-rc.1').isLessThan(semver('1.2.3'))", True),
    ("semver('v1.2', true).patch()", 0),
    ("isSemver('1.2')", False),
    ("isSemver('1.2', true)", True),
    ("semver('10.0.0').major()", 10),
    ("'Hello'.upperAscii()", "HELLO"),
    ("'a-b-c'.replace('-', '/', 1)", "a/b-c"),
    ("' pad '.trim()", "pad"),
    ("'abcabc'.lastIndexOf('b')", 4),
    ("'abc'.indexOf('c')", 2),
    ("'abc'.charAt(1)", "b"),
    ("['a', 'b'].join('+')", "a+b"),
    ("'x.y.z'.split('.', 2)", ["x", "y.z"]),
    ("[1, 2, 3].isSorted()", True),
    ("[1, 2, 3].sum()", 6),
    ("[4, 1, 3].min()", 1),
    ("'gpu-12-mig'.find('[0-9]+')", "12"),
    ("'a1b22'.findAll('[0-9]+')", ["1", "22"]),
    ("strings.quote('say \"hi\"')", '"say \\"hi\\""'),
]


@pytest.mark.parametrize(("expression", "expected"), LIBRARY, ids=[e for e, _ in LIBRARY])
def test_a_kubernetes_library_function_returns_the_value_cel_go_returns(
    expression: str, expected: object
) -> None:
    assert compile_expression(expression).evaluate({}) == expected


def test_a_crd_transition_rule_sees_self_and_old_self() -> None:
    rule = compile_expression(
        "self.maxReplicas >= oldSelf.minReplicas && self.minReplicas >= 0", variables=("self", "oldSelf")
    )
    assert rule.evaluate_bool({"self": {"maxReplicas": 3, "minReplicas": 1}, "oldSelf": {"minReplicas": 2}})
    assert not rule.evaluate_bool(
        {"self": {"maxReplicas": 1, "minReplicas": 1}, "oldSelf": {"minReplicas": 2}}
    )


def test_a_macro_variable_is_not_an_undeclared_reference() -> None:
    rule = compile_expression("self.replicas.all(r, r.name.size() > 0)", variables=("self",))
    assert rule.evaluate_bool({"self": {"replicas": [{"name": "a"}, {"name": "b"}]}})


COMPILE_ERRORS = [
    ("device.driver ==", "Syntax error"),
    ("device.capacity.frobnicate()", "undeclared reference to 'frobnicate'"),
    ("node.name == 'x'", "undeclared reference to 'node'"),
    ("", "empty expression"),
]


@pytest.mark.parametrize(
    ("expression", "needle"), COMPILE_ERRORS, ids=[f"{e!r} fails to compile" for e, _ in COMPILE_ERRORS]
)
def test_an_expression_that_kubernetes_would_reject_raises_a_compile_error_naming_the_problem(
    expression: str, needle: str
) -> None:
    with pytest.raises(CelCompileError) as info:
        compile_expression(expression, variables=("device",))
    assert needle in str(info.value)
    assert info.value.expression == expression


def test_a_syntax_error_carries_its_position() -> None:
    with pytest.raises(CelCompileError) as info:
        compile_expression("device.driver == 'x' &&")
    assert info.value.line == 1
    assert info.value.column is not None and info.value.column > 10


EVAL_ERRORS = [
    ("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'", "no such member"),
    ("device.attributes['example.com'].x == 1", "no such"),
    ("quantity('20Gb').sign() == 1", "unit 'Gb' is unknown"),
    ("quantity('1.5').asInteger() == 1", "loss of precision"),
    ("device.capacity['gpu.nvidia.com'].memory.compareTo(semver('1.0.0')) == 0", "no such overload"),
    ("1 / 0 == 1", "divide by zero"),
    ("device.driver", "expected a bool"),
    ("[].max() == 1", "empty list"),
    ("'abc'.substring(2, 9) == 'c'", "out of range"),
]


@pytest.mark.parametrize(
    ("expression", "needle"), EVAL_ERRORS, ids=[f"{e!r} fails at runtime" for e, _ in EVAL_ERRORS]
)
def test_a_runtime_failure_is_a_cel_eval_error_and_never_another_exception(
    expression: str, needle: str
) -> None:
    program = compile_expression(expression, variables=("device",))
    with pytest.raises(CelEvalError) as info:
        program.evaluate_bool({"device": a_gpu()})
    assert needle in str(info.value)


def test_an_error_on_the_untaken_side_of_or_is_absorbed_as_cel_requires() -> None:
    program = compile_expression(
        "device.attributes['gpu.nvidia.com'].profile == 'x' || true", variables=("device",)
    )
    assert program.evaluate_bool({"device": a_gpu()}) is True


def test_an_unconvertible_variable_is_an_eval_error() -> None:
    with pytest.raises(CelEvalError, match="cannot convert"):
        compile_expression("x == 1").evaluate({"x": object()})


def test_compilation_is_memoised() -> None:
    assert compile_expression("1 == 1") is compile_expression("1 == 1")


def test_a_prepared_activation_gives_the_same_answers_as_plain_values() -> None:
    prepared = prepare_activation({"device": a_gpu(memory="24Gi")})
    for expression, _ in SELECTORS:
        program = compile_expression(expression, variables=("device",))
        assert program.evaluate_bool(prepared) == program.evaluate_bool({"device": a_gpu(memory="24Gi")})


@given(st.integers(min_value=0, max_value=2**40), st.integers(min_value=0, max_value=2**40))
def test_quantity_compare_to_agrees_with_the_exact_values(a: int, b: int) -> None:
    program = compile_expression("quantity(a).compareTo(quantity(b))")
    expected = (a > b) - (a < b)
    assert program.evaluate({"a": f"{a}", "b": f"{b}Ki"}) == ((a > b * 1024) - (a < b * 1024))
    assert program.evaluate({"a": str(a), "b": str(b)}) == expected


@given(st.fractions(min_value=-(10**6), max_value=10**6, max_denominator=1000))
def test_a_fraction_variable_becomes_a_quantity_with_the_same_value(value: Fraction) -> None:
    assert compile_expression("q.sub(q).sign() == 0").evaluate_bool({"q": value})


@given(
    st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30)),
    st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30)),
)
def test_semver_ordering_is_the_numeric_ordering_of_its_parts(
    a: tuple[int, int, int], b: tuple[int, int, int]
) -> None:
    program = compile_expression("semver(a).compareTo(semver(b))")
    assert program.evaluate({"a": ".".join(map(str, a)), "b": ".".join(map(str, b))}) == (a > b) - (a < b)
