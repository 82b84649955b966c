"""The training data through datasets: local formats, a data set folder with a split and a text field, streaming
or not (the same rows; permuted whole, or shuffled in a buffer), shards that read only their part, and one-line errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from conftest import TOKENIZER_TEXT

from gated_qwen.cli import main
from gated_qwen.tools.training import (
    PackedRows,
    TrainingError,
    TrainRunArguments,
    load_documents,
    train_tokenizer,
)
from gated_qwen.tools.training.data import shard_documents


DOCUMENTS = [f"{i}: {text}" for i in range(12) for text in TOKENIZER_TEXT]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TOKENIZER_TEXT * 4, vocab_size=300)


def write_jsonl(path: Path, field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: text, "id": i}) + "\n" for i, text in enumerate(DOCUMENTS)))
    return path


def rows(args: TrainRunArguments, tokenizer, count: int = 12, **kwargs) -> list[list[int]]:
    stream = iter(
        PackedRows(
            load_documents(args),
            tokenizer,
            args.seq_len,
            num_shards=kwargs.get("shards", 1),
            rank=kwargs.get("rank", 0),
            world_size=kwargs.get("world", 1),
            seed=args.seed,
        )
    )
    return [next(stream)["input_ids"].tolist() for _ in range(count)]


def test_jsonl_parquet_and_streaming_give_the_same_rows(tmp_path, tokenizer):
    import datasets

    jsonl = write_jsonl(tmp_path / "t.jsonl")
    datasets.Dataset.from_dict({"text": DOCUMENTS}).to_parquet(str(tmp_path / "t.parquet"))
    base = {"output_dir": "unused", "max_steps": 1, "seq_len": 16}
    documents = load_documents(TrainRunArguments(train_file=str(jsonl), **base))
    epoch = list(PackedRows(documents, tokenizer, 16, num_shards=1, rank=0, world_size=1, seed=0).packed_rows(0))
    assert len(epoch) >= 12  # one pass over the documents, in their order
    reference = rows(TrainRunArguments(train_file=str(jsonl), **base), tokenizer, 2 * len(epoch))  # the Arrow cache
    assert (
        rows(TrainRunArguments(train_file=str(tmp_path / "t.parquet"), **base), tokenizer, 2 * len(epoch)) == reference
    )
    # every epoch is a permutation of all the rows, drawn from seed + epoch
    for index in range(2):
        order = torch.randperm(len(epoch), generator=torch.Generator().manual_seed(index)).tolist()
        assert reference[index * len(epoch) : (index + 1) * len(epoch)] == [epoch[i] for i in order]
    assert (
        rows(TrainRunArguments(train_file=str(jsonl), seed=1, **base), tokenizer) != reference[:12]
    )  # the seed orders them
    streamed = rows(TrainRunArguments(train_file=str(jsonl), streaming=True, **base), tokenizer, len(epoch))
    assert streamed != epoch and sorted(streamed) != sorted(epoch)  # documents shuffled before they are packed
    flat = [token for row in reference for token in row]
    assert flat.count(tokenizer.eos_token_id) >= 4  # documents packed across rows, an eos after each


def test_packed_rows_are_cached_for_the_same_text_and_rebuilt_when_it_changes(tmp_path, tokenizer):
    jsonl = write_jsonl(tmp_path / "t.jsonl")
    args = TrainRunArguments(train_file=str(jsonl), output_dir="unused", max_steps=1, seq_len=16)
    first = PackedRows(load_documents(args), tokenizer, 16, num_shards=1, rank=0, world_size=1, seed=0).row_table(0)
    again = PackedRows(load_documents(args), tokenizer, 16, num_shards=1, rank=0, world_size=1, seed=0).row_table(0)
    assert again.cache_files == first.cache_files  # read back, not tokenized again
    jsonl.write_text(jsonl.read_text().replace("0: ", "zero: "))
    changed = PackedRows(load_documents(args), tokenizer, 16, num_shards=1, rank=0, world_size=1, seed=0).row_table(0)
    assert changed.cache_files != first.cache_files and changed["input_ids"] != first["input_ids"]


def test_a_dataset_folder_with_a_split_and_a_text_field(tmp_path, tokenizer):
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", field="content")
    write_jsonl(folder / "validation.jsonl", field="content")
    args = TrainRunArguments(
        train_file=None,
        dataset=str(folder),
        split="validation",
        text_field="content",
        output_dir="unused",
        max_steps=1,
        seq_len=16,
    )
    documents = load_documents(args)
    assert documents.column_names == ["text"] and next(iter(documents))["text"] == DOCUMENTS[0]
    with pytest.raises(TrainingError, match="has no 'text' field .*content.*--text-field"):
        load_documents(TrainRunArguments(train_file=None, dataset=str(folder), output_dir="unused", max_steps=1))


def test_shards_split_the_documents_without_overlap(tmp_path):
    jsonl = write_jsonl(tmp_path / "t.jsonl")
    for streaming in (False, True):
        documents = load_documents(
            TrainRunArguments(train_file=str(jsonl), output_dir="u", max_steps=1, streaming=streaming)
        )
        parts = [[row["text"] for row in shard_documents(documents, 4, index)] for index in range(4)]
        assert sorted(sum(parts, [])) == sorted(DOCUMENTS) and all(parts), streaming
        assert not set(parts[0]) & set(parts[1])


def test_streaming_processes_need_a_multiple_of_their_count_in_shards(tmp_path, tokenizer):
    documents = load_documents(
        TrainRunArguments(
            train_file=str(write_jsonl(tmp_path / "t.jsonl")), output_dir="u", max_steps=1, streaming=True
        )
    )
    with pytest.raises(
        TrainingError,
        match="2 processes cannot share 3 streamed data shards evenly; pass --data-shards a multiple of 2",
    ):
        PackedRows(documents, tokenizer, 16, num_shards=3, rank=0, world_size=2, seed=0)


@pytest.mark.parametrize("shards", [1, 3])
def test_processes_split_the_global_stream_of_any_shard_count(tmp_path, tokenizer, shards):
    """From an Arrow data set, process r of W takes rows r, r + W, ... of the 1-process stream, however many shards."""
    documents = load_documents(
        TrainRunArguments(train_file=str(write_jsonl(tmp_path / "t.jsonl")), output_dir="u", max_steps=1)
    )

    def first_rows(rank: int, world: int, count: int) -> list[list[int]]:
        rows = PackedRows(documents, tokenizer, 16, num_shards=shards, rank=rank, world_size=world, seed=0)
        rows.check()
        return [row["input_ids"].tolist() for row in itertools.islice(rows, count)]

    one = first_rows(0, 1, 24)
    assert first_rows(0, 2, 12) == one[0::2] and first_rows(1, 2, 12) == one[1::2]


@pytest.mark.parametrize("streaming", ["--streaming", "--no-streaming"])
@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "fine"}\n[1, 2]\n', "t.jsonl:2 is not a JSON object"),
        ('{"text": "fine"}\nnot json\n', "t.jsonl:2 is not a JSON object"),
        ('{"body": "no text field"}\n', "has no 'text' field"),
    ],
)
def test_bad_data_is_one_line(tmp_path, capsys, content, message, streaming):
    (tmp_path / "t.jsonl").write_text(content)
    status = main(
        [
            "train",
            "--train-file",
            str(tmp_path / "t.jsonl"),
            "--out",
            str(tmp_path / "o"),
            "--max-steps",
            "1",
            streaming,
        ]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "o").exists()


def test_train_file_and_dataset_are_exclusive(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--train-file", "a.jsonl", "--dataset", "b", "--out", str(tmp_path / "o"), "--max-steps", "1"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_cli_trains_on_a_dataset_folder_with_a_heldout_split(tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", field="content")
    write_jsonl(folder / "validation.jsonl", field="content")
    config = str(Path(__file__).parents[2] / "configs" / "tiny_headwise.json")
    status = main(
        [
            "train",
            "--dataset",
            str(folder),
            "--text-field",
            "content",
            "--heldout-split",
            "validation",
            "--config",
            config,
            "--vocab-size",
            "300",
            "--seq-len",
            "16",
            "--batch-size",
            "2",
            "--max-steps",
            "2",
            "--eval-every",
            "2",
            "--eval-rows",
            "2",
            "--out",
            str(tmp_path / "run"),
            "--threads",
            "1",
            "--no-progress",
        ]
    )
    assert status == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["heldout"]["tokens"] == 2 * 15
    saved = json.loads((tmp_path / "run" / "train_args.json").read_text())
    assert (saved["dataset"], saved["text_field"], saved["heldout_split"]) == (str(folder), "content", "validation")
