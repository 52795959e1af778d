"""Prompt prefixes, hashed once per request at classification (step 3): the canonical
rendering of a prompt whatever API it came by (``render``), what is normalised away
(``normalise``), and the block-hash chain and template fingerprint over it (``prints``).
Hashes only leave this package, never prompt text."""
