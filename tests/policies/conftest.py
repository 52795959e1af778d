"""Shared policy text for the policy tests."""

from __future__ import annotations

import pytest

POLICY = """\
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ['http://s:8000']}
  standard: {kind: standard, model: m, endpoints: ['http://d:8000']}
ladder: [spec, standard]
rules:
- name: json
  match: {response_format: [json_object, json_schema], temperature: {max: 0.3}}
  start: spec
- name: long
  match: {context_tokens: {min: 16000}}
  start: standard
- name: default
  start: spec
"""


@pytest.fixture
def policy_text() -> str:
    """A one-model policy that lints clean; ``start: standard`` is on line 12."""
    return POLICY
