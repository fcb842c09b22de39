"""``python -m quotaledger.adapters.cli``: the console script, run as a module."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
