"""Headless Chromium driven over the DevTools protocol (its websocket, through aiohttp): load a page at a given
window width, wait until the page says it is done, read values from it, record every request it made, take a PNG.

``--dump-dom`` shows what a page holds but not how it lays out; this shows both (an A/B pair that overflows at
1280 px, a page that fetched something from another host). ``offline=True`` starts the browser with every host but
the loopback address unresolvable: a page that needs a CDN fails there as it would on an air-gapped machine.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--font-render-hinting=none",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
)
#: Every host name but the loopback address fails to resolve (Chromium's own resolver rules).
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (.ci/run does it)")
    return found


@dataclass
class Visit:
    """What one page load gave: the values asked for, the URLs requested, the screenshot (PNG bytes or None)."""

    values: dict[str, Any]
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    png: bytes | None = None


@contextmanager
def browser(profile: Path, *, offline: bool = False) -> Iterator[Browser]:
    command = [chromium(), *FLAGS, f"--user-data-dir={profile}", *([OFFLINE] if offline else []), "about:blank"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert process.stderr is not None
        endpoint = None
        for line in process.stderr:  # Chromium names its websocket on stderr once it listens
            if found := re.search(r"DevTools listening on (ws://\S+)", line):
                endpoint = found.group(1)
                break
        if endpoint is None:
            pytest.fail(f"chromium exited without a DevTools endpoint (code {process.wait(10)})")
        yield Browser(endpoint)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Browser:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def visit(
        self,
        url: str,
        *,
        width: int = 1280,
        height: int = 900,
        values: dict[str, str] | None = None,
        before_shot: str | None = None,
        shot_clip: str | None = None,
        timeout_s: float = 180.0,
    ) -> Visit:
        """Load ``url`` at ``width`` x ``height``, wait for ``document.body.dataset.state`` to be ``done`` or
        ``error``, evaluate each of ``values`` (JavaScript expressions, JSON-able results), then with ``shot_clip``
        (an expression giving ``{x, y, width, height}`` in CSS pixels) run ``before_shot`` and take a PNG of it."""
        return asyncio.run(
            self._visit(url, width, height, values or {}, before_shot, shot_clip, timeout_s), debug=False
        )

    async def _visit(
        self,
        url: str,
        width: int,
        height: int,
        values: dict[str, str],
        before_shot: str | None,
        shot_clip: str | None,
        timeout_s: float,
    ) -> Visit:
        async with aiohttp.ClientSession() as http, http.ws_connect(self.endpoint, max_msg_size=0) as ws:
            ids = itertools.count(1)
            events: list[dict[str, Any]] = []

            async def send(method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
                number = next(ids)
                message = {"id": number, "method": method, "params": params}
                if session:
                    message["sessionId"] = session
                await ws.send_str(json.dumps(message))
                while True:
                    reply = json.loads((await ws.receive(timeout=timeout_s)).data)
                    if reply.get("id") == number:
                        if "error" in reply:
                            raise RuntimeError(f"{method}: {reply['error']}")
                        return dict(reply.get("result", {}))
                    events.append(reply)

            target = (await send("Target.createTarget", url="about:blank"))["targetId"]
            session = (await send("Target.attachToTarget", targetId=target, flatten=True))["sessionId"]
            await send("Network.enable", session)
            await send("Page.enable", session)
            metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
            await send("Emulation.setDeviceMetricsOverride", session, **metrics)
            await send("Page.navigate", session, url=url)

            async def evaluate(expression: str) -> Any:
                answer = await send(
                    "Runtime.evaluate", session, expression=expression, returnByValue=True, awaitPromise=True
                )
                if "exceptionDetails" in answer:
                    raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
                return answer["result"].get("value")

            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while await evaluate("document.body ? document.body.dataset.state || '' : ''") not in ("done", "error"):
                if loop.time() > deadline:
                    raise TimeoutError(f"{url} did not finish within {timeout_s} s")
                await asyncio.sleep(0.2)
            visit = Visit({name: await evaluate(expression) for name, expression in values.items()})
            if shot_clip is not None:
                if before_shot:
                    await evaluate(before_shot)
                clip = await evaluate(shot_clip)
                full = await evaluate("document.documentElement.scrollHeight")
                await send("Emulation.setDeviceMetricsOverride", session, **{**metrics, "height": int(full)})
                shot = await send("Page.captureScreenshot", session, format="png", clip={**clip, "scale": 1})
                visit.png = base64.b64decode(shot["data"])
            await send("Target.closeTarget", targetId=target)
            _record_network(visit, events)
            return visit


def _record_network(visit: Visit, events: list[dict[str, Any]]) -> None:
    """The URLs the page requested and the errors of the loads that failed, from the DevTools events."""
    for event in events:
        if event.get("method") == "Network.requestWillBeSent":
            visit.requests.append(event["params"]["request"]["url"])
        if event.get("method") == "Network.loadingFailed":
            visit.failed.append(event["params"].get("errorText", ""))
