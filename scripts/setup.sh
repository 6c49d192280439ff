#!/usr/bin/env bash
# Sets up everything sandcell needs on a Debian machine: system packages, then a
# virtualenv at .venv built from the system Python (fast start, readable by cells).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v redis-server >/dev/null || need_apt+=(redis-server)
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
dpkg -s libseccomp2 >/dev/null 2>&1 || need_apt+=(libseccomp2)
command -v mkfs.ext4 >/dev/null || need_apt+=(e2fsprogs)
command -v setpriv >/dev/null || need_apt+=(util-linux)
command -v curl >/dev/null || need_apt+=(curl)  # the egress tests run curl inside cells
# Images (SPEC §12): debian:<suite> bases, and the tests' own tiny OCI image.
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)
command -v busybox >/dev/null || need_apt+=(busybox-static)
# The E2B version matrix's npm rows (tests/compat/e2b/node): the JS SDKs under Node.
command -v node >/dev/null || need_apt+=(nodejs)
command -v npm >/dev/null || need_apt+=(npm)
# The console's browser tests (tests/console): Debian's Chromium, driven by Playwright.
command -v chromium >/dev/null || need_apt+=(chromium)
# Another apt (unattended-upgrades, cloud-init, a second setup) may hold the locks: wait for
# it, up to 10 minutes, instead of failing at once.
APT_LOCK_WAIT_S=600
apt_update() {
    # DPkg::Lock::Timeout covers dpkg's lock, not the one on /var/lib/apt/lists that
    # `apt-get update` takes (apt 2.6 fails at once on it), so retry while that is held.
    local deadline=$((SECONDS + APT_LOCK_WAIT_S)) out waited=""
    until out=$(apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT_S" update -qq 2>&1); do
        if ! grep -q "Could not get lock" <<<"$out" || [ "$SECONDS" -ge "$deadline" ]; then
            echo "$out" >&2
            return 1
        fi
        [ -n "$waited" ] || echo "setup: waiting for another apt to release its lock" >&2
        waited=1
        sleep 2
    done
}
if [ ${#need_apt[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt_update
    apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT_S" install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,interpreter,mcp,telemetry]'
# typescript code contexts: the `typescript` package beside the driver, from its lockfile.
npm ci --prefix src/sandcell/daemon/code --ignore-scripts --no-audit --no-fund --loglevel=error
# The console's JavaScript (xterm.js), from its lockfile, into the package's static/vendor/.
npm ci --prefix src/sandcell/console/web --ignore-scripts --no-audit --no-fund --loglevel=error
.venv/bin/python -m sandcell.console.vendor >/dev/null
