"""``python -m runtimeproxy.hooks.plugins.network``: see :func:`.cli.main`."""

import sys

from .cli import main

sys.exit(main())
