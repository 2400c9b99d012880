"""`python -m loadgen` end to end against a real HTTP server on 127.0.0.1 (the `upstream` fixture)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.sandbox.ports import free_port
from loadgen.cli import EXIT_ERROR_RATIO, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, main
from loadgen.report import SUMMARY_KEYS

pytestmark = pytest.mark.slow


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads(self.out)  # type: ignore[no-any-return]


def loadgen(*argv: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return Result(code, out.getvalue(), err.getvalue())


def test_a_constant_rate_is_met_within_one_percent_and_the_json_has_the_documented_keys(upstream) -> None:  # type: ignore[no-untyped-def]
    r = loadgen(upstream.url("/ok"), "--shape", "200@2s", "--json", "--seed", "1")
    assert r.code == EXIT_OK, r.err
    s = r.summary
    assert list(s)[: len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)
    assert (s["target_rps"], s["sent"], s["ok"], s["errors"]) == (200.0, 400, 400, 0)
    assert abs(float(s["achieved_rps"]) - 200.0) <= 2.0
    assert 0 < float(s["p50_ms"]) <= float(s["p95_ms"]) <= float(s["p99_ms"])
    assert upstream.requests == 400


@pytest.mark.parametrize(
    "transport",
    ["aiohttp", "httpx"],
    ids=["aiohttp's client", "httpx with its own transport"],
)
def test_every_transport_sends_the_same_bodies_and_counts_the_same(upstream, transport: str) -> None:  # type: ignore[no-untyped-def]
    r = loadgen(upstream.url("/echo"), "--shape", "40@1s", "--body", '{"seq": ${seq}, "ctx": ${context_tokens}}',
                "--tokens", "64,8", "--transport", transport, "--json")  # fmt: skip
    assert r.code == EXIT_OK, r.err
    assert (r.summary["sent"], r.summary["ok"], r.summary["transport"]) == (40, 40, transport)
    assert float(r.summary["send_lag_ms_p99"]) > 0  # the write time was recorded
    assert sorted(b["seq"] for b in upstream.bodies) == list(range(40))
    assert {b["ctx"] for b in upstream.bodies} == {64}


def test_each_step_of_a_step_shape_is_sent_at_its_rate(upstream, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    timeline = tmp_path / "timeline.csv"
    r = loadgen(upstream.url("/ok"), "--shape", "100@1s,300@1s", "--json", "--timeline", str(timeline))
    assert r.code == EXIT_OK, r.err
    rows = list(csv.DictReader(timeline.open()))
    assert [int(row["scheduled"]) for row in rows[:2]] == [100, 300]
    assert [float(row["target"]) for row in rows[:2]] == [100.0, 300.0]
    assert abs(int(rows[0]["sent"]) - 100) <= 3 and abs(int(rows[1]["sent"]) - 300) <= 3
    assert float(r.summary["achieved_rps"]) == pytest.approx(200.0, rel=0.01)


def test_phases_split_the_summary_at_their_scheduled_starts(upstream) -> None:  # type: ignore[no-untyped-def]
    r = loadgen(upstream.url("/ok"), "--shape", "100@1s,300@1s", "--phases", "low=0,high=1s", "--json")
    assert r.code == EXIT_OK, r.err
    low, high = r.summary["phases"]
    assert (low["name"], low["start_s"], low["end_s"], low["scheduled"], low["ok"]) == ("low", 0.0, 1.0, 100, 100)
    assert (high["name"], high["start_s"], high["end_s"], high["scheduled"], high["errors"]) == ("high", 1.0, None,
                                                                                                 300, 0)
    assert 0 < high["p50_ms"] <= high["p95_ms"]
    text = loadgen(upstream.url("/ok"), "--shape", "10@1s,20@1s", "--phases", "0,1").out
    assert "phase      from 0s (0-1 s): scheduled 10  ok 10" in text
    assert "phase      from 1s (1-end s): scheduled 20  ok 20" in text


def test_phases_that_do_not_increase_are_a_usage_error(upstream, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        loadgen(upstream.url("/ok"), "--shape", "10@1s", "--phases", "a=5s,b=2s")
    assert exit_.value.code == EXIT_USAGE
    assert "phase 'b=2s': starts at 2 s, not after the previous phase (5 s)" in capsys.readouterr().err


def test_a_slow_server_raises_latency_while_the_rate_holds(upstream) -> None:  # type: ignore[no-untyped-def]
    fast = loadgen(upstream.url("/ok"), "--shape", "50@2s", "--json").summary
    slow = loadgen(upstream.url("/slow?ms=300"), "--shape", "50@2s", "--json").summary
    assert float(slow["p50_ms"]) >= 300 > 10 * float(fast["p50_ms"])
    for s in (fast, slow):
        assert s["sent"] == 100 and s["ok"] == 100
        assert float(s["achieved_rps"]) == pytest.approx(50.0, rel=0.01)
    assert int(slow["in_flight_peak"]) >= 12  # 50 req/s x 0.3 s (Little's law)


def test_a_refused_connection_ends_with_a_summary_of_what_was_tried_and_exit_status_3() -> None:
    port = free_port()
    r = loadgen(f"http://127.0.0.1:{port}/v1/infer", "--shape", "20@1s", "--json")
    assert r.code == EXIT_UNREACHABLE
    s = r.summary
    assert (s["sent"], s["ok"], s["errors"]) == (20, 0, 20)
    assert s["errors_by_kind"] == {"connect_refused": 20}
    assert f"no response from http://127.0.0.1:{port}/v1/infer: tried 20 requests" in r.err
    assert "connect_refused" in r.err and f"Cannot connect to host 127.0.0.1:{port}" in r.err  # aiohttp's words
    assert "Traceback" not in r.err


def test_the_installed_command_reports_a_refused_target_without_a_traceback() -> None:
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", f"http://127.0.0.1:{port}/", "--shape", "10@0.5s", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == EXIT_UNREACHABLE
    assert "errors     connect_refused: 5" in proc.stdout
    assert "send lag   none measured: no request reached a connection" in proc.stdout
    assert "no response from" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shape", "50@60s,5x0@2m"], 'loadgen: error: shape "50@60s,5x0@2m": "5x0@2m": rate "5x0" is not a number'),
        (["--shape", "100"], "a bare rate needs --duration"),
        (["--shape", "10@1s", "--body", '{"p": ${prompt}}'], "unknown placeholder ${prompt}"),
        (["--shape", "10@1s", "-H", "NoColon"], "--header 'NoColon' is not 'Name: value'"),
        (["--trace", "/nonexistent.csv"], "/nonexistent.csv: cannot open"),
    ],
    ids=[
        "a malformed shape names the token",
        "a bare rate without a duration says what is missing",
        "an unknown body placeholder is named",
        "a malformed header is named",
        "a missing trace file is named",
    ],
)
def test_bad_input_exits_2_naming_the_problem(upstream, argv: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    r = loadgen(upstream.url("/ok"), *argv)
    assert r.code == EXIT_USAGE
    assert message in r.err
    assert upstream.requests == 0


def test_a_malformed_trace_file_exits_2_naming_the_line(upstream, write_csv) -> None:  # type: ignore[no-untyped-def]
    path = write_csv("t.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.1,5,6", "oops,5,6"])
    r = loadgen(upstream.url("/echo"), "--trace", str(path))
    assert r.code == EXIT_USAGE
    assert f'{path} line 3: TIMESTAMP "oops" is not a timestamp' in r.err


def test_an_azure_trace_is_replayed_with_its_token_counts_in_the_body(upstream, azure_trace) -> None:  # type: ignore[no-untyped-def]
    path = azure_trace(n=20, gap_s=0.5)  # 9.5 s of trace
    r = loadgen(upstream.url("/echo"), "--trace", str(path), "--compress", "10", "--json")
    assert r.code == EXIT_OK, r.err
    s = r.summary
    assert (s["sent"], s["ok"], s["method"]) == (20, 20, "POST")
    assert float(s["duration_s"]) == pytest.approx(0.95)
    ordered = sorted(upstream.bodies, key=lambda b: b["prompt_tokens"])
    assert ordered[0] == {"prompt_tokens": 100, "max_tokens": 10}
    assert [b["max_tokens"] for b in ordered] == list(range(10, 30))


def test_a_count_trace_is_replayed_at_its_compressed_rate(upstream, write_csv) -> None:  # type: ignore[no-untyped-def]
    path = write_csv("calls.csv", ["DateTime,Calls", "2003-03-03T07:00:00Z,30", "2003-03-03T07:05:00Z,90"])
    r = loadgen(upstream.url("/ok"), "--trace", str(path), "--compress", "300", "--json")
    assert r.code == EXIT_OK, r.err
    assert (r.summary["sent"], r.summary["target_rps"]) == (120, 60.0)


def test_http_errors_are_counted_by_status_and_fail_the_run_past_the_error_ratio(upstream) -> None:  # type: ignore[no-untyped-def]
    r = loadgen(upstream.url("/status/503"), "--shape", "20@1s", "--json")
    assert r.code == EXIT_ERROR_RATIO
    assert r.summary["errors_by_kind"] == {"http_503": 20}
    assert r.summary["statuses"] == {"503": 20}
    tolerated = loadgen(upstream.url("/status/503"), "--shape", "20@1s", "--json", "--max-error-ratio", "1")
    assert tolerated.code == EXIT_OK


def test_an_in_flight_cap_that_binds_is_reported_and_its_wait_counts_as_latency(upstream) -> None:  # type: ignore[no-untyped-def]
    r = loadgen(upstream.url("/slow?ms=200"), "--shape", "50@1s", "--max-in-flight", "2")
    assert r.code == EXIT_OK, r.err
    waited = re.search(r"cap 2: BOUND, (\d+) requests waited", r.out)
    assert waited and int(waited.group(1)) > 30
    # 2 in flight x 5 req/s each = 10 req/s against 50 scheduled: the last ones wait about 4 s.
    assert re.search(r"p99 [3-9]\.\d+ s", r.out)


def test_a_timeline_as_json_and_a_plot_are_written(upstream, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    timeline, plot = tmp_path / "t.json", tmp_path / "run.png"
    r = loadgen(upstream.url("/ok"), "--shape", "20..60@2s", "--timeline", str(timeline), "--plot", str(plot), "--json")
    assert r.code == EXIT_OK, r.err
    rows = json.loads(timeline.read_text())
    assert [row["scheduled"] for row in rows[:2]] == [30, 50]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prometheus_metrics_are_served_during_the_run_and_the_port_is_freed_after(upstream) -> None:  # type: ignore[no-untyped-def]
    announced = threading.Event()
    port: list[int] = []

    class Err(io.StringIO):
        def write(self, s: str) -> int:
            m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", s)
            if m:
                port.append(int(m.group(1)))
                announced.set()
            return super().write(s)

    codes: list[int] = []
    out = io.StringIO()
    run = threading.Thread(
        target=lambda: codes.append(
            main([upstream.url("/ok"), "--shape", "40@2s", "--metrics-port", "0"], out=out, err=Err())
        )
    )
    run.start()
    try:
        assert announced.wait(10)
        text = ""
        while 'loadgen_responses_total{outcome="ok"}' not in text:  # until the first responses are in
            text = httpx.get(f"http://127.0.0.1:{port[0]}/metrics", timeout=5).text
        assert "loadgen_requests_sent_total" in text
        assert 'loadgen_request_duration_seconds_bucket{le="+Inf"}' in text
        assert "loadgen_target_rate_rps 40.0" in text
    finally:
        run.join(30)
    assert codes == [EXIT_OK]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port[0]}/metrics", timeout=2)


def test_poisson_arrivals_repeat_with_the_same_seed(upstream) -> None:  # type: ignore[no-untyped-def]
    runs = [
        loadgen(upstream.url("/ok"), "--shape", "100@1s", "--arrivals", "poisson", "--seed", "9", "--json")
        for _ in range(2)
    ]
    assert runs[0].summary["sent"] == runs[1].summary["sent"]
    assert runs[0].summary["seed"] == 9


def test_progress_lines_go_to_stderr_when_asked(upstream) -> None:  # type: ignore[no-untyped-def]
    r = loadgen(upstream.url("/ok"), "--shape", "30@2s", "--progress", "--json")
    assert re.search(r"\[\s+1s\] target\s+30\.0/s sent\s+\d+/s", r.err)
    json.loads(r.out)  # stdout stays one JSON object


def test_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for option in (
        "--shape",
        "--trace",
        "--compress",
        "--rate-scale",
        "--body",
        "--max-in-flight",
        "--timeline",
        "--phases",
        "--plot",
        "--metrics-port",
        "--json",
        "exit status",
    ):
        assert option in text


def test_infer_ctl_loadgen_forwards_every_argument(upstream, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from infer_ctl.cli.main import main as infer_ctl_main

    code = infer_ctl_main(["loadgen", upstream.url("/ok"), "--shape", "20@0.5s", "--json"])
    assert code == EXIT_OK
    assert json.loads(capsys.readouterr().out)["sent"] == 10


def test_loadgen_stands_alone_and_never_imports_infer_ctl() -> None:
    import ast

    root = Path(__file__).resolve().parents[2] / "loadgen"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n == "infer_ctl" or n.startswith("infer_ctl.") for n in names), path


def test_the_loadgen_module_runs_as_a_script_with_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and "open-loop" in proc.stdout.lower()


def test_ctrl_c_stops_scheduling_prints_the_summary_and_exits_130() -> None:
    port = free_port()  # nothing listening: the run would go on for 30 s
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", f"http://127.0.0.1:{port}/", "--shape", "20@30s", "--progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # the first progress line: the loop is running
        assert first.startswith("[    1s]"), first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert "interrupted: the schedule was stopped early" in out
    assert "Traceback" not in err


@pytest.fixture
def model_server() -> Iterator[str]:
    """The sandbox's vLLM stand-in as a real process: 51.2 ms per 256 max_tokens (20 ms per 100), 64 in parallel."""
    env = {**os.environ, "INFER_CTL_SANDBOX_SERVICE_TIME_MS": "51.2", "INFER_CTL_SANDBOX_CONCURRENCY": "64",
           "INFER_CTL_SANDBOX_DRAIN_S": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "infer_ctl.sandbox.modelserver", "vllm", "m", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        address = None
        for line in proc.stdout:
            if line.startswith("LISTENING"):  # vLLM listens once loaded
                address = line.split()[1]
                break
        assert address is not None, "model server did not start"
        yield f"http://{address}/v1/completions"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_replaying_a_trace_against_the_sandbox_model_server_scales_its_work_by_the_tokens(
    model_server: str, write_csv: Callable[[str, list[str]], Path]
) -> None:
    def trace(generated: int) -> Path:
        rows = [f"2023-11-16 18:17:{i // 10:02d}.{i % 10}000000,1000,{generated}" for i in range(20)]
        return write_csv(f"t{generated}.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", *rows])

    body = '{"model": "m", "prompt_tokens": ${context_tokens}, "max_tokens": ${generated_tokens}}'
    short = loadgen(model_server, "--trace", str(trace(50)), "--body", body, "--json").summary
    long = loadgen(model_server, "--trace", str(trace(500)), "--body", body, "--json").summary
    assert short["ok"] == long["ok"] == 20
    assert 10 <= float(short["p50_ms"]) < 40  # 20 ms x 50/100
    assert 100 <= float(long["p50_ms"]) < 160  # 20 ms x 500/100


@pytest.fixture
def tls_upstream(tmp_path: Path) -> Iterator[str]:
    """An HTTPS server on 127.0.0.1 with a fresh self-signed certificate (openssl), in a thread of its own."""
    import asyncio
    import shutil
    import ssl

    from aiohttp import web

    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="secure ok")

    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app, access_log=None)
    loop = asyncio.new_event_loop()
    port: list[int] = []
    started = threading.Event()

    def serve() -> None:
        async def start() -> None:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
            await site.start()
            server = site._server
            assert isinstance(server, asyncio.base_events.Server)
            port.append(server.sockets[0].getsockname()[1])

        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    yield f"https://127.0.0.1:{port[0]}/"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_https_works_with_insecure_and_an_unverified_certificate_is_a_connect_error(tls_upstream: str) -> None:
    secure = loadgen(tls_upstream, "--shape", "20@1s", "--insecure", "--json")
    assert secure.code == EXIT_OK, secure.err
    assert secure.summary["ok"] == 20
    refused = loadgen(tls_upstream, "--shape", "5@1s", "--json")
    assert refused.code == EXIT_UNREACHABLE
    assert refused.summary["errors_by_kind"] == {"tls": 5}
    assert "certificate verify failed" in refused.summary["error_examples"]["tls"].lower()


@pytest.mark.skipif(importlib.util.find_spec("h2") is not None, reason="h2 is installed here")
def test_http2_without_the_h2_package_is_a_usage_error(upstream) -> None:  # type: ignore[no-untyped-def]
    r = loadgen(upstream.url("/ok"), "--shape", "5@1s", "--transport", "httpx", "--http2")
    assert r.code == EXIT_USAGE
    assert "--http2 needs the h2 package" in r.err


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("sine:mean=40,amplitude=30,period=2s,duration=2s", 80),
        ("bursts:base=10,burst=150,on=0.3s,off=0.7s,duration=2s", None),
        ("0..80@2s", 80),
    ],
    ids=["a sine runs end to end", "Markov-modulated bursts run end to end", "a ramp runs end to end"],
)
def test_every_shape_kind_runs_end_to_end(upstream, shape: str, expected: int | None) -> None:  # type: ignore[no-untyped-def]
    r = loadgen(upstream.url("/ok"), "--shape", shape, "--seed", "3", "--json")
    assert r.code == EXIT_OK, r.err
    s = r.summary
    assert s["sent"] == s["scheduled"] == s["ok"] == upstream.requests
    if expected is not None:
        assert s["sent"] == expected  # deterministic arrivals send exactly the area under the curve
    else:
        assert s["arrivals"] == "poisson" and s["sent"] > 0
