// Building DOM from data without ever parsing text as markup (the page runs under Trusted
// Types with no policy, so innerHTML would throw), and rendering values generically.

export const $ = (id) => document.getElementById(id);

export function h(tag, props, ...kids) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "value" || key === "checked" || key === "disabled") el[key] = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  el.append(...kids.flat(Infinity).filter((k) => k !== null && k !== undefined && k !== false));
  return el;
}

// Replaces el's children; a <details data-k> the operator opened stays open, so that
// refreshing every few seconds does not fold it back.
export function fill(el, ...kids) {
  const open = new Set([...el.querySelectorAll("details[open][data-k]")].map((d) => d.dataset.k));
  el.replaceChildren(...kids.flat(Infinity).filter((k) => k !== null && k !== undefined && k !== false));
  for (const d of el.querySelectorAll("details[data-k]")) if (open.has(d.dataset.k)) d.open = true;
  return el;
}

export function num(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return String(value);
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toPrecision(3)));
}

export function show(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value === "number") return num(value);
  if (Array.isArray(value)) return value.length ? value.map(show).join(", ") : "none";
  if (typeof value === "object") {
    return Object.entries(value).map(([k, v]) => `${k}: ${show(v)}`).join("; ") || "–";
  }
  return String(value);
}

// Pairs "x" with "x_margin95" (or "x_margin") as "x ± margin"; other keys pass as they are.
export function withMargins(obj) {
  const out = [];
  for (const [key, value] of Object.entries(obj)) {
    if (/_margin(95)?$/.test(key) && key.replace(/_margin(95)?$/, "") in obj) continue;
    const margin = obj[`${key}_margin95`] ?? obj[`${key}_margin`];
    const shown = show(value);
    out.push([key, margin === undefined || margin === null || value === null ? shown : `${shown} ± ${num(margin)}`]);
  }
  return out;
}

// Every field of obj not in skip, as a definition list: fields the console does not know yet.
export function extras(obj, skip) {
  const rest = withMargins(obj).filter(([key]) => !skip.includes(key));
  if (!rest.length) return null;
  return h("dl", { class: "kv" }, rest.map(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
}

// A table whose columns are the union of the rows' keys, known ones first.
export function table(rows, first, label) {
  const keys = [...first];
  const shown = rows.map(([name, row]) => [name, Object.fromEntries(withMargins(row))]);
  for (const [, row] of shown) for (const key of Object.keys(row)) if (!keys.includes(key)) keys.push(key);
  const present = keys.filter((k) => shown.some(([, row]) => k in row));
  return h("div", { class: "scroll" }, h("table", null,
    h("thead", null, h("tr", null, h("th", null, label), present.map((k) => h("th", null, k.replaceAll("_", " "))))),
    h("tbody", null, shown.map(([name, row]) => h("tr", null, h("th", null, name), present.map((k) => h("td", null, k in row ? row[k] : "–")))))));
}

export function clock(at) {
  return new Date(at * 1000).toLocaleTimeString([], { hour12: false });
}

export function ago(at) {
  const s = Math.max(0, Date.now() / 1000 - at);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

export function chip(text, kind) {
  return h("span", { class: `chip ${kind || text}` }, text.replaceAll("_", " "));
}
