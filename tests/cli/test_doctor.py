"""`sandcell doctor` on this host: every layer enforced and a real trial cell."""

import subprocess
import sys
from pathlib import Path


def test_doctor_reports_every_layer_and_runs_a_cell():
    sandcell = Path(sys.executable).with_name("sandcell")
    done = subprocess.run(
        [str(sandcell), "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for layer in (
        "namespaces",
        "identity",
        "seccomp",
        "landlock",
        "cgroups",
        "disk_quota",
        "rlimits",
    ):
        line = next(x for x in done.stdout.splitlines() if f" {layer} " in x)
        assert " ok " in line, line
    assert "trial cell: a default cell started" in done.stdout
    assert not Path("/sys/fs/cgroup/pids/sandcell-doctor").exists()
