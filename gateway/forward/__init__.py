"""Forwarding: steps 5 and 8 of a request between the pools and the client. Whether a
non-streaming request passes through, the SSE relay, JSON assembly, the answer's headers
and its sending, and shadow mirrors. Never imports ``gateway/server/``."""
