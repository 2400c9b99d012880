"""Reading `policies/*.yaml` from disk into `infer_ctl.core.policy` values."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from infer_ctl.core.errors import FieldError, SpecError
from infer_ctl.core.policy import Policies, parse_catalog, parse_placement_policy, parse_scaling_policy
from infer_ctl.core.runtime import parse_runtime_profiles
from infer_ctl.paths import data_path

POLICIES_ENV = "INFER_CTL_POLICIES"


def default_policies_dir() -> Path:
    """$INFER_CTL_POLICIES, else the `policies/` folder of this checkout (or of the installed package)."""
    env = os.environ.get(POLICIES_ENV)
    if env:
        return Path(env)
    return data_path("policies")


POLICY_FILES = ("accelerators.yaml", "scaling.yaml", "placement.yaml", "runtimes.yaml")


def load_policies(directory: Path | None = None) -> Policies:
    """All four policy files, each checked; a SpecError lists every problem with file and field."""
    folder = directory or default_policies_dir()
    texts: dict[str, str | None] = {}
    for name in POLICY_FILES:
        try:
            texts[name] = (folder / name).read_text()
        except FileNotFoundError:
            texts[name] = None
    return parse_policies(texts, lambda name: str(folder / name))


def parse_policies(texts: Mapping[str, str | None], where: Callable[[str], str]) -> Policies:
    """The four policy files from their texts (None: missing), wherever they were read (a folder, the controller's
    ConfigMap); `where(file name)` names each in the errors."""
    errors: list[FieldError] = []
    docs: dict[str, Any] = {}
    for name in POLICY_FILES:
        text = texts.get(name)
        if text is None:
            errors.append(FieldError(where(name), "policy file is missing"))
            continue
        try:
            docs[name] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            errors.append(FieldError(where(name), f"not valid YAML: {exc}"))
    if errors:
        raise SpecError(errors)
    results: dict[str, Any] = {}
    for name, parse in (("accelerators.yaml", parse_catalog), ("scaling.yaml", parse_scaling_policy),
                        ("placement.yaml", parse_placement_policy), ("runtimes.yaml", parse_runtime_profiles)):
        try:
            results[name] = parse(docs[name], where(name))
        except SpecError as exc:
            errors.extend(exc.errors or [FieldError(where(name), str(exc))])
    if errors:
        raise SpecError(errors)
    return Policies(catalog=results["accelerators.yaml"], scaling=results["scaling.yaml"],
                    placement=results["placement.yaml"], runtimes=results["runtimes.yaml"])
