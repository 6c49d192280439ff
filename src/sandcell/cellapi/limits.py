"""The limits and timeouts of the host↔cell contract, defined once: the daemon enforces
them, the router's hop and the SDK wait for them (SPEC §2.2, §10)."""

from __future__ import annotations

import json
import math

MAX_TIMEOUT_S = 86_400  # the longest `timeout_s` an exec or code run may ask for
EXEC_TIMEOUT_S = 60.0  # an exec's default `timeout_s`
CODE_TIMEOUT_S = 300.0  # a code run's default `timeout_s`
MAX_JSON_BODY = 8 * 1_048_576  # the daemon's JSON request bodies
# A timed call's answer may take its own timeout plus this: the daemon kills the command at
# its timeout, then drains its pipes and answers.
ANSWER_MARGIN_S = 30.0
# Other calls: how long the daemon may take to answer (an upload to a slow disk, a listing).
DEFAULT_ANSWER_S = 120.0
# What the SDK waits past the hop's margin, so the router's own timeout answers first.
CLIENT_MARGIN_S = 15.0

# Daemon paths whose body carries its own `timeout_s`, and its default.
TIMED = {"/v1/exec": EXEC_TIMEOUT_S, "/v1/code/run": CODE_TIMEOUT_S}


def answer_within_s(target: str, body: bytes | None) -> float | None:
    """How long the daemon may take to answer `target`: a timed call's own timeout plus the
    margin, None (no limit) for following a process's output, else the default. The body is
    the caller's and not validated yet: anything odd falls back to the default timeout (the
    daemon answers it with a 400)."""
    path = target.partition("?")[0]
    if path.startswith("/v1/processes/") and path.endswith("/output"):
        return None  # following a process's output may stay quiet for as long as it runs
    default = TIMED.get(path)
    if default is None:
        return DEFAULT_ANSWER_S
    timeout = default
    if body:
        try:
            timeout = float(json.loads(body).get("timeout_s", default))
        except (ValueError, AttributeError, TypeError, RecursionError):
            timeout = default
    if not math.isfinite(timeout):
        timeout = default
    return min(max(timeout, 0.0), MAX_TIMEOUT_S) + ANSWER_MARGIN_S
