"""The shared sans-I/O core, driven by hand: retry policy, error mapping, NDJSON parsing.

These run no server: an operation is a generator of effects, so a test plays the transport.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sandcell import client
from sandcell.client import errors
from sandcell.client.config import ClientConfig, RetryPolicy
from sandcell.client.protocol import (
    NdjsonDecoder,
    OutputCollector,
    Reply,
    Request,
    Send,
    Sleep,
    call,
)
from sandcell.errors import STATUS, ErrorCode

POLICY = RetryPolicy(max_retries=3, backoff_s=0.1, max_backoff_s=1.0, max_retry_after_s=5.0)


def _error(status: int, code: str, headers: dict[str, str] | None = None) -> Reply:
    body = json.dumps({"error": {"code": code, "message": "m", "details": {"k": 1}}}).encode()
    return Reply(status, headers or {}, body)


def _ok() -> Reply:
    return Reply(200, {}, b"{}")


def _refused() -> errors.ConnectionFailedError:
    return errors.ConnectionFailedError("refused", request_sent=False)


def _broken() -> errors.ConnectionFailedError:
    return errors.ConnectionFailedError("reset", request_sent=True)


def test_every_error_code_has_its_exception_class():
    for code in ErrorCode:
        exc = errors.error_from_reply(STATUS[code], {}, _error(STATUS[code], code.value).body)
        assert exc.code == code.value
        assert exc.status == STATUS[code]
        assert exc.message == "m" and exc.details == {"k": 1}
        assert type(exc) is errors.BY_CODE[code.value], code
        assert isinstance(exc, errors.SandcellError)
    assert issubclass(errors.SandboxNotFoundError, errors.NotFoundError)
    assert issubclass(errors.FileNotFoundInSandboxError, errors.NotFoundError)
    assert not issubclass(errors.FileNotFoundInSandboxError, FileNotFoundError)
    assert issubclass(errors.AlreadyInitializedError, errors.ConflictError)


def test_replies_that_are_not_sandcell_json_map_by_status():
    exc = errors.error_from_reply(404, {}, b"<html>nope</html>")
    assert type(exc) is errors.NotFoundError and exc.code == "NOT_FOUND"
    exc = errors.error_from_reply(502, {}, b"Bad Gateway")
    assert type(exc) is errors.SandcellError and exc.code == "HTTP_502"
    assert "Bad Gateway" in exc.message
    exc = errors.error_from_reply(429, {"retry-after": "7"}, b"")
    assert isinstance(exc, errors.RateLimitedError) and exc.retry_after == 7.0


def test_retry_after_as_seconds_or_http_date():
    assert errors.parse_retry_after("3") == 3.0
    assert errors.parse_retry_after("soon") is None
    assert errors.parse_retry_after("Thu, 01 Jan 1970 00:01:40 GMT", now=90.0) == 10.0


def _drive(request: Request, outcomes: list) -> list:
    """Runs `call` against scripted outcomes; returns the effects it yielded."""
    op = call(request, POLICY)
    seen = [next(op)]
    outcomes = list(outcomes)
    while True:
        effect = seen[-1]
        try:
            if isinstance(effect, Send):
                outcome = outcomes.pop(0)
                if isinstance(outcome, Exception):
                    seen.append(op.throw(outcome))
                else:
                    seen.append(op.send(outcome))
            else:
                seen.append(op.send(None))
        except StopIteration as stop:
            seen.append(stop.value)
            return seen


def test_connect_errors_are_retried_for_every_call_even_create():
    create = Request("POST", "/v1/sandboxes", json={}, idempotent=False)
    seen = _drive(create, [_refused(), _refused(), _ok()])
    assert [type(e).__name__ for e in seen[:-1]] == ["Send", "Sleep", "Send", "Sleep", "Send"]
    assert seen[-1].status == 200
    assert 0.05 <= seen[1].seconds <= 0.1 and 0.1 <= seen[3].seconds <= 0.2  # backoff grows


def test_a_non_idempotent_call_that_may_have_run_is_never_repeated():
    exec_ = Request("POST", "/v1/sandboxes/x/exec", json={}, idempotent=False)
    with pytest.raises(errors.ConnectionFailedError):
        _drive(exec_, [_broken(), _ok()])


def test_an_idempotent_call_is_repeated_after_a_broken_connection_but_not_a_timeout():
    get = Request("GET", "/v1/sandboxes")
    assert _drive(get, [_broken(), _ok()])[-1].status == 200
    timed_out = errors.ConnectionFailedError("slow", request_sent=True, timed_out=True)
    with pytest.raises(errors.ConnectionFailedError):
        _drive(get, [timed_out, _ok()])


def test_429_and_503_are_retried_honouring_retry_after_capped():
    create = Request("POST", "/v1/sandboxes", json={}, idempotent=False)
    seen = _drive(
        create,
        [
            _error(429, "RATE_LIMITED", {"retry-after": "2"}),
            _error(503, "OVERLOADED", {"retry-after": "60"}),
            _ok(),
        ],
    )
    sleeps = [e.seconds for e in seen if isinstance(e, Sleep)]
    assert sleeps == [2.0, 5.0]  # 60 s is capped at max_retry_after_s
    assert seen[-1].status == 200


def test_retries_stop_after_max_retries_and_raise_the_last_error():
    get = Request("GET", "/v1/sandboxes")
    with pytest.raises(errors.RateLimitedError) as info:
        _drive(get, [_error(429, "RATE_LIMITED", {"retry-after": "0"})] * 4)
    assert info.value.retry_after == 0.0


def test_a_500_is_retried_only_for_idempotent_calls():
    delete = Request("DELETE", "/v1/sandboxes/x")
    assert _drive(delete, [_error(500, "INTERNAL"), Reply(204, {}, b"")])[-1].status == 204
    exec_ = Request("POST", "/v1/sandboxes/x/exec", json={}, idempotent=False)
    with pytest.raises(errors.InternalError):
        _drive(exec_, [_error(500, "INTERNAL"), _ok()])


@pytest.mark.parametrize(
    ("status", "code"),
    [(503, "ISOLATION_UNAVAILABLE"), (400, "BAD_REQUEST"), (404, "SANDBOX_NOT_FOUND")],
)
def test_errors_that_waiting_cannot_fix_are_not_retried(status: int, code: str):
    with pytest.raises(errors.BY_CODE[code]):
        _drive(Request("GET", "/x"), [_error(status, code), _ok()])


def test_ndjson_lines_split_anywhere_are_reassembled():
    lines = [
        {"type": "stdout", "data": "héllo\n"},
        {"type": "stderr", "data": "oops"},
        {"type": "progress", "data": 1},  # an event type from a newer server: skipped
        {"type": "exit", "exit_code": 3, "timed_out": False, "signal": None, "duration_s": 0.5},
    ]
    raw = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    for size in (1, 2, 7, len(raw)):
        decoder, collector, out = NdjsonDecoder(), OutputCollector(), []
        for i in range(0, len(raw), size):
            for event in decoder.feed(raw[i : i + size]):
                if (chunk := collector.add(event)) is not None:
                    out.append(chunk)
        assert decoder.close() == []
        result = collector.result()
        assert out == [("stdout", "héllo\n"), ("stderr", "oops")]
        assert (result.exit_code, result.stdout, result.stderr) == (3, "héllo\n", "oops")


def test_a_stream_cut_before_the_exit_line_is_an_error():
    collector = OutputCollector()
    collector.add({"type": "stdout", "data": "partial"})
    with pytest.raises(errors.SandboxUnreachableError):
        collector.result()
    with pytest.raises(errors.InvalidResponseError):
        NdjsonDecoder().feed(b"not json\n")


def test_config_from_arguments_then_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SANDCELL_URL", raising=False)
    monkeypatch.delenv("SANDCELL_API_KEY", raising=False)
    assert ClientConfig.resolve().url == "http://127.0.0.1:8700"
    assert ClientConfig.resolve().api_key is None
    monkeypatch.setenv("SANDCELL_URL", "http://example.test:1/")
    monkeypatch.setenv("SANDCELL_API_KEY", "sc_env")
    cfg = ClientConfig.resolve()
    assert (cfg.url, cfg.api_key) == ("http://example.test:1", "sc_env")
    cfg = ClientConfig.resolve(url="http://other:2", api_key="sc_arg")
    assert (cfg.url, cfg.api_key) == ("http://other:2", "sc_arg")
    assert "sc_arg" not in repr(cfg)
    with pytest.raises(errors.ConfigurationError):
        ClientConfig.resolve(url="127.0.0.1:8700")  # no scheme


def test_import_sandcell_stays_cheap_and_exports_the_sdk_lazily():
    code = (
        "import sys, sandcell\n"
        "assert 'httpx' not in sys.modules and 'sandcell.client' not in sys.modules\n"
        "from sandcell import Sandbox, AsyncSandbox, SandboxNotFoundError, CommandExitError\n"
        "assert Sandbox.__module__ == 'sandcell.client.sandbox'\n"
        "assert 'httpx' not in sys.modules  # only the first request needs it\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    import sandcell

    for name in client.__all__:
        if name in sandcell.__all__:
            assert getattr(sandcell, name) is getattr(client, name)
    exported = set(sandcell.__all__)
    assert {n for n in client.__all__ if n.endswith("Error")} <= exported
    assert {"Sandbox", "AsyncSandbox", "CommandResult", "SandboxInfo", "EntryInfo"} <= exported
