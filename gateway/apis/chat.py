"""OpenAI's chat completions, ``POST /v1/chat/completions``: a body of ``messages``
(``ChatRequest``), answers read by the completions dialect, a stream of data chunks ended by
``[DONE]``, relayed chunk by chunk and assembled into a chat body for a non-streaming client
of a pool that streams only."""

from gateway.apis.api import Api
from gateway.measure.completions import COMPLETIONS
from gateway.schema import ChatRequest

API = Api(
    name="chat",
    path="/v1/chat/completions",
    operation="chat",
    shape="openai",
    model=ChatRequest,
    dialect=COMPLETIONS,
    assemble="chat",
)
