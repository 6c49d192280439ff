// A terminal in a sandbox: a shell on a pty (POST .../processes), attached over the API's
// WebSocket (SPEC §9). Binary frames carry keystrokes and output; text frames carry JSON
// control (resize from here, exit from the server). The upgrade carries the session's CSRF
// token as a subprotocol, since a page cannot set headers on a WebSocket.
import { Terminal } from "./vendor/xterm.mjs";
import { FitAddon } from "./vendor/addon-fit.mjs";

const SHELL = "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh; fi";

export async function openTerminal(el, sandboxId, api, csrfToken) {
  const term = new Terminal({ fontFamily: "ui-monospace, monospace", fontSize: 14, cursorBlink: true });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(el);
  fit.fit();
  const base = `/v1/sandboxes/${encodeURIComponent(sandboxId)}/processes`;
  const proc = await api("POST", base, { command: SHELL, pty: { cols: term.cols, rows: term.rows } });
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${location.host}${base}/${proc.pid}/ws`, [
    "sandcell.console",
    `sandcell.csrf.${csrfToken}`,
  ]);
  ws.binaryType = "arraybuffer";
  const shown = () => { el.dataset.size = `${term.cols}x${term.rows}`; };
  shown();
  ws.onopen = () => { el.dataset.attached = "true"; };
  ws.onmessage = (event) => {
    if (typeof event.data !== "string") {
      term.write(new Uint8Array(event.data));
      return;
    }
    const message = JSON.parse(event.data);
    if (message.type === "exit") term.write(`\r\n[exited with ${message.exit_code}]\r\n`);
  };
  ws.onclose = () => { el.dataset.attached = "false"; };
  const encoder = new TextEncoder();
  const send = (data) => { if (ws.readyState === WebSocket.OPEN) ws.send(data); };
  term.onData((data) => send(encoder.encode(data)));
  term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0))));
  term.onResize(({ cols, rows }) => {
    send(JSON.stringify({ type: "resize", cols, rows }));
    shown();
  });
  const refit = () => fit.fit();
  window.addEventListener("resize", refit);
  term.focus();
  return {
    close() {
      window.removeEventListener("resize", refit);
      ws.close();
      term.dispose();
      el.replaceChildren();
      api("DELETE", `${base}/${proc.pid}`).catch(() => {});
    },
  };
}
