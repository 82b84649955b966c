"""Measure what the gate costs: model speed, checkpoint loading and conversion, each beside its floor.

Four arms share one architecture: transformers' own ``Qwen3ForCausalLM`` and ``Qwen3GatedForCausalLM``
with gate ``none``, ``headwise`` and ``elementwise`` (for a ``moe-`` size, ``Qwen3MoeForCausalLM`` and
``Qwen3MoeGatedForCausalLM``, where the parameter counts also say how many a token uses: the gate's cost
beside the experts'). The ``none`` arm carries the same weights as the
stock model. ``BenchmarkOptions.gates`` picks the gated arms and ``gate_variant`` gives them a variant of the
design space (a value gate, a SiLU gate, ...); the released gate is the default. All arms live in one process and are measured in rounds, each round running every arm
once in a rotated order, so that machine noise (other processes, clock changes) falls on all of
them alike. A gated arm's cost is the median over rounds of its time divided by the no-gate arm's
time *in the same round*; beside it stands the ratio of their parameter counts, the floor that a
memory-bound decode cannot beat.

Converter and loader are measured on checkpoints written into a scratch folder: the converter in a
child process (so that its peak resident memory is its own) beside a child
that copies the same files, and ``from_pretrained`` of a gated checkpoint beside transformers'
``Qwen3ForCausalLM.from_pretrained`` of the same-size stock checkpoint.

>>> from gated_qwen.tools.benchmark.measure import BenchmarkOptions, run_benchmark
>>> from gated_qwen.tools.benchmark.report import format_markdown
>>> options = dict(repeats=1, prompt_length=8, new_tokens=4, batch_sizes=(1,), loading=False, conversion=False)
>>> result = run_benchmark(BenchmarkOptions(size="tiny", **options))  # speed only: no converter or loader runs
>>> "| time / none |" in format_markdown(result)  # the table of ratios, then the machine it ran on
True
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.generation.streamers import BaseStreamer
from transformers.utils import logging as hf_logging

from ...errors import GatedQwenError
from ...models.qwen3_gated.configuration_qwen3_gated import Qwen3GatedConfig
from ...models.qwen3_gated.modeling_qwen3_gated import Qwen3GatedForCausalLM
from ...models.qwen3_moe_gated.configuration_qwen3_moe_gated import Qwen3MoeGatedConfig
from ...models.qwen3_moe_gated.modeling_qwen3_moe_gated import Qwen3MoeGatedForCausalLM
from ...utils.names import GATE_VARIANT_DEFAULTS
from .options import DTYPES, SIZES, BenchmarkOptions


ARCHITECTURE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
MOE_KEYS = (
    "moe_intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
)
CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # package data; SIZES["1b"] names a file here
STOCK_ARM = "qwen3"  # transformers' Qwen3ForCausalLM
ARMS = (STOCK_ARM, "none", "headwise", "elementwise")  # every arm there can be; options.gates picks the gated
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


# ----------------------------------------------------------------------------------------------
# Arms


def architecture(options: BenchmarkOptions) -> dict:
    """The config keys shared by all arms: the named size with ``overrides`` applied."""
    if options.size not in SIZES:
        raise GatedQwenError(f"unknown size {options.size!r}; choose one of {', '.join(SIZES)}")
    size = SIZES[options.size]
    moe = options.size.startswith("moe-")
    config_class = Qwen3MoeGatedConfig if moe else Qwen3GatedConfig
    if isinstance(size, str):  # a config shipped in the package (gated_qwen/configs/)
        released = config_class.from_json_file(CONFIGS / size)
        size = {key: getattr(released, key) for key in ARCHITECTURE_KEYS + (MOE_KEYS if moe else ())}
    unknown = sorted(set(options.overrides) - set(config_class.__dataclass_fields__))
    if unknown:
        family = "Qwen3-MoE" if moe else "Qwen3"
        raise GatedQwenError(
            f"{', '.join(unknown)}: not a {family} config key; see transformers' {family.replace('-', '')}Config"
        )
    return {
        **size,
        "tie_word_embeddings": True,
        "max_position_embeddings": max(4096, options.prompt_length + options.new_tokens),
        "attn_implementation": options.attn_implementation,
        **options.overrides,
    }


def is_moe(arch: dict) -> bool:
    """Whether the architecture is a mixture of experts (a ``moe-`` size)."""
    return "num_experts" in arch


def gate_arms(options: BenchmarkOptions) -> tuple[str, ...]:
    """The arms of Qwen3Gated: ``none`` and the gated ones ``options.gates`` asks for."""
    return ("none", *dict.fromkeys(options.gates))


def gated_config(arch: dict, gate: str, variant: dict | None = None) -> Qwen3GatedConfig | Qwen3MoeGatedConfig:
    """The config of one arm: the architecture, ``gate`` and (for a gated arm) the design-space ``variant``."""
    variant = variant if gate != "none" else None
    return (Qwen3MoeGatedConfig if is_moe(arch) else Qwen3GatedConfig)(**arch, gate_type=gate, **(variant or {}))


def gated_model(arch: dict, gate: str, variant: dict | None = None) -> torch.nn.Module:
    return (Qwen3MoeGatedForCausalLM if is_moe(arch) else Qwen3GatedForCausalLM)(gated_config(arch, gate, variant))


def stock_model(arch: dict) -> torch.nn.Module:
    """transformers' own model of the architecture: Qwen3ForCausalLM, or Qwen3MoeForCausalLM."""
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**arch)) if is_moe(arch) else Qwen3ForCausalLM(Qwen3Config(**arch))


def stock_class(arch: dict) -> type:
    return Qwen3MoeForCausalLM if is_moe(arch) else Qwen3ForCausalLM


def build_arms(options: BenchmarkOptions) -> dict[str, torch.nn.Module]:
    """The four models, in eval mode on ``options.device``; the stock arm holds the no-gate arm's weights.

    >>> arms = build_arms(BenchmarkOptions(size="tiny"))
    >>> list(arms), arms["qwen3"].model.layers[0].self_attn.q_proj.weight.equal(arms["none"].model.layers[0].self_attn.q_proj.weight)
    (['qwen3', 'none', 'headwise', 'elementwise'], True)
    """
    arch = architecture(options)
    dtype, device = _dtype(options.dtype), torch.device(options.device)
    arms = {}
    for gate in gate_arms(options):
        torch.manual_seed(options.seed)  # same draws for the weights the arms share
        arms[gate] = gated_model(arch, gate, options.gate_variant)
    stock = stock_model(arch)
    stock.load_state_dict(arms["none"].state_dict())
    arms = {STOCK_ARM: stock, **arms}
    return {name: model.to(device=device, dtype=dtype).eval() for name, model in arms.items()}


def parameter_counts(options: BenchmarkOptions) -> dict[str, dict[str, int]]:
    """Parameters of each arm, whole and in the decoder layers, from the architecture alone (meta device).

    >>> parameter_counts(BenchmarkOptions(size="tiny"))["parameters"]["headwise"] > parameter_counts(BenchmarkOptions(size="tiny"))["parameters"]["none"]
    True
    """
    arch = architecture(options)
    with torch.device("meta"):
        arms = {STOCK_ARM: stock_model(arch)}
        arms.update({gate: gated_model(arch, gate, options.gate_variant) for gate in gate_arms(options)})
    counts = {
        "parameters": {name: parameter_count(model) for name, model in arms.items()},
        "layer_parameters": {name: layer_parameter_count(model) for name, model in arms.items()},
    }
    if is_moe(arch):  # a token's share: the gate's cost beside the experts' it uses
        idle = gated_config(arch, "none").idle_expert_parameters()
        counts["active_parameters"] = {name: count - idle for name, count in counts["parameters"].items()}
        counts["active_layer_parameters"] = {name: count - idle for name, count in counts["layer_parameters"].items()}
    return counts


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def layer_parameter_count(model: torch.nn.Module) -> int:
    """The weights every prompt token is multiplied with: the decoder layers'.

    The embedding is a lookup and prefill runs lm_head on the last token only (``logits_to_keep=1``),
    so prefill's compute grows with these, while a decode step reads every weight, lm_head included.
    """
    return sum(p.numel() for p in model.model.layers.parameters())


def _dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise GatedQwenError(f"unknown dtype {name!r}; choose one of {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


# ----------------------------------------------------------------------------------------------
# Timing


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TokenClock(BaseStreamer):
    """A ``generate`` streamer that notes when each step's tokens arrive (the first ``put`` is the prompt)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.times: list[float] = []

    def put(self, value):
        _synchronize(self.device)
        self.times.append(time.perf_counter())

    def end(self):
        pass


def time_prefill(model, input_ids: torch.Tensor) -> float:
    """Seconds for one forward pass over ``input_ids`` that fills the KV cache (logits of the last token only)."""
    _synchronize(input_ids.device)
    start = time.perf_counter()
    with torch.inference_mode():
        model(input_ids, use_cache=True, logits_to_keep=1)
    _synchronize(input_ids.device)
    return time.perf_counter() - start


def time_decode(model, input_ids: torch.Tensor, new_tokens: int) -> float:
    """Seconds per token of greedy decoding with transformers' ``generate`` and its KV cache.

    The median of the intervals between generated tokens: ``new_tokens - 1`` cached steps, no
    prefill. A median, not the mean, so that a step which an interrupt or a page fault stretches
    does not move the run's figure.
    """
    if new_tokens < 2:
        raise GatedQwenError("decode needs at least 2 new tokens to time a cached step")
    clock = TokenClock(input_ids.device)
    generation_config = GenerationConfig(
        do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0
    )
    with torch.inference_mode():
        output = model.generate(input_ids, generation_config=generation_config, streamer=clock)
    if output.shape[1] - input_ids.shape[1] != new_tokens:  # cannot happen without an eos; checked all the same
        raise RuntimeError(f"generate stopped after {output.shape[1] - input_ids.shape[1]} of {new_tokens} tokens")
    return statistics.median(later - earlier for earlier, later in zip(clock.times[1:], clock.times[2:]))


def interleaved(arms: dict, measure: Callable, repeats: int) -> dict[str, list[float]]:
    """Run ``measure(model)`` for every arm, one warm-up round and ``repeats`` rounds, rotating the order."""
    names = list(arms)
    times = {name: [] for name in names}
    for round_index in range(repeats + 1):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            seconds = measure(arms[name])
            if round_index:  # round 0 warms caches, allocator and kernels
                times[name].append(seconds)
    return times


def paired_ratio(times: dict[str, list[float]], arm: str, reference: str) -> float:
    """Median over rounds of ``arm``'s time over ``reference``'s time in the same round."""
    return statistics.median(a / b for a, b in zip(times[arm], times[reference], strict=True))


def paired_quartiles(times: dict[str, list[float]], arm: str, reference: str) -> tuple[float, float]:
    """First and third quartile over rounds of the same ratios: the spread a reader weighs a median against.

    >>> paired_quartiles({"a": [2.0, 2.0, 2.0, 2.0], "b": [2.0, 4.0, 6.0, 8.0]}, "b", "a")
    (1.25, 3.75)
    """
    ratios = [a / b for a, b in zip(times[arm], times[reference], strict=True)]
    if len(ratios) < 2:
        return ratios[0], ratios[0]
    first, _, third = statistics.quantiles(ratios, n=4)
    return first, third


def measure_models(options: BenchmarkOptions) -> dict:
    """Prefill and decode of the four arms; medians, paired ratios and the parameter counts."""
    arms = build_arms(options)
    device = torch.device(options.device)
    vocab = next(iter(arms.values())).config.vocab_size
    generator = torch.Generator().manual_seed(options.seed)
    prompts = {
        b: torch.randint(vocab, (b, options.prompt_length), generator=generator).to(device)
        for b in options.batch_sizes
    }
    workloads = {f"prefill_b{b}": (lambda model, ids=ids: time_prefill(model, ids)) for b, ids in prompts.items()}
    decode_prompt = prompts.get(1, torch.randint(vocab, (1, options.prompt_length), generator=generator).to(device))
    workloads["decode_b1"] = lambda model: time_decode(model, decode_prompt, options.new_tokens)

    parameters = {name: parameter_count(model) for name, model in arms.items()}
    layer_parameters = {name: layer_parameter_count(model) for name, model in arms.items()}
    results = {}
    for workload, measure in workloads.items():
        times = interleaved(arms, measure, options.repeats)
        tokens = options.prompt_length * int(workload.split("_b")[1]) if workload.startswith("prefill") else 1
        results[workload] = {
            "tokens_per_run": tokens,
            "seconds": times,
            "median_seconds": {name: statistics.median(t) for name, t in times.items()},
            "tokens_per_second": {name: tokens / statistics.median(t) for name, t in times.items()},
            "time_ratio_to_none": {name: paired_ratio(times, name, "none") for name in arms},
            "time_ratio_quartiles_to_none": {name: paired_quartiles(times, name, "none") for name in arms},
            "none_time_ratio_to_qwen3": paired_ratio(times, "none", STOCK_ARM),
            "none_time_ratio_quartiles_to_qwen3": paired_quartiles(times, "none", STOCK_ARM),
        }
    return {"parameters": parameters, "layer_parameters": layer_parameters, "workloads": results}


# ----------------------------------------------------------------------------------------------
# Checkpoints: loading and conversion


def write_checkpoints(options: BenchmarkOptions, folder: Path) -> dict[str, Path]:
    """A stock Qwen3 checkpoint and its gated counterpart (the first gated arm) of the benchmark architecture.

    The gated one is a ``save_pretrained`` of a freshly built gated model, not the converter's
    output, so that loading is measured independently of conversion.
    """
    arch = architecture(options)
    dtype = _dtype(options.dtype)
    torch.manual_seed(options.seed)
    gate = options.gates[0]
    paths = {"stock": folder / "qwen3", gate: folder / f"qwen3-gated-{gate}"}
    stock_model(arch).to(dtype).save_pretrained(paths["stock"])
    gated_model(arch, gate, options.gate_variant).to(dtype).save_pretrained(paths[gate])
    return paths


def measure_loading(options: BenchmarkOptions, checkpoints: dict[str, Path]) -> dict:
    """``from_pretrained`` seconds of the gated checkpoint beside the stock one, interleaved, files warm."""
    arch = architecture(options)
    stock_loader = stock_class(arch)
    gated_loader = Qwen3MoeGatedForCausalLM if is_moe(arch) else Qwen3GatedForCausalLM
    gate = options.gates[0]
    loaders = {
        STOCK_ARM: lambda: stock_loader.from_pretrained(checkpoints["stock"], dtype="auto", device_map=options.device),
        gate: lambda: gated_loader.from_pretrained(checkpoints[gate], dtype="auto", device_map=options.device),
    }

    def timed(load):
        device = torch.device(options.device)
        start = time.perf_counter()
        model = load()
        _synchronize(device)
        seconds = time.perf_counter() - start
        del model
        return seconds

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one bar per load would bury the log
    try:
        times = interleaved(loaders, timed, options.repeats)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    return {
        "gate": gate,
        "bytes": {name: folder_bytes(checkpoints["stock" if name == STOCK_ARM else name]) for name in loaders},
        "seconds": times,
        "median_seconds": {name: statistics.median(t) for name, t in times.items()},
        "time_ratio_to_qwen3": paired_ratio(times, gate, STOCK_ARM),
    }


def measure_conversion(options: BenchmarkOptions, stock: Path, folder: Path) -> dict:
    """``convert_checkpoint`` of the stock checkpoint beside ``shutil.copytree`` of it, each in a child process.

    The converter adds the first gated arm's gate and variant, at ``init="identity"`` where the variant has one
    (``"random"`` where it has none: a multiplicative SiLU or an additive sigmoid gate)."""
    from ...checkpoint.formats import read_weight_file_header, resolve_weight_files
    from ...transforms.conversion import check_identity_init
    from .child import run_step

    gate = options.gates[0]
    try:
        check_identity_init(gated_config(architecture(options), gate, options.gate_variant), "identity")
        init = "identity"
    except GatedQwenError:
        init = "random"
    conversion = {"gate": gate, "init": init, **options.gate_variant}

    largest = max(
        info.nbytes for file in resolve_weight_files(stock) for info in read_weight_file_header(file).values()
    )

    def work(kind):
        target = folder / kind
        shutil.rmtree(target, ignore_errors=True)
        if hasattr(os, "sync"):
            os.sync()  # the previous run's writeback would otherwise fall on this one
        # in a process of its own: its own peak memory
        outcome = run_step(kind, str(stock), str(target), conversion if kind == "convert" else None)
        shutil.rmtree(target)
        return outcome

    runs = interleaved({"copy": "copy", "convert": "convert"}, work, options.repeats)  # lists of outcomes
    return {"converter": conversion, **_summarize_conversion(runs, largest, folder_bytes(stock))}


def _summarize_conversion(runs: dict[str, list[dict]], largest: int, source_bytes: int) -> dict:
    seconds = {kind: [run["seconds"] for run in outcomes] for kind, outcomes in runs.items()}
    median_seconds = {kind: statistics.median(s) for kind, s in seconds.items()}
    peak_rss = {kind: max(run["peak_rss"] for run in outcomes) for kind, outcomes in runs.items()}
    written = runs["convert"][0]["bytes"]
    return {
        "source_bytes": source_bytes,
        "written_bytes": written,
        "largest_tensor_bytes": largest,
        "seconds": seconds,
        "median_seconds": median_seconds,
        "megabytes_per_second": {
            "copy": source_bytes / 1e6 / median_seconds["copy"],
            "convert": written / 1e6 / median_seconds["convert"],
        },
        "time_ratio_to_copy": statistics.median(
            c / p for c, p in zip(seconds["convert"], seconds["copy"], strict=True)
        ),
        "peak_rss": peak_rss,
        "import_only_peak_rss": max(run["import_peak_rss"] for outcomes in runs.values() for run in outcomes),
    }


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


# ----------------------------------------------------------------------------------------------
# The whole benchmark


def machine_description(options: BenchmarkOptions) -> dict:
    """CPU model, core count, torch and transformers versions and threads: what a reader needs to compare."""
    import transformers

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    facts = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": options.device,
    }
    if torch.device(options.device).type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(torch.device(options.device))
    return facts


def run_benchmark(options: BenchmarkOptions, log: Callable[[str], None] = lambda message: None) -> dict:
    """Measure everything ``options`` asks for; a JSON-ready dict (see :func:`~.report.format_markdown`).

    >>> result = run_benchmark(BenchmarkOptions(size="tiny", repeats=1, prompt_length=8, new_tokens=4, batch_sizes=(1,),
    ...                                         loading=False, conversion=False))
    >>> sorted(result["models"]["workloads"]), result["models"]["workloads"]["decode_b1"]["time_ratio_to_none"]["none"]
    (['decode_b1', 'prefill_b1'], 1.0)
    """
    # decode is timed from the first generated token to the last, so it needs two
    for name, least in (("repeats", 1), ("prompt_length", 1), ("new_tokens", 2)):
        if getattr(options, name) < least:
            raise GatedQwenError(f"{name.replace('_', ' ')} must be at least {least}, not {getattr(options, name)}")
    if not options.batch_sizes or min(options.batch_sizes) < 1:
        raise GatedQwenError(f"batch sizes must be positive, not {options.batch_sizes}")
    if torch.device(options.device).type == "cuda" and not torch.cuda.is_available():
        raise GatedQwenError(f"device {options.device} asked for, but torch sees no CUDA device")
    unknown = set(options.gate_variant) - set(GATE_VARIANT_DEFAULTS)
    if unknown or not options.gates or not set(options.gates) <= {"headwise", "elementwise"}:
        raise GatedQwenError(
            f"gates must be headwise and/or elementwise (not {list(options.gates)}) and the gate variant's keys "
            f"among {', '.join(GATE_VARIANT_DEFAULTS)} (not {', '.join(sorted(unknown)) or '-'})"
        )
    try:  # size, keys and values of the overrides, checked before anything runs
        gated_config(architecture(options), "none")
    except GatedQwenError:
        raise
    except (StrictDataclassError, TypeError, ValueError) as error:  # strict validation, the config's own checks
        detail = " ".join(str(error).split())  # one line: strict validation spreads its message over several
        raise GatedQwenError(
            f"the benchmark architecture is not a valid config ({detail}); check the --set values"
        ) from error
    for gate in options.gates:  # a variant a gate cannot take (headwise after o_proj) is refused by the config
        gated_config(architecture(options), gate, options.gate_variant)
    if options.threads is not None:
        torch.set_num_threads(options.threads)

    result = {
        "options": asdict(options),
        "architecture": architecture(options),
        "machine": machine_description(options),
    }
    result.update(parameter_counts(options))  # from the architecture alone: reported whatever is skipped
    if options.models:
        log("measuring prefill and decode of the four arms")
        result["models"] = measure_models(options)
    if options.loading or options.conversion:
        from ...checkpoint.outputs import scratch_folder

        with scratch_folder(
            options.scratch_dir, name="gated-qwen-bench"
        ) as scratch:  # a killed run's is removed by the next
            log("writing the stock and gated checkpoints")
            checkpoints = write_checkpoints(options, Path(scratch))
            if options.loading:
                log("measuring from_pretrained")
                result["loading"] = measure_loading(options, checkpoints)
            if options.conversion:
                log("measuring the converter beside a plain copy")
                result["conversion"] = measure_conversion(options, checkpoints["stock"], Path(scratch))
    return result


__all__ = [
    "ARMS",
    "BenchmarkOptions",
    "SIZES",
    "build_arms",
    "measure_conversion",
    "measure_loading",
    "measure_models",
    "run_benchmark",
]
