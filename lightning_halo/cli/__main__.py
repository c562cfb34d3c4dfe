"""``python -m lightning_halo.cli VERB ...``: the ``lightning-halo`` command."""

import sys

from lightning_halo.cli.dispatch import main

sys.exit(main())
