"""The ``speclane`` command line: ``serve``, ``policy``, ``flags``, ``sim`` and ``demo``."""
