"""Every check of an InferenceService object, in the order the API server and the controller apply them.

1. the CRD: defaults, unknown fields, OpenAPI constraints, CEL rules (what kube-apiserver would refuse);
2. the parser: typed values and the checks a schema cannot express (e.g. the PromQL template);
3. the catalog: whether any allowed product can hold a replica.

`check_spec` is 2 and 3, for what an API server admitted (the controller); `check_inference_service` all three,
for a manifest no API server has seen (`infer-ctl validate`, `explain`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from infer_ctl.core import api
from infer_ctl.core.checks import check_against_catalog, check_products
from infer_ctl.core.errors import FieldError, SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.core.runtime import NO_RUNTIMES, RuntimeProfiles, check_runtime
from infer_ctl.kube.crd import Crd, apply_defaults, parse_crd, validate
from infer_ctl.paths import data_path

CRD_PATH = data_path("crds/inferenceservice.yaml")


@cache
def load_crd(path: Path = CRD_PATH) -> Crd:
    return parse_crd(yaml.safe_load(path.read_text()))


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of all checks: the parsed service when the spec is usable, and every problem found."""

    service: api.InferenceService | None
    schema_errors: tuple[FieldError, ...]  # what kube-apiserver would refuse
    spec_errors: tuple[FieldError, ...]  # what the parser refuses (a superset of the schema, with numbers and hints)
    catalog_errors: tuple[FieldError, ...]  # what no allowed product can run
    defaulted: Mapping[str, Any]

    @property
    def errors(self) -> tuple[FieldError, ...]:
        """One message per field: the parser's where it has one (it adds values and hints such as 'use G or
        Gi'), the schema's where only the schema speaks, then the catalog's."""
        covered = {e.path for e in self.spec_errors}
        only_schema = tuple(e for e in self.schema_errors if e.path not in covered)
        return self.spec_errors + only_schema + self.catalog_errors

    @property
    def ok(self) -> bool:
        return not self.errors


def check_spec(obj: Mapping[str, Any], catalog: AcceleratorCatalog | None = None,
               runtimes: RuntimeProfiles = NO_RUNTIMES) -> CheckResult:
    """The parser's, the accelerator catalog's and the runtime profiles' checks of an object the API server
    admitted (so defaulted and valid against the CRD's schema and CEL rules): what the API server cannot know (an
    engine without a profile is a catalog error: the policies', not the schema's). The controller's check.
    A spec that does not parse still gets the catalog's checks of the fields that did (`_catalog_of_unparsed`)."""
    service: api.InferenceService | None = None
    spec_errors: tuple[FieldError, ...] = ()
    try:
        service = parse_inference_service(obj)
    except SpecError as exc:
        spec_errors = exc.errors
    catalog_errors: tuple[FieldError, ...] = ()
    if catalog is not None:
        catalog_errors = tuple(check_against_catalog(service.spec, catalog) if service is not None
                               else _catalog_of_unparsed(obj, catalog))
    if service is not None:
        catalog_errors += tuple(check_runtime(service.spec.runtime, runtimes))
    return CheckResult(service=service, schema_errors=(), spec_errors=spec_errors, catalog_errors=catalog_errors,
                       defaulted=obj)


# What the parser needs besides the catalog's inputs: required fields the catalog's checks do not read.
_NOT_READ_BY_THE_CATALOG = {"runtime": {"image": "unused"}, "scaling": {"targetRequestsPerReplica": 1}}


def _catalog_of_unparsed(obj: Mapping[str, Any], catalog: AcceleratorCatalog) -> list[FieldError]:
    """The catalog's checks of a spec that does not parse, on what they read that did parse: every check at
    once when spec.model and spec.accelerator parse by themselves (the problems are elsewhere: a bad scaling
    field does not hide an unknown product), else the product names alone when they parse (`sharing: exclusive`
    beside `products: [h100-80gb]` reports both). The fit is not guessed from a model or accelerator with a
    problem: which products fit depends on every one of their fields."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return []
    inputs = {key: spec[key] for key in ("model", "accelerator") if key in spec}
    try:
        parsed = parse_inference_service({"apiVersion": api.API_VERSION, "kind": api.KIND,
                                          "metadata": {"name": "catalog-check"},
                                          "spec": {**_NOT_READ_BY_THE_CATALOG, **inputs}})
    except SpecError as exc:
        accelerator = inputs.get("accelerator")
        products = accelerator.get("products") if isinstance(accelerator, Mapping) else None
        unparsed = any(e.path.startswith("spec.accelerator.products") for e in exc.errors)
        if unparsed or not isinstance(products, list) or not all(isinstance(p, str) for p in products):
            return []
        return check_products(products, catalog)
    return check_against_catalog(parsed.spec, catalog)


def check_inference_service(obj: Mapping[str, Any], catalog: AcceleratorCatalog | None = None,
                            crd: Crd | None = None, *, schema: bool = True,
                            runtimes: RuntimeProfiles = NO_RUNTIMES) -> CheckResult:
    """The CRD's schema with its defaults (`schema`: for a manifest no API server has seen, as `infer-ctl
    validate` reads it), then `check_spec`'s (the engine against `runtimes` too). `schema=False` is `check_spec`:
    what an API server admitted was defaulted and validated by it already."""
    if not schema:
        return check_spec(obj, catalog, runtimes)
    version = (crd or load_crd()).storage_version
    defaulted = apply_defaults(version.schema, dict(obj))
    result = check_spec(defaulted, catalog, runtimes)
    return replace(result, schema_errors=tuple(validate(version.schema, defaulted)))
