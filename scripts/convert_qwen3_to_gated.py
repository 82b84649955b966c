"""Convert a stock Qwen3 checkpoint into a gated one: the same as ``gated-qwen convert``.

    python scripts/convert_qwen3_to_gated.py Qwen/Qwen3-0.6B qwen3-0.6b-headwise --gate headwise
"""

import sys

from gated_qwen.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))
