// The admin API client. The token lives in this module's memory only: never in cookies,
// localStorage or sessionStorage, so closing or reloading the tab forgets it.
let token = null;
let actor = "console";
let onRejected = () => {};

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || null;
    this.body = body;
  }
}

export function signIn(newToken, name) {
  token = newToken;
  // a header value is Latin-1 only: anything else would make every fetch throw
  const plain = (name || "").replace(/[^\x20-\x7e\xa0-\xff]/g, "?");
  actor = plain ? `${plain} (console)` : "console";
}

export function signOut() {
  token = null;
}

export function signedIn() {
  return token !== null;
}

export function whenRejected(callback) {
  onRejected = callback;
}

// One admin call; relative to the page, so a proxy may mount the gateway under a prefix.
export async function call(method, path, body) {
  if (token === null) throw new ApiError(401, null);
  const headers = { authorization: `Bearer ${token}`, "x-speclane-actor": actor };
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(new URL(`../admin/${path}`, location.href), init);
  const text = await response.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = { error: { message: text.slice(0, 200) } };
  }
  const code = parsed?.error?.code;
  if (response.status === 401 || code === "forbidden" || code === "admin_disabled") {
    token = null;
    onRejected(new ApiError(response.status, parsed));
  }
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}
