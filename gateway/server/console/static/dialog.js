// The one way the console changes anything: a dialog that shows what will change, asks for
// a reason, and only then calls the API.
import { $, fill, h } from "./dom.js";

let current = null;

function refresh() {
  if (!current) return;
  const changes = current.changes();
  const list = changes.length
    ? h("ul", { class: "changes" }, changes.map(([what, before, after]) =>
        h("li", null, h("b", null, what), ": ", h("del", null, before), " → ", h("ins", null, after))))
    : h("p", { class: "muted" }, current.nothing || "Nothing changes yet.");
  fill($("dialog-changes"), current.preview ? current.preview() : list);
  const reason = $("dialog-reason").value.trim();
  $("dialog-ok").disabled = !reason || (!changes.length && !current.preview) || Boolean(current.blocked?.());
  $("dialog-extra").disabled = !reason;
}

async function run(action) {
  const reason = $("dialog-reason").value.trim();
  $("dialog-ok").disabled = $("dialog-extra").disabled = true;
  try {
    await action(reason);
    close();
  } catch (error) {
    fill($("dialog-error"), error.message);
    refresh();
  }
}

function close() {
  current = null;
  $("dialog").close();
}

// spec: {title, body, changes() -> [[what, before, after]], ok, apply(reason),
//        extra?: {label, apply(reason)}, preview?() -> Node, blocked?() -> bool, nothing?}
export function ask(spec) {
  current = spec;
  fill($("dialog-title"), spec.title);
  fill($("dialog-body"), spec.body || []);
  fill($("dialog-error"));
  $("dialog-reason").value = "";
  fill($("dialog-ok"), spec.ok || "Apply");
  $("dialog-ok").className = spec.danger ? "danger" : "primary";
  $("dialog-ok").onclick = () => run(spec.apply);
  $("dialog-extra").hidden = !spec.extra;
  if (spec.extra) {
    fill($("dialog-extra"), spec.extra.label);
    $("dialog-extra").onclick = () => run(spec.extra.apply);
  }
  $("dialog").showModal();
  refresh();
  $("dialog-reason").focus();
}

export function setupDialog() {
  $("dialog").addEventListener("input", refresh);
  $("dialog").addEventListener("change", refresh);
  $("dialog").addEventListener("close", () => { current = null; });
  $("dialog-form").addEventListener("submit", (event) => event.preventDefault());
  $("dialog-cancel").addEventListener("click", close);
}

export { refresh as refreshDialog };
