"""``python -m iclprobe``: the command line (also under ``torchrun -m iclprobe``)."""

import sys

from iclprobe.cli import main

sys.exit(main())
