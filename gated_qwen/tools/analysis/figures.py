"""PNG figures of the instruments' results (matplotlib, the optional extra ``plot``):
:func:`plot_attention_maps`, :func:`plot_gate_histograms`, :func:`plot_first_token_attention`.
"""

from __future__ import annotations

import math

import torch

from ...errors import GatedQwenError


FIGURE_DPI = 100


def _pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise GatedQwenError("figures need matplotlib: pip install 'gated-qwen[plot]' (or skip figures)") from error
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path) -> None:
    # no bbox_inches="tight": the PNG keeps the pixel size figsize * dpi
    figure.savefig(path, dpi=FIGURE_DPI)
    figure.clf()
    _pyplot().close(figure)


def plot_attention_maps(
    maps: dict[str, dict[int, torch.Tensor]], tokens: dict[str, list[str]], path
) -> tuple[int, int]:
    """One heat map per model (rows) and layer (columns), averaged over heads, tokens on both axes; returns (width, height) px.

    Not run as a test (it needs matplotlib, the ``plot`` extra, which the tests may lack):

    >>> plot_attention_maps({"headwise": {0: map0}}, {"headwise": ["The", " fox"]}, "maps.png")  # doctest: +SKIP
    (400, 400)
    """
    plt = _pyplot()
    rows, columns = len(maps), max(len(layer_maps) for layer_maps in maps.values())
    size = (4 * columns, 4 * rows)
    figure, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
    for row, (label, layer_maps) in enumerate(maps.items()):
        for column, (layer, attention) in enumerate(sorted(layer_maps.items())):
            axis = axes[row][column]
            axis.imshow(attention.numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            names = [token.replace("\n", "\\n") for token in tokens[label]]
            step = math.ceil(len(names) / 48)  # at most 48 labels per axis stay legible
            positions = range(0, len(names), step)
            axis.set_xticks(positions, names[::step], rotation=90, fontsize=5)
            axis.set_yticks(positions, names[::step], fontsize=5)
            axis.set_xlabel("key", fontsize=8)
            axis.set_ylabel("query", fontsize=8)
            axis.set_title(f"{label}: layer {layer}", fontsize=9)
    figure.tight_layout()
    _save(figure, path)
    return size[0] * FIGURE_DPI, size[1] * FIGURE_DPI


def plot_gate_histograms(histograms: dict[str, list[list[int]]], path) -> tuple[int, int]:
    """Gate histograms per layer (one panel each), one bar series per gated model; returns (width, height) px."""
    plt = _pyplot()
    layers = max(len(h) for h in histograms.values())
    columns = min(layers, 4)
    rows = math.ceil(layers / columns)
    size = (3 * columns, 2.5 * rows)
    figure, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
    for layer in range(rows * columns):
        axis = axes[layer // columns][layer % columns]
        if layer >= layers:
            axis.axis("off")
            continue
        for label, per_layer in histograms.items():
            counts = torch.tensor(per_layer[layer], dtype=torch.float)
            edges = torch.linspace(0, 1, len(counts) + 1)
            axis.stairs((counts / counts.sum().clamp(min=1)).numpy(), edges.numpy(), label=label)
        axis.set_title(f"layer {layer}", fontsize=9)
        axis.set_xlim(0, 1)
    axes[0][0].legend(fontsize=7)
    figure.supxlabel("gate value")
    figure.tight_layout()
    _save(figure, path)
    return int(size[0] * FIGURE_DPI), int(size[1] * FIGURE_DPI)


def plot_first_token_attention(first_token: dict[str, list[float]], path) -> tuple[int, int]:
    """First-token attention mass per layer, one line per model; returns (width, height) px."""
    plt = _pyplot()
    size = (8, 5)
    figure, axis = plt.subplots(figsize=size)
    for label, per_layer in first_token.items():
        axis.plot(
            range(len(per_layer)), per_layer, marker="o", label=f"{label} (mean {sum(per_layer) / len(per_layer):.3f})"
        )
    axis.xaxis.get_major_locator().set_params(integer=True)  # layers are whole numbers
    axis.set_xlabel("layer")
    axis.set_ylabel("attention on the first token")
    axis.set_ylim(0, 1)
    axis.legend()
    figure.tight_layout()
    _save(figure, path)
    return size[0] * FIGURE_DPI, size[1] * FIGURE_DPI
