import json
import subprocess
import sys
from pathlib import Path

import gated_qwen

from gated_qwen.cli import main


def test_inspect_prints_the_facts_of_a_released_checkpoint(released_checkpoint, capsys):
    folder, spec = released_checkpoint(gate="headwise", num_key_value_heads=2, tie_word_embeddings=True)
    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "headwise" in out and "4 query / 2 kv, head_dim 8" in out
    assert main(["inspect", str(folder), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["parameters"] == sum(t.numel() for t in spec["tensors"].values())
    assert facts["gate_type"] == "headwise" and facts["num_hidden_layers"] == 2 and facts["weight_dtypes"] == ["float32"]


def test_inspect_with_subfolder(released_checkpoint, capsys):
    folder, _ = released_checkpoint(gate="elementwise")
    assert main(["inspect", str(folder.parent), "--subfolder", folder.name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gate_type"] == "elementwise"


def test_inspect_errors_are_one_line_without_traceback(released_checkpoint, tmp_path, capsys):
    folder, _ = released_checkpoint(gate="headwise")
    config = json.loads((folder / "config.json").read_text())
    config["headwise_attn_output_gate"] = False
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["inspect", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "'headwise' gate" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["inspect", str(tmp_path / "other")]) == 2
    assert "'llama' model, not Qwen3 or Qwen3Gated" in capsys.readouterr().err


def test_console_script_version_and_bad_argument():
    script = Path(sys.executable).parent / "gated-qwen"  # installed by pip from pyproject's [project.scripts]
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == f"gated-qwen {gated_qwen.__version__}"
    bad = subprocess.run([sys.executable, "-m", "gated_qwen", "inspect"], capture_output=True, text=True)
    assert bad.returncode == 2 and "PATH_OR_HUB_ID" in bad.stderr and "Traceback" not in bad.stderr
