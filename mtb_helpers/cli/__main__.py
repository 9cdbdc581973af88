"""``python -m mtb_helpers.cli ...``: the minitrainbench command, e.g. under
``torchrun --standalone --nproc-per-node=2 -m mtb_helpers.cli tp check``."""
import sys

from mtb_helpers.cli import main

sys.exit(main())
