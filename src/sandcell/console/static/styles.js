// xterm.js writes the styles it computes (cell sizes, theme colours, the font set in
// terminal.js) into <style> elements, which this page's Content-Security-Policy refuses (no
// inline style). Their text is xterm's own, never a sandbox's output, so it is carried over
// into constructed style sheets, which the policy does not govern.
const sheets = new Map();

function sync() {
  const live = new Set(document.querySelectorAll("style"));
  for (const el of live) {
    let entry = sheets.get(el);
    if (!entry) {
      entry = { sheet: new CSSStyleSheet(), text: null };
      sheets.set(el, entry);
    }
    const text = el.textContent || "";
    if (entry.text !== text) {
      entry.sheet.replaceSync(text);
      entry.text = text;
    }
  }
  for (const el of [...sheets.keys()]) if (!live.has(el)) sheets.delete(el);
  document.adoptedStyleSheets = [...sheets.values()].map((e) => e.sheet);
}

new MutationObserver((records) => {
  const styled = (n) => n instanceof HTMLStyleElement || n.parentNode instanceof HTMLStyleElement;
  if (records.some((r) => styled(r.target) || [...r.addedNodes, ...r.removedNodes].some(styled))) sync();
}).observe(document.documentElement, { childList: true, subtree: true, characterData: true });
