"""Training data through Hugging Face ``datasets``: read, sharded across processes, tokenized and packed on the fly.

:func:`load_documents` opens the text: local ``.jsonl``/``.json``/``.parquet``/``.csv``/``.txt`` files
(``.txt``: one document per file) or any data set ``datasets.load_dataset`` opens (a hub id with a config
and a split, a local folder), either through datasets' Arrow cache (memory-mapped) or streamed
(``streaming=True``). :class:`PackedRows` turns it into the rows one process trains on:

* the documents are split into ``data_shards`` shards (contiguous slices of an Arrow data set, or the
  data set's own files when streamed; documents ``k, k + D, ...`` when a stream has fewer files than
  shards). By default an Arrow data set is one shard, whatever the number of processes, and a stream one
  shard per process;
* each shard is tokenized in batches, an end-of-text token after each document, and packed into rows of
  ``seq_len`` tokens. From an Arrow data set (``streaming=False``, the default) the rows are written once
  into an Arrow data set of their own (datasets' cache, memory-mapped) and each epoch reads them in a new
  permutation drawn from ``seed + epoch``: every row of the shard is equally likely at every step, as
  Trainer's random sampler would draw them. Streamed, a shard cannot be permuted before it has been read:
  its documents are shuffled in a buffer (seeded by the seed and the epoch) before they are packed, which
  mixes only documents that lie within ``shuffle_buffer`` of each other in the files;
* the rows are repeated epoch after epoch, and the global stream of rows takes one row of each shard in turn:
  ``shard 0 row 0, shard 1 row 0, ..., shard D-1 row 0, shard 0 row 1, ...``. Process ``r`` of ``W`` takes rows
  ``r, r + W, r + 2W, ...`` of that stream. When ``W`` divides ``D`` those are the rows of shards ``r, r + W, ...``,
  and the process reads only these shards (as ``datasets.distributed.split_dataset_by_node`` assigns them);
  otherwise (an Arrow data set only: a stream needs ``W`` to divide ``D``) it reads every shard's row table and
  keeps its rows.

So the global stream depends on the data, ``D`` and the seed, not on the number of processes: with ``batch_size``
rows per process, the rows of a global step are the same for 1 process x 8 rows as for 2 processes x 4, which is
what makes a run on N processes match a run on one. No process holds more than a batch of documents and the row
tables' pages it reads (memory-mapped): memory does not grow with the corpus. The data position of a checkpoint is the number of rows taken, and a resumed run
reads up to it again (Trainer's ``skip_first_batches``).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from .arguments import TrainingError, TrainRunArguments


EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
TOKENIZE_BATCH = 64  # documents tokenized in one call
LOCAL_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".txt": "text",
    ".text": "text",
}


# ----------------------------------------------------------------------------------------------
# Reading


def _local_files(spec: str) -> tuple[str, list[str]]:
    """The datasets builder and the files of a ``--train-file`` value (one path, or several comma-separated)."""
    paths = [Path(part) for part in spec.split(",") if part]
    for path in paths:
        if not path.is_file():
            raise TrainingError(f"{path} does not exist; build the corpus with `python scripts/prepare_corpus.py`")
    builders = {LOCAL_BUILDERS.get(path.suffix) for path in paths}
    if None in builders or len(builders) != 1:
        raise TrainingError(
            f"cannot read {spec}: give files of one format, {', '.join(sorted(LOCAL_BUILDERS))}, or a data set with --dataset"
        )
    return builders.pop(), [str(path) for path in paths]


def _bad_json_line(path: str) -> str | None:
    """``path:N`` of the first line of a JSON-lines file that is not a JSON object (only run once reading failed)."""
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                if not isinstance(json.loads(line), dict):
                    return f"{path}:{number}"
            except json.JSONDecodeError:
                return f"{path}:{number}"
    return None


def load_documents(args: TrainRunArguments, heldout: bool = False, streaming: bool | None = None):
    """The documents of a run as a ``datasets`` data set (an ``IterableDataset`` when streamed).

    ``heldout`` opens ``args.heldout_file`` (or ``args.heldout_split`` of ``args.dataset``) instead of the
    training text; ``None`` when the run has none. Nothing is read but the files' headers (streaming) or
    the Arrow cache is built batch by batch (not streaming): the corpus is never held in memory.

    >>> import tempfile
    >>> folder = tempfile.TemporaryDirectory()
    >>> corpus = Path(folder.name) / "train.jsonl"
    >>> _ = corpus.write_text('{"text": "Record one."}\\n{"text": "Record two."}\\n')
    >>> docs = load_documents(TrainRunArguments(train_file=str(corpus), output_dir="o", max_steps=1))
    >>> len(docs), docs[0]["text"]
    (2, 'Record one.')
    >>> folder.cleanup()
    """
    try:
        import datasets
    except ImportError as error:
        raise TrainingError(
            "training reads its text with Hugging Face datasets: pip install 'gated-qwen[train]'"
        ) from error

    streaming = args.streaming if streaming is None else streaming
    if heldout:
        if args.heldout_file:
            spec, name, split = args.heldout_file, None, "train"
        elif args.dataset and args.heldout_split:
            spec, name, split = None, args.dataset, args.heldout_split
        else:
            return None
    else:
        if bool(args.train_file) == bool(args.dataset):
            raise TrainingError(
                "give the training text with --train-file (local files) or --dataset (a data set), one of them"
            )
        spec, name, split = args.train_file, args.dataset, args.split
    datasets.disable_progress_bars()
    try:
        if spec is not None:
            builder, files = _local_files(spec)
            options = {"sample_by": "document"} if builder == "text" else {}
            documents = datasets.load_dataset(builder, data_files=files, split="train", streaming=streaming, **options)
            where = spec
        else:
            documents = datasets.load_dataset(name, args.dataset_config, split=split, streaming=streaming)
            where = f"{name}" + (f" ({args.dataset_config})" if args.dataset_config else "") + f" split {split}"
    except TrainingError:
        raise
    except Exception as error:  # datasets raises many types (file not found, builder and parse errors)
        raise reading_error(args, error, heldout) from error
    field = "text" if spec is not None and builder == "text" else args.text_field
    columns = documents.column_names
    if columns is None:  # a stream whose features datasets does not know before reading: the first document says
        try:
            first = next(iter(documents.take(1)), None)
        except Exception as error:  # a parse error in the first lines
            raise reading_error(args, error, heldout) from error
        columns = list(first) if first is not None else None
    if columns is not None and field not in columns:
        raise TrainingError(
            f"{where} has no {field!r} field (its fields: {', '.join(columns)}); name the text field with --text-field"
        )
    if field != "text":
        documents = documents.rename_column(field, "text")
    return documents.select_columns(["text"])


def reading_error(args: TrainRunArguments, error: Exception, heldout: bool = False) -> TrainingError:
    """The one-line error for a failure of datasets while reading the text (opening it, or streaming it later):
    the first line that is not a JSON object for JSON-lines files, the missing text field, else datasets' reason."""
    spec = args.heldout_file if heldout else args.train_file
    if spec is not None and not args.dataset:
        builder, files = _local_files(spec)
        if builder == "json":
            for path in files:
                bad = _bad_json_line(path)
                if bad:
                    return TrainingError(f"{bad} is not a JSON object with a {args.text_field!r} field")
    where = spec or args.dataset
    if isinstance(error, KeyError):
        return TrainingError(
            f"{where} has no {args.text_field!r} field in every document; name the text field with --text-field"
        )
    reason = " ".join(str(error).split())[:300]
    return TrainingError(f"cannot read {where}: {reason}")


def shard_documents(documents, num_shards: int, index: int):
    """Shard ``index`` of ``num_shards`` of ``documents`` as an ``IterableDataset`` that reads only its part
    where it can: a contiguous slice of an Arrow data set, the data set's files ``index, index + num_shards, ...``
    when a stream has a multiple of ``num_shards`` files, else every ``num_shards``-th document.

    >>> from datasets import Dataset
    >>> [row["text"] for row in shard_documents(Dataset.from_dict({"text": list("abcd")}), 2, 1)]
    ['c', 'd']
    """
    import datasets

    if isinstance(documents, datasets.Dataset):
        if len(documents) < num_shards:
            raise TrainingError(
                f"the training text has {len(documents)} documents, fewer than the {num_shards} data shards; lower --data-shards"
            )
        return documents.shard(num_shards, index, contiguous=True).to_iterable_dataset()
    if num_shards == 1:
        return documents
    if documents.num_shards % num_shards == 0:
        return documents.shard(num_shards, index, contiguous=False)
    # a stream of fewer files than shards: every shard reads it all and keeps its documents
    return documents.filter(lambda _, position: position % num_shards == index, with_indices=True)


def _pack(documents, tokenizer, seq_len: int) -> Iterator[list[int]]:
    """Rows of ``seq_len`` tokens from a data set of documents (its ``text``, tokenized a batch at a time), an eos
    token after each document, in the documents' order."""
    buffer: list[int] = []
    for batch in documents.iter(batch_size=TOKENIZE_BATCH):
        for ids in tokenizer(batch["text"], add_special_tokens=False).input_ids:
            buffer.extend(ids)
            buffer.append(tokenizer.eos_token_id)
        while len(buffer) >= seq_len:
            yield buffer[:seq_len]
            del buffer[:seq_len]


def _row_records(rows):
    """``{"input_ids": row}`` for each row ``rows()`` yields (the generator of :meth:`PackedRows.row_table`)."""
    for row in rows():
        yield {"input_ids": row}


class PackedRows(torch.utils.data.IterableDataset):
    """The training rows of process ``rank`` of ``world_size``, each ``{"input_ids", "labels"}`` of seq_len tokens.

    See the module docstring: process ``rank`` yields rows ``rank, rank + world_size, ...`` of the global stream
    (one row of each of the ``num_shards`` shards in turn), for ever (Trainer stops at ``max_steps``).

    >>> from datasets import Dataset
    >>> from transformers import AutoTokenizer
    >>> from gated_qwen.default_models import default_model_path
    >>> tokenizer = AutoTokenizer.from_pretrained(default_model_path("headwise"))
    >>> documents = Dataset.from_dict({"text": [f"Document {i} says something short." for i in range(8)]})
    >>> rows = PackedRows(documents, tokenizer, seq_len=16, num_shards=2, rank=0, world_size=2, seed=0)
    >>> row = next(iter(rows))
    >>> row["input_ids"].shape, torch.equal(row["labels"], row["input_ids"])
    (torch.Size([16]), True)
    """

    def __init__(
        self,
        documents,
        tokenizer,
        seq_len: int,
        num_shards: int,
        rank: int,
        world_size: int,
        seed: int,
        shuffle_buffer: int = 1000,
    ):
        import datasets

        super().__init__()
        if tokenizer.eos_token_id is None:
            raise TrainingError("the tokenizer has no eos token; documents need one to be packed into a stream")
        # an Arrow data set's shards are packed once into row tables and permuted whole; a stream is buffer-shuffled
        self.permuted = isinstance(documents, datasets.Dataset)
        if num_shards % world_size and not self.permuted:
            raise TrainingError(
                f"{world_size} processes cannot share {num_shards} streamed data shards evenly; pass --data-shards a "
                f"multiple of {world_size}"
            )
        self.documents, self.tokenizer, self.seq_len = documents, tokenizer, seq_len
        self.num_shards, self.rank, self.world_size = num_shards, rank, world_size
        self.seed, self.shuffle_buffer = seed, shuffle_buffer
        # whether this process reads only its own shards r, r + W, ... (else every shard, keeping its rows)
        self.own_shards = num_shards % world_size == 0
        self._row_tables: dict = {}  # shard index -> its rows (row_table), once built or read back

    def packed_rows(self, index: int) -> Iterator[list[int]]:
        """The rows of data shard ``index`` in the order of its documents, once."""
        return _pack(shard_documents(self.documents, self.num_shards, index), self.tokenizer, self.seq_len)

    def row_table(self, index: int):
        """The rows of data shard ``index`` as an Arrow data set (column ``input_ids``), built once by
        ``datasets.Dataset.from_generator`` into datasets' cache and memory-mapped: a later run with the same
        documents, tokenizer, ``seq_len`` and shards reads it again instead of tokenizing."""
        import datasets

        if index in self._row_tables:
            return self._row_tables[index]
        key = json.dumps(
            [
                self.documents._fingerprint,
                self.tokenizer.backend_tokenizer.to_str(),
                self.tokenizer.eos_token_id,
                self.seq_len,
                self.num_shards,
                index,
            ]
        )
        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
        table = datasets.Dataset.from_generator(
            _row_records,
            features=features,
            gen_kwargs={"rows": functools.partial(self.packed_rows, index)},
            fingerprint=hashlib.sha256(key.encode()).hexdigest()[:32],
        )
        if len(table) == 0:
            raise TrainingError(self._too_little(index))
        self._row_tables[index] = table
        return table

    def shard_rows(self, index: int) -> Iterator[list[int]]:
        """The rows of data shard ``index``, epoch after epoch, each epoch in a new order (module docstring)."""
        epoch = 0
        if self.permuted:
            table = self.row_table(index)
            for position in self._positions(index):
                yield table[position]["input_ids"]
        shard = shard_documents(self.documents, self.num_shards, index)
        if self.shuffle_buffer > 1:
            shard = shard.shuffle(seed=self.seed + index, buffer_size=self.shuffle_buffer)
        while True:
            shard.set_epoch(epoch)
            yielded = 0
            for row in _pack(shard, self.tokenizer, self.seq_len):
                yielded += 1
                yield row
            if yielded == 0 and epoch == 0:
                raise TrainingError(self._too_little(index))
            epoch += 1

    def _positions(self, index: int) -> Iterator[int]:
        """The positions in the row table of data shard ``index`` of its rows, epoch after epoch: each epoch the
        permutation ``torch.randperm(rows)`` draws from a generator seeded ``seed + epoch``."""
        rows, epoch = len(self.row_table(index)), 0
        while True:
            yield from torch.randperm(rows, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
            epoch += 1

    def _too_little(self, index: int) -> str:
        return (
            f"the training text holds fewer than one batch: data shard {index} of {self.num_shards} has fewer than "
            f"one row of {self.seq_len} tokens; give more text or lower --seq-len or --data-shards"
        )

    def check(self) -> None:
        """Raise the error a shard too small to give one row would raise in training, reading only the start of each
        shard (all of them, so every process raises the same error before anything is written); then, from an Arrow
        data set, pack this process's shards into their row tables (:meth:`row_table`), so that training starts
        with every row in place."""
        for index in range(self.num_shards):
            if next(self.packed_rows(index), None) is None:
                raise TrainingError(self._too_little(index))
        if self.permuted:
            # datasets builds each table once under a file lock: processes that share a shard wait for its table
            shards = range(self.rank, self.num_shards, self.world_size) if self.own_shards else range(self.num_shards)
            for index in shards:
                self.row_table(index)

    def __iter__(self):
        for ids in self._rows():
            row = torch.tensor(ids, dtype=torch.long)
            yield {"input_ids": row, "labels": row}

    def _rows(self) -> Iterator[list[int]]:
        """This process's rows of the global stream, for ever (module docstring)."""
        if self.own_shards:  # rows r, r + W, ... of the global stream are those of shards r, r + W, ... in turn
            streams = [self.shard_rows(index) for index in range(self.rank, self.num_shards, self.world_size)]
            for stream in itertools.cycle(streams):
                yield next(stream)
        else:  # row g of the global stream is the next row of shard g % D: this process keeps those with g % W == r
            positions = [self._positions(index) for index in range(self.num_shards)]
            for g in itertools.count():
                index = g % self.num_shards
                position = next(positions[index])
                if g % self.world_size == self.rank:
                    yield self.row_table(index)[position]["input_ids"]


def read_heldout_rows(args: TrainRunArguments, tokenizer) -> torch.Tensor | None:
    """The first ``args.eval_rows`` rows of the held-out text, in order, packed as training packs: (N, seq_len).

    Streamed: only as many documents as those rows need are read.
    """
    documents = load_documents(args, heldout=True, streaming=True)
    if documents is None:
        return None
    rows = []
    for row in _pack(documents, tokenizer, args.seq_len):
        rows.append(row)
        if len(rows) == args.eval_rows:
            break
    if not rows:
        raise TrainingError(f"the held-out text holds fewer tokens than one row of {args.seq_len}")
    return torch.tensor(rows, dtype=torch.long)


def iter_texts(documents) -> Iterator[str]:
    """Every text of ``documents`` once, in order, a batch at a time (for training a tokenizer on a stream)."""
    for batch in documents.iter(batch_size=1000):
        yield from batch["text"]


# ----------------------------------------------------------------------------------------------
# In-memory helpers for small texts (scripts, tests): a list of documents, one token tensor


def read_documents(path: str | Path) -> list[str]:
    """The documents of a ``.jsonl`` file (its ``"text"`` fields) or a ``.txt`` file (the whole file).

    >>> import tempfile
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = Path(folder.name) / "train.jsonl"
    >>> _ = path.write_text('{"text": "Record one."}\\n\\n{"text": "Record two."}\\n')
    >>> read_documents(path)  # blank lines are skipped
    ['Record one.', 'Record two.']
    >>> folder.cleanup()
    """
    path = Path(path)
    if not path.is_file():
        raise TrainingError(f"{path} does not exist; build the corpus with `python scripts/prepare_corpus.py`")
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return [text]
    documents = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            documents.append(json.loads(line)["text"])
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise TrainingError(f'{path}:{number} is not a JSON object with a "text" field') from error
    if not documents:
        raise TrainingError(f"{path} holds no documents")
    return documents


def train_tokenizer(documents, vocab_size: int):
    """A byte-level BPE tokenizer (transformers fast tokenizer) trained on ``documents`` (any iterable of str,
    read once, so a stream is never held in memory).

    It has ``<|endoftext|>`` (end of document, also the eos token) and ``<|pad|>``, and decodes bytes
    exactly, so any text round-trips.

    >>> tokenizer = train_tokenizer(["def add(a, b):\\n    return a + b\\n"] * 4, vocab_size=300)
    >>> tokenizer.decode(tokenizer("return a + b").input_ids)
    'return a + b'
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 2:
        raise TrainingError(
            f"vocab_size {vocab_size} is too small: a byte-level BPE needs at least {len(alphabet) + 2}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_TOKEN, PAD_TOKEN], initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def pack_documents(documents: list[str], tokenizer) -> torch.Tensor:
    """All documents as one token stream, the eos token after each: a 1-D int64 tensor.

    >>> tokenizer = train_tokenizer(["ab ab ab"], vocab_size=260)
    >>> pack_documents(["ab", "ab"], tokenizer).tolist() == [*tokenizer("ab").input_ids, 0] * 2
    True
    """
    if tokenizer.eos_token_id is None:
        raise TrainingError("the tokenizer has no eos token; documents need one to be packed into a stream")
    ids: list[int] = []
    for encoded in tokenizer(documents, add_special_tokens=False).input_ids:
        ids.extend(encoded)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def heldout_rows(stream: torch.Tensor, seq_len: int, max_rows: int | None = None) -> torch.Tensor:
    """The first ``max_rows`` non-overlapping rows of a held-out stream, in order: (N, seq_len)."""
    rows = len(stream) // seq_len
    if rows == 0:
        raise TrainingError(f"the held-out text has {len(stream)} tokens, fewer than one row of {seq_len}")
    rows = rows if max_rows is None else min(rows, max_rows)
    return stream[: rows * seq_len].view(rows, seq_len)


__all__ = [
    "PackedRows",
    "heldout_rows",
    "iter_texts",
    "load_documents",
    "pack_documents",
    "read_documents",
    "read_heldout_rows",
    "shard_documents",
    "train_tokenizer",
]
