"""OpenAI's text completions, ``POST /v1/completions``: a body with a ``prompt``
(``CompletionRequest``), answers read by the completions dialect, a stream of data chunks
ended by ``[DONE]``, relayed chunk by chunk and assembled into a text completion for a
non-streaming client of a pool that streams only."""

from gateway.apis.api import Api
from gateway.measure.completions import COMPLETIONS
from gateway.schema import CompletionRequest

API = Api(
    name="completions",
    path="/v1/completions",
    operation="text_completion",
    shape="openai",
    model=CompletionRequest,
    dialect=COMPLETIONS,
    assemble="text",
)
