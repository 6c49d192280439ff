"""Code contexts (SPEC §10): the table, and each context's process through its lifecycle.

A context owns at most one kernel process at a time, started when a run first needs it (a
context costs nothing until used: tens of MB once IPython runs), and runs one request at a
time (others wait their turn). A run that outlives its timeout is interrupted (its state
kept); if the interrupt does not end it within `INTERRUPT_GRACE_S`, or the process dies during
a run, the process is killed, the run's error says the state is lost, and the next run starts
a fresh one. Every process is a child of the daemon inside the cell, so it counts against the
cell's memory and pids and dies with the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from sandcell.daemon.code.bash_kernel import BashLanguage
from sandcell.daemon.code.js_kernel import JavaScriptLanguage
from sandcell.daemon.code.kernel import Kernel, KernelDied, Language, Tracker
from sandcell.daemon.code.python_kernel import PythonLanguage
from sandcell.daemon.code.results import RunOutput, error_event, timeout_error
from sandcell.errors import ErrorCode, ServiceError

# Short names that clients (e2b-code-interpreter among them) use for languages.
ALIASES = {"js": "javascript", "ts": "typescript"}
INTERRUPT_GRACE_S = 2.0
START_TIMEOUT_S = 60.0
MAX_CONTEXTS = 16

EnvFactory = Callable[[], dict[str, str]]


class Context:
    def __init__(
        self,
        context_id: str,
        language: Language,
        cwd: str,
        env: EnvFactory,
        tracker: Tracker,
    ) -> None:
        self.id = context_id
        self.language = language
        self.cwd = cwd
        self._env = env
        self._tracker = tracker
        self._kernel: Kernel | None = None
        self._booting: asyncio.Future[Kernel] | None = None
        self._lock = asyncio.Lock()
        self._abandoned: asyncio.Future[Any] | None = None  # a run whose client went away
        self._run_ids = itertools.count(1)
        self._stopped_by: str | None = None
        self._ended_idle = ""  # how the process ended between runs, for the next run to say

    def view(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language.name, "cwd": self.cwd}

    # -- the process -----------------------------------------------------------------------

    async def _launch(self) -> Kernel:
        try:
            kernel = Kernel.spawn(self.language, self.cwd, self._env(), self._tracker)
        except OSError as exc:
            raise ServiceError(
                ErrorCode.OVERLOADED,
                f"could not start the {self.language.name} context's process: {exc.strerror}",
            ) from None
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await kernel.ready
        except (KernelDied, TimeoutError):
            kernel.kill()
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                self.language.start_failure(kernel.stderr_tail),
                {"context_id": self.id, "language": self.language.name},
            ) from None
        except BaseException:
            kernel.kill()
            raise
        return kernel

    async def _started(self) -> Kernel:
        """The context's process, started when first needed (once, however many wait)."""
        if self._kernel is not None and not self._kernel.dead:
            return self._kernel
        if self._kernel is not None:  # it ended between runs (a run's end is reported by it)
            self._ended_idle = self._kernel.why_dead
        self._drop_kernel()
        if self._booting is None:
            self._booting = asyncio.ensure_future(self._launch())
        booting = self._booting
        try:
            self._kernel = await asyncio.shield(booting)
        finally:
            if booting.done() and self._booting is booting:
                self._booting = None
        return self._kernel

    def _drop_kernel(self) -> None:
        if self._kernel is not None:
            self._kernel.kill()
            self._kernel = None

    def restart(self) -> None:
        """Fresh state: the process (and a run in it) is killed; the next run starts anew."""
        self._stopped_by = "the context was restarted"
        self._drop_kernel()
        self._abandoned = None

    def close(self) -> None:
        self._stopped_by = "the context was deleted"
        self._drop_kernel()
        if self._booting is not None:
            self._booting.add_done_callback(_kill_result)
            self._booting = None

    # -- runs ------------------------------------------------------------------------------

    def frame(self, code: str, env: Mapping[str, str]) -> tuple[int, bytes]:
        """A request for the process (checked now: a bad one is a 400, not a failed run)."""
        run_id = next(self._run_ids)
        return run_id, self.language.frame(run_id, code, env)

    async def prepare(self) -> None:
        """Starts the process if there is none (a start failure is the caller's 4xx)."""
        await self._started()

    async def run(
        self, frame: tuple[int, bytes], timeout_s: float, output: RunOutput
    ) -> dict[str, Any]:
        async with self._lock:
            await self._settle_abandoned()
            kernel = await self._started()
            if self._ended_idle:
                note = (
                    f"sandcell: the {self.language.name} context's process ended since the last "
                    f"run ({self._ended_idle}); this run starts a fresh one: earlier state is "
                    "lost\n"
                )
                output.output("stderr", note.encode())
                self._ended_idle = ""
            self._stopped_by = None
            submitted = asyncio.ensure_future(kernel.submit(*frame, output))
            try:
                return await self._outcome(kernel, submitted, timeout_s, output)
            except asyncio.CancelledError:
                # The client went away: stop the run, keep the state; the next run waits
                # for it to end (or restarts the process if it will not).
                kernel.interrupt()
                self._abandoned = submitted
                raise

    async def _outcome(
        self,
        kernel: Kernel,
        submitted: asyncio.Future[Any],
        timeout_s: float,
        output: RunOutput,
    ) -> dict[str, Any]:
        timed_out = False
        try:
            try:
                done = await asyncio.wait_for(asyncio.shield(submitted), timeout_s)
            except TimeoutError:
                timed_out = True
                output.interrupted = f"the run exceeded its timeout of {timeout_s:g} s"
                kernel.interrupt()
                done = await asyncio.wait_for(submitted, INTERRUPT_GRACE_S)
        except TimeoutError:
            self._replace(kernel)
            output.fail(
                error_event(
                    "TimeoutError",
                    f"the run exceeded its timeout of {timeout_s:g} s and did not stop within "
                    f"{INTERRUPT_GRACE_S:g} s of the interrupt: the context was restarted and "
                    "its state is lost",
                )
            )
            return output.summary(None, True)
        except KernelDied:
            self._died(kernel, output)
            return output.summary(None, timed_out)
        if output.interrupted is not None and output.error is None:
            output.fail(timeout_error(output.interrupted))  # it ended as the interrupt came
        return output.summary(self.language.finish(done, output), timed_out)

    def _died(self, kernel: Kernel, output: RunOutput) -> None:
        if self._stopped_by is not None:
            output.fail(error_event("ContextRestarted", f"{self._stopped_by} during this run"))
            return
        why = kernel.why_dead
        self._replace(kernel)
        output.fail(
            error_event(
                "ContextRestarted",
                f"the {self.language.name} context's process ended during this run ({why}); "
                "the context was restarted and its state is lost",
            )
        )

    def _replace(self, kernel: Kernel) -> None:
        """Kills `kernel`: the next run starts a fresh process."""
        kernel.kill()
        if self._kernel is kernel:
            self._kernel = None

    async def _settle_abandoned(self) -> None:
        abandoned, self._abandoned = self._abandoned, None
        if abandoned is None or abandoned.done() or self._kernel is None:
            return
        try:
            await asyncio.wait_for(abandoned, INTERRUPT_GRACE_S)
        except (TimeoutError, KernelDied):
            self._drop_kernel()


def _kill_result(future: asyncio.Future[Kernel]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().kill()


class Contexts:
    """The daemon's contexts by id, plus one default context per language."""

    def __init__(self, python: str, env: EnvFactory, tracker: Tracker) -> None:
        self._languages: dict[str, Language] = {
            "python": PythonLanguage(python),
            "bash": BashLanguage(),
            "javascript": JavaScriptLanguage("javascript"),
            "typescript": JavaScriptLanguage("typescript"),
        }
        self._env = env
        self._tracker = tracker
        self._contexts: dict[str, Context] = {}
        self._defaults: dict[str, str] = {}

    def language(self, name: str) -> Language:
        """The language a request names (or its short name), if this sandbox can run it."""
        language = self._languages.get(ALIASES.get(name, name))
        if language is None:
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"unknown language {name!r}; known: {sorted(self._languages)}",
                {"field": "language"},
            )
        language.check()
        return language

    def create(self, language: str, cwd: str) -> Context:
        """A new context in `cwd` (an absolute, checked directory); its process starts later."""
        lang = self.language(language)
        if len(self._contexts) >= MAX_CONTEXTS:
            raise ServiceError(
                ErrorCode.RATE_LIMITED,
                f"at most {MAX_CONTEXTS} contexts at once: delete one first",
                {"limit": MAX_CONTEXTS},
            )
        context = Context(f"ctx-{secrets.token_hex(8)}", lang, cwd, self._env, self._tracker)
        self._contexts[context.id] = context
        return context

    def get(self, context_id: str) -> Context:
        if context_id not in self._contexts:
            raise ServiceError(
                ErrorCode.NOT_FOUND,
                f"no code context {context_id!r}",
                {"context_id": context_id},
            )
        return self._contexts[context_id]

    def for_run(self, language: str | None, context_id: str | None, cwd: str) -> Context:
        """The context a run asks for: by id, else the language's default (made on first use)."""
        if context_id is not None:
            context = self.get(context_id)
            if language is not None and ALIASES.get(language, language) != context.language.name:
                raise ServiceError(
                    ErrorCode.BAD_REQUEST,
                    f"context {context_id} runs {context.language.name}, not {language}",
                    {"field": "language"},
                )
            return context
        name = self.language(language or "python").name
        default = self._defaults.get(name)
        if default in self._contexts:
            return self._contexts[default]
        context = self.create(name, cwd)
        self._defaults[name] = context.id
        return context

    def list(self) -> list[dict[str, str]]:
        return [c.view() for c in self._contexts.values()]

    def remove(self, context_id: str) -> None:
        self.get(context_id).close()
        del self._contexts[context_id]

    def close_all(self) -> None:
        for context in self._contexts.values():
            with contextlib.suppress(Exception):
                context.close()
        self._contexts.clear()
