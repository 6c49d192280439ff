"""`python -m sandcell.console.vendor`: the page's JavaScript dependencies, installed by
`npm ci` from web/package-lock.json at setup, copied into static/vendor/ (git-ignored) so
they ship with the package and nothing is fetched at run time."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent
MODULES = HERE / "web" / "node_modules"
VENDOR = HERE / "static" / "vendor"
# What the page loads, by the name it loads it under.
FILES = {
    "xterm.mjs": "@xterm/xterm/lib/xterm.mjs",
    "xterm.css": "@xterm/xterm/css/xterm.css",
    "addon-fit.mjs": "@xterm/addon-fit/lib/addon-fit.mjs",
}


def install() -> list[Path]:
    missing = [src for src in FILES.values() if not (MODULES / src).is_file()]
    if missing:
        raise SystemExit(
            f"console assets missing under {MODULES}: {', '.join(missing)}; "
            f"run `npm ci --prefix {HERE / 'web'}` first"
        )
    VENDOR.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copyfile(MODULES / src, VENDOR / name)) for name, src in FILES.items()]


if __name__ == "__main__":
    for path in install():
        sys.stdout.write(f"{path}\n")
