"""``python -m evolve``: the ``evolve`` command line (:mod:`evolve.cli.main`)."""

import sys

from evolve.cli.main import main

sys.exit(main())
