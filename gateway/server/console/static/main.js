// Sign-in, the three views, and polling the admin API every two seconds while signed in.
import { call, signIn, signOut, signedIn, whenRejected } from "./api.js";
import { setupDialog } from "./dialog.js";
import { $, clock, fill } from "./dom.js";
import { renderAudit, renderFlags, renderKill, whenChanged } from "./flags.js";
import { renderPools, renderSlices } from "./live.js";
import { renderPolicy, setupPolicy, whenApplied } from "./policy.js";

const VIEWS = ["live", "flags", "policy"];
const POLL_MS = 2000;
const DATA = ["slices", "pools", "killcard", "flaglist", "audit", "running", "problems", "explained"];
let timer = null;
let round = 0;

function view() {
  const wanted = location.hash.slice(1);
  return VIEWS.includes(wanted) ? wanted : "live";
}

function showView() {
  const inside = signedIn();
  for (const v of VIEWS) $(v).hidden = !inside || v !== view();
  for (const a of $("tabs").querySelectorAll("a")) {
    if (a.getAttribute("href") === `#${view()}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  $("login").hidden = inside;
  $("tabs").hidden = $("signout").hidden = !inside;
  if (!inside) $("kill").hidden = true;
}

function status(text, bad) {
  fill($("status"), text);
  $("status").className = bad ? "error" : "muted";
}

// What each view needs, fetched together; the flags always (the kill switch is in the header).
function fetches(v) {
  const work = [call("GET", "flags").then((f) => {
    renderKill(f.flags);
    if (v === "flags") renderFlags(f.flags);
  })];
  if (v === "live") {
    work.push(Promise.all([call("GET", "stats"), call("GET", "guardrail"), call("GET", "pools")])
      .then(([stats, guardrail, pools]) => {
        renderSlices(stats, guardrail);
        renderPools(pools);
      }));
  }
  if (v === "flags") work.push(call("GET", "audit?limit=50").then((a) => renderAudit(a.audit)));
  if (v === "policy" && round % 3 === 0) {
    work.push(Promise.all([call("GET", "policy/source"), call("GET", "policy")])
      .then(([source, policy]) => renderPolicy(source, policy)));
  }
  return work;
}

async function poll() {
  clearTimeout(timer);
  if (!signedIn()) return;
  try {
    await Promise.all(fetches(view()));
    status(`updated ${clock(Date.now() / 1000)}`);
  } catch (error) {
    if (signedIn()) status(`cannot reach the admin API: ${error.message}`, true);
  }
  round += 1;
  if (signedIn()) timer = setTimeout(poll, document.hidden ? POLL_MS * 5 : POLL_MS);
}

function now() {
  round = 0;
  poll();
}

function forget(message) {
  signOut();
  clearTimeout(timer);
  for (const id of DATA) fill($(id));
  $("draft").value = "";
  if ($("dialog").open) $("dialog").close();
  fill($("login-error"), message || "");
  status("");
  showView();
}

async function submit(event) {
  event.preventDefault();
  signIn($("token").value, $("actor").value.trim());
  $("token").value = "";
  try {
    await call("GET", "flags");
  } catch (error) {
    forget(error.status === 401 || error.status === 403 ? "That token was refused." : error.message);
    return;
  }
  fill($("login-error"));
  showView();
  now();
}

function start() {
  setupDialog();
  setupPolicy();
  whenRejected(() => forget("The gateway refused the token: sign in again."));
  whenChanged(now);
  whenApplied(now);
  $("login-form").addEventListener("submit", submit);
  $("signout").addEventListener("click", () => forget());
  window.addEventListener("hashchange", () => {
    showView();
    now();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) now();
  });
  showView();
  $("token").focus();
}

start();
