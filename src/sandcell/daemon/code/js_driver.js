// The javascript and typescript contexts' process: Node.js running each request in one
// global scope, so variables, functions and `require`d modules persist between runs. Run as
// `node js_driver.js CMD_FD EVENT_FD LANGUAGE`; it needs nothing but Node (and, for
// typescript, the `typescript` package, which strips the types before a run).
//
// Requests arrive on CMD_FD as in the python driver: a JSON header line {"id", "len", "env"}
// and `len` bytes of UTF-8 code. Events leave on EVENT_FD as JSON lines: `ready` once, then
// per run `result` (the value of the last expression, as util.inspect shows it), `error`,
// and `done` with the execution count. console.log and process.stdout write to fd 1 and
// console.error to fd 2, pipes the daemon reads (written synchronously on Linux, so output
// comes before the events that follow it).
'use strict';

const fs = require('fs');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');

const commandFd = Number(process.argv[2]);
const eventFd = Number(process.argv[3]);
const language = process.argv[4] || 'javascript';
// The daemon's name for a run it interrupted (its timeout): reported as a TimeoutError.
const INTERRUPTED = 'KeyboardInterrupt';

let runId = 0;
let count = 0;
let cancel = null; // rejects the awaited promise of the current run on SIGINT

function writeAll(fd, data) {
  let offset = 0;
  while (offset < data.length) {
    try {
      offset += fs.writeSync(fd, data, offset);
    } catch (err) {
      if (err.code !== 'EAGAIN') throw err;
    }
  }
}

function send(event) {
  writeAll(eventFd, Buffer.from(JSON.stringify({ ...event, id: runId }) + '\n'));
}

function errorEvent(err) {
  if (err instanceof Error || (err && typeof err === 'object' && 'stack' in err)) {
    const interrupted = err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED';
    return {
      type: 'error',
      name: interrupted ? INTERRUPTED : String(err.name || 'Error'),
      value: String(err.message === undefined ? err : err.message),
      traceback: String(err.stack || ''),
    };
  }
  // `throw 'text'` and the like: a value, not an Error.
  return { type: 'error', name: 'Error', value: util.inspect(err), traceback: '' };
}

let typescript = null;

function stripTypes(code) {
  // Resolved from this file (a node_modules beside it), then Node's global folders.
  typescript = typescript || require('typescript');
  const out = typescript.transpileModule(code, {
    compilerOptions: {
      target: typescript.ScriptTarget.ES2022,
      module: typescript.ModuleKind.CommonJS,
      esModuleInterop: true,
    },
    reportDiagnostics: true,
  });
  const problem = (out.diagnostics || [])[0];
  if (problem) {
    const text = typescript.flattenDiagnosticMessageText(problem.messageText, '\n');
    throw new SyntaxError(text);
  }
  return out.outputText;
}

function compile(code) {
  const filename = `<cell ${count + 1}>`;
  try {
    return new vm.Script(code, { filename });
  } catch (err) {
    if (!(err instanceof SyntaxError) || !/await/.test(err.message)) throw err;
    // Top-level await: the run becomes an async function (its declarations stay in it).
    return new vm.Script(`(async () => {\n${code}\n})()`, { filename, lineOffset: -1 });
  }
}

function interruptible(promise) {
  return new Promise((resolve, reject) => {
    cancel = reject;
    promise.then(resolve, reject);
  }).finally(() => {
    cancel = null;
  });
}

async function runOne(header, code) {
  const env = header.env || {};
  const saved = {};
  for (const [name, value] of Object.entries(env)) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
  try {
    const source = language === 'typescript' ? stripTypes(code) : code;
    let value = compile(source).runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (value instanceof Promise) value = await interruptible(value);
    if (value !== undefined) {
      const data = { 'text/plain': util.inspect(value) };
      send({ type: 'result', is_main_result: true, data });
    }
  } catch (err) {
    send(errorEvent(err));
  } finally {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
    count += 1;
    send({ type: 'done', execution_count: count });
  }
}

function serve() {
  let buffered = Buffer.alloc(0);
  let queue = Promise.resolve();
  const input = fs.createReadStream(null, { fd: commandFd });
  input.on('data', (chunk) => {
    buffered = Buffer.concat([buffered, chunk]);
    for (;;) {
      const end = buffered.indexOf(10);
      if (end < 0) return;
      const header = JSON.parse(buffered.subarray(0, end).toString());
      if (buffered.length < end + 1 + header.len) return;
      const code = buffered.subarray(end + 1, end + 1 + header.len).toString();
      buffered = buffered.subarray(end + 1 + header.len);
      queue = queue.then(() => {
        runId = header.id;
        return runOne(header, code);
      });
    }
  });
  input.on('end', () => process.exit(0)); // the daemon is gone
}

function main() {
  // `require` as in a module of the working directory; CommonJS output of typescript
  // (an `import`) writes to `exports`.
  globalThis.require = createRequire(path.join(process.cwd(), '<context>'));
  globalThis.module = { exports: {} };
  globalThis.exports = globalThis.module.exports;
  process.on('SIGINT', () => {
    if (cancel) {
      const err = new Error('the run was interrupted');
      err.name = INTERRUPTED;
      cancel(err);
    }
  });
  // A callback's error after its run ended: reported on stderr, the context lives on.
  process.on('uncaughtException', (err) => console.error(err));
  process.on('unhandledRejection', (err) => console.error(err));
  if (language === 'typescript') {
    try {
      typescript = require('typescript');
    } catch {
      console.error('sandcell: no typescript package for this Node.js');
      process.exit(3);
    }
  }
  send({ type: 'ready' });
  serve();
}

main();
