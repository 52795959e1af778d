"""Per-request CPU of the maintained ASGI instrumentation around a streaming ASGI app (20
body chunks, like a short chat stream), called in-process: bare app, the middleware with the
API's no-op tracer (no SDK), and with the SDK recording spans that nothing exports. Not a
speclane dependency; in a scratch venv:

    python -m venv /tmp/asgi && /tmp/asgi/bin/pip install opentelemetry-instrumentation-asgi \
        opentelemetry-sdk starlette
    /tmp/asgi/bin/python bench/asgi_instrumentation.py
"""

import asyncio
import time

from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NoOpTracerProvider

CHUNKS = [b"data: " + b"x" * 180 + b"\n\n"] * 20


async def app(scope, receive, send):
    await receive()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    for c in CHUNKS:
        await send({"type": "http.response.body", "body": c, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


SCOPE = {
    "type": "http",
    "http_version": "1.1",
    "method": "POST",
    "path": "/v1/chat/completions",
    "raw_path": b"/v1/chat/completions",
    "query_string": b"",
    "root_path": "",
    "scheme": "http",
    "server": ("127.0.0.1", 8080),
    "client": ("127.0.0.1", 5555),
    "headers": [
        (b"host", b"h"),
        (b"content-type", b"application/json"),
        (b"content-length", b"50"),
        (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ],
}


async def receive():
    return {"type": "http.request", "body": b"{}", "more_body": False}


async def send(message):
    pass


async def run(asgi, n):
    t = time.process_time()
    for _ in range(n):
        await asgi(dict(SCOPE), receive, send)
    return (time.process_time() - t) / n * 1e6


async def main():
    n = 5000
    bare = min([await run(app, n) for _ in range(3)])
    noop = OpenTelemetryMiddleware(app, tracer_provider=NoOpTracerProvider())
    sdk = OpenTelemetryMiddleware(app, tracer_provider=TracerProvider())
    sdk_quiet = OpenTelemetryMiddleware(
        app, tracer_provider=TracerProvider(), exclude_spans=["receive", "send"]
    )
    print(f"bare app: {bare:.1f} us/request")
    for name, asgi in (
        ("middleware, no-op tracer", noop),
        ("middleware, SDK spans", sdk),
        ("middleware, SDK, no send/receive spans", sdk_quiet),
    ):
        cost = min([await run(asgi, n) for _ in range(3)])
        print(f"{name}: {cost:.1f} us/request (+{cost - bare:.1f})")


asyncio.run(main())
