"""The registry of the APIs served: every lookup by path or name comes from it."""

from __future__ import annotations

import dataclasses

import pytest

from backends.upstream import Opening
from gateway.apis import APIS, CHOICES, api_of, named, shape_of
from gateway.apis.chat import API as CHAT
from gateway.apis.messages import API as MESSAGES
from gateway.apis.responses import API as RESPONSES
from policies.features import API_NAMES


def test_policy_lint_knows_every_api_served():
    """``policies/`` may not import the registry: its list of names must match it."""
    assert {api.name: api.path for api in APIS} == {k: v.value for k, v in API_NAMES.items()}


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/chat/completions", "openai"),
        ("/v1/completions", "openai"),
        ("/v1/messages", "anthropic"),
        ("/v1/messages/count_tokens", "anthropic"),
        ("/v1/responses", "responses"),
        ("/v1/responses/resp_1/cancel", "responses"),
        ("/v1/messagesx", "openai"),
        ("/tokenize", "openai"),
    ],
)
def test_every_path_has_the_error_shape_of_the_api_it_is_under(path, shape):
    assert shape_of(path) == shape


def test_names_and_paths_name_the_same_api():
    assert [api_of(api.path) for api in APIS] == ["chat", "completions", "messages", "responses"]
    assert api_of("/v1/embeddings") == ""
    assert named("messages") is named("/v1/messages") is MESSAGES
    assert CHOICES[:2] == ("chat", "/v1/chat/completions")
    with pytest.raises(ValueError, match="give one of chat, /v1/chat/completions"):
        named("/v1/echo")


def test_what_differs_by_api_is_its_values():
    assert [api.events for api in APIS] == [False, False, True, True]
    assert [api.assemble for api in APIS] == ["chat", "text", None, None]
    assert [api.stores for api in APIS] == [False, False, False, True]
    assert RESPONSES.limit == "max_output_tokens" and CHAT.limit == "max_tokens"
    assert "message_start" in MESSAGES.opening.preludes
    assert "message_start" not in RESPONSES.opening.preludes


def test_a_registry_and_an_api_refuse_what_cannot_be_served():
    echo = dataclasses.replace(CHAT, name="echo", path="/v1/echo")
    assert len(APIS.plus(echo)) == 5 and APIS.plus(echo).at("/v1/echo") is echo
    assert APIS.at("/v1/echo") is None  # the built-in registry is unchanged
    with pytest.raises(ValueError, match="share a path or a name"):
        APIS.plus(dataclasses.replace(echo, path=CHAT.path))
    with pytest.raises(ValueError, match="disagree on events"):
        dataclasses.replace(CHAT, opening=Opening(events=True))
    with pytest.raises(ValueError, match="never assembled"):
        dataclasses.replace(MESSAGES, assemble="chat")
