"""A real Chromium watches a fleet of two `core.serve --model tiny` replicas on the Live page: a shared prefix sent
to both and one prefix sent to each alone, so the page's "where each prefix lives" table shows each replica's
prefixes and the blocks held by both (memory spent twice).

The replicas' KV events sockets are on consecutive ports (rank r on the endpoint's port + r, as the page reads a
data-parallel fleet), their replay sockets too, so the page fills in what was cached before it subscribed.
Expected counts by hand (block size 16, one generated token, so only the prompts' full blocks are cached):
- both replicas: tokens 1..32 (2 blocks) then a distinct tail shorter than a block;
- replica 0 alone: tokens 300..331 (2 blocks); replica 1 alone: tokens 400..447 (3 blocks).
So replica 0 holds 4 blocks, 2 prefixes, 2 also cached elsewhere; replica 1 holds 5, 2 prefixes, 2 elsewhere;
the fleet 7 distinct blocks, 2 held by both, 2 extra copies, 9 cached blocks in all.
"""

import json
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from playwright.sync_api import expect

from core.serve.launcher import HOST, LabServer, free_port
from core.serve.ports import bindable
from tests.conftest import ARTIFACTS

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
WAIT_MS = 60_000  # two tiny servers, the app and the browser share 2 busy cores


def _consecutive_pair() -> int:
    """A port P with P and P + 1 free a moment ago on loopback."""
    for _ in range(50):
        port = free_port()
        if port < 65_535 and bindable(HOST, port + 1):
            return port
    raise AssertionError("no two consecutive free loopback ports")


def _replicas() -> list[LabServer]:
    events, replay = _consecutive_pair(), _consecutive_pair()
    while replay in (events - 1, events, events + 1):
        replay = _consecutive_pair()
    return [LabServer("tiny", (free_port(), events + r, replay + r), num_blocks=64) for r in range(2)]


def _send(server: LabServer, prompt: list[int]) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "ignore_eos": True}).encode()
    request = urllib.request.Request(
        server.url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    with OPENER.open(request, timeout=120) as response:
        assert response.status == 200, server.log[-3:]


@pytest.mark.browser
def test_live_page_shows_where_each_prefix_lives(streamlit_server, page):
    servers = _replicas()
    try:
        with ThreadPoolExecutor(2) as pool:  # both start at once: their start is most of the wait
            list(pool.map(lambda server: server.start(wait_s=120), servers))
        shared = list(range(1, 33))
        for i, server in enumerate(servers):
            _send(server, [*shared, 100 + i, 7])
            _send(server, [*shared, 110 + i, 8, 9])
        _send(servers[0], [*range(300, 332), 5])
        _send(servers[1], [*range(400, 448), 5])
        query = urllib.parse.urlencode(
            {
                "metrics": "\n".join(s.metrics_url for s in servers),
                "events": servers[0].events_endpoint,
                "replay": servers[0].replay_endpoint,
                "ranks": "2",
                "every": "2",
            }
        )
        page.goto(f"{streamlit_server}/live?{query}")
        expect(page.get_by_text("Fleet: 9 cached blocks over 2 ranks.")).to_be_visible(timeout=WAIT_MS)
        expect(
            page.get_by_text(
                "2 of 7 distinct cached blocks are held by several replicas at once "
                "(2 blocks of memory spent twice or more)"
            )
        ).to_be_visible(timeout=WAIT_MS)
        # the per-replica table (the second data frame: the first lists the ranks' streams), read from the
        # grid's accessible cells: replica, cached blocks, prefixes, also cached elsewhere, chain unknown
        table = page.locator('[data-testid="stDataFrame"]').nth(1)
        expect(table).to_be_visible()
        rows = table.locator('[role="row"]')
        expect(rows).to_have_count(3, timeout=WAIT_MS)
        expect(rows.nth(1).locator('[role="gridcell"]')).to_have_text(["rank 0", "4", "2", "2", "0"])
        expect(rows.nth(2).locator('[role="gridcell"]')).to_have_text(["rank 1", "5", "2", "2", "0"])
        assert page.locator('[data-testid="stException"]').count() == 0
        table.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "live_fleet.png"))
    finally:
        for server in servers:
            server.stop()
