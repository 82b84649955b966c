import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from conftest import write_released_arm

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
    assert (
        facts["gate_type"] == "headwise" and facts["num_hidden_layers"] == 2 and facts["weight_dtypes"] == ["float32"]
    )
    # as on the hub: model_type qwen2, one pytorch_model.bin whose shapes were read from its pickle
    assert facts["model_type"] == "qwen2" and facts["kind"] == "gated-attention release"
    assert facts["weights_format"] == "pytorch" and facts["shapes_checked"] is True and facts["files"] == 1


def test_inspect_a_released_arm_on_the_hub_without_downloading_its_bin(tmp_path, monkeypatch, capsys):
    """Pickle weights on the hub: only config.json is fetched; the parameters come from the config."""
    import huggingface_hub

    arm = tmp_path / "1B_gate_elementwise"
    spec = write_released_arm(arm, gate="elementwise", vocab_size=300)
    listing = {f"{arm.name}/{p.name}": p.stat().st_size for p in arm.iterdir()}
    fetched = []

    def fake_download(repo_id, filename, subfolder=None, **kwargs):
        fetched.append(f"{subfolder}/{filename}")
        return str(arm / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        "list_repo_tree",
        lambda self, repo_id, path_in_repo=None, **k: [SimpleNamespace(path=p, size=n) for p, n in listing.items()],
    )
    monkeypatch.setattr(
        "gated_qwen.checkpoint.sources._check_hub_repository", lambda *args: None
    )  # the hub probe (tests/checkpoint/test_hub.py)
    assert main(["inspect", "QwQZh/gated_attention", "--subfolder", arm.name, "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert fetched == [f"{arm.name}/config.json"]
    assert (
        facts["gate_type"] == "elementwise"
        and facts["shapes_checked"] is False
        and facts["weights_format"] == "pytorch"
    )
    assert facts["parameters"] == sum(t.numel() for t in spec["tensors"].values())
    assert facts["weight_bytes"] == (arm / "pytorch_model.bin").stat().st_size
    assert main(["inspect", "QwQZh/gated_attention", "--subfolder", arm.name]) == 0
    assert "not checked" in capsys.readouterr().out


def test_inspect_refuses_a_genuine_qwen2(tmp_path, capsys):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).save_pretrained(tmp_path / "qwen2")
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "qwen2")]) == 2
    err = capsys.readouterr().err
    assert "is a Qwen2 model" in err and "Qwen2ForCausalLM" in err and len(err.strip().splitlines()) == 1


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
