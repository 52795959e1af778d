"""OpenAI's Responses, ``POST /v1/responses``: a body of ``ResponsesRequest`` (its output
bounded by ``max_output_tokens``), answers read by the Responses dialect
(``gateway/measure/responses.py``), errors in OpenAI's shape with the Responses API's own
error event. Its stream opens with ``response.created`` and ``response.in_progress`` before
the engine's first output and is relayed event by event as it came; a non-streaming request
goes upstream whole. Its answers are stored upstream: each is pinned to the endpoint that
made it, and a request that continues one (``previous_response_id``) goes there."""

from backends.upstream import Opening
from gateway.apis.api import Api
from gateway.measure.responses import RESPONSES
from gateway.schema import ResponsesRequest

API = Api(
    name="responses",
    path="/v1/responses",
    operation="chat",
    shape="responses",
    model=ResponsesRequest,
    dialect=RESPONSES,
    opening=Opening(events=True, preludes=frozenset({"response.created", "response.in_progress"})),
    limit="max_output_tokens",
    stores=True,
)
