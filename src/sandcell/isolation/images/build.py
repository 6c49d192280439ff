"""Building an image: its steps in build cells, one build per digest, published whole or not
at all (SPEC §12).

A build is a job that other callers can follow: its events (`step`, `log`, then `done` or
`failed`) are kept, so a second request for the same digest, in this process, follows the
same build from its start; a build under way in another process (another replica on this
host) is waited for through the store's lock.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandcell import telemetry
from sandcell.isolation.bwrap import Bind
from sandcell.isolation.images import debian
from sandcell.isolation.images.buildcell import BUILD_UID, BuildCells, Step, StepFailed
from sandcell.isolation.images.spec import MIB, ImageSpec, digest
from sandcell.isolation.images.store import ImageMeta, ImageStore

log = logging.getLogger("sandcell.images")
IO_DIR = "/.sandcell-build"
FILES_DIR = "/.sandcell/in"
WAIT_POLL_S = 0.5
ERROR_PREFIX = "error: "
# Copies the staged sources onto their places, inside the image root (its symlinks resolve
# within the image, never to the host).
COPY_FILES = (
    "import os, shutil, sys\n"
    "for src, dest in zip(sys.argv[1::2], sys.argv[2::2]):\n"
    "    os.makedirs(os.path.dirname(dest), exist_ok=True)\n"
    "    shutil.copyfile(src, dest)\n"
    "    os.chmod(dest, 0o644)\n"
)


class BuildError(Exception):
    """A step failed; `tail` holds its last log lines."""

    def __init__(self, step: str, message: str, tail: list[str] | None = None) -> None:
        super().__init__(f"{step}: {message}")
        self.step, self.message, self.tail = step, message, tail or []

    def public(self) -> dict[str, Any]:
        return {"step": self.step, "message": self.message, "log": self.tail}


@dataclass
class BuildJob:
    """One build's events, kept for every follower."""

    template: str
    digest: str
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _then: list[Callable[[BuildJob], None]] = field(default_factory=list)

    def emit(self, event: dict[str, Any], *, last: bool = False) -> None:
        with self._cond:
            self.events.append(event)
            self.done = self.done or last
            self._cond.notify_all()
            then = list(self._then) if last else []
        for callback in then:
            callback(self)

    def when_done(self, callback: Callable[[BuildJob], None]) -> None:
        """Calls back once the build has ended (now, if it has)."""
        with self._cond:
            if not self.done:
                self._then.append(callback)
                return
        callback(self)

    def wait_events(self, start: int, timeout_s: float) -> tuple[list[dict[str, Any]], bool]:
        """Events from index `start` (waiting up to timeout_s for one), and whether the
        build has ended."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.events) > start or self.done, timeout_s)
            return self.events[start:], self.done

    def follow(self) -> Iterator[dict[str, Any]]:
        seen = 0
        while True:
            events, done = self.wait_events(seen, 1.0)
            seen += len(events)
            yield from events
            if done and seen == len(self.events):
                return


@dataclass(frozen=True)
class _Planned:
    """A step made when its turn comes (from the staging dir), and what follows it."""

    name: str
    make: Callable[[Path], Step]
    after: Callable[[Path], None] | None = None
    reports: bool = False  # sandcell's own step: its last `error:` line is the message

    def message(self, failed: StepFailed) -> str:
        """Why the step failed: for sandcell's own steps, the reason it printed (naming the
        archive's entry at fault), else how the command ended."""
        reasons = [line for line in failed.tail if line.startswith(ERROR_PREFIX)]
        if self.reports and reasons:
            return reasons[-1].removeprefix(ERROR_PREFIX)
        return str(failed)


class Builder:
    def __init__(self, store: ImageStore, cgroup_parent: str = "sandcell") -> None:
        self.store = store
        self.cells = BuildCells(cgroup_parent, store.root / "tmp")
        self._jobs: dict[str, BuildJob] = {}
        self._lock = threading.Lock()

    def job(self, digest: str) -> BuildJob | None:
        with self._lock:
            return self._jobs.get(digest)

    def start(self, template: str, spec: ImageSpec) -> BuildJob:
        """The running build of this spec's digest, or a new one in a thread."""
        image = digest(spec)
        with self._lock:
            job = self._jobs.get(image)
            if job is not None and not job.done:
                return job
            job = self._jobs[image] = BuildJob(template, image)
        threading.Thread(target=self._run, args=(job, spec), daemon=True).start()
        return job

    def _run(self, job: BuildJob, spec: ImageSpec) -> None:
        try:
            with telemetry.span("image.build", {"sandcell.template": job.template}):
                meta = self._build_once(job, spec)
        except BuildError as exc:
            self.store.record_failure(job.digest, exc.public())
            job.emit({"event": "failed", "error": exc.public()}, last=True)
        except Exception as exc:  # a bug or a host problem: reported, never a half image
            log.exception("building %s failed", job.template)
            error = BuildError("build", f"{type(exc).__name__}: {exc}")
            self.store.record_failure(job.digest, error.public())
            job.emit({"event": "failed", "error": error.public()}, last=True)
        else:
            state = self.store.state(meta.digest).public()
            job.emit({"event": "done", "image": state}, last=True)

    def _build_once(self, job: BuildJob, spec: ImageSpec) -> ImageMeta:
        """Unchanged specs are a no-op; a build under way elsewhere is waited for."""
        waiting = False
        while True:
            if (meta := self.store.meta(job.digest)) is not None:
                return meta
            with self.store.building_lock(job.digest) as mine:
                if mine:
                    if (meta := self.store.meta(job.digest)) is not None:
                        return meta
                    return self._build(job, spec)
            if not waiting:
                job.emit({"event": "log", "line": "another process is building this image"})
                waiting = True
            time.sleep(WAIT_POLL_S)

    def _build(self, job: BuildJob, spec: ImageSpec) -> ImageMeta:
        staging = self.store.staging(job.digest)
        try:
            plan = _plan(spec, staging)
            _hand_to_builder(staging)
            for index, planned in enumerate(plan, 1):
                job.emit(
                    {"event": "step", "step": planned.name, "index": index, "total": len(plan)}
                )
                step = planned.make(staging)
                try:
                    self.cells.run(step, lambda line: job.emit({"event": "log", "line": line}))
                except StepFailed as exc:
                    raise BuildError(planned.name, planned.message(exc), exc.tail) from None
                if planned.after is not None:
                    planned.after(staging)
            env, workdir = _image_config(staging, spec)
            (staging / "config.json").unlink(missing_ok=True)
            return self.store.publish(staging, job.digest, env, workdir)
        finally:
            if staging.exists():
                self.store.discard(staging)


def _plan(spec: ImageSpec, staging: Path) -> list[_Planned]:
    rootfs = staging / "rootfs"
    plan: list[_Planned] = []
    if spec.kind == "oci-archive":
        archive = spec.archive.resolve()
        if not archive.is_file():
            raise BuildError("unpack", f"no OCI archive at {archive}")
        limit = spec.max_unpacked_mb * MIB
        plan.append(_Planned("unpack", lambda s: _unpack(archive, s, limit), reports=True))
    elif spec.kind == "debian":
        base = debian.id_base()
        finish = functools.partial(debian.finish, owner=BUILD_UID)
        plan.append(_Planned("bootstrap", lambda s: debian.bootstrap(spec, s, base), finish))
    if spec.files:
        sources = [spec.source_path(src) for src in spec.files.values()]
        missing = [str(p) for p in sources if not p.is_file()]
        if missing:
            raise BuildError("files", f"missing files: {missing}")
        plan.append(_Planned("files", lambda _: _copy(spec, sources, rootfs)))
    if spec.pip:
        pip = ["python3", "-m", "pip", "install", "--no-cache-dir", "--root-user-action=ignore"]
        pip_step = Step(
            [*pip, *spec.pip], image_root=rootfs, env={"PIP_BREAK_SYSTEM_PACKAGES": "1"}
        )
        plan.append(_Planned("pip", lambda _: pip_step))
    for number, command in enumerate(spec.run, 1):
        run = Step(["/bin/sh", "-c", command], image_root=rootfs, chdir=spec.workdir or "/")
        plan.append(_Planned(f"run {number}", _made(run)))
    return plan


def _made(step: Step) -> Callable[[Path], Step]:
    """A step made already, whatever the staging dir."""
    return lambda _: step


def _unpack(archive: Path, staging: Path, max_bytes: int) -> Step:
    out = f"{IO_DIR}/out"
    command = ["python", "-s", "-B", "-m", "sandcell.isolation.images.oci"]
    command += [f"{IO_DIR}/archive", f"{out}/rootfs", f"{out}/config.json", str(max_bytes)]
    binds = [Bind(str(archive), f"{IO_DIR}/archive"), Bind(str(staging), out, writable=True)]
    return Step(command, binds)


def _copy(spec: ImageSpec, sources: list[Path], rootfs: Path) -> Step:
    binds = [Bind(str(src), f"{FILES_DIR}/{i}") for i, src in enumerate(sources)]
    pairs = [a for i, dest in enumerate(spec.files) for a in (f"{FILES_DIR}/{i}", dest)]
    return Step(["python", "-c", COPY_FILES, *pairs], binds, image_root=rootfs)


def _hand_to_builder(staging: Path) -> None:
    """The build uid writes the staging directory (and nothing else on the host)."""
    if os.geteuid() == 0:
        for path in (staging, staging / "rootfs"):
            os.chown(path, BUILD_UID, BUILD_UID)


def _image_config(staging: Path, spec: ImageSpec) -> tuple[dict[str, str], str]:
    """The OCI config's env and workdir (written by the build cell: checked, not trusted)."""
    try:
        raw = json.loads((staging / "config.json").read_text())
    except (OSError, ValueError):
        raw = {}
    env = raw.get("env") if isinstance(raw, dict) else None
    env = {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    workdir = raw.get("workdir") if isinstance(raw, dict) else ""
    return env, spec.workdir or (workdir if isinstance(workdir, str) else "")
