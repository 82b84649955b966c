"""What torchao weight-only quantization gives a gated model: logit difference from float32 and model memory.

For the embedded default model (``gated_qwen/default_models/headwise``) and a converted one (a tiny
released-layout elementwise arm, as ``tests/conftest.py`` writes it, loaded and re-saved), each quantized
with transformers' ``TorchAoConfig`` (int8 weight-only; int4 weight-only as torchao's group-32 int4 that
runs on CPU), saved, and loaded back with strict ``from_pretrained``. Writes ``results/quantization/``.

    python scripts/measure_quantization.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import ROOT, describe, new_report, write_results  # noqa: E402


def quantizers() -> dict:
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    return {
        "int8 weight-only": Int8WeightOnlyConfig(),
        "int4 weight-only (group 32)": IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    }


def converted_model(folder: Path) -> Path:
    """A tiny released-layout elementwise arm, converted (loaded and saved by gated-qwen)."""
    from gated_qwen import Qwen3GatedForCausalLM
    from tests.conftest import write_released_checkpoint

    write_released_checkpoint(
        folder / "released", gate="elementwise", hidden_size=128, head_dim=32, vocab_size=256, num_hidden_layers=2
    )
    Qwen3GatedForCausalLM.from_pretrained(folder / "released").save_pretrained(folder / "converted")
    return folder / "converted"


def weights_bytes(folder: Path) -> int:
    return sum(file.stat().st_size for file in folder.glob("*.safetensors"))


def measure(name: str, folder: Path, scratch: Path) -> list[dict]:
    from transformers import TorchAoConfig

    from gated_qwen import Qwen3GatedForCausalLM

    tokens = torch.arange(64).unsqueeze(0) % 200
    model = Qwen3GatedForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = model(tokens).logits
    rows = [{"model": name, "quantization": "none (float32)", "max_logit_diff": 0.0}]
    model.save_pretrained(scratch / f"{name}-float32")
    rows[0].update(memory_bytes=model.get_memory_footprint(), weights_bytes=weights_bytes(scratch / f"{name}-float32"))
    for label, quant_type in quantizers().items():
        quantized = Qwen3GatedForCausalLM.from_pretrained(
            folder, dtype=torch.float32, quantization_config=TorchAoConfig(quant_type)
        ).eval()
        saved = scratch / f"{name}-{label.split()[0]}"
        quantized.save_pretrained(saved)
        reloaded = Qwen3GatedForCausalLM.from_pretrained(saved).eval()  # strict: refuses what it cannot check
        with torch.no_grad():
            in_memory, loaded = quantized(tokens).logits, reloaded(tokens).logits
        rows.append(
            {
                "model": name,
                "quantization": label,
                "max_logit_diff": float((loaded - reference).abs().max()),
                "reload_equals_in_memory": bool(torch.equal(loaded, in_memory)),
                # get_memory_footprint counts a quantized weight at its float size (torchao's tensor reports
                # the dtype it stands for); the saved weights show what the quantized storage takes.
                "memory_bytes": reloaded.get_memory_footprint(),
                "weights_bytes": weights_bytes(saved),
            }
        )
    return rows


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import torchao

    from gated_qwen.default_models import default_model_path

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        rows = measure("embedded default (headwise)", default_model_path(), scratch)
        rows += measure("converted released-layout arm (elementwise, tiny)", converted_model(scratch), scratch)
    report = new_report("quantization", torchao=torchao.__version__, tokens=64, rows=rows)
    lines = [
        "| model | quantization | max logit difference vs float32 | `get_memory_footprint()` | saved weights |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['quantization']} | {row['max_logit_diff']:.4f} | "
            f"{row['memory_bytes'] / 2**20:.2f} MiB | {row['weights_bytes'] / 2**20:.2f} MiB |"
        )
    markdown = "\n".join(lines) + "\n\n" + describe(report) + f" torchao {torchao.__version__}.\n"
    write_results(ROOT / "results" / "quantization", report, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
