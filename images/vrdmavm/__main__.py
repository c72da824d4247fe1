"""`python3 images/vrdmavm ARGS` or `python3 -m vrdmavm ARGS` (images/ on sys.path)."""

import os
import sys

if not __package__:
    # Run as a directory: its parent (images/) makes the package importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vrdmavm.cli import main  # noqa: E402

sys.exit(main())
