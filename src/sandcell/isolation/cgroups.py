"""Per-cell cgroups: limits, accounting and a reliable kill, on cgroup v2 or v1 (SPEC §3).

A cell's cgroup is what lets us bound its memory, processes and CPU and, when the sandbox is
deleted, kill every process it ever started (a fork bomb included) instead of only a leader.
Cells live under a parent group placed under *this* process's own cgroup in every hierarchy,
so that whoever accounts the daemon by its cgroup also accounts its cells.

A controller the host lacks raises ``CgroupUnavailable`` naming it: limits are never
silently skipped (fail closed).
"""

import abc
import contextlib
import errno
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

REQUIRED_CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000
_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
_POLL_S = 0.01


@dataclass(frozen=True)
class Limits:
    """Resource limits of one cell."""

    memory_mb: int
    pids_max: int
    cpus: float

    def __post_init__(self) -> None:
        if self.memory_mb <= 0 or self.pids_max <= 0 or self.cpus <= 0:
            raise ValueError(f"limits must be positive: {self}")

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * 1024 * 1024

    @property
    def cpu_quota_us(self) -> int:
        return max(1000, round(self.cpus * _CPU_PERIOD_US))  # the kernel's minimum is 1 ms


class CgroupUnavailable(Exception):
    """A controller (or the cgroup layer itself) this host cannot provide; ``missing`` names it."""

    def __init__(self, missing: Iterable[str], detail: str) -> None:
        self.missing = tuple(missing)
        super().__init__(f"cgroup {', '.join(self.missing)} unavailable: {detail}")


def _check_name(name: str) -> str:
    """Names become path components: letters, digits, ``_`` and ``-`` only (no ``/``, ``.``)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"invalid cgroup name {name!r}: use 1-128 of [A-Za-z0-9_-]")
    return name


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _keyed(path: str) -> dict[str, int]:
    """Parse a flat-keyed cgroup file (``key value`` per line)."""
    return {key: int(value) for key, value in (line.split() for line in _read(path).splitlines())}


def _wait_until(done: Callable[[], bool], timeout_s: float, poll_s: float = _POLL_S) -> None:
    """Poll ``done`` for at most ``timeout_s``; the caller goes on either way."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(poll_s)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _own_dir(fstype: str, controller: str | None) -> str | None:
    """This process's cgroup directory in the hierarchy of ``controller`` (None: cgroup2)."""
    own: dict[str | None, str] = {}
    for line in _read("/proc/self/cgroup").splitlines():
        hier_id, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if hier_id != "0" else [None]:
            own[name] = path
    own_path = own.get(controller)
    if own_path is None:
        return None
    path = own_path
    for line in _read("/proc/self/mountinfo").splitlines():
        fields, _, fs_fields = line.partition(" - ")
        root, mountpoint = (_unescape(f) for f in fields.split()[3:5])
        mount_fstype, _, super_opts = fs_fields.split()[:3]
        if mount_fstype != fstype or (controller and controller not in super_opts.split(",")):
            continue
        if root == "/":
            return mountpoint + path.rstrip("/")
        if path == root or path.startswith(root + "/"):
            return mountpoint + path[len(root) :]
    return None


class CellCgroup(abc.ABC):
    """One cell's cgroup directories (one per hierarchy) and what can be done with them."""

    def __init__(self, name: str, dirs: Iterable[str]) -> None:
        self.name = name
        self.dirs = list(dict.fromkeys(dirs))

    @property
    def procs_files(self) -> list[str]:
        """Every ``cgroup.procs`` a launcher must write the cell's first pid into."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(FileNotFoundError):
                found.update(int(pid) for pid in _read(procs).split())
        return found

    def kill(self) -> None:
        """SIGKILL every process in the cell, forks included, without waiting for the exits:
        none of them runs user code again (a deletion answers here, `destroy` waits later)."""
        with contextlib.suppress(FileNotFoundError):  # removed already: nothing left
            self._kill_everything()

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process in the cell, forks included, and wait until it is empty."""
        deadline = time.monotonic() + timeout_s
        while self.pids():
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell {self.name}: processes survive SIGKILL: {self.pids()}")
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile: nothing left
                self._kill_everything()
            time.sleep(_POLL_S)

    def destroy(self, timeout_s: float = 5.0) -> None:
        """Kill everything, then remove the cell's directory in every hierarchy (idempotent)."""
        self.kill_all(timeout_s)
        deadline = time.monotonic() + timeout_s
        for d in self.dirs:
            while True:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    break
                except OSError as exc:  # EBUSY while the last exits are accounted
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(_POLL_S)
                else:
                    break

    @contextlib.contextmanager
    def frozen(self, timeout_s: float = 2.0) -> Iterator[bool]:
        """Every process of the cell stopped while the block runs (they cannot tell), then
        thawed; yields whether the freeze took (a v1 host may have no freezer hierarchy)."""
        took = self._freeze(True, timeout_s)
        try:
            yield took
        finally:
            self._freeze(False, timeout_s)

    def thaw(self) -> None:
        """Undoes a freeze a crash left in place (idempotent)."""
        with contextlib.suppress(FileNotFoundError):
            self._freeze(False, 1.0)

    @abc.abstractmethod
    def _freeze(self, on: bool, timeout_s: float) -> bool:
        """Freeze or thaw; when freezing, wait until it took. False: no freezer here."""

    @abc.abstractmethod
    def oom_kills(self) -> int:
        """How many of the cell's processes the OOM killer has killed."""

    @abc.abstractmethod
    def memory_peak_bytes(self) -> int:
        """The highest memory usage the cell has reached."""

    @abc.abstractmethod
    def _kill_everything(self) -> None:
        """SIGKILL every process in the cell, with no window for a fork to escape."""


class CgroupDriver(abc.ABC):
    """Creates, finds and lists the cells under one parent group."""

    version: int

    def __init__(self, parent: str) -> None:
        self.parent = _check_name(parent)

    @property
    @abc.abstractmethod
    def parent_dirs(self) -> list[str]:
        """Where cells live: the parent group's directory in every hierarchy used."""

    @abc.abstractmethod
    def create(self, name: str, limits: Limits) -> CellCgroup:
        """Create a fresh cell with its limits written; a failure leaves nothing behind."""

    @abc.abstractmethod
    def open(self, name: str) -> CellCgroup | None:
        """The existing cell ``name`` (e.g. to reconcile after a restart), or None."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for ``sandcell doctor``: version, controllers and where cells live."""

    def list_names(self) -> list[str]:
        names: set[str] = set()
        for parent in self.parent_dirs:
            with contextlib.suppress(FileNotFoundError):
                names.update(e.name for e in os.scandir(parent) if e.is_dir())
        return sorted(names)

    def destroy_all(self, timeout_s: float = 5.0) -> None:
        """Destroy every cell, then the parent group itself (shutdown, tests, uninstall)."""
        for name in self.list_names():
            cell = self.open(name)
            if cell is not None:
                cell.destroy(timeout_s)
        for parent in self.parent_dirs:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(parent)

    def _mkdirs(self, dirs: list[str], configure: Callable[[], None]) -> None:
        """Create the cell's directories and run ``configure``, undoing all on failure.

        A hierarchy we may not write to (no root, an undelegated or read-only cgroupfs) is
        the cgroups layer being unavailable, never a bare OSError.
        """
        if any(os.path.exists(d) for d in dirs):
            raise FileExistsError(f"cgroup cell already exists: {dirs}")
        created: list[str] = []
        try:
            for parent in self.parent_dirs:
                os.makedirs(parent, exist_ok=True)
            for d in dirs:
                os.mkdir(d)
                created.append(d)
            configure()
        except BaseException as exc:
            for d in reversed(created):
                os.rmdir(d)
            if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
                raise CgroupUnavailable(REQUIRED_CONTROLLERS, f"cannot set up: {exc}") from exc
            raise


class _V1Cell(CellCgroup):
    def __init__(self, name: str, dirs: dict[str, str]) -> None:
        super().__init__(name, dirs.values())
        self._memory = dirs["memory"]
        self._freezer = dirs.get("freezer")

    def oom_kills(self) -> int:
        return _keyed(os.path.join(self._memory, "memory.oom_control"))["oom_kill"]

    def memory_peak_bytes(self) -> int:
        return int(_read(os.path.join(self._memory, "memory.max_usage_in_bytes")))

    def _freeze(self, on: bool, timeout_s: float) -> bool:
        if not self._freezer:
            return False
        state = os.path.join(self._freezer, "freezer.state")
        _write(state, "FROZEN" if on else "THAWED")
        if not on:
            return True
        _wait_until(lambda: _read(state).strip() == "FROZEN", timeout_s)
        return _read(state).strip() == "FROZEN"  # FREEZING: a task in uninterruptible sleep

    def _kill_everything(self) -> None:
        """v1 has no cgroup.kill: freeze, list and kill, thaw (so that the killed can exit).

        Frozen, nothing can fork between listing and killing, and no listed process can exit
        and have its pid recycled.  Without a freezer hierarchy kill_all's loop still
        converges, as pids.max bounds the forks.
        """
        state = os.path.join(self._freezer, "freezer.state") if self._freezer else None
        if state:
            _write(state, "FROZEN")
            # Tasks in uninterruptible sleep can hold it at FREEZING: kill the rest anyway.
            # A freeze mostly takes under a millisecond: a deletion answers after this one.
            _wait_until(lambda: _read(state).strip() == "FROZEN", 1.0, poll_s=0.001)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if state:
            _write(state, "THAWED")


class CgroupV1Driver(CgroupDriver):
    """One hierarchy per controller (memory, pids, cpu; freezer when mounted, for kill_all)."""

    version = 1

    def __init__(self, parent: str = "sandcell") -> None:
        super().__init__(parent)
        self._own: dict[str, str] = {}
        for controller in (*REQUIRED_CONTROLLERS, "freezer"):
            own = _own_dir("cgroup", controller)
            if own is not None:
                self._own[controller] = own
        missing = [c for c in REQUIRED_CONTROLLERS if c not in self._own]
        if missing:
            raise CgroupUnavailable(missing, "not mounted as cgroup v1 hierarchies")

    @property
    def parent_dirs(self) -> list[str]:
        return list(dict.fromkeys(os.path.join(own, self.parent) for own in self._own.values()))

    def _dirs(self, name: str) -> dict[str, str]:
        return {
            c: os.path.join(own, self.parent, _check_name(name)) for c, own in self._own.items()
        }

    def create(self, name: str, limits: Limits) -> CellCgroup:
        dirs = self._dirs(name)

        def configure() -> None:
            memory = dirs["memory"]
            _write(os.path.join(memory, "memory.limit_in_bytes"), str(limits.memory_bytes))
            memsw = os.path.join(memory, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):  # absent when swap accounting is off (describe() tells)
                _write(memsw, str(limits.memory_bytes))
            _write(os.path.join(dirs["pids"], "pids.max"), str(limits.pids_max))
            _write(os.path.join(dirs["cpu"], "cpu.cfs_period_us"), str(_CPU_PERIOD_US))
            _write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), str(limits.cpu_quota_us))

        self._mkdirs(list(dict.fromkeys(dirs.values())), configure)
        return _V1Cell(name, dirs)

    def open(self, name: str) -> CellCgroup | None:
        dirs = self._dirs(name)
        return _V1Cell(name, dirs) if any(map(os.path.isdir, dirs.values())) else None

    def describe(self) -> str:
        memsw = os.path.exists(os.path.join(self._own["memory"], "memory.memsw.limit_in_bytes"))
        controllers = ", ".join(
            c + ("+memsw" if c == "memory" and memsw else "") for c in self._own
        )
        return f"cgroup v1 ({controllers}); cells under {', '.join(self.parent_dirs)}"


class _V2Cell(CellCgroup):
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name, [path])
        self._path = path

    def oom_kills(self) -> int:
        return _keyed(os.path.join(self._path, "memory.events"))["oom_kill"]

    def memory_peak_bytes(self) -> int:
        return int(_read(os.path.join(self._path, "memory.peak")))

    def _freeze(self, on: bool, timeout_s: float) -> bool:
        _write(os.path.join(self._path, "cgroup.freeze"), "1" if on else "0")
        if not on:
            return True
        events = os.path.join(self._path, "cgroup.events")
        _wait_until(lambda: _keyed(events).get("frozen") == 1, timeout_s)
        return _keyed(events).get("frozen") == 1

    def _kill_everything(self) -> None:
        """One write makes the kernel kill the whole subtree, new forks included."""
        _write(os.path.join(self._path, "cgroup.kill"), "1")


class CgroupV2Driver(CgroupDriver):
    """The unified hierarchy; needs memory, pids and cpu available to this process's cgroup."""

    version = 2

    def __init__(self, parent: str = "sandcell") -> None:
        super().__init__(parent)
        own = _own_dir("cgroup2", None)
        if own is None:
            raise CgroupUnavailable(["cgroup2"], "no cgroup2 hierarchy holds this process")
        self._own = own

    @property
    def parent_dirs(self) -> list[str]:
        return [os.path.join(self._own, self.parent)]

    def missing_controllers(self) -> list[str]:
        available = _read(os.path.join(self._own, "cgroup.controllers")).split()
        return [c for c in REQUIRED_CONTROLLERS if c not in available]

    def create(self, name: str, limits: Limits) -> CellCgroup:
        path = os.path.join(self.parent_dirs[0], _check_name(name))
        missing = self.missing_controllers()
        if missing:
            raise CgroupUnavailable(missing, f"not in {self._own}/cgroup.controllers")
        enable = " ".join("+" + c for c in REQUIRED_CONTROLLERS)
        try:
            _write(os.path.join(self._own, "cgroup.subtree_control"), enable)
            os.makedirs(self.parent_dirs[0], exist_ok=True)
            _write(os.path.join(self.parent_dirs[0], "cgroup.subtree_control"), enable)
        except OSError as exc:  # EBUSY: our own cgroup holds processes (no delegated subtree)
            raise CgroupUnavailable(REQUIRED_CONTROLLERS, f"cannot enable them: {exc}") from exc

        def configure() -> None:
            if not os.path.exists(os.path.join(path, "cgroup.kill")):
                raise CgroupUnavailable(["cgroup.kill"], "needs Linux >= 5.14 to kill a cell")
            _write(os.path.join(path, "memory.max"), str(limits.memory_bytes))
            swap = os.path.join(path, "memory.swap.max")
            if os.path.exists(swap):  # absent when the kernel does not account swap
                _write(swap, "0")
            _write(os.path.join(path, "pids.max"), str(limits.pids_max))
            _write(os.path.join(path, "cpu.max"), f"{limits.cpu_quota_us} {_CPU_PERIOD_US}")

        self._mkdirs([path], configure)
        return _V2Cell(name, path)

    def open(self, name: str) -> CellCgroup | None:
        path = os.path.join(self.parent_dirs[0], _check_name(name))
        return _V2Cell(name, path) if os.path.isdir(path) else None

    def describe(self) -> str:
        available = _read(os.path.join(self._own, "cgroup.controllers")).split()
        return (
            f"cgroup v2 (controllers: {', '.join(available) or 'none'}); "
            f"cells under {self.parent_dirs[0]}"
        )


def detect(parent: str = "sandcell") -> CgroupDriver:
    """The v2 driver when the unified hierarchy has our controllers, else v1, else raise."""
    try:
        v2 = CgroupV2Driver(parent)
        v2_missing = v2.missing_controllers()
        if not v2_missing:
            return v2
        v2_problem = f"cgroup v2 lacks {', '.join(v2_missing)}"
    except CgroupUnavailable as exc:
        v2_problem = str(exc)
    try:
        return CgroupV1Driver(parent)
    except CgroupUnavailable as exc:
        raise CgroupUnavailable(exc.missing, f"{exc}; and {v2_problem}") from exc
