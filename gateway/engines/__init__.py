"""The serving engines speclane knows, one module each, and the one registry of them.

Each module (``vllm.py``, ``neuron.py``, ``sglang.py``, ``trtllm.py``) makes one ``Engine``
(``engine.py``): the fields a request to it adds, how its answers say their speculation,
whether an answer assembled from its stream is faithful, how its pages show speculation
and load, and how ``speclane init`` recognises it. ``ENGINES`` lists them; a pool's
``engine`` names one, and the request path (``gateway/pipeline.py``), the relay, the
measurement, the scrapers and ``init`` ask it, never the engine's name. An engine is thus
one axis and an API (``gateway/apis/``) the other: every API's answers are measured the
way their engine says. A new engine is one more module and one more row here.

The first row is the engine an OpenAI-compatible server that no other engine recognises
is taken for (``speclane init``).
"""

from __future__ import annotations

from gateway.engines import neuron, sglang, trtllm, vllm
from gateway.engines.engine import Engine, Evidence, Gauges, Registry, Said, Timings

ENGINES = Registry(
    (
        vllm.ENGINE,
        neuron.ENGINE,
        sglang.ENGINE,
        trtllm.ENGINE,
    )
)

__all__ = ["ENGINES", "Engine", "Evidence", "Gauges", "Registry", "Said", "Timings"]
