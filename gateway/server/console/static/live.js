// Live: every slice with its rule, rung, phase, evidence and guardrail timeline; the pools.
import { $, ago, chip, clock, extras, fill, h, num, show, table } from "./dom.js";

const MAX_SPAN_S = 15 * 60;
const MIN_SPAN_S = 2 * 60;
const SLICE_KNOWN = ["rule", "model", "offset", "phase", "since", "start", "rung", "probing", "requests_per_s", "window_s", "pools"];
const RANK = { fallen_back: 0, probing: 1 };

function phaseWords(slice) {
  if (slice.phase === "fallen_back") return `fallen back to ${slice.rung ?? `rung +${slice.offset}`}`;
  if (slice.phase === "probing") return `probing ${slice.probing ?? "the rung above"}, served on ${slice.rung ?? "the rung below"}`;
  return `on ${slice.rung ?? `rung +${slice.offset ?? 0}`}`;
}

// The strip covers the last 15 minutes, or less when the first event kept is more recent.
function spanOf(events, now) {
  const first = events.length ? events[0].at - 60 : now - MAX_SPAN_S;
  return Math.min(MAX_SPAN_S, Math.max(MIN_SPAN_S, now - first));
}

function segments(events, phase, now, span) {
  const start = now - span;
  const out = [];
  let t = start;
  let current = events.length ? events[0].from?.phase ?? phase : phase;
  for (const e of events) {
    if (e.at > start) out.push([current, Math.max(t, start), e.at]);
    current = e.to?.phase ?? current;
    t = e.at;
  }
  out.push([current, Math.max(t, start), now]);
  return out.filter(([, a, b]) => b > a);
}

function timeline(key, slice, events, now) {
  const mine = events.filter((e) => e.slice === key).sort((a, b) => a.at - b.at);
  const span = spanOf(mine, now);
  const strip = h("div", { class: "strip" });
  for (const [phase, a, b] of segments(mine, slice.phase, now, span)) {
    const part = h("span", { class: `seg ${phase}`, title: `${phase.replace("_", " ")} from ${clock(a)}` });
    part.style.width = `${((b - a) / span) * 100}%`;
    strip.append(part);
  }
  const items = [...mine].reverse().map((e) => h("li", null,
    h("time", null, clock(e.at)), " ",
    chip(e.from?.phase ?? "?"), " → ", chip(e.to?.phase ?? "?"), " ",
    h("span", null, e.reason ?? ""), " ",
    e.numbers ? h("span", { class: "muted" }, show(e.numbers)) : null));
  return h("div", { class: "timeline" },
    h("div", { class: "axis muted" }, h("span", null, `${Math.round(span / 60)} min ago`), h("span", null, "now")),
    strip,
    h("details", { "data-k": `events ${key}` }, h("summary", null, `${mine.length} guardrail transition${mine.length === 1 ? "" : "s"}`),
      items.length ? h("ol", { class: "events" }, items) : h("p", { class: "muted" }, "None kept.")));
}

function splitWords(split) {
  // a slice split by application: what it split by, its children's rungs, and why
  const children = (split.children || []).map((c) => `${c.slice.slice(split.parent.length + 3)} on ${c.rung ?? "?"}`);
  return `split by ${split.key}${split.pinned ? " (pinned)" : ""}: ${children.join(", ")}`;
}

function sliceCard(key, slice, events, now, splits) {
  const pools = Object.entries(slice.pools || {});
  const split = splits[key];
  const parent = Object.values(splits).find((s) => (s.children || []).some((c) => c.slice === key));
  return h("article", { class: `card slice ${slice.phase}`, "data-slice": key, "data-phase": slice.phase, "data-rung": slice.rung ?? "" },
    h("h3", null, chip(slice.phase), " ", h("span", { class: "key" }, key)),
    h("p", { class: "meta" },
      h("span", null, `rule ${slice.rule}`), h("span", null, `model ${slice.model}`),
      h("span", { class: "rung" }, phaseWords(slice)),
      slice.start ? h("span", null, `starts on ${slice.start}`) : null,
      slice.requests_per_s !== undefined ? h("span", null, `${num(slice.requests_per_s)} req/s`) : null,
      slice.since ? h("span", null, `since ${ago(slice.since)}`) : null,
      slice.window_s ? h("span", { class: "muted" }, `window ${num(slice.window_s)} s`) : null,
      split ? h("span", { class: "split", title: split.why }, splitWords(split)) : null,
      parent ? h("span", { class: "split", title: parent.why }, `split from ${parent.parent} by ${parent.key}`) : null),
    pools.length ? table(pools, ["requests", "measured", "acceptance"], "pool") : h("p", { class: "muted" }, "No evidence in the window."),
    timeline(key, slice, events, now),
    extras(slice, SLICE_KNOWN));
}

export function renderSlices(stats, guardrail) {
  const now = Date.now() / 1000;
  const events = guardrail?.events || [];
  const slices = Object.entries(stats?.slices || {});
  slices.sort(([ka, a], [kb, b]) =>
    (RANK[a.phase] ?? 2) - (RANK[b.phase] ?? 2) || (b.requests_per_s ?? 0) - (a.requests_per_s ?? 0) || ka.localeCompare(kb));
  fill($("slices"), slices.length
    ? slices.map(([key, slice]) => sliceCard(key, slice, events, now, stats?.splits || {}))
    : h("p", { class: "muted" }, "No traffic yet: a slice appears with its first request."));
}

export function renderPools(pools) {
  const entries = Object.entries(pools?.pools || {});
  fill($("pools"), entries.map(([name, pool]) => {
    const scraped = pool.scraped;
    const endpoints = (pool.endpoints || []).map((e, i) => [e.url ?? String(i), Object.fromEntries(Object.entries(e).filter(([k]) => k !== "url"))]);
    return h("article", { class: "card pool", "data-pool": name },
      h("h3", null, chip(pool.healthy === false ? "unhealthy" : "healthy"), " ", name),
      h("p", { class: "meta" },
        h("span", null, pool.kind), h("span", null, `model ${pool.model}`),
        pool.num_speculative_tokens ? h("span", null, `k=${pool.num_speculative_tokens}`) : null,
        pool.kind === "speculative" ? h("span", null, scraped ? `scraped acceptance ${num(scraped.acceptance)} (${num(scraped.draft_tokens)} draft tokens)` : "no scraped counters yet") : null),
      endpoints.length ? table(endpoints, [], "endpoint") : h("p", { class: "muted" }, "No endpoints."),
      extras(pool, ["kind", "model", "num_speculative_tokens", "healthy", "endpoints", "scraped"]));
  }));
}
