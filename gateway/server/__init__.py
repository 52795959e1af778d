"""The HTTP surface: the app factory, the routes (step 1: bytes in) and the admin API. What
goes upstream and comes back is ``gateway/forward/``'s."""
