#!/usr/bin/env python
"""Complete prompts with a Qwen3Gated model; the same as ``gated-qwen generate`` (see its --help).

    python scripts/generate.py --model QwQZh/gated_attention --subfolder 1B_gate_headwise "The gate"
"""

import sys

from gated_qwen.cli import main

if __name__ == "__main__":
    sys.exit(main(["generate", *sys.argv[1:]]))
