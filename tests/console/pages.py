"""What the console tests do with a page: sign in, read the terminal."""

from __future__ import annotations

import time

from playwright.sync_api import Page, expect


def sign_in(page: Page, key: str) -> None:
    page.goto("/ui/")
    page.fill("#sign-in input[name=api_key]", key)
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#list-page")).to_be_visible()


def terminal_lines(page: Page) -> list[str]:
    return [line.rstrip() for line in page.locator(".xterm-rows").inner_text().splitlines()]


def wait_for_line(page: Page, wanted: str, timeout_s: float = 15) -> list[str]:
    """Polls the terminal's screen until a line reads `wanted` exactly."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = terminal_lines(page)
        if wanted in lines:
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"no line {wanted!r} on the terminal: {lines}")
        page.wait_for_timeout(50)
