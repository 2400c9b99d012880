"""Runtime profiles (policies/runtimes.yaml): the shipped ones parse, each problem names its field, a service finds
its engine and version, and the engine's arguments the Pod template writes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from infer_ctl.actuate.manifests import engine_args, memory_share
from infer_ctl.core.errors import SpecError
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.runtime import (
    check_runtime,
    engine_version,
    image_tag,
    parse_runtime_profiles,
    parse_version,
    rate_query,
    service_runtime,
)
from infer_ctl.paths import data_path
from tests.builders import InferenceServiceBuilder

SHIPPED: dict[str, Any] = yaml.safe_load(data_path("policies/runtimes.yaml").read_text())
PROFILES = parse_runtime_profiles(SHIPPED, "runtimes.yaml")


@pytest.mark.parametrize(("image", "engine", "version"), [
    pytest.param("vllm/vllm-openai:v0.11.0", "vllm", (0, 11, 0), id="a vLLM tag gives the version"),
    pytest.param("docker.io/vllm/vllm-openai:latest", "vllm", None, id="latest is the newest"),
    pytest.param("vllm/vllm-openai@sha256:abc", "vllm", None, id="a digest is the newest"),
    pytest.param("lmsysorg/sglang:v0.5.2-cu126", "sglang", (0, 5, 2), id="an SGLang image finds its profile"),
    pytest.param("registry.example/our-vllm:1.2", "vllm", (1, 2, 0), id="an image no profile knows is vLLM"),
])
def test_a_service_finds_its_engine_by_image_and_its_version_by_tag(image: str, engine: str,
                                                                     version: tuple[int, int, int] | None) -> None:
    profile = PROFILES.resolve("", image)
    assert profile is not None and profile.engine == engine
    assert engine_version("", image) == version


def test_an_explicit_engine_and_version_win_over_the_image() -> None:
    assert engine_version("0.16.1", "vllm/vllm-openai:v0.11.0") == (0, 16, 1)
    profile = PROFILES.resolve("sglang", "vllm/vllm-openai:v0.11.0")
    assert profile is not None and profile.engine == "sglang"
    assert image_tag("host:5000/a/b:v1@sha256:x") == "v1" and image_tag("host:5000/a/b") == ""
    assert parse_version("nightly") is None


@pytest.mark.parametrize(("tag", "params", "drain_first"), [
    pytest.param("v0.11.0", {}, True, id="vLLM 0.11 has no mode: drained first"),
    pytest.param("v0.16.0", {"mode": "wait"}, False, id="vLLM 0.16 sleeps with mode=wait"),
    pytest.param("latest", {"mode": "wait"}, False, id="latest is the newest behaviour"),
])
def test_the_sleep_of_each_vllm_version(tag: str, params: dict[str, str], drain_first: bool) -> None:
    profile = PROFILES.profiles["vllm"]
    assert profile.sleep is not None
    entry = profile.sleep.at(engine_version("", f"vllm/vllm-openai:{tag}"))
    assert (dict(entry.params), entry.drain_first) == (params, drain_first)
    assert dict(profile.sleep.env) == {"VLLM_SERVER_DEV_MODE": "1"}
    assert profile.sleep.args == ("--enable-sleep-mode",)


def broken(path: str, value: object) -> dict[str, Any]:
    doc = copy.deepcopy(SHIPPED)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[key]
    node[last] = value
    return doc


@pytest.mark.parametrize(("path", "value", "message"), [
    pytest.param("runtimes.vllm.metrics.requests", "vllm request total", "runtimes.vllm.metrics.requests: "
                 "'vllm request total' is not a Prometheus metric name", id="a metric name with spaces"),
    pytest.param("runtimes.vllm.port", 0, "runtimes.vllm.port", id="a port out of range"),
    pytest.param("runtimes.vllm.flags.servedModelName", "", "runtimes.vllm.flags.servedModelName: is required",
                 id="no served-model-name flag"),
    pytest.param("runtimes.vllm.sleep.versions", [{"since": "0.16.0"}, {"since": "0.11.0"}],
                 "runtimes.vllm.sleep.versions[1].since: must be above the previous entry's",
                 id="versions out of order"),
    pytest.param("runtimes.vllm.sleep.sleep.params", {"level": 1}, "runtimes.vllm.sleep.sleep.params.level: names "
                 "and values must be strings", id="a number as a query parameter"),
    pytest.param("runtimes.vllm.metrcs", {}, "runtimes.vllm.metrcs: unknown field (did you mean 'metrics'?)",
                 id="a misspelt field"),
])
def test_a_bad_profile_names_the_field_and_the_problem(path: str, value: object, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_runtime_profiles(broken(path, value), "runtimes.yaml")
    assert any(message in str(e) for e in caught.value.errors), caught.value.errors


def test_a_service_of_an_engine_with_no_profile_is_refused_naming_the_field() -> None:
    svc = parse_inference_service(InferenceServiceBuilder().with_("spec.runtime.engine", "tgi").build())
    assert [str(e) for e in check_runtime(svc.spec.runtime, PROFILES)] == [
        "spec.runtime.engine: unknown engine 'tgi': the runtime profiles (policies/runtimes.yaml) have vllm, sglang"]
    assert service_runtime(svc.spec.runtime, PROFILES) is None


def test_the_rate_query_is_the_service_s_else_its_engine_s() -> None:
    svc = parse_inference_service(InferenceServiceBuilder().build())
    assert rate_query(svc.spec, PROFILES) == \
        'sum(rate(vllm:request_success_total{namespace="{{namespace}}",service="{{name}}"}[1m]))'
    own = 'sum(rate(my_requests_total{namespace="{{namespace}}",svc="{{name}}"}[30s]))'
    custom = parse_inference_service(InferenceServiceBuilder().with_("spec.scaling.metric.query", own).build())
    assert rate_query(custom.spec, PROFILES) == own


def args_of(image: str, *, args: list[str] | None = None, sleeps: bool = False,
            share: float | None = None) -> list[str]:
    builder = InferenceServiceBuilder().with_("spec.runtime.image", image) \
        .with_("spec.model.uri", "hf://meta-llama/Llama-3.1-8B-Instruct").with_("spec.model.name", "llama-8b")
    if args is not None:
        builder = builder.with_("spec.runtime.args", args)
    svc = parse_inference_service(builder.build())
    runtime = service_runtime(svc.spec.runtime, PROFILES)
    assert runtime is not None
    return engine_args(svc.spec, runtime, sleeps=sleeps, memory_share=share)


@pytest.mark.parametrize(("image", "options", "expected"), [
    pytest.param("vllm/vllm-openai:v0.16.0", {}, ["meta-llama/Llama-3.1-8B-Instruct", "--served-model-name",
                                                  "llama-8b", "--port", "8000"], id="vLLM: the model positional"),
    pytest.param("vllm/vllm-openai:v0.16.0", {"sleeps": True, "share": 0.27},
                 ["meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-8b", "--port", "8000",
                  "--enable-sleep-mode", "--gpu-memory-utilization", "0.27"], id="vLLM asleep on a shared GPU"),
    pytest.param("vllm/vllm-openai:v0.16.0", {"args": ["/models/llama", "--max-model-len", "8192",
                                                       "--served-model-name", "x"]},
                 ["/models/llama", "--port", "8000", "--max-model-len", "8192", "--served-model-name", "x"],
                 id="vLLM: the service's own model and flags win"),
    pytest.param("lmsysorg/sglang:v0.5.2", {"sleeps": True}, ["--model-path", "meta-llama/Llama-3.1-8B-Instruct",
                                                              "--served-model-name", "llama-8b", "--port", "8000",
                                                              "--enable-metrics", "--enable-memory-saver"],
                 id="SGLang: --model-path, metrics on, the memory saver for sleep"),
])
def test_the_engine_s_arguments_on_the_replica(image: str, options: dict[str, Any], expected: list[str]) -> None:
    assert args_of(image, **options) == expected


def test_a_memory_share_rounds_down_so_that_shares_that_fit_still_fit() -> None:
    assert memory_share(int(21.9 * 2**30), 80 * 2**30) == 0.27
    assert memory_share(40 * 2**30, 80 * 2**30) == 0.5
    assert memory_share(1, 0) is None
