"""The shapes a run produces, in-process: whatever a kernel sends, the API gets valid JSON."""

from __future__ import annotations

import json

from sandcell.daemon.code.bash_kernel import BashLanguage
from sandcell.daemon.code.results import MAX_RESULT_BYTES, RunOutput, error_event, result_bundle
from sandcell.http.ndjson import line


def test_bundles_keep_known_types_as_strings():
    bundle = result_bundle(
        {"text/plain": 3, "image/png": "QUJD", "application/json": {"k": [1]}, "x/evil": "no"}
    )
    assert bundle == {"text/plain": "3", "image/png": "QUJD", "application/json": {"k": [1]}}
    assert result_bundle(["not", "a", "dict"]) == {}
    assert result_bundle(None) == {}


def test_lone_surrogates_and_control_bytes_stay_valid_json():
    events: list[dict] = []
    out = RunOutput(events.append, max_output_bytes=100)
    out.result({"text/plain": "\ud800 lone \x00 nul"}, is_main=True)
    out.fail(error_event("\udcff", b"bytes", None))
    out.output("stdout", b"\xff\xfe half \xe2\x82", final=True)
    for event in events:
        encoded = line(event)
        assert encoded.isascii() and encoded.endswith(b"\n") and encoded.count(b"\n") == 1
        json.loads(encoded)
        encoded.decode().encode("utf-8")  # no lone surrogate survives as such
    assert "\ud800" not in events[0]["text/plain"]


def test_output_is_capped_and_results_have_a_budget():
    out = RunOutput(None, max_output_bytes=10)
    out.output("stdout", b"0123456789abcdef")
    assert out.text["stdout"] == ["0123456789"] and out.streams["stdout"].truncated
    big = "x" * (MAX_RESULT_BYTES // 2)
    for _ in range(3):
        out.result({"text/plain": big}, is_main=False)
    assert len(out.results) == 1 and out.results_truncated
    reply = out.reply(out.summary(1, False))
    assert reply["results_truncated"] and reply["stdout_truncated"]


def test_reply_lines_split_on_newlines_only():
    out = RunOutput(None, max_output_bytes=100)
    for chunk in (b"a\rb", b"\x0cc\nd", b"e\n", b"tail"):
        out.output("stdout", chunk)
    assert out.reply(out.summary(None, False))["stdout"] == ["a\rb\x0cc\n", "de\n", "tail"]


def test_a_timeout_rewrites_the_interrupt_only():
    out = RunOutput(None, max_output_bytes=10)
    out.interrupted = "the run exceeded its timeout of 1 s"
    out.fail(error_event("KeyboardInterrupt", "", "Traceback ... KeyboardInterrupt"))
    assert out.error["name"] == "TimeoutError" and "keeps its state" in out.error["value"]
    assert out.error["traceback"] == "Traceback ... KeyboardInterrupt"


def test_bash_frames_count_lines_as_bash_reads_them():
    frame = BashLanguage().frame(7, "echo a\rb\necho 'x\x0cy'\n", {"K": "v w"})
    header, _, text = frame.decode().partition("\n")
    assert header == f"7 {text.count(chr(10))}"
    first = text.splitlines()[0]
    assert first.startswith("K='v w' . /dev/fd/9 9<<'__sandcell_") and first.endswith("</dev/null")
