"""Small trained models shipped inside the package (see the model card in each folder).

``headwise/`` is the embedded default of ``gated-qwen generate``; ``baseline/`` is its matched
no-gate arm (same size, data, seed and token budget).
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODELS_DIR = Path(__file__).parent
DEFAULT_MODEL_NAME = "headwise"


def default_model_path(name: str = DEFAULT_MODEL_NAME) -> Path | None:
    """The folder of a shipped model, or None when this install has none of that name.

    >>> default_model_path() is None or (default_model_path() / "config.json").is_file()
    True
    """
    folder = DEFAULT_MODELS_DIR / name
    return folder if (folder / "config.json").is_file() else None
