"""``python -m benchmarks``: see :mod:`benchmarks.run`."""

import sys

from .run import main

sys.exit(main())
