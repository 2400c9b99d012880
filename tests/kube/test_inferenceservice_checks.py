"""Every problem of an InferenceService at once: the catalog's checks run on the fields that parsed, so a problem
in one field does not hide an unknown product or a model that fits nowhere (`check_spec`, `infer-ctl validate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infer_ctl.config.policies import load_policies
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.kube.inferenceservice import check_inference_service, check_spec
from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
UNKNOWN_PRODUCT = "unknown product 'h100-80gb'"
FITS_NOWHERE = "no allowed product can hold a replica"


@pytest.fixture(scope="module")
def catalog() -> AcceleratorCatalog:
    return load_policies(ROOT / "policies").catalog


def service(**changes: Any) -> dict[str, Any]:
    builder = InferenceServiceBuilder()
    for path, value in changes.items():
        builder.with_(path.replace("__", "."), value)
    return builder.build()


CASES = [
    pytest.param(service(spec__accelerator__sharing="exclusive", spec__accelerator__products=["h100-80gb"]),
                 {"spec.accelerator.sharing": "Unsupported value", "spec.accelerator.products[0]": UNKNOWN_PRODUCT},
                 id="a sharing mode in the wrong case does not hide an unknown product"),
    pytest.param(service(spec__scaling__minReplicas=9, spec__model__memory="100Gi"),
                 {"spec.scaling": "must not exceed maxReplicas", "spec.model.memory": FITS_NOWHERE},
                 id="a scaling problem does not hide a model that fits no allowed product"),
    pytest.param(service(**{"spec__scaling__metric": {"query": "rate(x[1m])"}},
                         spec__accelerator__products=["h100-80gb"]),
                 {"spec.scaling.metric.query": "must match the service's namespace and name",
                  "spec.accelerator.products[0]": UNKNOWN_PRODUCT},
                 id="a metric query the rules refuse does not hide an unknown product"),
    pytest.param(service(spec__model__memory="20Gb", spec__accelerator__products=["h100-80gb"]),
                 {"spec.model.memory": "unit 'Gb' is unknown", "spec.accelerator.products[0]": UNKNOWN_PRODUCT},
                 id="an unknown product is named even when the model's memory does not parse"),
    pytest.param(service(spec__model__memory="20Gb", spec__accelerator__products=["L4"]),
                 {"spec.model.memory": "unit 'Gb' is unknown"},
                 id="no fit is guessed from a memory that does not parse"),
    pytest.param(service(spec__accelerator__sharing="mig", spec__model__memory="100Gi"),
                 {"spec.accelerator.sharing": "Unsupported value"},
                 id="no fit is guessed from a sharing mode that does not parse"),
    pytest.param(service(spec__accelerator__products=["H100-80GB", 7]),
                 {"spec.accelerator.products[1]": "must be a string"},
                 id="products that do not parse are the parser's problem alone"),
    pytest.param(service(spec__runtime=InferenceServiceBuilder.DELETE, spec__accelerator__products=["h100-80gb"]),
                 {"spec.runtime": "Required value", "spec.accelerator.products[0]": UNKNOWN_PRODUCT},
                 id="a missing section does not hide an unknown product"),
]


@pytest.mark.parametrize(("manifest", "expected"), CASES)
def test_every_problem_is_reported_with_the_catalog_checks_of_what_parsed(
        manifest: dict[str, Any], expected: dict[str, str], catalog: AcceleratorCatalog) -> None:
    result = check_inference_service(manifest, catalog)
    found = {e.path: e.message for e in result.errors}
    assert set(found) == set(expected), found
    for path, message in expected.items():
        assert message in found[path], found[path]
    assert result.service is None


def test_the_controller_check_of_an_admitted_object_reports_the_catalog_problems_beside_the_parser_ones(
        catalog: AcceleratorCatalog) -> None:
    # what an API server admitted: schema-valid, so the parser's own problems (a metric query the rules refuse)
    # are the only spec errors, and the catalog still speaks
    manifest = service(**{"spec__scaling__metric": {"query": "rate(x[1m])"}}, spec__model__memory="100Gi",
                       spec__accelerator__products=["L4", "T4"])
    result = check_spec(manifest, catalog)
    assert [e.path for e in result.spec_errors] == ["spec.scaling.metric.query"]
    assert [e.path for e in result.catalog_errors] == ["spec.model.memory"]
    assert "L4: " in result.catalog_errors[0].message and "T4: " in result.catalog_errors[0].message


def test_a_valid_spec_gets_the_same_catalog_checks_as_before(catalog: AcceleratorCatalog) -> None:
    fine = check_spec(service(), catalog)
    assert fine.ok and fine.service is not None and fine.catalog_errors == ()
    too_big = check_spec(service(spec__model__memory="100Gi"), catalog)
    assert too_big.service is not None and [e.path for e in too_big.catalog_errors] == ["spec.model.memory"]
    unknown = check_spec(service(spec__accelerator__products=["h100-80gb", "B200"]), catalog)
    assert [e.path for e in unknown.catalog_errors] == ["spec.accelerator.products[0]",
                                                        "spec.accelerator.products[1]"]


def test_without_a_catalog_only_the_parser_speaks() -> None:
    result = check_spec(service(spec__accelerator__sharing="exclusive", spec__accelerator__products=["h100-80gb"]))
    assert [e.path for e in result.errors] == ["spec.accelerator.sharing"]
