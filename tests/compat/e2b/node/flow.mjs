// The npm rows of docs/e2b.md's version matrix: matrix_flow.py's steps through the JS SDKs,
// run by tests/compat/e2b/test_matrix.py against the façade the E2B_* variables name.
//   node flow.mjs sandbox   # e2b's Sandbox
//   node flow.mjs code      # @e2b/code-interpreter's runCode with a result
// Prints "ok" when every step held; a failed step throws, naming what it saw.
import assert from "node:assert/strict";
import { Sandbox as CodeSandbox } from "@e2b/code-interpreter";
import { CommandExitError, NotFoundError, Sandbox } from "e2b";

const DIR = "/home/user/matrix";

async function sandboxFlow() {
  const sbx = await Sandbox.create("base", { timeoutMs: 120_000, metadata: { flow: "matrix" } });
  try {
    assert.equal((await sbx.commands.run("echo $((6 * 7))")).stdout, "42\n");
    const seen = [];
    await sbx.commands.run("echo out; echo err >&2", { onStdout: (d) => seen.push(d) });
    assert.equal(seen.join(""), "out\n");
    await assert.rejects(sbx.commands.run("echo bad >&2; exit 2"), (err) => {
      assert.ok(err instanceof CommandExitError, String(err));
      assert.deepEqual([err.exitCode, err.stderr], [2, "bad\n"]);
      return true;
    });

    const fed = await sbx.commands.run("read line; echo got $line", {
      background: true,
      stdin: true,
    });
    await sbx.commands.sendStdin(fed.pid, "it\n");
    assert.equal((await fed.wait()).stdout, "got it\n");
    const sleeper = await sbx.commands.run("sleep 60", { background: true });
    assert.ok((await sbx.commands.list()).some((p) => p.pid === sleeper.pid));
    assert.equal(await sbx.commands.kill(sleeper.pid), true);

    await sbx.files.write(`${DIR}/a.txt`, "from the matrix");
    assert.equal(await sbx.files.read(`${DIR}/a.txt`), "from the matrix");
    assert.deepEqual((await sbx.files.list(DIR)).map((e) => e.name), ["a.txt"]);
    assert.equal(await sbx.files.exists(`${DIR}/a.txt`), true);
    // Commands start in /home/user and see what the files API wrote there.
    assert.equal((await sbx.commands.run("cat matrix/a.txt")).stdout, "from the matrix");
    assert.equal(await sbx.files.makeDir(`${DIR}/sub`), true);
    const bytes = new Uint8Array([0, 98, 121, 116, 101, 115]);
    await sbx.files.write(`${DIR}/c.txt`, bytes.buffer);
    const moved = await sbx.files.rename(`${DIR}/c.txt`, `${DIR}/sub/c.txt`);
    assert.equal(moved.path, `${DIR}/sub/c.txt`);
    assert.equal((await sbx.files.getInfo(`${DIR}/sub/c.txt`)).size, 6);
    assert.deepEqual(await sbx.files.read(`${DIR}/sub/c.txt`, { format: "bytes" }), bytes);
    await sbx.files.remove(`${DIR}/sub`);
    assert.equal(await sbx.files.exists(`${DIR}/sub`), false);
    // A signed URL, at the path the SDK builds (sandbox, path and operation in it).
    const url = await sbx.downloadUrl(`${DIR}/a.txt`);
    assert.equal(await (await fetch(url)).text(), "from the matrix");

    const seenPty = [];
    const terminal = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => seenPty.push(d) });
    await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode("echo pty$((1 + 1)); exit 0\n"));
    await terminal.wait();
    assert.ok(Buffer.concat(seenPty).includes("pty2"), Buffer.concat(seenPty).toString());

    const info = await sbx.getInfo();
    assert.equal(info.sandboxId, sbx.sandboxId);
    assert.deepEqual(info.metadata, { flow: "matrix" });
    await sbx.setTimeout(100_000); // E2B counts it from the call, shorter or longer
    const left = ((await sbx.getInfo()).endAt.getTime() - Date.now()) / 1000;
    assert.ok(left > 90 && left <= 101, `${left} s left`);

    const late = await sbx.commands.run("read go; echo late", { background: true, stdin: true });
    const other = await Sandbox.connect(sbx.sandboxId);
    assert.equal((await other.commands.run("echo connected")).stdout, "connected\n");
    assert.equal(await other.files.read(`${DIR}/a.txt`), "from the matrix");
    const joined = await other.commands.connect(late.pid); // the first client's process
    await other.commands.sendStdin(late.pid, "\n");
    assert.equal((await joined.wait()).stdout, "late\n");
    assert.ok(Array.isArray(await sbx.getMetrics()));
  } finally {
    await sbx.kill();
  }
  assert.equal(await sbx.isRunning(), false);
  await assert.rejects(Sandbox.connect(sbx.sandboxId), NotFoundError);
}

async function codeFlow() {
  const sbx = await CodeSandbox.create("base", { timeoutMs: 120_000 });
  try {
    const execution = await sbx.runCode("x = 6 * 7\nprint('hi')\nx");
    assert.equal(execution.error, undefined);
    assert.equal(execution.text, "42");
    assert.equal(execution.logs.stdout.join(""), "hi\n");
    assert.equal((await sbx.runCode("x + 1")).text, "43"); // state kept between runs
    const failed = await sbx.runCode("1 / 0");
    assert.equal(failed.error?.name, "ZeroDivisionError");
  } finally {
    await sbx.kill();
  }
}

const flows = { sandbox: sandboxFlow, code: codeFlow };
const started = performance.now();
await flows[process.argv[2]]();
console.log(`ok ${((performance.now() - started) / 1000).toFixed(1)}s`);
