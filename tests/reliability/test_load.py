"""Load through the router: 50 sandboxes, 20 concurrent clients, 2,000 execs (issue 8).

Every exec prints its sandbox's id (a file written at creation) and a token unique to the
request, and sends that token as its request id: a result is correct only if it came from the
right sandbox, for the right request, over the right response.
"""

from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from reliability.harness import cells_of, config, latency_summary, rss_bytes, wait_for

SANDBOXES = 50
CLIENTS = 20
EXECS = 2_000
# Python rarely hands freed memory back to the system: "back to baseline" allows this much.
RSS_SLACK_BYTES = 16 * 1024 * 1024


def _exec_body(i: int, token: str) -> dict:
    """Three shapes: a shell string, an argv with env, and stdin."""
    if i % 3 == 0:
        return {"command": f"cat whoami && echo {token}", "timeout_s": 30}
    if i % 3 == 1:
        script = 'cat whoami && printf "%s\\n" "$TOKEN"'
        return {"command": ["/bin/sh", "-c", script], "env": {"TOKEN": token}, "timeout_s": 30}
    return {"command": "cat whoami && cat", "stdin": f"{token}\n", "timeout_s": 30}


def _lifecycle(c: httpx.Client, execs: int) -> str:
    sbx = c.post("/v1/sandboxes", json={})
    assert sbx.status_code == 201, sbx.text
    sid = sbx.json()["id"]
    for i in range(execs):
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["echo", str(i)]})
        assert r.status_code == 200 and r.json()["stdout"] == f"{i}\n", r.text
    return sid


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fifty_sandboxes_twenty_clients_two_thousand_execs(fleet, figures):
    server = fleet.start("load", config_text=config(max_sandboxes_per_key=SANDBOXES + 10))
    key = server.create_key("load")
    local = threading.local()
    opened: list[httpx.Client] = []

    def client() -> httpx.Client:
        """One keep-alive client per worker thread."""
        if not hasattr(local, "c"):
            local.c = server.client(key, timeout=60)
            opened.append(local.c)
        return local.c

    # Warm up every code path once, then take the baseline with no sandbox left.
    with server.client(key) as c:
        for sid in [_lifecycle(c, 20) for _ in range(2)]:
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
    wait_for(lambda: not cells_of(server.data_dir), 15, "the warm-up cells to go")
    baseline = rss_bytes(server.proc.pid)

    clients = ThreadPoolExecutor(CLIENTS, thread_name_prefix="load")
    try:

        def create(n: int) -> str:
            r = client().post("/v1/sandboxes", json={"metadata": {"n": str(n)}})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            put = client().put(f"/v1/sandboxes/{sid}/files", params={"path": "whoami"}, content=sid)
            assert put.status_code == 200, put.text
            return sid

        started = time.monotonic()
        ids = list(clients.map(create, range(SANDBOXES)))
        create_s = time.monotonic() - started
        assert len(set(ids)) == SANDBOXES
        peak_sandboxes = rss_bytes(server.proc.pid)

        def run(i: int) -> tuple[float, str | None]:
            sid, token = ids[i % SANDBOXES], f"{i:04d}-{secrets.token_hex(8)}"
            began = time.perf_counter()
            try:
                r = client().post(
                    f"/v1/sandboxes/{sid}/exec",
                    json=_exec_body(i, token),
                    headers={"x-request-id": token},
                )
            except httpx.HTTPError as exc:
                return time.perf_counter() - began, f"#{i}: {exc!r}"
            elapsed = time.perf_counter() - began
            if r.status_code != 200:
                return elapsed, f"#{i}: {r.status_code} {r.text[:200]}"
            body = r.json()
            expected = f"{sid}{token}\n"
            if (body["stdout"], body["exit_code"], body["stderr"]) != (expected, 0, ""):
                return elapsed, f"#{i}: got {body!r}, expected stdout {expected!r}"
            if r.headers.get("x-request-id") != token:
                return elapsed, f"#{i}: answered as request {r.headers.get('x-request-id')}"
            return elapsed, None

        started = time.monotonic()
        results = list(clients.map(run, range(EXECS)))
        exec_s = time.monotonic() - started
        peak_load = rss_bytes(server.proc.pid)
        errors = [e for _, e in results if e]
        latencies = [t for t, _ in results]

        # Every sandbox is still there, once, and nothing else.
        listed = client().get("/v1/sandboxes").json()["sandboxes"]
        assert sorted(s["id"] for s in listed) == sorted(ids)

        def delete(sid: str) -> int:
            return client().delete(f"/v1/sandboxes/{sid}").status_code

        assert set(clients.map(delete, ids)) == {204}
    finally:
        clients.shutdown(wait=True)
    assert client().get("/v1/sandboxes").json()["sandboxes"] == []
    for c in opened:
        c.close()
    wait_for(lambda: not cells_of(server.data_dir), 30, "every cell to be destroyed")
    time.sleep(1)
    after = rss_bytes(server.proc.pid)

    mib = 1024 * 1024
    figures["load"] = {
        "sandboxes": SANDBOXES,
        "clients": CLIENTS,
        "execs": EXECS,
        "errors": len(errors),
        "create_all_s": round(create_s, 2),
        "exec_all_s": round(exec_s, 2),
        "execs_per_s": round(EXECS / exec_s, 1),
        **latency_summary(latencies),
        "rss_baseline_mib": round(baseline / mib, 1),
        "rss_with_50_sandboxes_mib": round(peak_sandboxes / mib, 1),
        "rss_after_load_mib": round(peak_load / mib, 1),
        "rss_after_delete_mib": round(after / mib, 1),
    }
    assert errors == [], f"{len(errors)} failed execs, first: {errors[:5]}"
    assert after <= baseline + RSS_SLACK_BYTES, figures["load"]
