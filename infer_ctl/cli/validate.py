"""`infer-ctl validate FILE...`: check manifests as the API server and the controller would, and explain them.

InferenceServices go through the CRD (schema and CEL rules), the parser and the accelerator catalog; other
Kubernetes objects are checked against the 1.37 schemas of kubernetes-validate. Exit 0 when everything is valid
(a summary of what each InferenceService asks for is printed), 1 when anything is not (every problem is printed
with its file, object and field path), 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

KUBERNETES_VERSION = "1.37.0"


def register(sub: Any) -> None:
    parser = sub.add_parser("validate", help="check manifests against the CRD, its CEL rules and the catalog",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="YAML files (several documents each)")
    parser.add_argument("--policies", type=Path, default=None,
                        help="policies folder (default: $INFER_CTL_POLICIES or the checkout's policies/)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from infer_ctl.config.policies import load_policies
    from infer_ctl.core.errors import SpecError

    try:
        policies = load_policies(args.policies)
    except SpecError as exc:
        print("infer-ctl: the policies are invalid:", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error}", file=sys.stderr)
        return 2
    out = sys.stdout
    invalid = 0
    for path in args.files:
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except OSError as exc:
            print(f"{path}: cannot read: {exc.strerror}", file=sys.stderr)
            return 2
        except yaml.YAMLError as exc:
            print(f"{path}: not valid YAML: {exc}", file=sys.stderr)
            return 2
        for index, doc in enumerate(docs):
            if not _check_document(out, path, index, doc, policies, quiet=args.quiet):
                invalid += 1
    if invalid:
        print(f"\n{invalid} invalid object(s)", file=out)
    return 1 if invalid else 0


def _check_document(out: TextIO, path: Path, index: int, doc: Any, policies: Any, *, quiet: bool) -> bool:
    from infer_ctl.core import api

    where = f"{path}#{index + 1}"
    if not isinstance(doc, dict):
        print(f"{where}: not a Kubernetes object (a mapping with apiVersion and kind)", file=out)
        return False
    meta = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    name = f"{meta.get('namespace', 'default')}/{meta.get('name', '<unnamed>')}"
    kind = doc.get("kind")
    if doc.get("apiVersion") == api.API_VERSION and kind == api.KIND:
        return _check_inference_service(out, path, name, doc, policies, quiet=quiet)
    return _check_builtin(out, where, f"{kind} {name}", doc, quiet=quiet)


def _check_inference_service(out: TextIO, path: Path, name: str, doc: dict[str, Any], policies: Any,
                             *, quiet: bool) -> bool:
    from infer_ctl.kube.inferenceservice import check_inference_service

    result = check_inference_service(doc, policies.catalog)
    if not result.ok:
        print(f"{path}: InferenceService {name} is invalid:", file=out)
        for error in result.errors:
            print(f"  {error.path}: {error.message}", file=out)
        return False
    assert result.service is not None
    if not quiet:
        print(f"{path}: InferenceService {name} is valid", file=out)
        for line in explain_service(result.service, policies):
            print(f"  {line}", file=out)
    return True


def _check_builtin(out: TextIO, where: str, what: str, doc: dict[str, Any], *, quiet: bool) -> bool:
    from infer_ctl.cli.extras import missing

    if missing("validate"):
        if not quiet:
            print(f"{where}: {what}: not checked: the Kubernetes {KUBERNETES_VERSION} schemas come with infer-ctl's "
                  "'validate' extra (pip install 'infer-ctl[validate]')", file=out)
        return True
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        if not quiet:
            print(f"{where}: {what}: no 1.37 schema for {doc.get('apiVersion')}/{doc.get('kind')}; not checked",
                  file=out)
        return True
    except kubernetes_validate.ValidationError as exc:
        field = ".".join(str(p) for p in exc.path) or "<root>"
        print(f"{where}: {what} is invalid:\n  {field}: {exc.message}", file=out)
        return False
    if not quiet:
        print(f"{where}: {what} is valid (Kubernetes {KUBERNETES_VERSION} schema)", file=out)
    return True


def explain_service(svc: Any, policies: Any) -> list[str]:
    """What an InferenceService asks for, in a few lines a platform engineer can check at a glance."""
    from infer_ctl.core import api
    from infer_ctl.core.checks import memory_per_device_bytes, product_fits
    from infer_ctl.core.duration import format_duration
    from infer_ctl.core.policy import effective_scaling
    from infer_ctl.core.quantity import format_bytes

    spec: api.InferenceServiceSpec = svc.spec
    model, acc, scaling = spec.model, spec.accelerator, spec.scaling
    if model.memory_source == "derived":
        params = f"{model.parameters / 1e9:g}B" if model.parameters else "?"
        kv = f" + {format_bytes(model.kv_cache_bytes)} KV cache" if model.kv_cache_bytes else ""
        how = f"derived: {params} x {model.dtype.value} x {1 + model.overhead_percent / 100:.2f}{kv}"
    else:
        how = "given"
    per_gpu = ""
    if acc.count > 1:
        per_gpu = f", {format_bytes(memory_per_device_bytes(spec))} on each of {acc.count} GPUs"
    lines = [f"model      {model.name}: {format_bytes(model.memory_bytes)} per replica ({how}){per_gpu}"]
    fits = product_fits(spec, policies.catalog)
    allowed = " > ".join(acc.products) if acc.products else "any product that fits"
    cc = f", compute capability >= {acc.min_compute_capability[0]}.{acc.min_compute_capability[1]}" \
        if acc.min_compute_capability else ""
    lines.append(f"devices    {acc.sharing.value} on {allowed} (class {acc.device_class_name}{cc})")
    for fit in fits:
        mark = "fits" if fit.fits else "no  "
        lines.append(f"  {mark}     {fit.accelerator.name:<11} {fit.why}")
    eff = effective_scaling(scaling, policies.scaling)
    capacity = scaling.max_replicas * scaling.target_rps_per_replica
    lines.append(f"scaling    {scaling.min_replicas}..{scaling.max_replicas} replicas at "
                 f"{scaling.target_rps_per_replica:g} req/s each (up to {capacity:g} req/s); preset "
                 f"{scaling.preset.value}: quantile {eff.quantile:g}, standby {eff.standby_replicas}, "
                 f"scale down after {format_duration(eff.scale_down_stabilization_s)} of lower load")
    if scaling.forecast.enabled:
        forecast = f"{scaling.forecast.method.value} (seasonality {scaling.forecast.seasonality.value})"
    else:
        forecast = "off (reactive only)"
    lead = format_duration(scaling.prewarm.lead_s) if scaling.prewarm.lead_s is not None else \
        "auto (measured cold start p90 + one control period)"
    hint = f", cold start hint {format_duration(spec.runtime.cold_start_s)}" if spec.runtime.cold_start_s else ""
    lines.append(f"forecast   {forecast}; prewarm lead {lead}{hint}")
    if scaling.scale_to_zero.enabled:
        keep_alive_s = scaling.scale_to_zero.keep_alive_s
        keep = f"{format_duration(keep_alive_s)} idle" if keep_alive_s is not None else \
            "an idle time learned from the service's idle-time histogram"
        lines.append(f"zero       scales to zero after {keep}; wakes on the first request")
    if spec.replicas is not None:
        lines.append(f"paused     autoscaling paused: spec.replicas pins {spec.replicas} serving replicas")
    if spec.slo.latency_p95_ms is not None:
        lines.append(f"slo        p95 latency <= {spec.slo.latency_p95_ms:g} ms")
    return lines
