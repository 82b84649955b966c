"""Text generation with Qwen3Gated models: what ``gated-qwen generate`` does, as library functions.

A thin layer over transformers: ``Qwen3GatedForCausalLM.from_pretrained`` loads the model,
``AutoTokenizer`` the tokenizer, ``GenerationMixin.generate`` does the decoding (stop strings
included) and ``TextStreamer`` prints tokens as they come. What is added here is what a command
line needs around them: device, dtype and attention checked up front with one clear message each,
tokenizer files checked before transformers would quietly build an empty tokenizer, prompts run
as left-padded batches, and one record per prompt.

>>> from pathlib import Path
>>> import gated_qwen
>>> arm = Path(gated_qwen.__file__).parent / "default_models" / "headwise"  # the embedded 4.2M model
>>> model, tokenizer = load_model_and_tokenizer(str(arm), device="cpu")
>>> config = build_generation_config(model, tokenizer, max_new_tokens=20)
>>> [(c.prompt, 0 < c.new_tokens <= 20) for c in generate(model, tokenizer, ["def add(a, b):"], config)]
[('def add(a, b):', True)]
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, TextStreamer
from transformers.utils import logging

from ..checkpoint import read_config_json
from ..checkpoint.formats import present_files
from ..checkpoint.sources import hub_error, resolve_source, source_location
from ..errors import GatedQwenError
from ..models.auto import causal_lm_class
from ..models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM
from ..utils.devices import check_attention, resolve_device, resolve_dtype


logger = logging.get_logger(__name__)

# One of these sets of files makes a tokenizer; tokenizer_config.json alone does not (transformers
# would then build an empty tokenizer without complaint).
TOKENIZER_FILE_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",), ("vocab.txt",))


def local_checkpoint_folder(model: str, subfolder: str = "", revision: str | None = None) -> Path | None:
    """The local folder of ``model`` (checked to hold a config.json), or None for a readable hub repository.

    Every problem with the source (no such folder, a file, no network, an unknown repository, offline
    without a cached copy) is one :class:`GatedQwenError` from :func:`gated_qwen.checkpoint.sources.resolve_source`.

    >>> from gated_qwen.default_models import default_model_path
    >>> local_checkpoint_folder(str(default_model_path("headwise"))) == default_model_path("headwise")
    True
    >>> local_checkpoint_folder("QwQZh/gated_attention", "1B_gate_headwise") is None  # asks the hub  # doctest: +SKIP
    True
    """
    folder = resolve_source(model, subfolder, revision)
    if folder is not None and not (folder / "config.json").is_file():
        arms = sorted(p.name for p in folder.iterdir() if (p / "config.json").is_file())
        hint = (
            f"it holds several models: pass --subfolder with one of {', '.join(arms)}"
            if arms
            else ("it is not a model checkpoint folder")
        )
        raise GatedQwenError(f"{folder} has no config.json; {hint}")
    return folder


GENERATE_TOKENIZER_FLAG = "gated-qwen generate --tokenizer PATH_OR_HUB_ID"


def check_tokenizer_files(
    source: str, subfolder: str = "", revision: str | None = None, elsewhere: str | None = GENERATE_TOKENIZER_FLAG
) -> None:
    """Refuse a checkpoint without tokenizer files, naming the files it needs.

    transformers alone would build an empty tokenizer from a folder with tokenizer_config.json only.
    The advice names ``elsewhere``, the way to take a tokenizer from another place, where there is one.

    >>> import tempfile
    >>> weights_only = tempfile.mkdtemp()  # a folder without tokenizer files
    >>> check_tokenizer_files(weights_only)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gated_qwen.errors.GatedQwenError: ... has no tokenizer files: it needs tokenizer.json, ...
    """
    local = resolve_source(source, subfolder, revision)  # a missing folder is named as such, not as "no tokenizer"
    names = [name for names in TOKENIZER_FILE_SETS for name in names]
    try:
        found_names = set(present_files(source, names, subfolder=subfolder, revision=revision))
    except OSError as error:
        mapped = hub_error(error.__cause__ or error, source, subfolder, revision)
        if mapped is error:
            raise
        raise mapped from error
    if not any(found_names.issuperset(names) for names in TOKENIZER_FILE_SETS):
        where = source_location(source, subfolder)
        if local is None:
            where += " (on the hub, or in the local cache when offline)"
        wanted = ", or ".join(" and ".join(names) for names in TOKENIZER_FILE_SETS)
        raise GatedQwenError(
            f"{where} has no tokenizer files: it needs {wanted}. Copy the tokenizer files of the model into it"
            + (f", or load the tokenizer from elsewhere ({elsewhere})" if elsewhere else "")
        )


def load_tokenizer(
    source: str, subfolder: str = "", revision: str | None = None, elsewhere: str | None = GENERATE_TOKENIZER_FLAG
):
    """The tokenizer of a checkpoint folder or hub id, left-padded for batched generation.

    Raises :class:`GatedQwenError` naming the missing files when ``source`` has no tokenizer; its
    advice names ``elsewhere``, the way to take a tokenizer from another place, where there is one.

    >>> from gated_qwen.default_models import default_model_path
    >>> tokenizer = load_tokenizer(str(default_model_path("headwise")))
    >>> tokenizer.padding_side, tokenizer.pad_token
    ('left', '<|pad|>')
    """
    check_tokenizer_files(source, subfolder, revision, elsewhere)
    tokenizer = AutoTokenizer.from_pretrained(
        source, subfolder=subfolder, revision=revision, trust_remote_code=False, padding_side="left"
    )
    if tokenizer.pad_token is None:  # Qwen-style tokenizers pad with their end-of-text token
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    model: str,
    subfolder: str = "",
    revision: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    attn_implementation: str | None = None,
) -> Qwen3GatedForCausalLM:
    """A Qwen3 or Qwen3Gated checkpoint (released arm, plain Qwen3, or saved here), or a Qwen3-MoE or
    Qwen3MoeGated one, on ``device``, in eval mode.

    Device, dtype and attention are checked before anything is read.

    >>> from gated_qwen.default_models import default_model_path
    >>> model = load_model(str(default_model_path("headwise")), device="cpu", dtype="float32")
    >>> type(model).__name__, model.dtype, model.training
    ('Qwen3GatedForCausalLM', torch.float32, False)
    """
    torch_device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    check_attention(attn_implementation, torch_device, torch_dtype)
    local_checkpoint_folder(model, subfolder, revision)
    model_class = causal_lm_class(read_config_json(model, subfolder, revision))
    loaded, info = model_class.from_pretrained(
        model,
        subfolder=subfolder,
        revision=revision,
        dtype=torch_dtype,
        attn_implementation=attn_implementation,
        device_map=str(torch_device),
        output_loading_info=True,
    )
    # from_pretrained starts a head a bare-model checkpoint lacks afresh, as transformers does; text from
    # a random lm_head is noise, so here that is an error.
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise GatedQwenError(
            f"{source_location(model, subfolder)} lacks {', '.join(missing[:4])}"
            + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            + ": it is not a complete causal language model (a bare Qwen3GatedModel checkpoint has no lm_head)"
        )
    return loaded.eval()


def load_model_and_tokenizer(
    model: str, subfolder: str = "", revision: str | None = None, tokenizer: str | None = None, **model_kwargs
):
    """``(model, tokenizer)``; the tokenizer comes from ``tokenizer`` if given, else from the model's folder.

    Device, dtype, attention and the model's folder are checked first and the tokenizer is loaded
    next, so a problem with any of them is reported before the weights are read.

    >>> from pathlib import Path
    >>> import gated_qwen
    >>> arm = Path(gated_qwen.__file__).parent / "default_models" / "headwise"  # the embedded 4.2M model
    >>> model, tokenizer = load_model_and_tokenizer(str(arm), device="cpu")
    >>> type(model).__name__, model.training
    ('Qwen3GatedForCausalLM', False)
    """
    check_attention(
        model_kwargs.get("attn_implementation"),
        resolve_device(model_kwargs.get("device", "auto")),
        resolve_dtype(model_kwargs.get("dtype", "auto")),
    )
    local_checkpoint_folder(model, subfolder, revision)
    text_tokenizer = load_tokenizer(model, subfolder, revision) if tokenizer is None else load_tokenizer(tokenizer)
    loaded = load_model(model, subfolder, revision, **model_kwargs)
    if len(text_tokenizer) > loaded.config.vocab_size:
        raise GatedQwenError(
            f"the tokenizer has {len(text_tokenizer)} tokens but the model's vocab_size is "
            f"{loaded.config.vocab_size}: it is not this model's tokenizer"
        )
    return loaded, text_tokenizer


SAMPLING_OPTIONS = ("temperature", "top_p", "top_k")
# GenerationConfig flags that act only when sampling
SAMPLING_ONLY_FLAGS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def build_generation_config(
    model,
    tokenizer,
    max_new_tokens: int = 64,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    repetition_penalty: float | None = None,
    stop_strings: list[str] | None = None,
) -> GenerationConfig:
    """The model's generation config with the given options set; None leaves the model's value.

    ``do_sample=None`` samples when a sampling option is given, and otherwise keeps the model's
    choice (greedy unless its generation_config.json says otherwise). End-of-sequence and padding
    fall back to the tokenizer's.

    >>> from pathlib import Path
    >>> import gated_qwen
    >>> arm = Path(gated_qwen.__file__).parent / "default_models" / "headwise"  # the embedded 4.2M model
    >>> model, tokenizer = load_model_and_tokenizer(str(arm), device="cpu")
    >>> config = build_generation_config(model, tokenizer, max_new_tokens=32, temperature=0.7)
    >>> config.do_sample
    True
    """
    sampling = {name: value for name, value in zip(SAMPLING_OPTIONS, (temperature, top_p, top_k)) if value is not None}
    if do_sample is False and sampling:
        raise GatedQwenError(f"{', '.join(sampling)} only apply to sampling; drop them or drop greedy decoding")
    if do_sample is None and sampling:
        do_sample = True
    options = {"max_new_tokens": max_new_tokens, "do_sample": do_sample, "repetition_penalty": repetition_penalty}
    options = {name: value for name, value in {**options, **sampling}.items() if value is not None}
    if stop_strings:
        options["stop_strings"] = list(stop_strings)
    config = copy.deepcopy(model.generation_config)
    config.update(**options)
    if not config.do_sample:  # greedy: the model's sampling settings do not apply (and transformers would warn)
        for name in SAMPLING_ONLY_FLAGS:
            setattr(config, name, None)
    if config.eos_token_id is None:
        config.eos_token_id = tokenizer.eos_token_id
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    return config


def truncate_at_stop(text: str, stop_strings: Iterable[str] | None) -> str:
    """``text`` up to and including the first stop string in it (the model's last token may run past it).

    >>> truncate_at_stop("a + b\\n    return", ["\\n"])
    'a + b\\n'
    """
    if isinstance(stop_strings, str):  # a generation_config.json may hold one string
        stop_strings = [stop_strings]
    ends = [text.find(stop) + len(stop) for stop in stop_strings or () if stop and stop in text]
    return text[: min(ends)] if ends else text


class CompletionStreamer(TextStreamer):
    """transformers' TextStreamer for the completion only: skips the prompt and special tokens, ends at a stop string.

    >>> import contextlib, io
    >>> from gated_qwen.default_models import default_model_path
    >>> model, tokenizer = load_model_and_tokenizer(str(default_model_path("headwise")), device="cpu")
    >>> inputs = tokenizer(["def read_config(path):"], return_tensors="pt")
    >>> printed = io.StringIO()
    >>> with contextlib.redirect_stdout(printed):  # what the streamer prints as the tokens come
    ...     output = model.generate(**inputs, max_new_tokens=16, streamer=CompletionStreamer(tokenizer, ["\\n"]))
    >>> completion = tokenizer.decode(output[0, inputs.input_ids.shape[1] :], skip_special_tokens=True)
    >>> printed.getvalue() == truncate_at_stop(completion, ["\\n"]) + "\\n"  # the completion up to its first line end
    True
    """

    def __init__(self, tokenizer, stop_strings: Iterable[str] | None = None):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.stop_strings = stop_strings
        self.text = ""  # what has been printed of this completion

    def on_finalized_text(self, text: str, stream_end: bool = False):
        whole = truncate_at_stop(self.text + text, self.stop_strings)
        new_text, self.text = whole[len(self.text) :], whole
        super().on_finalized_text(new_text, stream_end=stream_end)
        if stream_end:
            self.text = ""


@dataclass
class Completion:
    """One prompt's result; ``seconds`` is the wall time of the batch it ran in."""

    prompt: str
    completion: str
    new_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        """The record ``gated-qwen generate --json`` prints.

        >>> Completion("Hi", " there", 2, 0.5).to_json()
        {'prompt': 'Hi', 'completion': ' there', 'new_tokens': 2, 'seconds': 0.5, 'tokens_per_second': 4.0}
        """
        return {
            "prompt": self.prompt,
            "completion": self.completion,
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
        }


def chat_prompt(tokenizer, prompt: str, system: str | None = None) -> str:
    """``prompt`` (and ``system``) rendered by the tokenizer's chat template, ready for the reply.

    The shipped toy model has no chat template; a ChatML one (Qwen's) is set here for the example:

    >>> from gated_qwen.default_models import default_model_path
    >>> tokenizer = load_tokenizer(str(default_model_path("headwise")))
    >>> tokenizer.chat_template = (
    ...     "{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}"
    ...     "{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}"
    ... )
    >>> chat_prompt(tokenizer, "What does the gate do?", system="Be brief.")
    '<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nWhat does the gate do?<|im_end|>\\n<|im_start|>assistant\\n'
    """
    if not tokenizer.chat_template:
        raise GatedQwenError(
            f"the tokenizer of {tokenizer.name_or_path} has no chat template; drop --chat (and --system), "
            "or use a tokenizer that has one"
        )
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def batched(items: list, size: int) -> Iterator[list]:
    """Consecutive chunks of ``items`` of at most ``size`` (itertools.batched needs Python 3.12).

    >>> list(batched([1, 2, 3, 4, 5], 2))
    [[1, 2], [3, 4], [5]]
    """
    if size < 1:
        raise GatedQwenError(f"batch size must be at least 1, not {size}")
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _completion_ids(row: list[int], generation_config: GenerationConfig) -> list[int]:
    """The new tokens of one sequence, without its end-of-sequence token or the padding after it."""
    eos = generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    end = next((i for i, token in enumerate(row) if token in eos_ids), len(row))
    row = row[:end]
    # A sequence that stopped on a stop string is padded to the batch's length.
    pad = generation_config.pad_token_id
    while row and pad is not None and pad not in eos_ids and row[-1] == pad:
        row = row[:-1]
    return row


def generate(
    model,
    tokenizer,
    prompts: list[str],
    generation_config: GenerationConfig,
    batch_size: int = 8,
    chat: bool = False,
    system: str | None = None,
    seed: int | None = None,
    streamer: TextStreamer | None = None,
) -> Iterator[Completion]:
    """Generate a completion for each prompt, ``batch_size`` prompts per left-padded batch, in order.

    ``seed`` seeds torch once before the first batch, so a sampled run repeats exactly. A
    ``streamer`` (one prompt per batch only, as TextStreamer requires) prints tokens as they come.

    >>> from pathlib import Path
    >>> import gated_qwen
    >>> arm = Path(gated_qwen.__file__).parent / "default_models" / "headwise"  # the embedded 4.2M model
    >>> model, tokenizer = load_model_and_tokenizer(str(arm), device="cpu")
    >>> config = build_generation_config(model, tokenizer, max_new_tokens=8)
    >>> for c in generate(model, tokenizer, ["Hello", "def f(x):"], config, seed=0):
    ...     print(c.prompt, isinstance(c.completion, str), c.new_tokens <= 8)
    Hello True True
    def f(x): True True
    """
    from transformers import set_seed

    for number, prompt in enumerate(prompts, 1):
        if not prompt.strip():
            raise GatedQwenError(f"prompt {number} is empty")
    if system is not None and not chat:
        raise GatedQwenError("a system prompt needs chat mode (--chat)")
    if streamer is not None and batch_size != 1 and len(prompts) > 1:
        raise GatedQwenError("streaming prints one sequence: use batch size 1 or a single prompt")
    if seed is not None:
        set_seed(seed)
    for batch in batched(prompts, batch_size):
        texts = [chat_prompt(tokenizer, prompt, system) for prompt in batch] if chat else batch
        # the chat template already holds any special tokens the model expects
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not chat).to(model.device)
        start = time.perf_counter()
        try:
            sequences = model.generate(
                **inputs, generation_config=generation_config, tokenizer=tokenizer, streamer=streamer
            ).cpu()  # (B, T_prompt + T_new); .cpu() waits for the device, so the timing is honest
        except torch._dynamo.exc.TorchDynamoException as error:
            # flex_attention is compiled on first use; a compiler that fails there is a setup problem
            attention = model.config._attn_implementation
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise GatedQwenError(
                f"attention {attention} failed to compile on {model.device.type} ({first_line}); use --attn sdpa"
            ) from error
        seconds = time.perf_counter() - start
        new_ids = sequences[:, inputs["input_ids"].shape[1] :].tolist()  # (B, T_new)
        for prompt, row in zip(batch, new_ids):
            ids = _completion_ids(row, generation_config)
            text = tokenizer.decode(ids, skip_special_tokens=True)
            yield Completion(prompt, truncate_at_stop(text, generation_config.stop_strings), len(ids), seconds)


__all__ = [
    "Completion",
    "CompletionStreamer",
    "batched",
    "build_generation_config",
    "chat_prompt",
    "check_tokenizer_files",
    "generate",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "local_checkpoint_folder",
    "truncate_at_stop",
]
