"""``python -m gated_qwen`` is the ``gated-qwen`` command."""

import sys

from .cli import main


sys.exit(main())
