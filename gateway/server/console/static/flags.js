// Flags: the kill switch, each flag's state, rollout and tenants, editing, the audit log.
import { call } from "./api.js";
import { ask } from "./dialog.js";
import { $, ago, chip, clock, extras, fill, h, show } from "./dom.js";

const KILL = "speculation";
let changed = () => {};

export function whenChanged(callback) {
  changed = callback;
}

function tenants(list) {
  return list === null || list === undefined ? "all tenants" : list.length ? list.join(", ") : "none";
}

export function words(flag) {
  if (!flag) return "–";
  if (!flag.enabled) return "off";
  const parts = ["on"];
  if (flag.rollout !== null && flag.rollout !== undefined) parts.push(`for ${show(flag.rollout)}%`);
  const t = flag.tenants || {};
  if (t.allow) parts.push(`for tenants ${tenants(t.allow)}`);
  if (t.deny && t.deny.length) parts.push(`not for ${t.deny.join(", ")}`);
  return parts.join(" ");
}

function list(text) {
  return text.split(",").map((s) => s.trim()).filter(Boolean);
}

function edit(flag, preset) {
  const t = flag.tenants || { allow: null, deny: [] };
  const enabled = h("input", { type: "checkbox", checked: preset?.enabled ?? flag.enabled });
  const rollout = h("input", { type: "number", min: 0, max: 100, step: "any", placeholder: "everyone", value: flag.rollout ?? "" });
  const allow = h("input", { placeholder: "every tenant", value: t.allow ? t.allow.join(", ") : "" });
  const deny = h("input", { placeholder: "none", value: (t.deny || []).join(", ") });
  const wanted = () => ({
    enabled: enabled.checked,
    rollout: rollout.value === "" ? null : Number(rollout.value),
    tenants: { allow: allow.value.trim() ? list(allow.value) : null, deny: list(deny.value) },
  });
  const changes = () => {
    const w = wanted();
    const out = [];
    if (w.enabled !== flag.enabled) out.push(["state", flag.enabled ? "on" : "off", w.enabled ? "on" : "off"]);
    if (w.rollout !== (flag.rollout ?? null)) out.push(["rollout", flag.rollout === null ? "everyone" : `${show(flag.rollout)}%`, w.rollout === null ? "everyone" : `${show(w.rollout)}%`]);
    if (tenants(w.tenants.allow) !== tenants(t.allow)) out.push(["allowed tenants", tenants(t.allow), tenants(w.tenants.allow)]);
    if (w.tenants.deny.join() !== (t.deny || []).join()) out.push(["denied tenants", tenants(t.deny), tenants(w.tenants.deny)]);
    return out;
  };
  const kill = flag.name === KILL;
  ask({
    title: kill ? "Kill switch: speculation for all traffic" : `Flag ${flag.name}`,
    body: h("div", { class: "fields" },
      h("label", { class: "check" }, enabled, kill ? " speculation on (off sends every request to standard pools)" : " on"),
      h("label", null, "Rollout % (empty: everyone)", rollout),
      h("label", null, "Only these tenants (comma-separated; empty: all)", allow),
      h("label", null, "Never these tenants", deny)),
    changes,
    danger: kill && !wanted().enabled,
    ok: "Apply",
    apply: async (reason) => {
      await call("PUT", `flags/${encodeURIComponent(flag.name)}`, { ...wanted(), reason });
      changed();
    },
    extra: flag.source === "ops" ? {
      label: "Back to the policy's default",
      apply: async (reason) => {
        await call("DELETE", `flags/${encodeURIComponent(flag.name)}?reason=${encodeURIComponent(reason)}`);
        changed();
      },
    } : null,
  });
}

export function renderKill(flags) {
  const flag = flags.find((f) => f.name === KILL) || { name: KILL, enabled: true, tenants: {} };
  const off = !flag.enabled;
  const button = $("kill");
  button.hidden = false;
  button.className = off ? "kill off" : "kill";
  fill(button, off ? "Speculation OFF: all traffic on standard" : `Speculation ${words(flag)}`);
  button.onclick = () => edit(flag, { enabled: !flag.enabled });
  fill($("killcard"),
    h("h2", null, "Kill switch"),
    h("p", { class: off ? "big off" : "big" }, off ? "Speculation is OFF: every request goes to a standard pool." : `Speculation is ${words(flag)}.`),
    h("button", { type: "button", class: off ? "primary" : "danger", onclick: () => edit(flag, { enabled: !flag.enabled }) },
      off ? "Turn speculation back on…" : "Turn speculation off…"));
}

export function renderFlags(flags) {
  fill($("flaglist"), flags.filter((f) => f.name !== KILL).map((flag) =>
    h("article", { class: "card flag", "data-flag": flag.name },
      h("h3", null, flag.name, " ", chip(flag.enabled ? "on" : "off"), " ", h("span", { class: "muted" }, flag.source)),
      flag.description ? h("p", null, flag.description) : null,
      h("dl", { class: "kv" },
        h("dt", null, "state"), h("dd", null, words(flag)),
        h("dt", null, "rollout"), h("dd", null, flag.rollout === null || flag.rollout === undefined ? "everyone" : `${show(flag.rollout)}%`),
        h("dt", null, "tenants allowed"), h("dd", null, tenants(flag.tenants?.allow)),
        h("dt", null, "tenants denied"), h("dd", null, tenants(flag.tenants?.deny)),
        h("dt", null, "rules"), h("dd", null, show(flag.rules))),
      extras(flag, ["name", "enabled", "rollout", "tenants", "source", "description", "rules"]),
      h("button", { type: "button", onclick: () => edit(flag) }, "Change…"))));
}

export function renderAudit(entries) {
  const rows = [...entries].sort((a, b) => b.at - a.at).map((e) =>
    h("tr", null,
      h("td", { title: ago(e.at) }, clock(e.at)),
      h("td", null, e.who),
      h("td", null, e.flag),
      e.policy ? h("td", null, "policy applied: ", e.policy)
        : h("td", null, e.old ? words(e.old) : "policy default", " → ", e.new ? words(e.new) : "policy default"),
      h("td", null, e.reason || "–")));
  fill($("audit"),
    h("thead", null, h("tr", null, ["when", "who", "flag", "change", "reason"].map((c) => h("th", null, c)))),
    h("tbody", null, rows.length ? rows : h("tr", null, h("td", { colspan: 5, class: "muted" }, "No changes yet."))));
}
