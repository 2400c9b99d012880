"""Starting a stand-in as the node agent does: its own process, an env of its own, `LISTENING host:port` on stdout."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client.parser import text_string_to_metric_families


@asynccontextmanager
async def standin(*argv: str, **env: str) -> AsyncIterator[str]:
    """`python -m infer_ctl.sandbox.modelserver ARGV` with `env` (plus PATH/PYTHONPATH) until the block ends; yields
    its URL once it listens."""
    environment = {k: os.environ[k] for k in ("PATH", "PYTHONPATH") if k in os.environ} | env
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "infer_ctl.sandbox.modelserver", *argv, "--host", "127.0.0.1", "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=environment)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(20):
            line = (await process.stdout.readline()).decode().strip()
        assert line.startswith("LISTENING "), f"no LISTENING line: {line!r}"
        yield f"http://{line.split()[1]}"
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def families(text: str) -> dict[str, dict[str, object]]:
    """name -> {type, labels (a set of label names, `le` aside), buckets (for histograms)} of an exposition."""
    found: dict[str, dict[str, object]] = {}
    for family in text_string_to_metric_families(text):
        labels: set[str] = set()
        buckets: list[float] = []
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
            if sample.name.endswith("_bucket") and sample.labels.get("le") != "+Inf":
                le = float(sample.labels["le"])
                if le not in buckets:
                    buckets.append(le)
        exposed = family.name + ("_total" if family.type == "counter" else "")
        found[exposed] = {"type": family.type, "labels": labels, "buckets": tuple(buckets)}
    return found


def value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name}{labels}")
