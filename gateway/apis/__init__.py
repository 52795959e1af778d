"""The APIs speclane serves, one module each, and the one registry of them.

Each module (``chat.py``, ``completions.py``, ``messages.py``, ``responses.py``) makes one
``Api`` (``api.py``): its path, name, operation and error shape; its request model and
dialect; how its stream opens and is relayed; whether its answers are stored. ``APIS``
lists them; the routes and the fast lane (``gateway/server/app.py``) and every lookup by
path or name (``api_of``, ``shape_of``, ``named``; the pipeline's and the shadow
mirrors' own) are made from it. A new API is one more module and one more row here.

Both explain forms (``speclane policy explain --endpoint`` and ``POST
/admin/policy/explain``'s ``endpoint``) take either the short name (``chat``) or the path
(``/v1/chat/completions``) through ``named``.
"""

from __future__ import annotations

from gateway.apis import chat, completions, messages, responses
from gateway.apis.api import Api, Registry

APIS = Registry(
    (
        chat.API,
        completions.API,
        messages.API,
        responses.API,
    )
)
CHOICES = APIS.choices
api_of = APIS.name_of
shape_of = APIS.shape_of
named = APIS.named

__all__ = ["APIS", "CHOICES", "Api", "Registry", "api_of", "named", "shape_of"]
