"""Data analysis with the code interpreter: pandas and matplotlib run in a sandbox's stateful
python context; the chart comes back as a PNG and is saved here.

    export SANDCELL_URL=http://127.0.0.1:8700 SANDCELL_API_KEY=sc_...   # sandcell keys create
    python examples/chart_analysis.py [out_dir]

The context keeps its state between runs, as a notebook does: the data loaded by the first
run is there for the next ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sandcell import Sandbox

LOAD = """
import numpy as np
import pandas as pd

rng = np.random.default_rng(7)
days = pd.date_range("2026-01-01", periods=120, freq="D")
sales = pd.DataFrame({
    "day": np.tile(days, 3),
    "region": np.repeat(["north", "south", "west"], len(days)),
    "revenue": rng.gamma(4.0, 250.0, 3 * len(days)).round(2),
})
print(f"{len(sales)} rows loaded")
"""

SUMMARY = """
monthly = sales.groupby([sales.day.dt.to_period("M"), "region"]).revenue.sum().unstack()
monthly.round(0)
"""

CHART = """
import matplotlib.pyplot as plt

ax = monthly.plot(kind="bar", figsize=(8, 4), title="Revenue by month and region")
ax.set_xlabel("month")
ax.set_ylabel("revenue")
ax.legend(title="region", loc="upper left", bbox_to_anchor=(1, 1))
plt.tight_layout()
plt.show()
"""


def main(out_dir: Path) -> None:
    with Sandbox.create() as sbx:
        loaded = sbx.run_code(LOAD, on_stdout=lambda message: print(message, end=""))
        if loaded.error:
            sys.exit(f"{loaded.error.name}: {loaded.error.value}")
        summary = sbx.run_code(SUMMARY)
        print(summary.text)  # the DataFrame's plain text (its .html is there too)
        chart = sbx.run_code(CHART)
        images = [r.image_bytes() for r in chart.results if r.png]
        if chart.error or not images:
            sys.exit(f"no chart: {chart.error}")
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / "revenue_by_month.png"
        target.write_bytes(images[0])
        print(f"chart saved to {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
