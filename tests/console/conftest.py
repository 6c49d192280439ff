"""One real `sandcell serve` for the console's tests, and one headless Chromium (Debian's,
driven by Playwright) a module; each test gets a fresh browser context, so no cookie
carries over."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from sdk.helpers import served
from support.server import RunningServer

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("console"), warm_pool=1)


@pytest.fixture(scope="package")
def alice(server: RunningServer) -> str:
    return server.create_key("alice")


@pytest.fixture(scope="package")
def bob(server: RunningServer) -> str:
    return server.create_key("bob")


# Per module: Playwright's sync API keeps an event loop running while it is open, which the
# async (anyio) tests of this package could not run beside.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def context(browser: Browser, server: RunningServer) -> Iterator[BrowserContext]:
    ctx = browser.new_context(base_url=server.url, viewport={"width": 1100, "height": 760})
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    page = context.new_page()
    page.set_default_timeout(15_000)
    return page
