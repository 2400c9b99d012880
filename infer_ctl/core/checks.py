"""Checks of an InferenceService against the accelerator catalog: can it run anywhere at all?

The CRD and the parser check the spec by itself; these need the catalog (`policies/accelerators.yaml`):
unknown products, a model too large for every product allowed, MIG asked of products without MIG, a compute
capability no allowed product has. `infer-ctl validate` prints them and the controller sets `Valid=False`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infer_ctl.core import api
from infer_ctl.core.errors import FieldError
from infer_ctl.core.policy import AcceleratorCatalog, AcceleratorType, MigProfile
from infer_ctl.core.quantity import format_bytes


@dataclass(frozen=True, slots=True)
class ProductFit:
    """How one replica fits one catalog product: whole GPUs, a MIG profile, or a memory share."""

    accelerator: AcceleratorType
    fits: bool
    why: str  # the reason it does not fit, or how it fits
    mig_profile: MigProfile | None = None


def memory_per_device_bytes(spec: api.InferenceServiceSpec) -> int:
    """Device memory each of the replica's GPUs must hold: the model's memory split evenly over `count`."""
    count = spec.accelerator.count
    return -(-spec.model.memory_bytes // count)


def candidate_products(spec: api.InferenceServiceSpec, catalog: AcceleratorCatalog) -> tuple[AcceleratorType, ...]:
    """The catalog entries a replica may use, in order of preference (all of them when `products` is empty)."""
    if spec.accelerator.products:
        found = (catalog.get(name) for name in spec.accelerator.products)
        return tuple(a for a in found if a is not None)
    return catalog.accelerators


def product_fits(spec: api.InferenceServiceSpec, catalog: AcceleratorCatalog) -> tuple[ProductFit, ...]:
    """For each candidate product, whether one replica fits it and how."""
    need = memory_per_device_bytes(spec)
    min_cc = spec.accelerator.min_compute_capability
    out: list[ProductFit] = []
    for acc in candidate_products(spec, catalog):
        if min_cc is not None and acc.compute_capability < min_cc:
            have = ".".join(map(str, acc.compute_capability))
            out.append(ProductFit(acc, False, f"compute capability {have} < {min_cc[0]}.{min_cc[1]}"))
        elif spec.accelerator.sharing is api.Sharing.MIG:
            profile = acc.smallest_mig_profile(need)
            if not acc.mig_profiles:
                out.append(ProductFit(acc, False, "has no MIG"))
            elif profile is None:
                largest = max(p.memory_bytes for p in acc.mig_profiles)
                out.append(ProductFit(acc, False, f"largest MIG profile has {format_bytes(largest)}, "
                                                  f"needs {format_bytes(need)}"))
            else:
                out.append(ProductFit(acc, True, f"MIG {profile.name} ({format_bytes(profile.memory_bytes)})",
                                      profile))
        elif acc.memory_bytes < need:
            out.append(ProductFit(acc, False, f"{format_bytes(acc.memory_bytes)} per GPU, needs {format_bytes(need)}"))
        elif spec.accelerator.sharing is api.Sharing.SHARED:
            out.append(ProductFit(acc, True, f"share of {format_bytes(need)} of {format_bytes(acc.memory_bytes)}"))
        else:
            gpus = f"{spec.accelerator.count} whole GPUs" if spec.accelerator.count > 1 else "whole GPU"
            out.append(ProductFit(acc, True, f"{gpus} ({format_bytes(acc.memory_bytes)} each)"))
    return tuple(out)


def check_products(products: Sequence[str], catalog: AcceleratorCatalog) -> list[FieldError]:
    """Each product name the catalog does not have, with its field path. Reads nothing but the names, so it can
    run on a spec whose other fields do not parse."""
    return [FieldError(f"spec.accelerator.products[{i}]",
                       f"unknown product {name!r}; the catalog has: {', '.join(catalog.names)}",
                       "FieldValueNotSupported")
            for i, name in enumerate(products) if catalog.get(name) is None]


def check_fit(spec: api.InferenceServiceSpec, catalog: AcceleratorCatalog) -> list[FieldError]:
    """Whether any allowed product can hold a replica (reads spec.model and spec.accelerator only)."""
    fits = product_fits(spec, catalog)
    if not fits or any(f.fits for f in fits):
        return []
    detail = "; ".join(f"{f.accelerator.name}: {f.why}" for f in fits)
    field = {
        api.Sharing.MIG: "spec.accelerator.sharing",
    }.get(spec.accelerator.sharing, "spec.model.memory")
    if spec.accelerator.min_compute_capability is not None and all("compute capability" in f.why for f in fits):
        field = "spec.accelerator.minComputeCapability"
    return [FieldError(field, f"no allowed product can hold a replica ({detail})")]


def check_against_catalog(spec: api.InferenceServiceSpec, catalog: AcceleratorCatalog) -> list[FieldError]:
    """Problems that make the service unplaceable on every product it allows, each with its field path: unknown
    products first; the fit only when every product is known (an unknown one would be left out of it)."""
    return check_products(spec.accelerator.products, catalog) or check_fit(spec, catalog)
