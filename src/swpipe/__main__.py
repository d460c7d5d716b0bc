"""``python -m swpipe``: the ``swpipe`` command without the console script (same arguments)."""

import sys

from swpipe.cli import main

if __name__ == "__main__":
    sys.exit(main())
