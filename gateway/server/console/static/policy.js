// Policy: the running policy and its version, a draft with lint problems at their lines,
// a request explained against both, and apply through the gateway's reload path.
import { call } from "./api.js";
import { ask } from "./dialog.js";
import { $, ago, chip, clock, fill, h, show } from "./dom.js";

let source = null;
let marks = new Map();
let changed = () => {};

export function whenApplied(callback) {
  changed = callback;
}

function gutter() {
  const lines = $("draft").value.split("\n").length;
  const out = [];
  for (let i = 1; i <= lines; i++) {
    out.push(h("span", { class: marks.get(i) || null, "data-line": i }, String(i)), "\n");
  }
  fill($("gutter"), out);
  $("gutter").scrollTop = $("draft").scrollTop;
}

function jump(line, column) {
  const area = $("draft");
  const lines = area.value.split("\n");
  let at = 0;
  for (let i = 0; i < line - 1 && i < lines.length; i++) at += lines[i].length + 1;
  const end = at + (lines[line - 1] || "").length;
  area.focus();
  area.setSelectionRange(Math.min(at + Math.max(column - 1, 0), end), end);
  const height = parseFloat(getComputedStyle(area).lineHeight) || 18;
  area.scrollTop = Math.max(0, (line - 4) * height);
}

function problemItem(p) {
  return h("li", { class: p.severity, "data-line": p.line, onclick: () => jump(p.line, p.column) },
    h("b", null, `line ${p.line}, column ${p.column}`), ` ${p.severity}: `,
    h("code", null, p.path), ` ${p.message}`, p.hint ? h("span", { class: "muted" }, ` (${p.hint})`) : null);
}

function showProblems(problems, summary) {
  marks = new Map();
  for (const p of problems) if (p.severity === "error" || !marks.has(p.line)) marks.set(p.line, p.severity);
  gutter();
  fill($("problems"), h("li", { class: "summary" }, summary), problems.map(problemItem));
  $("problems").classList.remove("stale");
}

async function lintDraft() {
  const answer = await call("POST", "policy/lint", { text: $("draft").value });
  const summary = answer.errors || answer.warnings
    ? `${answer.errors} error(s), ${answer.warnings} warning(s)`
    : "No problems.";
  showProblems(answer.problems, summary);
  return answer;
}

function running(policy) {
  const s = source;
  const last = s.last_reload;
  const file = s.file || {};
  return [
    h("h2", null, "Running policy"),
    h("dl", { class: "kv" },
      h("dt", null, "version"), h("dd", { id: "version" }, h("code", null, s.version ?? "–")),
      h("dt", null, "file"), h("dd", null, s.path ?? "–"),
      h("dt", null, "last reload"), h("dd", null, last
        ? [chip(last.ok ? "ok" : "rejected"), ` ${clock(last.at)} (${ago(last.at)})`, last.errors.length ? h("ul", { class: "problems" }, last.errors.map((e) => h("li", { class: "error" }, e))) : null]
        : "none since the gateway started"),
      h("dt", null, "file on disk"), h("dd", null, file.error
        ? `cannot read: ${file.error}`
        : file.same ? "same as running" : [`differs (version ${file.version}; not running)`, " ",
            h("button", { type: "button", onclick: () => setDraft(file.text ?? "") }, "Load it into the draft")]),
      h("dt", null, "apply"), h("dd", null, s.apply?.blocked ? s.apply.blocked : "possible: drafts are written to the file and reloaded"),
      policy?.rules ? [h("dt", null, "rules"), h("dd", null, policy.rules.join(", "))] : null,
      policy?.warnings?.length ? [h("dt", null, "warnings"), h("dd", null, policy.warnings.join("\n"))] : null),
    h("details", { "data-k": "running-text" }, h("summary", null, "Running text"), h("pre", { class: "source" }, s.text ?? "")),
  ];
}

function setDraft(text) {
  $("draft").value = text;
  marks = new Map();
  fill($("problems"));
  gutter();
}

// A request body of each API to explain, until one is typed in: what the endpoint menu
// offers, the model the running policy serves in place of MODEL.
const ASK = "Extract the fields as JSON";
const FIELDS = { type: "object", properties: { name: { type: "string" } }, required: ["name"] };
const SAMPLES = {
  chat: { model: "MODEL", messages: [{ role: "user", content: ASK }], temperature: 0.1, response_format: { type: "json_object" } },
  completions: { model: "MODEL", prompt: "def add(a, b):", temperature: 0, max_tokens: 64 },
  messages: { model: "MODEL", max_tokens: 256, messages: [{ role: "user", content: ASK }], temperature: 0.1 },
  responses: { model: "MODEL", input: ASK, temperature: 0.1, text: { format: { type: "json_schema", name: "fields", schema: FIELDS } } },
};
let model = "MODEL";
let offered = "";  // the sample last put in the box: replaced when the endpoint changes

function sample(endpoint) {
  return JSON.stringify({ ...SAMPLES[endpoint], model });
}

function offer(endpoint) {
  const box = $("sample");
  if (box.value.trim() && box.value !== offered) return;  // the operator's own: kept
  box.value = offered = sample(endpoint);
}

export function renderPolicy(src, policy) {
  source = src;
  fill($("running"), running(policy));
  if (!$("draft").value) setDraft(src.text ?? "");
  const served = Object.keys(policy?.ladders || {})[0];
  if (served && model !== served) {
    model = served;
    offer($("sample-endpoint").value);
  }
}

const DECISION = ["rule", "slice", "pool", "rung", "start", "rungs", "reason", "shadow_to", "probe", "flags"];

function side(title, answer, other) {
  if (!answer) return h("div", { class: "card side" }, h("h3", null, title), h("p", { class: "muted" }, "No draft."));
  if (answer.problems) {
    return h("div", { class: "card side" }, h("h3", null, title),
      h("p", { class: "error" }, `The draft does not load: ${answer.problems.length} error(s). Lint it.`));
  }
  return h("div", { class: "card side", "data-side": title.toLowerCase() }, h("h3", null, title),
    h("dl", { class: "kv" }, DECISION.filter((k) => k in answer).map((k) => {
      const differs = other && !other.problems && show(other[k]) !== show(answer[k]);
      return [h("dt", null, k), h("dd", { class: differs ? "differs" : null, "data-key": k }, show(answer[k]))];
    })),
    h("details", null, h("summary", null, "Rules tried"),
      h("ol", { class: "events" }, (answer.rules || []).map((r) => h("li", null, chip(r.matched ? "match" : "no"), ` ${r.rule}: ${r.why}`)))),
    h("details", null, h("summary", null, "Features"), h("dl", { class: "kv" },
      Object.entries(answer.features || {}).map(([k, v]) => [h("dt", null, k), h("dd", null, show(v))]))));
}

async function explainBoth() {
  let request;
  let headers;
  try {
    request = JSON.parse($("sample").value);
    headers = JSON.parse($("sample-headers").value || "{}");
  } catch (error) {
    fill($("explained"), h("p", { class: "error" }, `Not JSON: ${error.message}`));
    return;
  }
  const draft = $("draft").value.trim() ? $("draft").value : null;
  const answer = await call("POST", "policy/explain", { request, headers, endpoint: $("sample-endpoint").value, draft });
  fill($("explained"), side("Running", answer.running, answer.draft), side("Draft", answer.draft, answer.running));
}

async function apply() {
  const text = $("draft").value;
  const base = source?.file?.version ?? null;
  const preview = await call("POST", "policy/apply", { text, base_version: base, dry_run: true });
  const errors = preview.problems.filter((p) => p.severity === "error");
  ask({
    title: "Apply the draft",
    body: h("div", null,
      h("p", null, `Writes the draft (version ${preview.version}) over ${source?.path ?? "the policy file"} and reloads it, as a changed file is.`),
      preview.blocked ? h("p", { class: "error" }, `Cannot apply here: ${preview.blocked}. Copy the draft to where the file comes from instead.`) : null,
      errors.length ? h("p", { class: "error" }, `The draft has ${errors.length} error(s): lint it first.`) : null),
    changes: () => [],
    preview: () => preview.diff ? h("pre", { class: "diff" }, preview.diff.split("\n").map((line) =>
      h("span", { class: line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : null }, line + "\n"))) : h("p", { class: "muted" }, "The draft is the file as it is."),
    blocked: () => Boolean(preview.blocked) || errors.length > 0 || !preview.diff,
    ok: "Apply and reload",
    apply: async (reason) => {
      const done = await call("POST", "policy/apply", { text, base_version: base, reason });
      fill($("problems"), h("li", { class: "summary" }, `Applied version ${done.version}; reload ${done.reloaded ? "ok" : "rejected"}.`));
      changed();
    },
  });
}

function guard(action) {
  return async () => {
    try {
      await action();
    } catch (error) {
      fill($("problems"), h("li", { class: "error" }, error.message));
    }
  };
}

export function setupPolicy() {
  $("draft").addEventListener("input", () => {
    marks = new Map();
    gutter();
    $("problems").classList.add("stale");
  });
  $("draft").addEventListener("scroll", () => { $("gutter").scrollTop = $("draft").scrollTop; });
  $("from-running").addEventListener("click", () => setDraft(source?.text ?? ""));
  $("lint").addEventListener("click", guard(lintDraft));
  $("explain").addEventListener("click", guard(explainBoth));
  $("sample-endpoint").addEventListener("change", () => offer($("sample-endpoint").value));
  offer($("sample-endpoint").value);
  $("apply").addEventListener("click", guard(apply));
  gutter();
}
