// The console's pages. Every call goes to the same /v1 API as any client's, authenticated by
// the session cookie; state-changing ones carry the session's CSRF token. Whatever comes from
// a sandbox (ids, metadata, file names, output) is set as text, never as markup.
import "./styles.js";
import { openTerminal } from "./terminal.js";

const REFRESH_MS = 3000;
const $ = (id) => document.getElementById(id);
const session = { csrf: null, principal: null, admin: false };
let refreshTimer = null;
let terminal = null;
let following = null; // the AbortController of the log being followed

class SignedOut extends Error {}

async function api(method, path, body) {
  const headers = {};
  if (method !== "GET") headers["X-CSRF-Token"] = session.csrf || "";
  let payload = body;
  if (body !== undefined && !(body instanceof Blob) && !(body instanceof URLSearchParams)) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const response = await fetch(path, { method, headers, body: payload, credentials: "same-origin" });
  if (response.status === 401 && path !== "/ui/session") {
    show("sign-in-page");
    throw new SignedOut();
  }
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    try {
      const { error } = await response.json();
      message = `${error.code}: ${error.message}`;
    } catch {}
    throw new Error(message);
  }
  if (response.status === 204) return null;
  return response.json();
}

function report(error) {
  if (error instanceof SignedOut || error.name === "AbortError") return;
  $("error").textContent = String(error.message || error);
  $("error").hidden = false;
}

function show(page) {
  for (const id of ["sign-in-page", "list-page", "sandbox-page"]) $(id).hidden = id !== page;
  const signedIn = page !== "sign-in-page";
  $("sign-out").hidden = !signedIn;
  $("who").textContent = signedIn ? `${session.principal}${session.admin ? " (admin)" : ""}` : "";
  document.body.dataset.page = page;
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// Control characters (an ANSI escape's ESC among them) shown as their Unicode pictures.
function visible(text) {
  return String(text).replace(/[\x00-\x1f\x7f]/g, (c) =>
    String.fromCharCode(c === "\x7f" ? 0x2421 : 0x2400 + c.charCodeAt(0)),
  );
}

// Output as text: newlines and tabs kept, other control characters shown as pictures.
function visibleOutput(text) {
  return visible(text).replace(/\u240a/g, "\n").replace(/\u2409/g, "\t");
}

function age(createdAt) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(createdAt)) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}

async function refreshList() {
  const asked = performance.now();
  const { sandboxes } = await api("GET", "/v1/sandboxes");
  const answered = performance.now();
  const rows = sandboxes.map((sbx) => {
    const row = document.createElement("tr");
    row.dataset.id = sbx.id;
    const link = document.createElement("a");
    link.href = `#/sandbox/${encodeURIComponent(sbx.id)}`;
    link.textContent = sbx.id;
    row.insertCell().append(link);
    cell(row, sbx.state, "state");
    cell(row, sbx.template);
    cell(row, age(sbx.created_at));
    const meta = Object.entries(sbx.metadata).map(([k, v]) => `${visible(k)}=${visible(v)}`);
    cell(row, meta.join("\n"), "meta");
    const actions = row.insertCell();
    const action = { running: "pause", paused: "resume" }[sbx.state];
    if (action) actions.append(button(action, () => lifecycle(sbx.id, action)));
    actions.append(button("delete", () => deleteSandbox(sbx.id)));
    return row;
  });
  $("sandboxes").replaceChildren(...rows);
  $("empty").hidden = rows.length > 0;
  // How long a refresh takes, whole and its rendering alone (read by the tests).
  performance.measure("sandboxes-refresh", { start: asked });
  performance.measure("sandboxes-render", { start: answered });
}

function button(name, act) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = name;
  b.textContent = name[0].toUpperCase() + name.slice(1);
  b.addEventListener("click", () => {
    b.disabled = true;
    act().catch(report).finally(() => { b.disabled = false; });
  });
  return b;
}

async function lifecycle(id, action) {
  await api("POST", `/v1/sandboxes/${encodeURIComponent(id)}/${action}`, {});
  await refreshList();
}

async function deleteSandbox(id) {
  await api("DELETE", `/v1/sandboxes/${encodeURIComponent(id)}`);
  if (location.hash !== "#/") location.hash = "#/";
  else await refreshList();
}

async function listFiles(id) {
  const path = `/v1/sandboxes/${encodeURIComponent(id)}/files`;
  const { entries } = await api("GET", `${path}/list?path=.`);
  $("files").replaceChildren(
    ...entries.map((entry) => {
      const li = document.createElement("li");
      if (entry.type === "file") {
        const link = document.createElement("a");
        link.href = "#";
        link.textContent = entry.name;
        link.addEventListener("click", (event) => {
          event.preventDefault();
          download(`${path}?path=${encodeURIComponent(entry.path)}`, entry.name).catch(report);
        });
        li.append(link, ` (${entry.size} bytes)`);
      } else {
        li.textContent = `${entry.name}/`;
      }
      return li;
    }),
  );
}

// Fetched by script (the session cookie authenticates no navigation), then saved from an
// opaque blob: a file from a sandbox is never rendered at the console's origin.
async function download(url, name) {
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  const blob = new Blob([await response.arrayBuffer()], { type: "application/octet-stream" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
}

async function listProcesses(id) {
  const { processes } = await api("GET", `/v1/sandboxes/${encodeURIComponent(id)}/processes`);
  $("processes").replaceChildren(
    ...processes.map((proc) => {
      const row = document.createElement("tr");
      row.dataset.pid = proc.pid;
      cell(row, String(proc.pid));
      const command = Array.isArray(proc.command) ? proc.command.join(" ") : proc.command;
      cell(row, visible(command), "meta");
      cell(row, proc.state, "state");
      cell(row, proc.exit_code === null ? "" : String(proc.exit_code));
      row.insertCell().append(
        button("log", async () => {
          followLog(id, proc.pid).catch(report); // runs as long as the process does
        }),
      );
      return row;
    }),
  );
}

function b64bytes(text) {
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
}

// GET .../output?follow=true: the process's buffered output, then live, as NDJSON.
async function followLog(id, pid) {
  following?.abort();
  following = new AbortController();
  const log = $("log");
  log.replaceChildren();
  log.hidden = false;
  log.dataset.pid = pid;
  log.dataset.exited = "false";
  const url = `/v1/sandboxes/${encodeURIComponent(id)}/processes/${pid}/output?follow=true`;
  const response = await fetch(url, { credentials: "same-origin", signal: following.signal });
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const decoders = {};
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += value;
    let end;
    while ((end = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, end).trim();
      pending = pending.slice(end + 1);
      if (!line) continue;
      const event = JSON.parse(line);
      if (event.data_b64 !== undefined) {
        decoders[event.type] ??= new TextDecoder();
        const text = decoders[event.type].decode(b64bytes(event.data_b64), { stream: true });
        log.append(visibleOutput(text));
      } else if (event.type === "lost") {
        log.append(`[${event.bytes} bytes no longer kept]\n`);
      } else if (event.type === "exit") {
        log.append(`[exited with ${event.exit_code}]\n`);
        log.dataset.exited = "true";
      }
    }
  }
}

async function openSandbox(id) {
  show("sandbox-page");
  const sbx = await api("GET", `/v1/sandboxes/${encodeURIComponent(id)}`);
  $("sandbox-id").textContent = sbx.id;
  $("sandbox-state").textContent = sbx.state;
  $("sandbox-template").textContent = sbx.template;
  $("sandbox-page").dataset.id = sbx.id;
  listFiles(id).catch(report);
  terminal = await openTerminal($("terminal"), id, api, session.csrf);
  await listProcesses(id); // the terminal's shell among them
}

async function route() {
  clearInterval(refreshTimer);
  terminal?.close();
  terminal = null;
  following?.abort();
  following = null;
  $("log").hidden = true;
  $("error").hidden = true;
  if (!session.csrf) {
    show("sign-in-page");
    return;
  }
  const match = location.hash.match(/^#\/sandbox\/([^/]+)$/);
  if (match) {
    await openSandbox(decodeURIComponent(match[1]));
    return;
  }
  show("list-page");
  await refreshList();
  refreshTimer = setInterval(() => refreshList().catch(report), REFRESH_MS);
}

function signedIn(view) {
  session.csrf = view.csrf_token;
  session.principal = view.principal;
  session.admin = view.admin;
}

$("sign-in").addEventListener("submit", (event) => {
  event.preventDefault();
  const form = new URLSearchParams(new FormData(event.target));
  api("POST", "/ui/session", form)
    .then((view) => {
      event.target.reset();
      signedIn(view);
      return route();
    })
    .catch(report);
});

$("sign-out").addEventListener("click", () => {
  api("DELETE", "/ui/session")
    .then(() => {
      session.csrf = null;
      return route();
    })
    .catch(report);
});

$("create").addEventListener("submit", (event) => {
  event.preventDefault();
  const form = new FormData(event.target);
  const body = { template: form.get("template") };
  if (form.get("idle_timeout_s")) body.idle_timeout_s = Number(form.get("idle_timeout_s"));
  api("POST", "/v1/sandboxes", body).then(refreshList).catch(report);
});

$("delete").addEventListener("click", () => {
  deleteSandbox($("sandbox-page").dataset.id).catch(report);
});

$("processes-refresh").addEventListener("click", () => {
  listProcesses($("sandbox-page").dataset.id).catch(report);
});

$("upload").addEventListener("submit", (event) => {
  event.preventDefault();
  const file = new FormData(event.target).get("file");
  if (!file || !file.name) return;
  const id = $("sandbox-page").dataset.id;
  const path = `/v1/sandboxes/${encodeURIComponent(id)}/files?path=${encodeURIComponent(file.name)}`;
  api("PUT", path, file).then(() => listFiles(id)).catch(report);
});

window.addEventListener("hashchange", () => route().catch(report));

fetch("/ui/session", { credentials: "same-origin" })
  .then((r) => (r.ok ? r.json() : null))
  .then((view) => {
    if (view) signedIn(view);
    return route();
  })
  .catch(report);
