"""An unmodified E2B snippet, run on sandcell: only the environment says where E2B is.

    export E2B_API_URL=http://127.0.0.1:8700/e2b
    export E2B_SANDBOX_URL=http://127.0.0.1:8700/e2b
    export E2B_API_KEY=sc_...            # a sandcell key: sandcell keys create NAME
    python examples/e2b_unmodified.py

Everything below is E2B's own quick-start code (e2b-code-interpreter), untouched except
`template="base"`, sandcell's fast host-system template, so the example needs no image build.
"""

from e2b_code_interpreter import Sandbox

with Sandbox.create(template="base") as sandbox:
    sandbox.files.write("/home/user/numbers.txt", "3\n4\n5\n")
    print(sandbox.commands.run("wc -l < numbers.txt").stdout.strip(), "lines")
    sandbox.run_code("values = [int(x) for x in open('numbers.txt')]")
    execution = sandbox.run_code("sum(v * v for v in values)")
    print("sum of squares:", execution.text)
    chart = sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.bar([1, 2, 3], values)\nplt.show()"
    )
    print("chart:", "png" if chart.results and chart.results[0].png else "missing")
