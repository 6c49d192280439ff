"""Log lines a client cannot forge or flood: escaping and repeat collapsing."""

from __future__ import annotations

import io
import logging

from sandcell.logs import RepeatFilter, printable


def test_printable_escapes_controls_and_invisible_characters():
    assert printable("/healthz") == "/healthz"
    assert printable("/a\nb\r\x1b[2J\x00\u202e\u2028é") == "/a\\nb\\r\\x1b[2J\\x00\\u202e\\u2028é"


def test_repeated_warnings_collapse_into_one_line_and_a_count():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    now = [1000.0]  # the filter's clock: the window ends when the test says, whatever the load
    repeats = RepeatFilter(window_s=0.5, clock=lambda: now[0])
    handler.addFilter(repeats)
    logger = logging.getLogger("sandcell.test-repeats")
    logger.addHandler(handler)
    logger.addFilter(repeats)  # met twice per record: counted once
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        for n in range(10_000):
            logger.warning("accept failed: %s", n)
            logger.info("served %s", n)  # INFO is the access log: never dropped
        now[0] += 0.5  # the window is over
        logger.warning("accept failed: %s", "again")
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(repeats)
    lines = stream.getvalue().splitlines()
    warnings = [line for line in lines if line.startswith("accept failed")]
    assert warnings == [
        "accept failed: 0",
        "accept failed: again (9999 more like this in the last 0.5 s)",
    ]
    assert sum(line.startswith("served") for line in lines) == 10_000
