"""``python -m gateway`` is the ``speclane`` command."""

import sys

from gateway.cli import main

sys.exit(main())
