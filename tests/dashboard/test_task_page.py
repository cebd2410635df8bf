"""The dashboard's task page: `/api/task/{id}` (details and story, 404 and 400 for unknown
and malformed ids) and `/task/{id}` in a real headless Chromium, reached by the link in the
task list, rendering every value as text."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
from playwright.async_api import expect
from starlette.testclient import TestClient

from snerd.core.timefmt import format_rfc3339
from tests.dashboard.test_dashboard import (
    XSS_ERROR,
    XSS_ID,
    Server,
    append,
    browser_page,
    hand_made_queue,
    task,
    wall_us,
)
from tests.dashboard.test_dashboard import client as client  # the fixture

SECOND = 1_000_000
#: Where the page's screenshot is written when set (to look at it).
SCREENSHOT = os.environ.get("SNERD_TASK_PAGE_PNG")


def claim(epoch: int, node: str) -> dict[str, Any]:
    return {"snerdKind": "claim", "epoch": epoch, "node": node, "at": format_rfc3339(wall_us())}


def dispatch(task_id: str, attempt: int, epoch: int, node: str) -> dict[str, Any]:
    return {
        "snerdKind": "dispatch", "task": task_id, "attempt": attempt,
        "at": format_rfc3339(wall_us()), "snerdNode": node, "snerdEpoch": epoch,
    }


def run_twice(q: Path, task_id: str = "twice-1", error: str = "SMTP 451") -> None:
    """A task whose first attempt failed, whose second ran on n1, then again on n2 after n2
    took the shard over; n1's late success is fenced; n2's counts."""
    retry_at = format_rfc3339(wall_us() + SECOND)
    for fields in (
        claim(1, "host-a@pid-1-aaaaaa"),
        task(task_id, 10, snerdEpoch=1, snerdNode="host-a@pid-1-aaaaaa"),
        dispatch(task_id, 1, 1, "host-a@pid-1-aaaaaa"),
        task(task_id, 10, retryCount=1, retryAfterTime=retry_at, LastErrorObj=error,
             snerdEpoch=1, snerdNode="host-a@pid-1-aaaaaa"),
        dispatch(task_id, 2, 1, "host-a@pid-1-aaaaaa"),
        claim(2, "host-b@pid-2-bbbbbb"),
        dispatch(task_id, 2, 2, "host-b@pid-2-bbbbbb"),
        task(task_id, 10, retryCount=1, deletedAt=format_rfc3339(wall_us()),
             snerdOutcome="completed", snerdEpoch=1, snerdNode="host-a@pid-1-aaaaaa"),
        task(task_id, 10, retryCount=1, deletedAt=format_rfc3339(wall_us()),
             snerdOutcome="completed", snerdResult={"sent": 1}, snerdEpoch=2,
             snerdNode="host-b@pid-2-bbbbbb"),
    ):
        append(q, fields)


def test_the_api_serves_a_tasks_details_and_story(client: tuple[TestClient, Path]) -> None:
    c, q = client
    run_twice(q)
    r = c.get("/api/task/twice-1")
    assert r.status_code == 200
    report = r.json()
    assert (report["state"], report["attempts"], report["runs"]) == ("succeeded", 2, 3)
    assert report["result"] == {"sent": 1} and report["stale_records"] == 1
    assert [s["kind"] for s in report["story"]] == [
        "enqueued", "dispatched", "retry_scheduled", "dispatched", "claimed", "dispatched",
        "completed", "completed",
    ]
    assert "taskData" not in r.text and "task_data" not in r.text


def test_an_id_with_a_slash_and_odd_characters_is_found(client: tuple[TestClient, Path]) -> None:
    c, q = client
    odd = "a/b c?d#é"
    append(q, task(odd, 20))
    report = c.get(f"/api/task/{quote(odd, safe='')}").json()
    assert (report["task_id"], report["state"], report["shard"]) == (odd, "queued", 0)


def test_an_unknown_id_is_a_404_and_a_malformed_one_a_400(client: tuple[TestClient, Path]) -> None:
    c, _ = client
    r = c.get("/api/task/nope")
    assert r.status_code == 404
    assert r.json()["found"] is False and "no task 'nope'" in r.json()["error"]
    r = c.get("/api/task/")
    assert r.status_code == 400 and "task id" in r.json()["error"]
    r = c.get("/api/task/" + "x" * 2000)
    assert r.status_code == 400 and "bytes" in r.json()["error"]
    page = c.get("/task/nope")
    assert page.status_code == 200 and "task.js" in page.text  # the page says "no task"
    assert c.get("/task.js").status_code == 200


async def _the_task_page(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path, dead_id=XSS_ID, error=XSS_ERROR)
    run_twice(q, error=XSS_ERROR)
    with Server(q) as server:
        async with browser_page() as page:
            await page.goto(server.url)
            await page.wait_for_selector('body[data-source="ws"]')
            # The list links each id to its page.
            await page.locator("#tasks a.task-link", has_text="twice-1").click()
            await page.wait_for_selector('body[data-state="succeeded"]')
            assert page.url.endswith("/task/twice-1")
            await expect(page.locator('#details tr[data-key="attempts"] td')).to_have_text("2")
            await expect(page.locator('#details tr[data-key="runs"] td')).to_have_text("3")
            await expect(page.locator('#details tr[data-key="result"] td')).to_have_text(
                '{"sent":1}'
            )
            rows = page.locator("#story tbody tr")
            await expect(rows).to_have_count(8)
            await expect(page.locator("#story tr.stale")).to_have_count(1)
            await expect(page.locator('#story tr[data-kind="claimed"]')).to_have_count(1)
            await expect(page.locator("#story tbody td", has_text="runs twice")).to_have_count(1)
            # The hostile error is text: no element made of it, its script never ran.
            await expect(page.locator("#story tbody td", has_text=XSS_ERROR)).to_have_count(1)
            assert await page.locator("main img, main script").count() == 0
            assert await page.title() == "snerd task twice-1"
            if SCREENSHOT:
                await page.screenshot(path=SCREENSHOT, full_page=True)
            # The dead letter with the hostile id links to its page, which finds it.
            await page.goto(server.url)
            await page.locator("#dead a.task-link").click()
            await page.wait_for_selector('body[data-state="dead_letter"]')
            await expect(page.locator("#task-title")).to_have_text(f"task {XSS_ID}")
            assert await page.locator("main img, header img").count() == 0
            # An unknown id says so.
            await page.goto(server.url + "task/nope")
            await page.wait_for_selector('body[data-state="unknown"]')
            await expect(page.locator("#error")).to_contain_text('No task "nope"')
        assert server.stop() == 0


def test_the_task_page_in_chromium(tmp_path: Path) -> None:
    anyio.run(_the_task_page, tmp_path, backend="asyncio")
