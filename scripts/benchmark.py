#!/usr/bin/env python
"""Benchmark the gate: the same as ``gated-qwen bench`` (see ``--help``).

    python scripts/benchmark.py --threads 2 --output-dir benchmark-results
"""

import sys

from gated_qwen.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
