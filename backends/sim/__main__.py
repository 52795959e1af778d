"""``python -m backends.sim``: the ``sim`` sub-command on its own."""

from __future__ import annotations

import logging

from backends.sim.cli import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    raise SystemExit(main())
