"""Build the training corpus: the docstrings of the Python standard library installed with this Python.

Every ``.py`` file under the standard library folder (``sysconfig.get_paths()["stdlib"]``), minus tests,
``site-packages`` and demo folders, is parsed with :mod:`ast` (never imported or run). Each module
docstring becomes a document; each class and function with a docstring becomes a document holding its
signature and docstring, as source (``def f(x):`` then the indented docstring), so the model sees both
prose and the code shape of a definition. Files are visited in sorted order and one file in 20 (by a hash of
its relative path) goes to the held-out split, so the output depends only on the Python version.

The text is CPython's, under the PSF License Agreement (``LICENSE.txt`` in the same folder), which permits
redistribution of derived works; see ``corpus/README.md``.

    python scripts/prepare_corpus.py                 # writes data/stdlib_docstrings/{train,heldout}.jsonl
    python scripts/prepare_corpus.py --out DIR --force
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

from gated_qwen.checkpoint.outputs import output_file, write_text


SKIPPED_PARTS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "lib2to3",
    "turtledemo",
}
HELDOUT_EVERY = 20


def _definition_source(node: ast.AST) -> str:
    """``def name(args):`` / ``class Name(bases):`` with the node's docstring indented under it, as source."""
    doc = ast.get_docstring(node, clean=True).replace('"""', "'''")
    stub = type(node)(**{**{f: getattr(node, f) for f in node._fields}, "body": [ast.Pass()], "decorator_list": []})
    header = ast.unparse(ast.fix_missing_locations(stub)).removesuffix("pass").rstrip()  # "def f(x):"
    body = "\n".join(("    " + line) if line else "" for line in doc.split("\n"))
    closing = "\n    " if "\n" in doc else ""
    return f'{header}\n    """{body.removeprefix("    ")}{closing}"""'


def documents_of(source: str) -> list[str]:
    """The documents of one module's source: its docstring, then each documented class and function."""
    tree = ast.parse(source)
    documents = []
    module_doc = ast.get_docstring(tree, clean=True)
    if module_doc:
        documents.append(module_doc)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and ast.get_docstring(node):
            documents.append(_definition_source(node))
    return documents


def is_heldout(relative_path: str) -> bool:
    return int(hashlib.sha256(relative_path.encode()).hexdigest(), 16) % HELDOUT_EVERY == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]), help="standard library folder"
    )
    parser.add_argument("--out", type=Path, default=Path("data/stdlib_docstrings"), help="output folder")
    parser.add_argument("--force", action="store_true", help="overwrite existing output files")
    args = parser.parse_args(argv)

    outputs = {split: args.out / f"{split}.jsonl" for split in ("train", "heldout")}
    existing = [str(p) for p in outputs.values() if p.exists()]
    if existing and not args.force:
        parser.error(f"{', '.join(existing)} exist; pass --force to overwrite")
    if not (args.stdlib / "LICENSE.txt").is_file():
        parser.error(f"{args.stdlib} has no LICENSE.txt; pass --stdlib the folder of a CPython standard library")

    splits: dict[str, list[str]] = {"train": [], "heldout": []}
    files = 0
    for path in sorted(args.stdlib.rglob("*.py")):
        relative = path.relative_to(args.stdlib).as_posix()
        if SKIPPED_PARTS.intersection(Path(relative).parts[:-1]) or Path(relative).name.startswith("test_"):
            continue
        try:
            documents = documents_of(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are deliberately invalid (e.g. bad-encoding samples)
        files += 1
        splits["heldout" if is_heldout(relative) else "train"].extend(documents)

    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {"python": sys.version.split()[0], "stdlib": str(args.stdlib), "files": files}
    for split, documents in splits.items():
        with output_file(outputs[split]) as partial, partial.open("w", encoding="utf-8") as f:
            for text in documents:
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        data = outputs[split].read_bytes()
        manifest[split] = {"documents": len(documents), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_text(args.out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
