"""What `sandcell doctor` reports for the layers cells rely on, on this very host."""

from sandcell.isolation import landlock
from sandcell.isolation.probe import probe_host


def test_landlock_is_reported_with_the_signal_scoping_cells_need() -> None:
    report = next(r for r in probe_host() if r.layer == "landlock")
    available, detail = landlock.cell_support()
    assert report.available is available
    if available:
        assert "signal scoping" in report.detail and detail in report.detail
    else:
        assert report.detail == detail  # e.g. "signal scoping needs Landlock ABI 6, ..."


def test_seccomp_report_names_the_socket_families() -> None:
    report = next(r for r in probe_host() if r.layer == "seccomp")
    assert report.available and "unix/inet/inet6/netlink" in report.detail
