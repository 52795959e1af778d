"""The ops console: a static page at ``/console`` that runs on the admin API alone."""
