"""``speclane local-vllm``: a real vLLM stack (CPU build, tiny local models) on loopback.

``install`` puts vLLM's CPU build into its own cached venv, ``models`` builds the tiny target
and draft models with ``tinymodels.py`` (run by that venv's Python), ``servers`` starts,
watches and stops the vLLM servers, ``stackfile`` is the state file and policy that ``up``
writes and ``status``/``down`` read, ``record`` captures real responses as test fixtures,
and ``command`` is the sub-command that ties them together.
"""
