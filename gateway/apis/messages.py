"""Anthropic's Messages, ``POST /v1/messages`` (and, for its error shape, every route under
it, such as ``count_tokens``): a body of ``MessagesRequest``, answers read by the Messages
dialect (``gateway/measure/messages.py``), errors in Anthropic's shape. Its stream opens with
``message_start`` (and ``ping``) before the engine's first output and is relayed event by
event as it came, to ``message_stop``; a non-streaming request goes upstream whole."""

from backends.upstream import Opening
from gateway.apis.api import Api
from gateway.measure.messages import MESSAGES
from gateway.schema import MessagesRequest

API = Api(
    name="messages",
    path="/v1/messages",
    operation="chat",
    shape="anthropic",
    model=MessagesRequest,
    dialect=MESSAGES,
    opening=Opening(events=True, preludes=frozenset({"message_start", "ping"})),
)
