"""The console in a real browser (SPEC §19): headless Chromium against a real `sandcell
serve`, through the page's own forms and terminal. The screenshots in docs/console/ are
written by these tests."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from support.server import RunningServer

from .conftest import SCREENSHOTS
from .pages import sign_in, wait_for_line

HOSTILE = {
    "script": "<script>window.__pwned = 'script'</script>",
    "img": "<img src=x onerror=\"window.__pwned = 'img'\">",
    "ansi": "\x1b[31mred\x1b[0m",
}


def _shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


@pytest.mark.slow
def test_sign_in_terminal_resize_files_delete_sign_out(page: Page, alice: str) -> None:
    page.goto("/ui/")
    expect(page.locator("#sign-in-page")).to_be_visible()
    _shot(page, "sign-in")
    sign_in(page, alice)
    expect(page.locator("#who")).to_have_text("alice")

    page.click("#create button[type=submit]")
    row = page.locator("#sandboxes tr").first
    expect(row.locator(".state")).to_have_text("running")
    sandbox_id = row.get_attribute("data-id")
    assert sandbox_id
    _shot(page, "sandboxes")

    row.locator("a").click()
    expect(page.locator("#sandbox-id")).to_have_text(sandbox_id)
    terminal = page.locator("#terminal")
    expect(terminal).to_have_attribute("data-attached", "true")
    page.locator(".xterm").click()
    page.keyboard.type("echo hi\n")
    wait_for_line(page, "hi")
    _shot(page, "sandbox")

    # A smaller window: the terminal refits, the pty follows, and the shell sees the new size.
    before = terminal.get_attribute("data-size")
    page.set_viewport_size({"width": 700, "height": 600})
    expect(terminal).not_to_have_attribute("data-size", before or "")
    cols, rows = (terminal.get_attribute("data-size") or "").split("x")
    page.keyboard.type("stty size\n")
    wait_for_line(page, f"{rows} {cols}")

    # A file up and back down, byte for byte; its hostile name is shown as text.
    payload = bytes(range(256)) * 64
    page.set_input_files(
        "#upload input[type=file]",
        files=[
            {
                "name": HOSTILE["img"] + ".bin",
                "mimeType": "application/octet-stream",
                "buffer": payload,
            }
        ],
    )
    page.click("#upload button[type=submit]")
    link = page.locator("#files a", has_text="onerror")
    expect(link).to_have_text(HOSTILE["img"] + ".bin")
    with page.expect_download() as download:
        link.click()
    assert download.value.path().read_bytes() == payload
    assert page.evaluate("window.__pwned === undefined")

    page.click("#delete")
    expect(page.locator("#list-page")).to_be_visible()
    expect(page.locator(f'#sandboxes tr[data-id="{sandbox_id}"]')).to_have_count(0)

    # Signed in, the browser's own navigation to the API is still not let in.
    api_page = page.context.new_page()
    assert api_page.goto("/v1/sandboxes").status == 403
    api_page.close()

    page.click("#sign-out")
    expect(page.locator("#sign-in-page")).to_be_visible()
    status = page.evaluate("fetch('/v1/sandboxes').then(r => r.status)")
    assert status == 401


def test_second_principal_sees_none_of_the_first(
    page: Page, server: RunningServer, alice: str, bob: str
) -> None:
    with server.client(alice) as api:
        alices = api.post("/v1/sandboxes", json={"metadata": {"owner": "alice"}}).json()["id"]
    try:
        sign_in(page, bob)
        expect(page.locator("#empty")).to_be_visible()
        assert page.locator(f'#sandboxes tr[data-id="{alices}"]').count() == 0
        status = page.evaluate(f"fetch('/v1/sandboxes/{alices}').then(r => r.status)")
        assert status == 404
        page.goto(f"/ui/#/sandbox/{alices}")
        expect(page.locator("#error")).to_contain_text("SANDBOX_NOT_FOUND")
        expect(page.locator("#terminal .xterm")).to_have_count(0)
    finally:
        with server.client(alice) as api:
            api.delete(f"/v1/sandboxes/{alices}")


def test_sandbox_metadata_renders_inert(page: Page, server: RunningServer, alice: str) -> None:
    with server.client(alice) as api:
        made = api.post("/v1/sandboxes", json={"metadata": HOSTILE})
        assert made.status_code == 201, made.text
        sandbox_id = made.json()["id"]
    try:
        sign_in(page, alice)
        meta = page.locator(f'#sandboxes tr[data-id="{sandbox_id}"] td.meta')
        expect(meta).to_contain_text("<script>window.__pwned")
        expect(meta).to_contain_text('img=<img src=x onerror="window.__pwned')
        expect(meta).to_contain_text("ansi=\u241b[31mred\u241b[0m")  # ESC shown, not obeyed
        assert page.locator("#sandboxes img, #sandboxes script").count() == 0
        assert page.evaluate("window.__pwned === undefined")
    finally:
        with server.client(alice) as api:
            api.delete(f"/v1/sandboxes/{sandbox_id}")


def test_follow_a_background_processs_log(page: Page, server: RunningServer, alice: str) -> None:
    # Its first lines are in the buffer when the log opens; the rest come live, once the
    # test drops a file named `go` in the workspace.
    script = (
        "for i in 1 2 3; do echo line-$i; done; while [ ! -e go ]; do sleep 0.05; done;"
        " printf '%s\\033[2J\\n' \"$1\"; echo oops >&2; exit 3"
    )
    with server.client(alice) as api:
        sandbox_id = api.post("/v1/sandboxes", json={}).json()["id"]
        started = api.post(
            f"/v1/sandboxes/{sandbox_id}/processes",
            json={"command": ["sh", "-c", script, "sh", HOSTILE["img"]]},
        )
        assert started.status_code == 201, started.text
        pid = started.json()["pid"]
    try:
        sign_in(page, alice)
        page.goto(f"/ui/#/sandbox/{sandbox_id}")
        page.locator(f'#processes tr[data-pid="{pid}"] button.log').click()
        log = page.locator("#log")
        expect(log).to_contain_text("line-3")
        with server.client(alice) as api:
            assert api.put(f"/v1/sandboxes/{sandbox_id}/files?path=go").status_code == 200
        expect(log).to_have_attribute("data-exited", "true", timeout=10_000)
        text = log.inner_text()
        assert "line-1\nline-2\nline-3\n" in text
        assert HOSTILE["img"] + "\u241b[2J" in text  # markup and escapes shown, not obeyed
        assert "oops" in text and "[exited with 3]" in text
        assert page.evaluate("window.__pwned === undefined")
    finally:
        with server.client(alice) as api:
            api.delete(f"/v1/sandboxes/{sandbox_id}")


def test_pause_and_resume_from_the_list(page: Page, server: RunningServer, alice: str) -> None:
    with server.client(alice) as api:
        sandbox_id = api.post("/v1/sandboxes", json={}).json()["id"]
    try:
        sign_in(page, alice)
        row = page.locator(f'#sandboxes tr[data-id="{sandbox_id}"]')
        row.locator("button.pause").click()
        expect(row.locator(".state")).to_have_text("paused", timeout=30_000)
        row.locator("button.resume").click()
        expect(row.locator(".state")).to_have_text("running", timeout=30_000)
    finally:
        with server.client(alice) as api:
            api.delete(f"/v1/sandboxes/{sandbox_id}")


def test_every_console_response_carries_the_policy(server: RunningServer) -> None:
    with server.client() as c:
        for path in ("/ui/", "/ui/static/console.js", "/ui/static/vendor/xterm.mjs", "/ui/session"):
            r = c.get(path)
            csp = r.headers.get("content-security-policy", "")
            assert re.search(r"default-src 'self'", csp), (path, r.headers)
            assert "frame-ancestors 'none'" in csp
            assert "unsafe-inline" not in csp
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "no-referrer"
            assert r.headers["x-frame-options"] == "DENY"
