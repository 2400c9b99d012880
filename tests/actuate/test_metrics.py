from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.actuate.metrics import ControllerMetrics
from infer_ctl.version import BuildInfo


def samples(m: ControllerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_per_service_series_carry_namespace_and_service() -> None:
    m = ControllerMetrics()
    m.set_replicas("prod", "llm", {"Serving": 3, "Loading": 1})
    m.decisions.labels("prod", "llm", "ForecastRise").inc()
    got = samples(m)
    assert got[("infer_ctl_replicas", (("namespace", "prod"), ("service", "llm"), ("state", "Serving")))] == 3
    assert got[("infer_ctl_scaling_decisions_total",
                (("namespace", "prod"), ("reason", "ForecastRise"), ("service", "llm")))] == 1


def test_a_deleted_service_leaves_no_series_behind() -> None:
    m = ControllerMetrics()
    m.set_replicas("prod", "llm", {"Serving": 3})
    m.set_replicas("prod", "other", {"Serving": 1})
    m.forget("prod", "llm")
    names = {labels for (name, labels) in samples(m) if name == "infer_ctl_replicas"}
    assert names == {(("namespace", "prod"), ("service", "other"), ("state", "Serving"))}


def test_two_controllers_in_one_process_do_not_share_a_registry() -> None:
    a, b = ControllerMetrics(), ControllerMetrics()
    a.cold_start.labels("H100-80GB", "true").observe(42)
    assert not any(name.startswith("infer_ctl_cold_start_seconds_count") and v for (name, _), v in samples(b).items())


def test_build_info_is_one_series_at_one_naming_the_build() -> None:
    build = BuildInfo("0.1.0", "0123456789abcdef0123456789abcdef01234567", "recorded when the package was built",
                      "3.12.3")
    got = {labels: v for (name, labels), v in samples(ControllerMetrics(build=build)).items()
           if name == "infer_ctl_build_info"}
    assert got == {(("commit", build.commit), ("python", "3.12.3"), ("version", "0.1.0")): 1.0}
