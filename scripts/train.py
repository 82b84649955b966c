"""Train a Qwen3Gated model from scratch: the same as ``gated-qwen train`` (see ``--help``)."""

import sys

from gated_qwen.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
