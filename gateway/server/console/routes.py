"""The ops console's routes: the page's shell and its static files, nothing else.

The shell (HTML, CSS, JavaScript modules, the same bytes as in the package) holds no data:
everything it shows it fetches from ``/admin`` with the token the operator types, which it
keeps in memory for the tab. So the console needs no auth of its own, and is served only
when the admin API is on (``SPECLANE_ADMIN_TOKEN`` set) and ``SPECLANE_CONSOLE`` is not
false. Every answer carries a strict Content-Security-Policy: scripts, styles and fetches
from this origin only, no inline code, no framing, no form posts, and Trusted Types
required, so the page cannot turn text it shows into markup.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    ]
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "cache-control": "no-cache",
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def assets() -> dict[str, Asset]:
    """Every file of ``static/`` by name, read once from the installed package."""
    out = {}
    for item in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + item.name.rsplit(".", 1)[-1]
        if item.is_file() and suffix in _TYPES:
            body = item.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            out[item.name] = Asset(body, _TYPES[suffix], etag)
    return out


def console_routes() -> list[Route]:
    files = assets()

    def serve(asset: Asset, request: Request) -> Response:
        if request.headers.get("if-none-match") == asset.etag:
            return Response(status_code=304, headers={**HEADERS, "etag": asset.etag})
        headers = {**HEADERS, "etag": asset.etag}
        return Response(asset.body, media_type=asset.media_type, headers=headers)

    async def shell(request: Request) -> Response:
        return serve(files["index.html"], request)

    async def static(request: Request) -> Response:
        asset = files.get(request.path_params["name"])
        if asset is None or request.path_params["name"] == "index.html":
            return Response("not found", 404, headers=HEADERS, media_type="text/plain")
        return serve(asset, request)

    async def slash(request: Request) -> Response:
        return RedirectResponse("console/", 308, headers=HEADERS)

    return [
        Route("/console", slash, methods=["GET"]),
        Route("/console/", shell, methods=["GET"]),
        Route("/console/static/{name}", static, methods=["GET"]),
    ]


def console_off_routes(admin_api: bool) -> list[Route]:
    """Where the console would be, when it is off: a 404 that says why and how to turn it on
    (``admin_api``: the admin API is on, so ``SPECLANE_CONSOLE=false`` turned it off)."""
    if admin_api:
        why = "it is turned off (SPECLANE_CONSOLE=false); unset it to serve the console"
    else:
        why = (
            "the admin API is disabled. Set SPECLANE_ADMIN_TOKEN to turn on both; "
            "the console asks for that token when it opens"
        )
    text = f"speclane's ops console is off: {why}.\n"

    async def off(request: Request) -> Response:
        return Response(text, 404, headers=HEADERS, media_type="text/plain")

    return [Route("/console", off, methods=["GET"]), Route("/console/{rest:path}", off)]
