import pytest
import torch

from gated_qwen.models.layout import (
    gate_dim,
    gate_type_for_rows,
    merge_query_and_gate,
    q_proj_rows,
    split_query_and_gate,
)


def spec_rows(num_heads, num_kv_heads, head_dim, g):
    """Row labels in the order docs/released-format.md lists them: ("q", head, i) or ("g", head, i)."""
    group = num_heads // num_kv_heads
    rows = []
    for k in range(num_kv_heads):
        heads = range(k * group, (k + 1) * group)
        rows += [("q", h, i) for h in heads for i in range(head_dim)]
        rows += [("g", h, i) for h in heads for i in range(g)]
    return rows


@pytest.mark.parametrize("heads,kv", [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_split_finds_each_row_where_the_spec_puts_it(heads, kv, gate):
    D = 4
    g = gate_dim(gate, D)
    labels = spec_rows(heads, kv, D, g)
    fused = torch.arange(len(labels))
    query, gate_logits = split_query_and_gate(fused, kv, D, g)
    assert query.shape == (kv, heads // kv, D) and gate_logits.shape == (kv, heads // kv, g)
    query, gate_logits = query.reshape(heads, D), gate_logits.reshape(heads, g)
    for index, (kind, head, i) in enumerate(labels):
        assert (query if kind == "q" else gate_logits)[head, i] == index


def test_released_layout_is_not_the_qwen3_next_interleave():
    # Qwen3-Next reads q_proj as [query D | gate D] per head; with G > 1 the rows differ.
    heads, kv, D = 4, 2, 3
    fused = torch.arange(heads * 2 * D)
    query, _ = split_query_and_gate(fused, kv, D, D)
    next_query, _ = fused.view(heads, 2 * D).chunk(2, dim=-1)
    assert not torch.equal(query.reshape(heads, D), next_query)


def test_split_gives_views_and_merge_inverts_it_on_weights_and_activations():
    weight = torch.randn(2 * (3 * 4 + 3 * 1), 5)  # K=2, G=3, D=4, g=1, 5 inputs
    query, gate = split_query_and_gate(weight, 2, 4, 1, dim=0)
    assert query.shape == (2, 3, 4, 5) and gate.shape == (2, 3, 1, 5)
    assert query.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    assert torch.equal(merge_query_and_gate(query, gate, dim=0), weight)
    activations = torch.randn(2, 7, weight.shape[0])
    assert torch.equal(merge_query_and_gate(*split_query_and_gate(activations, 2, 4, 1)), activations)


def test_row_counts_and_the_gate_type_they_imply():
    assert q_proj_rows("none", 16, 128) == 2048
    assert q_proj_rows("headwise", 16, 128) == 2048 + 16
    assert q_proj_rows("elementwise", 16, 128) == 4096
    assert [gate_type_for_rows(r, 16, 128) for r in (2048, 2064, 4096, 2050)] == [
        "none",
        "headwise",
        "elementwise",
        None,
    ]


def test_bad_sizes_and_names_are_refused():
    with pytest.raises(ValueError, match="do not split"):
        split_query_and_gate(torch.zeros(12), 2, 4, 1)
    with pytest.raises(ValueError, match="unknown gate type"):
        gate_dim("channelwise", 8)
    with pytest.raises(ValueError, match="not of the same heads"):
        merge_query_and_gate(torch.zeros(2, 3, 4), torch.zeros(2, 2, 1))
