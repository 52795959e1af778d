"""The HTTP surface: the app factory, the routes, the admin API, and steps 1 and 8 of a
request (bytes in, SSE or JSON out)."""
