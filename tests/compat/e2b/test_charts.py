"""`result.chart` through the unmodified e2b-code-interpreter: a matplotlib figure shown in a
python context arrives as its PNG and as E2B's chart data (e2b_charts' extraction)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScaleType,
    ScatterChart,
    SuperChart,
)

pytestmark = pytest.mark.slow
PRELUDE = "import matplotlib.pyplot as plt\nimport numpy as np\n"


@pytest.fixture(scope="module")
def sbx() -> Iterator[Sandbox]:
    sandbox = Sandbox.create(template="base", timeout=300)
    yield sandbox
    sandbox.kill()


def _chart(sbx: Sandbox, code: str) -> object:
    execution = sbx.run_code(PRELUDE + code, timeout=120)
    assert execution.error is None, execution.error
    (result,) = execution.results
    assert result.png is not None and "chart" in result.formats()
    return result.chart


def test_a_line_chart_with_two_labelled_lines_and_its_ticks(sbx: Sandbox) -> None:
    chart = _chart(
        sbx,
        "x = np.linspace(0, 4, 5)\n"
        "plt.plot(x, x * 2, label='double')\nplt.plot(x, x ** 2, label='square')\n"
        "plt.title('Growth')\nplt.xlabel('Time (s)')\nplt.ylabel('Distance [m]')\n"
        "plt.xticks([0, 2, 4])\nplt.legend()\nplt.show()",
    )
    assert isinstance(chart, LineChart) and chart.type == ChartType.LINE
    assert (chart.title, chart.x_label, chart.y_label) == ("Growth", "Time (s)", "Distance [m]")
    assert (chart.x_unit, chart.y_unit) == ("s", "m")
    assert chart.x_scale == ScaleType.LINEAR
    assert chart.x_ticks == [0, 2, 4] and chart.x_tick_labels == ["0", "2", "4"]
    assert chart.y_ticks and len(chart.y_ticks) == len(chart.y_tick_labels)
    double, square = chart.elements
    assert (double.label, square.label) == ("double", "square")
    assert double.points == [(0, 0), (1, 2), (2, 4), (3, 6), (4, 8)]
    assert square.points[-1] == (4, 16)


def test_a_scatter_chart(sbx: Sandbox) -> None:
    chart = _chart(
        sbx,
        "plt.scatter([1, 2, 3], [3, 1, 2], label='a')\n"
        "plt.scatter([4, 5], [9, 8], label='b')\nplt.xlabel('x')\nplt.show()",
    )
    assert isinstance(chart, ScatterChart) and chart.type == ChartType.SCATTER
    a, b = chart.elements
    assert (a.label, a.points) == ("a", [(1, 3), (2, 1), (3, 2)])
    assert (b.label, b.points) == ("b", [(4, 9), (5, 8)])
    assert chart.x_label == "x" and chart.y_label is None


def test_a_bar_chart(sbx: Sandbox) -> None:
    chart = _chart(
        sbx,
        "plt.bar(['apples', 'pears'], [3, 5], label='2025')\n"
        "plt.title('Fruit')\nplt.ylabel('Crates')\nplt.show()",
    )
    assert isinstance(chart, BarChart) and chart.type == ChartType.BAR
    assert (chart.title, chart.y_label) == ("Fruit", "Crates")
    assert [(e.label, e.value, e.group) for e in chart.elements] == [
        ("apples", 3, "2025"),
        ("pears", 5, "2025"),
    ]


def test_a_pie_chart(sbx: Sandbox) -> None:
    chart = _chart(
        sbx, "plt.pie([1, 3], labels=['small', 'large'], radius=1)\nplt.title('Share')\nplt.show()"
    )
    assert isinstance(chart, PieChart) and chart.type == ChartType.PIE
    assert chart.title == "Share"
    small, large = chart.elements
    assert (small.label, large.label) == ("small", "large")
    assert (small.angle, large.angle) == (90, 270)  # degrees of the circle, a quarter each
    assert small.radius == large.radius == 1


def test_a_box_and_whisker_chart(sbx: Sandbox) -> None:
    # Boxes drawn as patches, as E2B's extractor recognises them (plain boxes are lines).
    chart = _chart(
        sbx,
        "plt.boxplot([[1, 2, 3, 4, 5], [1, 3, 5, 7, 9, 30]], tick_labels=['calm', 'wild'],"
        " patch_artist=True)\n"
        "plt.ylabel('Value')\nplt.show()",
    )
    assert isinstance(chart, BoxAndWhiskerChart) and chart.type == ChartType.BOX_AND_WHISKER
    calm, wild = chart.elements
    assert calm.label == "calm"
    assert (calm.min, calm.first_quartile, calm.median, calm.third_quartile, calm.max) == (
        1,
        2,
        3,
        4,
        5,
    )
    assert (wild.label, wild.first_quartile, wild.median, wild.max) == ("wild", 3.5, 6, 9)
    assert wild.outliers == [30] and calm.outliers == []
    assert chart.y_label == "Value"


def test_subplots_make_a_superchart_and_plain_results_have_none(sbx: Sandbox) -> None:
    chart = _chart(
        sbx,
        "fig, (a, b) = plt.subplots(1, 2)\nfig.suptitle('Both')\n"
        "a.plot([1, 2], [3, 4])\nb.bar(['x'], [1])\nplt.show()",
    )
    assert isinstance(chart, SuperChart) and chart.title == "Both"
    assert [type(c) for c in chart.elements] == [LineChart, BarChart]
    (plain,) = sbx.run_code("1 + 1").results
    assert plain.chart is None and plain.formats() == ["text"]


def test_a_first_plot_writes_nothing_to_stderr(sbx: Sandbox) -> None:
    # A context of its own, with matplotlib's cache in a fresh directory: the first figure
    # builds the font list (where matplotlib asks fontconfig's fc-list for the fonts).
    ctx = sbx.create_code_context(language="python")
    execution = sbx.run_code(
        PRELUDE + "plt.plot([1, 2])\nplt.show()",
        context=ctx,
        envs={"MPLCONFIGDIR": "/tmp/fresh-matplotlib"},
        timeout=120,
    )
    sbx.remove_code_context(ctx)
    assert execution.error is None and len(execution.results) == 1
    assert execution.logs.stderr == []
