"""Analyse a CSV file in a sandbox: upload it, run a stdlib-only script there, download the
result. The data and the analysis code never run on this machine.

    export SANDCELL_URL=http://127.0.0.1:8700 SANDCELL_API_KEY=sc_...   # sandcell keys create
    python examples/data_analysis.py [sales.csv] [out_dir]

Without a CSV, a sample sales file is generated first.
"""

from __future__ import annotations

import csv
import random
import sys
import tempfile
from pathlib import Path

from sandcell import Sandbox

# Runs inside the sandbox, with nothing but the standard library (no pandas needed).
ANALYSIS = r"""
import csv
import json
import statistics
from collections import defaultdict

revenue = defaultdict(float)
units = defaultdict(int)
prices = defaultdict(list)
with open("data/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        amount = int(row["units"]) * float(row["unit_price"])
        revenue[row["region"]] += amount
        units[row["product"]] += int(row["units"])
        prices[row["product"]].append(float(row["unit_price"]))

with open("out/summary.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["product", "units", "median_price"])
    for product in sorted(units, key=units.get, reverse=True):
        writer.writerow([product, units[product], round(statistics.median(prices[product]), 2)])

print(json.dumps({
    "rows": sum(len(p) for p in prices.values()),
    "revenue_by_region": {r: round(v, 2) for r, v in sorted(revenue.items())},
    "best_seller": max(units, key=units.get),
}, indent=2))
"""


def sample_csv(path: Path, rows: int = 5000) -> Path:
    rng = random.Random(7)  # noqa: S311 - sample data
    products = {"widget": 2.5, "gadget": 12.0, "gizmo": 7.25, "doohickey": 30.0}
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date", "region", "product", "units", "unit_price"])
        for i in range(rows):
            product, price = rng.choice(list(products.items()))
            writer.writerow(
                [
                    f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}",
                    rng.choice(["north", "south", "east", "west"]),
                    product,
                    rng.randint(1, 20),
                    round(price * rng.uniform(0.8, 1.2), 2),
                ]
            )
    return path


def analyse(csv_path: Path, out_dir: Path) -> Path:
    with Sandbox.create(timeout=300) as sbx:
        sbx.files.upload(csv_path, "data/sales.csv")
        sbx.files.write("analyze.py", ANALYSIS)
        sbx.files.mkdir("out")
        print("summary computed in the sandbox:")
        sbx.commands.run(
            ["python3", "analyze.py"],
            timeout=120,
            check=True,  # a failing script raises CommandExitError, with its stderr
            on_stdout=lambda text: print(text, end=""),
            on_stderr=lambda text: print(text, end="", file=sys.stderr),
        )
        return sbx.files.download("out/summary.csv", out_dir / "summary.csv")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="sandcell-analysis-"))
    csv_path = Path(sys.argv[1]) if len(sys.argv) > 1 else sample_csv(work / "sales.csv")
    out_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else work
    out_dir.mkdir(parents=True, exist_ok=True)
    result = analyse(csv_path, out_dir)
    print(f"\nper-product table downloaded to {result}:")
    print(result.read_text())


if __name__ == "__main__":
    main()
