"""State that outlives a request: the running policy, flags with their audit log, and the
store that shares them and the guardrail's states between replicas (memory or Redis)."""
