"""Measurement: steps 6 and 7 of a request (outcomes, windows, the guardrail's evidence),
the pools' scraped counters, and the metrics and spans operators read."""
