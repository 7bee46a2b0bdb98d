"""``python -m slurmfm.job`` (development); the zipapp has its own ``__main__.py``."""

import sys

from .cli import main

sys.exit(main())
