"""Figures of SPEC §9, each beside a same-run local baseline: a background start until its
first output byte, and the round trip of one keystroke through a WebSocket terminal."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

from websockets.sync.client import ClientConnection, connect

from bench.figures import Row, Server, row
from bench.stats import sample_ms

# Raw mode without echo: a keystroke reaches `cat`, which writes it back (an application's
# round trip, not the line discipline's echo).
RAW_CAT = "stty raw -echo; exec cat"
SETTLE_S = 0.5


def background_first_byte(server: Server, n: int) -> list[Row]:
    def local() -> None:
        proc = subprocess.Popen(["echo", "x"], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.read(1)
        proc.wait()

    base = row("local Popen(['echo']) -> first output byte", sample_ms(local, n))
    sandbox_id = server.create()
    base_path = f"/v1/sandboxes/{sandbox_id}/processes"

    def remote() -> None:
        r = server.http.post(base_path, json={"command": ["echo", "x"]})
        r.raise_for_status()
        url = f"{base_path}/{r.json()['pid']}/output"
        with server.http.stream("GET", url, params={"follow": "true"}) as out:
            for line in out.iter_lines():
                if '"data_b64"' in line:
                    return

    routed = row("background start -> first output byte (router)", sample_ms(remote, n), base)
    server.delete(sandbox_id)
    return [base, routed]


def keystroke_round_trips(server: Server, n: int) -> list[Row]:
    with _local_raw_cat() as master:

        def local() -> None:
            os.write(master, b"x")
            os.read(master, 1)

        base = row("keystroke round trip, local pty (raw cat)", sample_ms(local, n))
    sandbox_id = server.create()
    with _remote_raw_cat(server, sandbox_id) as ws:

        def remote() -> None:
            ws.send(b"x")
            ws.recv(timeout=10)

        routed = row(
            "keystroke round trip, WebSocket via router (raw cat)", sample_ms(remote, n), base
        )
    server.delete(sandbox_id)
    return [base, routed]


@contextlib.contextmanager
def _local_raw_cat() -> Iterator[int]:
    master, slave = os.openpty()
    proc = subprocess.Popen(
        ["/bin/sh", "-c", RAW_CAT], stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    try:
        subprocess.run(["sleep", str(SETTLE_S)], check=True)
        yield master
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


@contextlib.contextmanager
def _remote_raw_cat(server: Server, sandbox_id: str) -> Iterator[ClientConnection]:
    path = f"/v1/sandboxes/{sandbox_id}/processes"
    r = server.http.post(path, json={"command": RAW_CAT, "pty": {"cols": 80, "rows": 24}})
    r.raise_for_status()
    url = "ws" + server.srv.url.removeprefix("http") + f"{path}/{r.json()['pid']}/ws"
    headers = {"authorization": f"Bearer {server.key}"}
    with connect(url, additional_headers=headers, compression=None) as ws:
        subprocess.run(["sleep", str(SETTLE_S)], check=True)
        with contextlib.suppress(TimeoutError):
            while True:  # whatever came before raw mode
                ws.recv(timeout=0.2)
        yield ws
