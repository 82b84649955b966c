"""Train a tiny Qwen3Gated model a few steps under torch's FSDP2 (``fully_shard``) on CPU with gloo, the gate rows of
q_proj a parameter of their own (:func:`gated_qwen.tools.training.gate_parameter_groups`), and write what happened.

Run by tests/tools/test_training_fsdp.py under ``torchrun --nproc_per_node 2`` (sharded) and as one plain process
(the reference): ``python tests/tools/fsdp_on_cpu.py OUT.json``. accelerate (so Trainer and ``gated-qwen train
--fsdp``) enables FSDP only on GPUs; this launcher is the FSDP that runs on CPU: the same gate groups, the same
sharding of the parameters, optimizer and gradients, without Trainer around it.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from gated_qwen import Qwen3GatedConfig, Qwen3GatedForCausalLM
from gated_qwen.tools.training import gate_parameter_groups, merge_gate_rows


STEPS, GLOBAL_BATCH, SEQ_LEN, GATE_LR_SCALE = 4, 8, 16, 10.0


def main(out: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo")
    config = Qwen3GatedConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        headwise_attn_output_gate=True,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen3GatedForCausalLM(config)
    start = {name: p.detach().clone() for name, p in model.state_dict().items()}
    groups = gate_parameter_groups(model, lr=1e-2, gate_lr_scale=GATE_LR_SCALE, weight_decay=0.1)
    names = {id(p): name for name, p in model.named_parameters()}
    named = [
        {**{k: v for k, v in g.items() if k != "params"}, "names": [names[id(p)] for p in g["params"]]} for g in groups
    ]
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    parameters = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(
        [
            {**{k: v for k, v in g.items() if k != "names"}, "params": [parameters[n] for n in g["names"]]}
            for g in named
        ],
        betas=(0.9, 0.95),
    )
    gate_name = "model.layers.0.self_attn.q_proj.parametrizations.weight.original1"
    gate = parameters[gate_name]
    local_rows = (gate.to_local() if hasattr(gate, "to_local") else gate).shape[0]
    data = torch.randint(0, 128, (STEPS, GLOBAL_BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(1))
    per_rank = GLOBAL_BATCH // world
    losses = []
    for step in range(STEPS):
        rows = data[step, rank * per_rank : (rank + 1) * per_rank]
        loss = model(input_ids=rows, labels=rows).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        reported = loss.detach().clone()
        if world > 1:
            dist.all_reduce(reported)
            reported /= world
        losses.append(reported.item())
    if world > 1:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        # the sharded parameters gathered into full tensors (as a SHARDED -> FULL state dict conversion does)
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        full = model.state_dict()
    if rank == 0:  # the full state dict (cpu_offload) is on rank 0 only
        plain = Qwen3GatedForCausalLM(config)
        gate_parameter_groups(plain, lr=1.0, gate_lr_scale=GATE_LR_SCALE)  # the same parametrization, to load into
        plain.load_state_dict(full)
        merge_gate_rows(plain)
        trained = plain.state_dict()
        result = {
            "world": world,
            "losses": losses,
            "gate_rows_local": local_rows,
            "gate_rows_full": int(full[gate_name].shape[0]),
            "gate_is_sharded": type(gate).__name__ == "DTensor",
            "changed": {name: not torch.equal(trained[name], start[name]) for name in start},
            "q_proj_0": trained["model.layers.0.self_attn.q_proj.weight"].tolist(),
        }
        with open(out, "w") as f:
            json.dump(result, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
