"""E2B's own SDK tests, unmodified, against a real `sandcell serve`: a measurement, not CI.

E2B's test files cannot be vendored, and CI reaches only PyPI and npm, so this is run by hand
(pytest never collects it: no `test_` name). Get the tests first, from a clone of
github.com/e2b-dev/E2B at the commit to judge:

    git -C E2B archive <commit> packages/python-sdk packages/js-sdk | tar -x -C /tmp/e2b-upstream

then, from the repository root:

    .venv/bin/python tests/compat/e2b/upstream/run.py --upstream /tmp/e2b-upstream [--python]
        [--js] [-k EXPR] [--work DIR]

It starts `sandcell serve` on a free loopback port with a data dir of its own, makes a key,
sets docs/e2b.md's three variables, and runs
- the Python SDK's sandbox tests (tests/{sync,async}/{sandbox,api}_*) with their own conftest
  and pytest.ini, in a venv of pinned test dependencies, against the SDK source beside them;
- the JS SDK's tests/sandbox and tests/api with vitest, against the SDK source beside them,
  in a directory of pinned npm packages, except the files that mock E2B's API with msw
  (they test the SDK alone, and fail as unhandled requests once pointed at a server).
  Upstream's vitest.config.mts also defines a browser project (playwright); a config
  holding only its `unit` project's node settings replaces it.
Templates, volumes and secrets (E2B's build service and stores) are not run. Results: junit
XML and summary.md under --work, one line per area and every failure with its first message
line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "tests"))

from compat.e2b.venvs import hex_key, make_venv  # noqa: E402
from sdk.helpers import stop_and_clean  # noqa: E402
from support.server import start_server  # noqa: E402

# The Python SDK's test dependencies, at the versions of its uv.lock.
PY_REQUIREMENTS = [
    "pytest==9.1.1",
    "pytest-asyncio==1.4.0",
    "pytest-timeout==2.4.0",
    "pytest-dotenv==0.5.2",
    "python-dotenv==1.2.2",
]
PY_PATHS = ["tests/sync/sandbox_sync", "tests/async/sandbox_async"]
PY_PATHS += ["tests/sync/api_sync", "tests/async/api_async"]
# The JS SDK's dependencies and test runner, at the versions of E2B's pnpm-lock.yaml.
JS_PACKAGES = {
    "@bufbuild/protobuf": "2.12.1",
    "@connectrpc/connect": "2.1.2",
    "@connectrpc/connect-web": "2.1.2",
    "chalk": "5.3.0",
    "compare-versions": "6.1.1",
    "dockerfile-ast": "0.7.1",
    "glob": "13.0.6",
    "openapi-fetch": "0.14.1",
    "platform": "1.3.6",
    "tar": "7.5.21",
    "undici": "7.29.0",
    "vitest": "4.1.10",
    "msw": "2.12.14",
    "error-stack-parser-es": "2.0.1",
    "@types/node": "20.19.43",
}
JS_PATHS = ["tests/sandbox", "tests/api"]
# Upstream's `unit` project, node only.
VITEST_CONFIG = """import { defineConfig } from 'vitest/config'
export default defineConfig({ test: {
  include: ['tests/**/*.test.ts'],
  exclude: ['tests/runtimes/**', 'tests/template/**', 'tests/connectionConfig.test.ts'],
  isolate: true, globals: false, testTimeout: 30_000, environment: 'node', bail: 0,
  setupFiles: ['tests/globalFetchFallback.setup.ts'], deps: { interopDefault: true },
} })
"""
# Roomier than the suite's small template: upstream writes and reads files of some MiB.
SERVER_CONFIG = """
[templates.default]
memory_mb = 512
pids_max = 256
disk_mb = 512
warm_pool = 2
"""

# Where a test file's name says what it exercises; first match wins.
AREAS = [
    ("templates", ("template",)),
    ("git", ("/git/",)),
    ("pty", ("pty",)),
    ("commands", ("command", "cmd", "sendstdin", "envvars", "killedduringrun")),
    ("files", ("/files/", "signing")),
    ("metrics", ("metrics",)),
    ("snapshots", ("snapshot", "fork")),
    ("network", ("network", "internet", "egress", "host", "urls")),
    ("sandbox lifecycle", ("",)),
]


def area_of(path: str) -> str:
    flat = path.lower().replace("_", "")
    return next(name for name, words in AREAS if any(w.replace("_", "") in flat for w in words))


@dataclass
class Outcome:
    suite: str
    test: str
    file: str
    status: str  # passed, failed, skipped
    message: str


def read_junit(suite: str, xml: Path, base: Path) -> list[Outcome]:
    out = []
    for case in ET.parse(xml).iter("testcase"):
        # pytest's classname is dotted (tests.sync....test_x), vitest's is the file's path.
        classname = case.get("classname", "")
        file = case.get("file") or (classname if suite == "js" else classname.replace(".", "/"))
        name = f"{file}::{case.get('name')}"
        status, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                status = "skipped" if tag == "skipped" else "failed"
                text = node.get("message") or node.text or ""
                message = text.strip().splitlines()[0][:240] if text.strip() else tag
                break
        out.append(Outcome(suite, name, file, status, message))
    return out


def run_python(upstream: Path, work: Path, env: dict[str, str], select: str | None) -> Path:
    sdk = upstream / "packages" / "python-sdk"
    venv = work / "py-venv"
    if not (venv / "installed").exists():
        shutil.rmtree(venv, ignore_errors=True)
        # The SDK's own dependencies come from its release; its source beside the tests runs.
        version = _toml_version(sdk / "pyproject.toml")
        make_venv(venv, [f"e2b=={version}", *PY_REQUIREMENTS])
        (venv / "installed").write_text("\n".join(PY_REQUIREMENTS))
    xml = work / "python.xml"
    args = [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    args += ["-o", "junit_family=xunit1", f"--junitxml={xml}", *PY_PATHS]
    args += ["-k", select] if select else []
    # `python -m` puts the SDK's directory first on sys.path: its source is what runs.
    subprocess.run(args, cwd=sdk, env=env, check=False)
    return xml


def _toml_version(pyproject: Path) -> str:
    import tomllib

    return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def run_js(upstream: Path, work: Path, env: dict[str, str], select: str | None) -> Path:
    sdk = upstream / "packages" / "js-sdk"
    js = work / "js"
    js.mkdir(parents=True, exist_ok=True)
    for name in ("src", "tests", "tsconfig.json", "package.json"):
        target = js / name
        if target.is_symlink() or target.exists():
            target.unlink() if not target.is_dir() or target.is_symlink() else shutil.rmtree(target)
    for name in ("src", "tests", "tsconfig.json"):
        (js / name).symlink_to(sdk / name)
    deps = ",".join(f'"{n}": "{v}"' for n, v in JS_PACKAGES.items())
    (js / "package.json").write_text(
        f'{{"name": "e2b-upstream", "type": "module", "dependencies": {{{deps}}}}}'
    )
    if not (js / "node_modules" / ".installed").exists():
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=js, check=True
        )
        (js / "node_modules" / ".installed").write_text("")
    (js / "vitest.upstream.config.mts").write_text(VITEST_CONFIG)
    xml = work / "js.xml"
    mocked = mocked_js(sdk)
    print("not run (the SDK against a mocked API, not the server):", *mocked, sep="\n  ")
    args = ["npx", "vitest", "run", "--config", "vitest.upstream.config.mts"]
    args += [f"--exclude={name}" for name in mocked]
    args += ["--reporter=default", "--reporter=junit", f"--outputFile.junit={xml}", *JS_PATHS]
    args += ["-t", select] if select else []
    subprocess.run(args, cwd=js, env=env, check=False)
    return xml


def mocked_js(sdk: Path) -> list[str]:
    """The JS test files that answer the SDK from msw's mocks of api.e2b.app: they test the
    SDK alone, and pointed at a server (E2B_API_URL) they fail as unhandled requests."""
    return sorted(
        str(f.relative_to(sdk))
        for where in JS_PATHS
        for f in (sdk / where).rglob("*.test.ts")
        if "from 'msw" in f.read_text()
    )


def summarise(outcomes: list[Outcome]) -> str:
    lines = []
    for suite in sorted({o.suite for o in outcomes}):
        mine = [o for o in outcomes if o.suite == suite]
        counts = Counter(o.status for o in mine)
        lines.append(
            f"## {suite}: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped of {len(mine)}\n"
        )
        lines.append("| area | passed | failed | skipped |\n|---|---|---|---|")
        for area, _ in AREAS:
            here = Counter(o.status for o in mine if area_of(o.file) == area)
            if here:
                lines.append(
                    f"| {area} | {here['passed']} | {here['failed']} | {here['skipped']} |"
                )
        lines.append("\nFailures:\n")
        for o in mine:
            if o.status == "failed":
                lines.append(f"- [{area_of(o.file)}] `{o.test}`: {o.message}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", type=Path, default=Path("/tmp/e2b-upstream"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/e2b-upstream-work"))
    parser.add_argument("--python", action="store_true", help="the Python SDK's tests only")
    parser.add_argument("--js", action="store_true", help="the JS SDK's tests only")
    parser.add_argument("-k", dest="select", help="pytest -k / vitest -t expression")
    opts = parser.parse_args()
    both = not (opts.python or opts.js)
    opts.work.mkdir(parents=True, exist_ok=True)
    server_dir = opts.work / "server"
    shutil.rmtree(server_dir, ignore_errors=True)
    server_dir.mkdir()
    server = start_server(server_dir / "data", config_text=SERVER_CONFIG)
    outcomes: list[Outcome] = []
    try:
        url = f"{server.url}/e2b"
        env = {**os.environ, "E2B_API_URL": url, "E2B_SANDBOX_URL": url}
        # These SDKs refuse a key not of E2B's shape: the hex form the façade decodes.
        env = hex_key({**env, "E2B_API_KEY": server.create_key("upstream")})
        env.pop("E2B_DEBUG", None)
        if opts.python or both:
            xml = run_python(opts.upstream, opts.work, env, opts.select)
            outcomes += read_junit("python", xml, opts.upstream) if xml.exists() else []
        if opts.js or both:
            xml = run_js(opts.upstream, opts.work, env, opts.select)
            outcomes += read_junit("js", xml, opts.upstream) if xml.exists() else []
    finally:
        stop_and_clean(server)
    report = summarise(outcomes)
    (opts.work / "summary.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
