"""A simulated vLLM: an OpenAI-compatible server with a speculative or standard engine model.

``model`` (acceptance, cost model) and ``workload`` (request kinds) are pure; ``engine`` runs
continuous batching in real time and ``virtual`` in virtual time; ``server`` is the Starlette
app (``create_app``, ``serve``); ``cli`` is the ``sim`` sub-command. Imports nothing from
``gateway/`` or ``policies/``.
"""
