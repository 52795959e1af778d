"""``python -m gateway`` is the ``speclane`` command."""

import sys

from gateway.cli.main import main

sys.exit(main())
