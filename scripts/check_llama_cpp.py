"""Show what llama.cpp does today with a Qwen3.5 export: GGUF conversion, then greedy decoding.

    python scripts/check_llama_cpp.py --llama-cpp path/to/llama.cpp [--model gated_qwen/default_models/headwise]

1. Exports ``--model`` (default: the embedded headwise model) with ``gated_qwen.transforms.export`` in float32.
2. Converts the export with llama.cpp's own ``convert_hf_to_gguf.py`` (``--llama-cpp``: a llama.cpp source
   tree, e.g. the ``vendor/llama.cpp`` of a llama-cpp-python sdist) with ``--no-mtp`` (the export has no
   multi-token-prediction block, and the converter asserts without the flag). A toy tokenizer's BPE
   pre-tokenizer is unknown to the converter, which then refuses it; this script then names it
   ``gpt-2`` (the regex of a tokenizers ``ByteLevel`` pre-tokenizer). Decoding below feeds token ids, so
   the choice does not affect the check. Real arms carry Qwen's tokenizer, which the converter knows.
3. Prints the GGUF's architecture and the metadata the export sets (layers, RoPE dims and sections,
   full-attention interval).
4. Decodes greedily with llama-cpp-python (``import llama_cpp``; a built library elsewhere can be named
   with llama-cpp-python's ``LLAMA_CPP_LIB_PATH``) in a child process, since a failed GGML_ASSERT aborts
   it, and compares the tokens with gated-qwen's own greedy ``generate`` on the same prompt.

The script changes nothing in llama.cpp. Exit status 0 whatever llama.cpp does; it prints what happened.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]

CONVERT = r"""
import os, runpy, sys
llama_cpp_dir = sys.argv[1]
sys.path[:0] = [llama_cpp_dir, os.path.join(llama_cpp_dir, "gguf-py")]
from conversion import base

original = base.TextModel.get_vocab_base_pre

def get_vocab_base_pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:
        print("check_llama_cpp: the converter does not know this BPE pre-tokenizer; naming it gpt-2", file=sys.stderr)
        return "gpt-2"

base.TextModel.get_vocab_base_pre = get_vocab_base_pre
script = os.path.join(llama_cpp_dir, "convert_hf_to_gguf.py")
sys.argv = [script, *sys.argv[2:]]
runpy.run_path(script, run_name="__main__")
"""

READ_GGUF = r"""
import json, sys
sys.path.insert(0, sys.argv[1] + "/gguf-py")
from gguf import GGUFReader

reader = GGUFReader(sys.argv[2])
fields = {}
for name, field in reader.fields.items():
    if name.startswith(("general.architecture", "qwen35.")):
        value = field.contents()
        fields[name] = value
print(json.dumps(fields, default=str))
"""

DECODE = r"""
import json, sys
import llama_cpp

prompt, new_tokens = json.loads(sys.argv[2]), int(sys.argv[3])
# logits_all: llama-cpp-python keeps the logits (Llama.scores) only then
model = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_batch=64, n_threads=1, verbose=False, logits_all=True)
print(json.dumps({"llama_cpp": llama_cpp.__version__}), flush=True)
model.eval(prompt)
print(json.dumps({"prefill": "ok"}), flush=True)
tokens = []
for _ in range(new_tokens):  # plain argmax of the last logits: no sampler, no end-of-text stop
    token = int(model.scores[model.n_tokens - 1].argmax())
    tokens.append(token)
    model.eval([token])
print(json.dumps({"tokens": tokens}), flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--llama-cpp", required=True, type=Path, help="a llama.cpp source tree (holds convert_hf_to_gguf.py)"
    )
    parser.add_argument(
        "--model", default=str(REPO / "gated_qwen" / "default_models" / "headwise"), help="a gated checkpoint folder"
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="folder for the export and the GGUF (default: a temporary one)"
    )
    parser.add_argument("--prompt", default="def read_config(path):")
    parser.add_argument("--new-tokens", type=int, default=8)
    args = parser.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        parser.error(f"{args.llama_cpp} has no convert_hf_to_gguf.py; give a llama.cpp source tree")

    import torch
    from transformers import AutoTokenizer

    from gated_qwen import Qwen3GatedForCausalLM
    from gated_qwen.transforms.export import export_checkpoint

    work = args.work or Path(tempfile.mkdtemp(prefix="check_llama_cpp_"))
    exported, gguf = work / "qwen3_5", work / "model-f32.gguf"
    export_checkpoint(args.model, exported, dtype="float32", overwrite=True, progress=False)
    print(f"exported {args.model} -> {exported}")

    convert = subprocess.run(
        [sys.executable, "-c", CONVERT, str(args.llama_cpp.resolve()), str(exported),
         "--outfile", str(gguf), "--outtype", "f32", "--no-mtp"],
        capture_output=True, text=True,
    )  # fmt: skip
    if convert.returncode != 0:
        print(f"conversion: FAILED (exit {convert.returncode})\n{convert.stderr[-2000:]}")
        return 0
    print(f"conversion: ok -> {gguf} ({gguf.stat().st_size / 1e6:.1f} MB)")
    metadata = subprocess.run(
        [sys.executable, "-c", READ_GGUF, str(args.llama_cpp.resolve()), str(gguf)], capture_output=True, text=True
    )
    if metadata.returncode == 0:
        for key, value in json.loads(metadata.stdout).items():
            print(f"  {key} = {value}")

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompt = tokenizer(args.prompt)["input_ids"]
    model = Qwen3GatedForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    sequence = list(prompt)
    with torch.no_grad():  # plain argmax, as on the llama.cpp side (generate would apply the generation config)
        for _ in range(args.new_tokens):
            sequence.append(int(model(torch.tensor([sequence])).logits[0, -1].argmax()))
    expected = sequence[len(prompt) :]
    print(f"gated-qwen greedy tokens: {expected}")

    decode = subprocess.run(
        [sys.executable, "-c", DECODE, str(gguf), json.dumps(prompt), str(args.new_tokens)],
        capture_output=True,
        text=True,
    )
    steps = {k: v for line in decode.stdout.splitlines() if line.startswith("{") for k, v in json.loads(line).items()}
    if "llama_cpp" in steps:
        print(f"llama-cpp-python {steps['llama_cpp']}")
    if decode.returncode != 0:
        if "prefill" in steps:
            where = "while decoding"
        else:
            where = "on the first decode (the prompt)" if "llama_cpp" in steps else "while loading"
        # the failed assertion, and where it was called from when ggml could print a backtrace (gdb installed)
        assertion = [line.strip() for line in decode.stderr.splitlines()
                     if "GGML_ASSERT" in line or "llm_graph_input" in line or "Error" in line]  # fmt: skip
        signal = f"signal {-decode.returncode}" if decode.returncode < 0 else f"exit {decode.returncode}"
        print(f"llama.cpp decode: FAILED {where} ({signal})")
        for line in assertion[:3] or decode.stderr.strip().splitlines()[-3:]:
            print(f"  {line}")
        return 0
    tokens = steps.get("tokens", [])
    print(f"llama.cpp greedy tokens:  {tokens}")
    print(
        "llama.cpp decode: tokens " + ("EQUAL to gated-qwen's" if tokens == expected else "DIFFER from gated-qwen's")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
