"""E2B's paths on sandcell (SPEC §14.2): /home/user is the workspace for the files API and for
every command, commands start there with HOME=/home/user, and the files API reaches the cell's
private /tmp, confined there as in the workspace. Driven by the unmodified e2b SDK."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path

import httpx
import pytest
from e2b import FilesystemEventType, FileType, Sandbox
from e2b.exceptions import SandboxException

from sandcell.cellapi.environment import FIXED_PATH
from support.server import RunningServer

pytestmark = pytest.mark.slow


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_commands_start_in_home_user(sbx: Sandbox) -> None:
    run = sbx.commands.run('pwd; echo "$HOME"; cd ~ && pwd')
    assert run.stdout.split() == ["/home/user", "/home/user", "/home/user"]


def test_a_login_shell_keeps_the_path_and_forks_nothing(sbx: Sandbox) -> None:
    """E2B runs every command as `bash -l -c`: the cell's /etc/profile keeps sandcell's PATH
    (Debian's would reset it) and forks nothing (Debian's runs `id -u`, 1.5 ms a command).
    Pids in the cell's PID namespace are sequential, so what a login shell forks before its
    command shows as a gap between two `sh`s."""
    assert sbx.commands.run('echo "$PATH"').stdout.strip() == FIXED_PATH
    pids = sbx.commands.run("sh -c 'echo $$'; bash -l -c \"sh -c 'echo \\$\\$'; :\"; :")
    first, second = map(int, pids.stdout.split())
    assert second - first == 2  # the login shell itself, then its `sh`: nothing between


def test_a_file_written_by_the_api_is_there_for_commands(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/f", "from the files API")
    assert sbx.commands.run("cat /home/user/f").stdout == "from the files API"
    assert sbx.commands.run("cat f").stdout == "from the files API"  # relative to the home
    assert sbx.commands.run("cat /workspace/f").stdout == "from the files API"  # one directory
    sbx.commands.run("mkdir -p /home/user/made && echo by-a-command > /home/user/made/g")
    assert sbx.files.read("/home/user/made/g") == "by-a-command\n"
    assert sbx.files.read("made/g") == "by-a-command\n"
    assert sbx.commands.run("pwd", cwd="/home/user/made").stdout.strip() == "/home/user/made"


def test_agno_style_listing_of_home(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/listed.txt", "x")
    entries = {e.name: e for e in sbx.files.list("/home/user")}
    assert entries["listed.txt"].path == "/home/user/listed.txt"
    assert entries["listed.txt"].type == FileType.FILE


def test_hydrate_a_workspace_from_a_tar_in_tmp(sbx: Sandbox) -> None:
    """openai-agents' hydrate_workspace: the tar goes to /tmp, a command unpacks it."""
    sbx.files.write("/tmp/x.tar", _tar({"proj/a.txt": b"alpha", "proj/b/c.txt": b"gamma"}))
    assert sbx.files.get_info("/tmp/x.tar").path == "/tmp/x.tar"
    sbx.commands.run("tar -xf /tmp/x.tar -C /home/user")
    assert sbx.files.read("/home/user/proj/a.txt") == "alpha"
    assert sbx.files.read("/home/user/proj/b/c.txt") == "gamma"


def test_tmp_through_the_files_api(sbx: Sandbox) -> None:
    sbx.commands.run("mkdir -p /tmp/work/sub && printf hi > /tmp/work/from-a-command")
    assert sbx.files.read("/tmp/work/from-a-command") == "hi"
    sbx.files.write("/tmp/work/sub/from-the-api", "there")
    assert sbx.commands.run("cat /tmp/work/sub/from-the-api").stdout == "there"
    names = {e.path for e in sbx.files.list("/tmp/work", depth=2)}
    assert names == {"/tmp/work/from-a-command", "/tmp/work/sub", "/tmp/work/sub/from-the-api"}
    assert sbx.files.get_info("/tmp/work/sub").type == FileType.DIR
    assert sbx.files.make_dir("/tmp/work/new")
    sbx.files.rename("/tmp/work/from-a-command", "/tmp/work/renamed")
    assert sbx.files.exists("/tmp/work/renamed")
    sbx.files.remove("/tmp/work")
    assert not sbx.files.exists("/tmp/work")
    assert sbx.commands.run("test ! -e /tmp/work && echo gone").stdout == "gone\n"


def test_watch_a_directory_in_tmp(sbx: Sandbox) -> None:
    sbx.files.make_dir("/tmp/watched")
    handle = sbx.files.watch_dir("/tmp/watched")
    sbx.commands.run("echo x > /tmp/watched/made")
    assert ("made", FilesystemEventType.CREATE) in {
        (e.name, e.type) for e in handle.get_new_events()
    }
    handle.stop()


def test_a_move_between_home_and_tmp_says_why_it_cannot(sbx: Sandbox) -> None:
    sbx.files.write("/tmp/mover", "m")
    with pytest.raises(SandboxException, match="a move stays within /tmp"):
        sbx.files.rename("/tmp/mover", "/home/user/mover")
    assert sbx.files.read("/tmp/mover") == "m"


def test_the_cells_tmp_is_its_own(sbx: Sandbox, e2b_server: RunningServer) -> None:
    """Not the host's /tmp, and not another sandbox's."""
    marker = f"sandcell-host-{uuid.uuid4().hex}"
    host_file = Path("/tmp") / marker
    host_file.write_text("host")
    try:
        assert not sbx.files.exists(f"/tmp/{marker}")
        assert sbx.commands.run(f"test -e /tmp/{marker} || echo absent").stdout == "absent\n"
        sbx.files.write(f"/tmp/{marker}-cell", "cell")
        assert not (Path("/tmp") / f"{marker}-cell").exists()
        other = Sandbox.create(timeout=60)
        try:
            assert not other.files.exists(f"/tmp/{marker}-cell")
        finally:
            other.kill()
    finally:
        host_file.unlink()


@pytest.mark.parametrize(
    "path",
    [
        "/tmp/../etc/passwd",
        "/tmp/../../etc/hostname",
        "/home/user/../../etc/passwd",
        "/etc/passwd",
        "//etc/passwd",
    ],
)
def test_dot_segments_lead_to_the_cells_root_read_only(sbx: Sandbox, path: str) -> None:
    """Out of /tmp or the home by `..` is the cell's own root (test_cell_root.py): read as a
    command reads it, never written."""
    assert sbx.files.read(path) == sbx.commands.run(f"cat {path}").stdout
    with pytest.raises(SandboxException, match="read-only"):
        sbx.files.write(path, "x")


def test_symlinks_in_tmp_do_not_lead_out(sbx: Sandbox, e2b_server: RunningServer) -> None:
    """Links made by a command in /tmp, to the cell's /etc, its root, /proc and host paths:
    the files API does not follow them out of /tmp, reading, writing, listing or removing."""
    host = str(e2b_server.data_dir)
    sbx.commands.run(
        "ln -sfn /etc /tmp/etc-link && ln -sfn / /tmp/root-link"
        " && ln -sfn /proc/1/root /tmp/proc-link && ln -sfn /home/user /tmp/home-link"
        f" && ln -sfn {host} /tmp/host-link && ln -sfn ../etc/passwd /tmp/dotdot-link"
    )
    for link in ("etc-link", "root-link", "proc-link", "host-link", "home-link"):
        with pytest.raises(SandboxException, match="outside"):
            sbx.files.list(f"/tmp/{link}")
        with pytest.raises(SandboxException, match="outside"):
            sbx.files.read(f"/tmp/{link}/passwd")
        with pytest.raises(SandboxException, match="outside"):
            sbx.files.write(f"/tmp/{link}/planted", "x")
        with pytest.raises(SandboxException, match="outside"):
            sbx.files.remove(f"/tmp/{link}/hostname")
    with pytest.raises(SandboxException, match="outside"):
        sbx.files.read("/tmp/dotdot-link")
    with pytest.raises(SandboxException, match="outside"):
        sbx.files.write("/tmp/etc-link", "replace the link's target")  # not followed
    assert sbx.commands.run("test ! -e /home/user/planted && echo ok").stdout == "ok\n"
    # The link itself is the cell's own: described and removed as a link, never its target.
    info = sbx.files.get_info("/tmp/etc-link")
    assert info.type == FileType.FILE or info.symlink_target == "/etc"
    sbx.files.remove("/tmp/etc-link")
    assert sbx.commands.run("test -d /etc && test ! -e /tmp/etc-link && echo ok").stdout == "ok\n"


def test_v1_still_reaches_the_workspace_alone(
    sbx: Sandbox, e2b_server: RunningServer, e2b_env: dict[str, str]
) -> None:
    """SPEC §2.4: sandcell's own files API of the same sandbox does not reach /tmp, nor the
    façade's cell-wide table through the /v1 relay."""
    sbx.files.write("/tmp/v1-probe", "scratch")
    sbx.files.write("/home/user/v1-probe", "workspace")
    base = f"{e2b_server.url}/v1/sandboxes/{sbx.sandbox_id}"
    headers = {"authorization": f"Bearer {e2b_env['E2B_API_KEY']}"}
    with httpx.Client(headers=headers, timeout=10) as client:
        assert client.get(f"{base}/files", params={"path": "v1-probe"}).text == "workspace"
        assert client.get(f"{base}/files", params={"path": "/tmp/v1-probe"}).status_code == 403
        for sneaky in ("../cell/files", "..%2Fcell%2Ffiles", "%2E%2E/cell/files"):
            answer = client.get(f"{base}/{sneaky}", params={"path": "/tmp/v1-probe"})
            assert answer.status_code in (400, 403, 404), (sneaky, answer.status_code)
            assert "scratch" not in answer.text


def test_code_contexts_start_in_home_user() -> None:
    """e2b-code-interpreter's default context and a new one, as E2B's: in /home/user."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sandbox = CodeSandbox.create(template="base", timeout=120)
    try:
        ran = sandbox.run_code("import os; print(os.getcwd(), os.path.expanduser('~'))")
        assert "".join(ran.logs.stdout) == "/home/user /home/user\n"
        context = sandbox.create_code_context()
        assert context.cwd == "/home/user"
        again = sandbox.run_code("import os; print(os.getcwd())", context=context)
        assert "".join(again.logs.stdout) == "/home/user\n"
    finally:
        sandbox.kill()
