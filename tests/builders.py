"""Fluent builders of test objects (Kueue-style): start from a valid object, change only what a test is about."""

from __future__ import annotations

import copy
import json
from typing import Any, Self

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the builder's spec.model.name: the engine's served model name


def completion(model: str = DEFAULT_MODEL, prompt: str = "x") -> str:
    """A completion request's JSON body for a service serving `model` (vLLM requires the served name)."""
    return json.dumps({"model": model, "prompt": prompt})


class InferenceServiceBuilder:
    """A valid InferenceService manifest (dict), as a user would write it; `.with_(path, value)` changes a field.

    E.g. `InferenceServiceBuilder().with_("spec.scaling.minReplicas", 5).build()`; a value of `DELETE` removes
    the field.
    """

    DELETE: Any = object()

    def __init__(self, name: str = "llm", namespace: str = "default") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "infer-ctl.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "model": {"name": DEFAULT_MODEL, "memory": "24Gi"},
                "runtime": {"image": "vllm/vllm-openai:v0.11.0", "port": 8000},
                "accelerator": {"products": ["H100-80GB", "A100-80GB"]},
                "scaling": {"minReplicas": 1, "maxReplicas": 4, "targetRequestsPerReplica": 20},
            },
        }

    def with_(self, path: str, value: Any) -> Self:
        parts = path.split(".")
        node = self._obj
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        if value is self.DELETE:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
        return self

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)
