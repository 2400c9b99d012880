"""deploy/monitoring/: the PrometheusRule passes promtool (check and unit tests), every PromQL expression of the
rules and the Grafana dashboard parses in a real Prometheus and reads only series the controller exports, and
the ServiceMonitor scrapes the port deploy/kustomize/base/controller.yaml exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.actuate.metrics import ControllerMetrics
from infer_ctl.core import api
from infer_ctl.decide.decision import Reason
from infer_ctl.sandbox.router import GATEWAY_METRIC, GatewayMetrics
from tests.prometheus_server import prometheus

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
CONTROLLER_MANIFEST = ROOT / "deploy" / "kustomize" / "base" / "controller.yaml"
RULES_UNIT_TESTS = Path(__file__).with_name("monitoring_rules_test.yaml")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install "
                                                             "--no-install-recommends prometheus)")

# Labels every scraped series gets from its target (honorLabels keeps the controller's namespace/service).
TARGET_LABELS = frozenset({"job", "instance"})
# Labels whose values are codes of the controller: a matcher on them must name a value it really exports.
ENUMERATED_LABELS = frozenset({"state", "role", "bound", "reason", "source", "cached", "le", "code"})
# Reason codes the reconciler writes besides the decider's (spec.replicas pins the count).
EXTRA_DECISION_REASONS = ("Paused",)


# ----------------------------------------------------------------------------------------------- the artifacts

def prometheus_rule() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((MONITORING / "rules.yaml").read_text())
    return doc


def rule_groups() -> list[dict[str, Any]]:
    return list(prometheus_rule()["spec"]["groups"])


def all_rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"]]


def rule_name(rule: dict[str, Any]) -> str:
    return str(rule.get("record") or rule.get("alert"))


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((MONITORING / "dashboard.json").read_text())
    return doc


def dashboard_panels() -> list[dict[str, Any]]:
    out = []
    for panel in dashboard()["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", ()))  # a collapsed row keeps its panels inside
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, expression) of every panel query and every template variable's label_values query."""
    out = [(f"panel '{p['title']}' query {t['refId']}", str(t["expr"])) for p in dashboard_panels()
           for t in p.get("targets", ())]
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
            assert match, f"variable ${var['name']}: expected label_values(selector, label)"
            out.append((f"variable ${var['name']}", match.group(1)))
    return out


def rule_expressions() -> list[tuple[str, str]]:
    return [(f"rule {rule_name(r)}", str(r["expr"])) for r in all_rules()]


# Grafana's variables, with the values a user would have selected (the live test scrapes with its own job name).
def concrete(expr: str, job: str = "infer-ctl") -> str:
    values = {"__rate_interval": "1m", "__interval": "30s", "__range": "1h", "job": job, "namespace": "prod",
              "service": "chat"}
    out = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]",
                 lambda m: values[next(g for g in m.groups() if g)], expr)
    assert "$" not in out, f"an unknown variable is left in {out!r}"
    return out


# ----------------------------------------------------------------------------------- what the controller exports

def controller_metrics() -> ControllerMetrics:
    """The controller's metrics with a sample of each series set, with the label values the reconciler uses."""
    m = ControllerMetrics()
    m.set_replicas("prod", "chat", {s.value: 1 for s in api.ReplicaState})
    m.desired.labels("prod", "chat", "serving").set(2)
    m.desired.labels("prod", "chat", "standby").set(1)
    m.forecast_rps.labels("prod", "chat", "mean").set(40)
    m.forecast_rps.labels("prod", "chat", "upper").set(55)
    m.observed_rps.labels("prod", "chat").set(38)
    m.slo_attainment.labels("prod", "chat").set(0.993)
    m.slo_objective.labels("prod", "chat").set(0.99)
    for reason in [*(r.value for r in Reason), *EXTRA_DECISION_REASONS]:
        m.decisions.labels("prod", "chat", reason).inc()
    for cached in ("true", "false"):
        m.cold_start.labels("a100-80gb", cached).observe(45)
    m.placement_failures.labels("prod", "chat", "NoDeviceMemory").inc()
    m.fragmentation.set(0.25)
    for source in ("PodGroup", "Workload"):
        m.gang_demand.labels(source).set(4)
    m.reconcile.observe(0.2)
    return m


def gateway_metrics() -> GatewayMetrics:
    gateway = GatewayMetrics()
    gateway.open("prod", "chat")
    gateway.count("prod", "chat", 200, 0.15)
    gateway.count("prod", "chat", 503, 30.0)
    return gateway


@dataclass(frozen=True, slots=True)
class Exported:
    labels: dict[str, frozenset[str]]  # series name -> its label names
    values: dict[tuple[str, str], frozenset[str]]  # (series name, label name) -> the values seen


def exported() -> Exported:
    labels: dict[str, set[str]] = {"up": set()}
    values: dict[tuple[str, str], set[str]] = {}
    for text in (generate_latest(controller_metrics().registry).decode(),
                 generate_latest(gateway_metrics().registry).decode()):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels.setdefault(sample.name, set()).update(sample.labels)
                for name, value in sample.labels.items():
                    values.setdefault((sample.name, name), set()).add(value)
    return Exported({k: frozenset(v) for k, v in labels.items()}, {k: frozenset(v) for k, v in values.items()})


def test_the_exports_include_every_metric_of_the_controller_and_the_gateway() -> None:
    names = set(exported().labels)
    assert {"infer_ctl_replicas", "infer_ctl_desired_replicas", "infer_ctl_forecast_requests_per_second",
            "infer_ctl_observed_requests_per_second", "infer_ctl_slo_attainment", "infer_ctl_slo_objective",
            "infer_ctl_scaling_decisions_total",
            "infer_ctl_cold_start_seconds_bucket", "infer_ctl_placement_failures_total",
            "infer_ctl_gpu_fragmentation_ratio", "infer_ctl_pending_gang_gpus", "infer_ctl_reconcile_seconds_bucket",
            "infer_ctl_reconcile_seconds_count", f"{GATEWAY_METRIC}_total"} <= names


# -------------------------------------------------------------------------------------- a small PromQL reader

_TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<duration>(?<![\w:.])(?:\d+(?:ms|[smhdwy]))+(?![\w:]))
  | (?P<number>(?<![\w:.])(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![\w:]))
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[=<>{}(),+\-*/^%])
  | (?P<space>\s+)
""", re.VERBOSE)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}


@dataclass(frozen=True, slots=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value)


@dataclass(frozen=True, slots=True)
class References:
    selectors: tuple[Selector, ...]
    grouping_labels: frozenset[str]


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise AssertionError(f"cannot read {expr[pos:pos + 20]!r} in {expr!r}")
        kind = match.lastgroup or ""
        if kind != "space":
            out.append((kind, match.group()))
        pos = match.end()
    return out


def references(expr: str) -> References:
    """The series selectors (metric name and label matchers) and the labels of by/without/on/ignoring/group_*
    clauses of a PromQL expression."""
    toks = tokens(expr)
    selectors: list[Selector] = []
    grouping: set[str] = set()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        following = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "ident" and text in _GROUPING and following == "(":
            j = i + 2
            while toks[j][1] != ")":
                if toks[j][0] == "ident":
                    grouping.add(toks[j][1])
                j += 1
            i = j + 1
            continue
        if kind == "ident" and text == "offset":
            i += 2
            continue
        if kind == "ident" and (following in {"(", "by", "without"} or text.lower() in _KEYWORDS):
            i += 1
            continue
        if kind == "ident" or (kind == "op" and text == "{"):
            metric = text if kind == "ident" else ""
            matchers: list[tuple[str, str, str]] = []
            j = i + 1 if kind == "ident" else i
            if j < len(toks) and toks[j][1] == "{":
                j += 1
                while toks[j][1] != "}":
                    if toks[j][1] == ",":
                        j += 1
                        continue
                    label, op, value = toks[j][1], toks[j + 1][1], toks[j + 2][1]
                    assert toks[j + 2][0] == "string", f"a matcher's value must be a string in {expr!r}"
                    matchers.append((label, op, json.loads(value) if value.startswith('"') else value[1:-1]))
                    j += 3
                j += 1
            assert metric, f"a selector without a metric name in {expr!r}"
            selectors.append(Selector(metric, tuple(matchers)))
            i = j
            continue
        i += 1
    return References(tuple(selectors), frozenset(grouping))


def test_the_promql_reader_finds_selectors_matchers_and_grouping_labels() -> None:
    refs = references('sum by (namespace, le) (rate(a_total{x="1", y=~"b|c"}[5m])) / on (namespace) b > 0.5 '
                      'and ignoring (z) c{w!="it\'s"} offset 5m')
    assert refs.selectors == (Selector("a_total", (("x", "=", "1"), ("y", "=~", "b|c"))), Selector("b", ()),
                              Selector("c", (("w", "!=", "it's"),)))
    assert refs.grouping_labels == {"namespace", "le", "z"}


def test_the_promql_reader_sees_a_misspelt_label_as_a_matcher_of_its_own() -> None:
    assert references('x{sevice="chat"}').selectors[0].matchers == (("sevice", "=", "chat"),)


# ------------------------------------------------------------------------------------ the metric and label check

def recorded_labels() -> dict[str, frozenset[str]]:
    """A recording rule's series keeps the labels of its aggregation (less `le`, consumed by histogram_quantile)."""
    return {str(r["record"]): references(str(r["expr"])).grouping_labels - {"le"} for r in all_rules()
            if "record" in r}


def problems_with(expr: str, known: dict[str, frozenset[str]],
                  values: dict[tuple[str, str], frozenset[str]]) -> list[str]:
    refs = references(expr)
    problems = []
    available: set[str] = set(TARGET_LABELS)
    for sel in refs.selectors:
        if sel.metric not in known:
            problems.append(f"{sel.metric} is not a series the controller (or the gateway) exports")
            continue
        available |= known[sel.metric]
        for label, op, value in sel.matchers:
            if label not in known[sel.metric] | TARGET_LABELS:
                problems.append(f"{sel.metric} has no label {label!r} (it has {sorted(known[sel.metric])})")
            elif op == "=" and label in ENUMERATED_LABELS and value not in values.get((sel.metric, label), ()):
                problems.append(f"{sel.metric}{{{label}={value!r}}} matches nothing: {label} is one of "
                                f"{sorted(values.get((sel.metric, label), ()))}")
    problems += [f"grouping by {label!r}, which no series of the expression has"
                 for label in sorted(refs.grouping_labels - available)]
    return problems


@pytest.mark.parametrize(("where", "expr"), rule_expressions(), ids=[w for w, _ in rule_expressions()])
def test_every_rule_reads_only_series_and_labels_the_controller_exports(where: str, expr: str) -> None:
    ex = exported()
    assert problems_with(expr, {**ex.labels, **recorded_labels()}, ex.values) == []


@pytest.mark.parametrize(("where", "expr"), dashboard_queries(), ids=[w for w, _ in dashboard_queries()])
def test_every_dashboard_query_reads_only_series_and_labels_the_controller_exports(where: str, expr: str) -> None:
    ex = exported()  # the dashboard reads raw series only: it must work without the recording rules installed
    assert problems_with(concrete(expr), ex.labels, ex.values) == []


@pytest.mark.parametrize(("expr", "problem"), [
    ('infer_ctl_replica{state="Serving"}', "infer_ctl_replica is not a series"),
    ('infer_ctl_replicas{sevice="chat"}', "has no label 'sevice'"),
    ('infer_ctl_replicas{state="serving"}', "matches nothing"),
    ("sum by (pod) (infer_ctl_replicas)", "grouping by 'pod'"),
    ('infer_ctl_reconcile_seconds_bucket{le="10"}', "matches nothing"),
    ('infer_ctl_scaling_decisions_total{reason="NoDeviceMemory"}', "matches nothing"),
], ids=["a misspelt metric name is found", "a misspelt label is found", "a state in the wrong case is found",
        "grouping by a label no series has is found", "a bucket bound not as the client renders it is found",
        "a placement failure reason as a decision reason is found"])
def test_the_check_finds_what_would_silently_match_nothing(expr: str, problem: str) -> None:
    ex = exported()
    found = problems_with(expr, ex.labels, ex.values)
    assert len(found) == 1 and problem in found[0], found


# ---------------------------------------------------------------------------------------------- the PrometheusRule

def test_the_prometheus_rule_is_a_prometheus_operator_object_of_rule_groups() -> None:
    doc = prometheus_rule()
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] and doc["metadata"]["namespace"] == "infer-ctl-system"
    assert set(doc["spec"]) == {"groups"}
    names = [g["name"] for g in rule_groups()]
    assert len(names) == len(set(names)), "group names are unique"
    for group in rule_groups():
        assert set(group) <= {"name", "interval", "rules", "limit", "partial_response_strategy"}
        assert group["rules"], f"group {group['name']} has rules"
        for rule in group["rules"]:
            assert ("record" in rule) != ("alert" in rule), f"{rule_name(rule)}: exactly one of record and alert"
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            allowed = {"record", "expr", "labels"} if "record" in rule else \
                {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
            assert set(rule) <= allowed, f"{rule_name(rule)}: unknown keys {set(rule) - allowed}"


def test_recorded_series_follow_the_level_metric_operations_convention() -> None:
    for name in recorded_labels():
        assert re.fullmatch(r"[a-z_]*:infer_ctl_[a-z_]+:[a-z0-9_]+", name), name


def alerts() -> list[dict[str, Any]]:
    return [r for r in all_rules() if "alert" in r]


@pytest.mark.parametrize("alert", alerts(), ids=[a["alert"] for a in alerts()])
def test_every_alert_has_a_severity_a_wait_and_a_runbook_that_exists(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in {"critical", "warning", "info"}
    assert re.fullmatch(r"\d+[mh]", alert["for"]), "an alert waits minutes before firing, not a single evaluation"
    annotations = alert["annotations"]
    assert {"summary", "description", "runbook_url"} <= set(annotations)
    if "namespace" in references(alert["expr"]).grouping_labels:
        assert "$labels.service" in annotations["summary"], "a per-service alert names the service"
    anchor = annotations["runbook_url"].rpartition("#")[2]
    headings = {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                for line in (MONITORING / "README.md").read_text().splitlines() if line.startswith("#")}
    assert anchor in headings, f"README.md has no section #{anchor}"


@needs_promtool
def test_the_rule_groups_pass_promtool_check_rules(tmp_path: Path) -> None:
    rules_file = tmp_path / "infer-ctl-rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule_groups()}))
    result = subprocess.run([str(PROMTOOL), "check", "rules", str(rules_file)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(all_rules())} rules found" in result.stdout


@needs_promtool
def test_the_alerts_fire_on_synthetic_series_and_stay_silent_otherwise(tmp_path: Path) -> None:
    (tmp_path / "infer-ctl-rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    unit_tests = tmp_path / RULES_UNIT_TESTS.name
    shutil.copy(RULES_UNIT_TESTS, unit_tests)
    result = subprocess.run([str(PROMTOOL), "test", "rules", str(unit_tests)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {t["alertname"] for case in yaml.safe_load(RULES_UNIT_TESTS.read_text())["tests"]
              for t in case.get("alert_rule_test", ()) if t["exp_alerts"]}
    assert len(tested) >= 2 and tested <= {a["alert"] for a in alerts()}


# ---------------------------------------------------------------------------------------------- the ServiceMonitor

def controller_documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(CONTROLLER_MANIFEST.read_text()) if d]


def test_the_service_monitor_scrapes_the_metrics_port_the_controller_exposes() -> None:
    monitor: dict[str, Any] = yaml.safe_load((MONITORING / "servicemonitor.yaml").read_text())
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["name"]
    spec = monitor["spec"]
    service = next(d for d in controller_documents() if d["kind"] == "Service"
                   and all(d["metadata"].get("labels", {}).get(k) == v
                           for k, v in spec["selector"]["matchLabels"].items()))
    assert service["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
    deployment = next(d for d in controller_documents() if d["kind"] == "Deployment")
    container_ports = {p["name"]: p["containerPort"] for c in deployment["spec"]["template"]["spec"]["containers"]
                       for p in c.get("ports", ())}
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    for endpoint in spec["endpoints"]:
        port = service_ports[endpoint["port"]]
        assert port["targetPort"] in container_ports or port["targetPort"] in container_ports.values()
        assert endpoint.get("path", "/metrics") == "/metrics"
        assert endpoint["honorLabels"] is True, "the controller's namespace/service labels must not be renamed"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert str(container_ports["metrics"]) == args[args.index("--metrics-port") + 1]


def test_the_job_the_rules_assume_is_the_one_the_service_monitor_gives() -> None:
    monitor = yaml.safe_load((MONITORING / "servicemonitor.yaml").read_text())
    service = next(d for d in controller_documents() if d["kind"] == "Service")
    job = service["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    jobs = {value for _, expr in rule_expressions() for sel in references(expr).selectors
            for label, _, value in sel.matchers if label == "job"}
    assert jobs == {job}


# ---------------------------------------------------------------------------------------------- the dashboard

def test_the_dashboard_has_a_prometheus_datasource_and_namespace_and_service_variables() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 39 and board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "service"):
        assert variables[name]["type"] == "query"
        assert variables[name]["query"]["query"].startswith("label_values(")
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    assert "$namespace" in variables["service"]["query"]["query"], "services are those of the chosen namespaces"
    assert not variables["job"]["includeAll"] and not variables["job"]["multi"], \
        'one controller job: "All" would make up{job=~".*"} count every target of the Prometheus'


def test_every_panel_reads_the_chosen_datasource_and_panels_do_not_overlap() -> None:
    ids = [p["id"] for p in dashboard_panels()]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in dashboard_panels():
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells


def test_the_dashboard_shows_what_an_operator_of_the_controller_needs() -> None:
    metrics_of = {p["title"]: {s.metric for t in p.get("targets", ()) for s in references(t["expr"]).selectors}
                  for p in dashboard_panels()}
    wanted = {
        "Request rate vs forecast": {"infer_ctl_observed_requests_per_second",
                                     "infer_ctl_forecast_requests_per_second"},
        "Replicas by state vs desired: $service": {"infer_ctl_replicas", "infer_ctl_desired_replicas"},
        "Scaling decisions by reason": {"infer_ctl_scaling_decisions_total"},
        "Cold start p50 / p90 by accelerator": {"infer_ctl_cold_start_seconds_bucket"},
        "Placement failures by reason": {"infer_ctl_placement_failures_total"},
        "GPU fragmentation": {"infer_ctl_gpu_fragmentation_ratio"},
        "Pending gang GPUs": {"infer_ctl_pending_gang_gpus"},
        "Reconcile latency p50 / p99": {"infer_ctl_reconcile_seconds_bucket"},
        "SLO attainment vs objective": {"infer_ctl_slo_attainment", "infer_ctl_slo_objective"},
    }
    for title, metrics in wanted.items():
        assert metrics <= metrics_of.get(title, set()), title
    forecast = next(p for p in dashboard_panels() if p["title"] == "Request rate vs forecast")
    assert {'bound="mean"', 'bound="upper"'} <= {m for t in forecast["targets"] for m in re.findall(
        r'bound="\w+"', t["expr"])}


# ----------------------------------------------------------------------------- against a real Prometheus server

@dataclass(frozen=True, slots=True)
class LivePrometheus:
    url: str
    job: str


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePrometheus]:
    """A real Prometheus scraping the controller's metrics registry and a gateway's, each with every series set."""
    registries = (controller_metrics().registry, gateway_metrics().registry)
    servers = [start_http_server(0, addr="127.0.0.1", registry=r) for r in registries]
    try:
        targets = [f"127.0.0.1:{httpd.server_port}" for httpd, _ in servers]
        with prometheus(tmp_path_factory.mktemp("prom"), scrape_targets=targets, scrape_interval_s=0.5) as url:
            with httpx.Client(base_url=url, timeout=10) as http:
                # Rates need two samples in their window: wait for three scrapes of both targets (no event to
                # await from a Prometheus server; 0.5 s apart, within about 5 s of start).
                for _ in range(200):
                    result = http.get("/api/v1/query", params={
                        "query": "count_over_time(up[1m]) >= 3 and up == 1"}).json()["data"]["result"]
                    if len(result) == len(targets):
                        break
                    time.sleep(0.25)
                else:
                    pytest.fail("Prometheus did not scrape both targets three times")
                job = str(result[0]["metric"]["job"])
            yield LivePrometheus(url, job)
    finally:
        for httpd, thread in servers:
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=5)


def instant_query(live: LivePrometheus, expr: str) -> httpx.Response:
    return httpx.get(f"{live.url}/api/v1/query", params={"query": expr}, timeout=10)


def test_a_real_prometheus_refuses_an_expression_that_does_not_parse(live: LivePrometheus) -> None:
    response = instant_query(live, "sum by (namespace (infer_ctl_replicas)")
    assert response.status_code == 400 and response.json()["errorType"] == "bad_data"


@pytest.mark.parametrize(("where", "expr"), rule_expressions(), ids=[w for w, _ in rule_expressions()])
def test_every_rule_expression_parses_in_a_real_prometheus(live: LivePrometheus, where: str, expr: str) -> None:
    response = instant_query(live, expr)
    assert response.status_code == 200, response.text
    if where.removeprefix("rule ") in recorded_labels():
        assert response.json()["data"]["result"], "a recording rule records series when the controller exports"


@pytest.mark.parametrize(("where", "expr"), dashboard_queries(), ids=[w for w, _ in dashboard_queries()])
def test_every_dashboard_query_returns_series_from_a_real_prometheus(live: LivePrometheus, where: str,
                                                                    expr: str) -> None:
    response = instant_query(live, concrete(expr, job=live.job))
    assert response.status_code == 200, response.text
    assert response.json()["data"]["result"], f"{where} shows nothing although every series is exported"
