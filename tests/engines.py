"""The shipped engine profiles (policies/runtimes.yaml) as the tests use them: the queries and scrapes the controller
makes for a vLLM service."""

from __future__ import annotations

from infer_ctl.config.policies import load_policies
from infer_ctl.core.runtime import RuntimeProfile
from infer_ctl.observe.rates import ScrapeRates
from infer_ctl.paths import data_path

VLLM: RuntimeProfile = load_policies(data_path("policies")).runtimes.profiles["vllm"]
RATE_QUERY = VLLM.metrics.rate_query()  # sum(rate(vllm:request_success_total{namespace=..,service=..}[1m]))
IN_FLIGHT_QUERY = VLLM.metrics.in_flight_query()
REQUESTS = VLLM.metrics.requests  # vllm:request_success_total
RUNNING, WAITING = VLLM.metrics.running, VLLM.metrics.waiting


def vllm_scrape(**options: object) -> ScrapeRates:
    """A direct scrape of vLLM replicas, as the controller sets it up for a vLLM service."""
    return ScrapeRates(metric=REQUESTS, in_flight=VLLM.metrics.in_flight, **options)  # type: ignore[arg-type]
