"""PicoD timeouts are Go durations (the SDK sends "30s"); older clients send seconds."""

import pytest

from sandcell.compat.agentcube.picod import DEFAULT_TIMEOUT_S, go_duration_s
from sandcell.errors import ServiceError


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30s", 30),
        ("2.5s", 2.5),
        ("1m30s", 90),
        ("500ms", 0.5),
        ("1h", 3600),
        (7, 7),
        (None, DEFAULT_TIMEOUT_S),
        ("", DEFAULT_TIMEOUT_S),
    ],
)
def test_durations(value, seconds):
    assert go_duration_s(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["soon", "-1s", "1", "s", "1s ", "0s", 0, "25h", 10**9])
def test_bad_durations_are_refused(value):
    with pytest.raises(ServiceError):
        go_duration_s(value)
