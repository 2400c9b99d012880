"""The open loop on a fake clock (looptime): a mock server with a known service time, so every figure is exact."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from loadgen.client import ClientConfig, HttpxSender, Sender
from loadgen.runner import Runner
from loadgen.schedule import Arrivals, curve_arrivals
from loadgen.shapes import parse_shape


def mock_server(service_s: Callable[[int], float], fail: Exception | None = None) -> Callable[[ClientConfig], Sender]:
    """A client factory whose 'server' answers after service_s(n) seconds of loop time (n = request number)."""
    served = 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal served
        n = served
        served += 1
        request.extensions["loadgen_sent"][0] = asyncio.get_running_loop().time()
        if fail is not None:
            raise fail
        await asyncio.sleep(service_s(n))
        return httpx.Response(200, content=b"ok")

    def factory(cfg: ClientConfig) -> Sender:
        return HttpxSender(cfg, client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))

    return factory


def schedule(spec: str):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    return curve_arrivals(parse_shape(spec).curve(rng), Arrivals.DETERMINISTIC, rng)


def config(**overrides: object) -> ClientConfig:
    return ClientConfig(url="http://upstream.test/infer", **overrides)  # type: ignore[arg-type]


@pytest.mark.looptime
async def test_a_constant_rate_is_sent_on_time_and_latency_is_the_service_time() -> None:
    runner = Runner(config(), client_factory=mock_server(lambda n: 0.050))
    outcome = await runner.run(schedule("100@10s"))
    s = outcome.stats
    assert (s.sent, s.ok, s.errors) == (1000, 1000, 0)
    assert s.latency_us.quantile(0.5) == pytest.approx(50_000, rel=s.latency_us.relative_error)
    assert s.latency_us.quantile(0.99) == pytest.approx(50_000, rel=s.latency_us.relative_error)
    assert s.send_lag_us.max_value == 0
    assert [r.sent for r in s.rows[:10]] == [100] * 10


@pytest.mark.looptime
async def test_a_slow_server_raises_latency_and_in_flight_but_not_the_sending_rate() -> None:
    runner = Runner(config(), client_factory=mock_server(lambda n: 2.0))
    outcome = await runner.run(schedule("100@10s"))
    s = outcome.stats
    assert s.sent == 1000
    assert outcome.last_start_s < 10.0  # every request went out inside the 10 s schedule
    assert s.latency_us.quantile(0.5) == pytest.approx(2_000_000, rel=s.latency_us.relative_error)
    assert s.in_flight_peak == pytest.approx(200, abs=2)  # rate x latency (Little's law)


@pytest.mark.looptime
async def test_a_server_that_slows_down_midway_shows_as_latency_growth_in_the_timeline() -> None:
    runner = Runner(config(), client_factory=mock_server(lambda n: 0.01 if n < 500 else 0.5))
    outcome = await runner.run(schedule("100@10s"))
    rows = outcome.stats.rows
    assert [r.sent for r in rows[:10]] == [100] * 10
    assert rows[2].p50_ms == pytest.approx(10, rel=0.02)
    assert rows[7].p50_ms == pytest.approx(500, rel=0.02)


@pytest.mark.looptime
async def test_an_in_flight_cap_that_binds_queues_requests_counts_their_wait_and_is_reported() -> None:
    runner = Runner(config(max_in_flight=10), client_factory=mock_server(lambda n: 1.0))
    outcome = await runner.run(schedule("100@5s"))
    s = outcome.stats
    assert s.in_flight_peak == 10
    assert s.cap_waited > 400
    assert s.sent == 500 and s.ok == 500
    # 10 in flight at 1 s each serve 10 req/s against 100 scheduled: the queue wait becomes latency.
    assert s.latency_us.quantile(0.99) > 40_000_000
    assert s.send_lag_us.quantile(0.99) > 30_000_000


@pytest.mark.looptime
async def test_a_cap_that_never_binds_changes_nothing() -> None:
    runner = Runner(config(max_in_flight=50), client_factory=mock_server(lambda n: 0.1))
    outcome = await runner.run(schedule("100@5s"))
    assert outcome.stats.cap_waited == 0
    assert outcome.stats.in_flight_peak == 10


@pytest.mark.looptime
async def test_client_errors_are_counted_by_kind_with_an_example_and_never_stop_the_loop() -> None:
    refused = httpx.ConnectError("127.0.0.1:9: Connection refused")
    runner = Runner(config(), client_factory=mock_server(lambda n: 0.0, fail=refused))
    outcome = await runner.run(schedule("50@2s"))
    s = outcome.stats
    assert (s.sent, s.ok, s.errors) == (100, 0, 100)
    assert s.errors_by_kind == {"connect_refused": 100}
    assert "Connection refused" in s.error_examples["connect_refused"]
    assert not s.statuses


@pytest.mark.looptime
async def test_stopping_ends_scheduling_and_lets_started_requests_finish() -> None:
    runner = Runner(config(), client_factory=mock_server(lambda n: 0.2))

    async def stop_later() -> None:
        await asyncio.sleep(1.0)
        runner.stop()

    stopper = asyncio.create_task(stop_later())
    outcome = await runner.run(schedule("100@10s"))
    await stopper
    assert outcome.interrupted
    assert 90 <= outcome.stats.sent <= 115
    assert outcome.stats.ok == outcome.stats.sent


@pytest.mark.looptime
async def test_a_shape_that_ends_in_silence_lasts_its_whole_duration() -> None:
    runner = Runner(config(), client_factory=mock_server(lambda n: 0.01))
    outcome = await runner.run(schedule("100@2s,0@5s"), duration_s=7.0)
    assert outcome.stats.sent == 200
    assert outcome.ended_s == pytest.approx(7.0, abs=0.05)
    assert [r.scheduled for r in outcome.stats.rows[:7]] == [100, 100, 0, 0, 0, 0, 0]


@pytest.mark.looptime
async def test_stopping_during_a_silent_tail_ends_the_run_at_once() -> None:
    runner = Runner(config(), client_factory=mock_server(lambda n: 0.01))

    async def stop_later() -> None:
        await asyncio.sleep(3.0)
        runner.stop()

    stopper = asyncio.create_task(stop_later())
    outcome = await runner.run(schedule("100@1s,0@60s"), duration_s=61.0)
    await stopper
    assert outcome.interrupted
    assert outcome.ended_s == pytest.approx(2.9, abs=0.05)  # 3 s after setup, t0 being 0.1 s in


@pytest.mark.looptime
async def test_a_backlog_parts_answered_by_completion_from_ok_by_scheduled_second() -> None:
    # One request at a time (a cap of 1 in flight) at 0.1 s each serves 10 req/s; 20 req/s are due for 5 s. By
    # scheduled second, every second's 20 requests succeed (late); by completion, 10 are answered per second
    # (at 0.1, 0.2, ... 10.0 s) until the backlog has drained, 5 s after the schedule.
    runner = Runner(config(max_in_flight=1), client_factory=mock_server(lambda n: 0.1))
    outcome = await runner.run(schedule("20@5s"))
    rows = outcome.stats.rows
    assert [r.ok for r in rows[:5]] == [20] * 5
    assert [r.answered for r in rows[1:10]] == [10] * 9
    assert sum(r.answered for r in rows) == 100
    assert max(r.t_s for r in rows if r.answered) == 10
    assert rows[4].p50_ms < rows[4].p95_ms <= rows[4].p99_ms  # the wait grows within the second


@pytest.mark.looptime
async def test_phases_count_and_time_their_own_requests_by_scheduled_time() -> None:
    from loadgen.stats import RunStats

    stats = RunStats((("fast", 0.0), ("slow", 2.0)))
    runner = Runner(config(), stats, client_factory=mock_server(lambda n: 0.01 if n < 200 else 0.5))
    outcome = await runner.run(schedule("100@4s"))
    fast, slow = outcome.stats.phases
    assert (fast.name, fast.scheduled, fast.ok, slow.scheduled, slow.ok) == ("fast", 200, 200, 200, 200)
    assert fast.latency_us.quantile(0.95) == pytest.approx(10_000, rel=0.01)
    assert slow.latency_us.quantile(0.5) == pytest.approx(500_000, rel=0.01)


def test_phase_starts_that_do_not_increase_are_refused() -> None:
    from loadgen.stats import RunStats

    with pytest.raises(ValueError, match="phase starts must increase"):
        RunStats((("a", 0.0), ("b", 0.0)))
