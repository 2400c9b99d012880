"""The loop of the sandbox's in-process controllers (scheduler, volume binder, node agent): one pass at start and
one after each change a store subscription signals, as a Kubernetes controller's work queue drives its sync."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


async def run_on_changes(wake: asyncio.Event, step: Callable[[], object], what: str, *,
                         gather_s: float = 0.0) -> None:
    """Run `step` now and whenever `wake` is set (changes set it while a step runs are seen by the next one),
    after `gather_s` (a burst of changes becomes one pass). A step that raises is logged and tried again on the
    next change: it never ends the loop. Runs until cancelled."""
    wake.set()
    while True:
        await wake.wait()
        if gather_s:
            await asyncio.sleep(gather_s)
        wake.clear()
        try:
            step()
        except Exception:
            log.exception("%s failed; retrying on the next change", what)
        await asyncio.sleep(0)
