"""The token streams of a language model's training splits, made once (`templm data streams`) and read by
`templm train-lm` in place of the corpus: at paper scale the tokenisation of tens of millions of documents is the
work of a Beam pipeline (templm.data.lm_streams_beam), not of every training process at its start.

A streams folder:

  manifest.json                  what was tokenised: the corpus, the SentencePiece model (its SHA-256, EOS) and per
                                 split its split file, documents, tokens, first and last date, months, the ids the
                                 corpus lacks (counted, the first few named) and the documents whose date differs
                                 from the split file's;
  <split>/<YYYY-MM>.tokens.npy   int32: the month's documents in (date, id) order, each its pieces then EOS;
  <split>/<YYYY-MM>.lengths.npy  int64: each of those documents' tokens, EOS included.

The months' files one after the other are `lm_data.tokenize_documents(read_split_documents(...))`: the same tokens
and offsets, so a run trained from the folder has the data fingerprint of one trained from the corpus (either may
resume the other). Which document an id names is as `splits.apply_split` says: its first in corpus order.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np

from templm import paths
from templm.data.lm_data import load_processor, require_split_file, split_path, tokenize_documents
from templm.data.readers import Corpus, describe_corpus, resolve_corpus
from templm.data.splits import apply_split
from templm.data.token_stream import month_of
from templm.errors import DataError
from templm.io import file_sha256, write_failure_named

MANIFEST = "manifest.json"
FORMAT = "templm token streams"
VERSION = 1


def month_files(folder: str, split: str, month: str) -> Tuple[str, str]:
    """(tokens, lengths) file of a split's month."""
    return (paths.join(folder, split, f"{month}.tokens.npy"), paths.join(folder, split, f"{month}.lengths.npy"))


def write_npy(path: str, chunks: Iterable[np.ndarray], count: int, dtype: str) -> None:
    """A 1-D .npy file of `count` values of `dtype` ('<i4', '<i8') written from `chunks` in turn (the whole array is
    never held), with the header np.save writes for it."""
    written = 0
    try:
        with paths.open(path, "wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": dtype, "fortran_order": False, "shape": (int(count),)})
            for chunk in chunks:
                data = np.asarray(chunk, dtype=dtype)
                f.write(data.tobytes())
                written += len(data)
    except OSError as e:  # a full disk names the file
        raise write_failure_named(e, path) from None
    if written != count:
        raise ValueError(f"{path}: {written} values written where the header says {count}")


def split_entry(split_file: str, months: Mapping[str, Tuple[int, int]], first: Optional[str], last: Optional[str],
                missing: int, missing_ids: List[str], date_mismatches: int) -> Dict[str, Any]:
    """A split's record in the manifest (months: {YYYY-MM: (documents, tokens)})."""
    return {"split_file": split_file, "documents": sum(d for d, _ in months.values()),
            "tokens": sum(t for _, t in months.values()), "first_date": first, "last_date": last,
            "months": {m: {"documents": d, "tokens": t} for m, (d, t) in sorted(months.items())},
            "missing": missing, "missing_ids": missing_ids, "date_mismatches": date_mismatches}


def write_manifest(folder: str, corpus: Corpus, spm_model: str, eos_id: int, splits: Mapping[str, Any]) -> dict:
    manifest = {"format": FORMAT, "version": VERSION, "corpus": corpus, "spm_model": spm_model,
                "spm_sha256": file_sha256(spm_model), "eos_id": int(eos_id), "splits": dict(splits)}
    path = paths.join(folder, MANIFEST)
    try:
        with paths.open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    except OSError as e:
        raise write_failure_named(e, path) from None
    return manifest


def split_files_of(split_dir: str, names: Iterable[str]) -> Dict[str, str]:
    """{split: its file} in a splits folder (`split_dir/split.gz`, or `split_dir/split` where it was gunzipped)."""
    return {name: paths.absolute(split_path(None, split_dir, name)) for name in names}


def check_found(name: str, found: int, expected_missing: int, split_file: str, corpus: Corpus) -> None:
    if not found:
        raise DataError(f"none of the ids of split {name} is in the corpus {describe_corpus(corpus)} "
                        f"({expected_missing} missing)", split_file)


def write_streams(corpus: Corpus, split_files: Mapping[str, str], spm_model: str, folder: str,
                  format: str = "auto", on_error: str = "raise") -> dict:
    """Writes the streams of each split (`{name: split file}`) into `folder` (module docstring); returns the
    manifest. One process: a split's documents are held while they are sorted and tokenised, as train-lm holds them."""
    corpus = resolve_corpus(corpus)
    spm_model = paths.absolute(spm_model)
    processor = load_processor(spm_model)
    entries = {}
    for name, split_file in split_files.items():
        split_file = paths.absolute(split_file)
        require_split_file(split_file)
        docs_iter, report = apply_split(corpus, split_file, format, on_error)
        docs = sorted(docs_iter, key=lambda d: (d.date, d.id))
        check_found(name, len(docs), report.missing, split_file, corpus)
        paths.makedirs(paths.join(folder, name))
        months: Dict[str, Tuple[int, int]] = {}
        for month, group in itertools.groupby(docs, key=lambda d: month_of(d.date)):
            tokens, offsets = tokenize_documents(list(group), processor)
            lengths = np.diff(offsets)
            tokens_file, lengths_file = month_files(folder, name, month)
            write_npy(tokens_file, [tokens], len(tokens), "<i4")
            write_npy(lengths_file, [lengths], len(lengths), "<i8")
            months[month] = (len(lengths), len(tokens))
        entries[name] = split_entry(split_file, months, docs[0].date.isoformat(), docs[-1].date.isoformat(),
                                    report.missing, list(report.missing_ids), report.date_mismatches)
    return write_manifest(folder, corpus, spm_model, int(processor.eos_id()), entries)


def read_manifest(folder: str) -> dict:
    path = paths.join(os.fspath(folder), MANIFEST)
    if not paths.exists(path):
        raise DataError("no manifest.json: not a streams folder (write one with `templm data streams`)", folder)
    try:
        with paths.open(path, "r", encoding="utf-8") as f:
            manifest = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"not valid JSON: {e}", path) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"not a manifest of templm's token streams (its format is not {FORMAT!r})", path)
    if manifest.get("version") != VERSION:
        raise DataError(f"token streams of version {manifest.get('version')!r}; this templm reads version "
                        f"{VERSION} (write them again with `templm data streams`)", path)
    return manifest


def open_split_stream(folder: str, split: str, spm_model: str, allow_missing: bool = False) -> Tuple[dict, dict]:
    """(the split's manifest entry, the manifest) of one split of a streams folder, checked before its tokens are
    read: there, tokenised with the SentencePiece model `spm_model` (by SHA-256), and, unless `allow_missing`, with
    every id of its split file in the corpus (as lm_data.read_split_documents); a DataError naming what is not."""
    folder = paths.absolute(folder)
    manifest = read_manifest(folder)
    where = paths.join(folder, MANIFEST)
    if split not in manifest["splits"]:
        raise DataError(f"holds no split {split!r} (it holds {', '.join(sorted(manifest['splits']))})", where)
    if file_sha256(spm_model) != manifest["spm_sha256"]:
        raise DataError(f"was tokenised with {manifest['spm_model']}, not with the SentencePiece model {spm_model} "
                        "(their SHA-256 differ): bind the streams' model, or write the streams with this one", where)
    entry = manifest["splits"][split]
    if entry["missing"] and not allow_missing:
        raise DataError(f"{entry['missing']} of the document ids of split {split} were not in the corpus (first: "
                        f"{', '.join(entry['missing_ids'])}); is it the split of another corpus?", entry["split_file"])
    return entry, manifest


def read_split_stream(folder: str, split: str, spm_model: str,
                      allow_missing: bool = False) -> Tuple[np.ndarray, np.ndarray, dict, dict]:
    """(tokens, offsets [D + 1], the split's manifest entry, the manifest) of one split of a streams folder
    (`open_split_stream`, then `read_split_tokens`)."""
    entry, manifest = open_split_stream(folder, split, spm_model, allow_missing)
    return (*read_split_tokens(folder, split, entry), entry, manifest)


def read_split_tokens(folder: str, split: str, entry: Mapping[str, Any]) -> Tuple[np.ndarray, np.ndarray]:
    """(tokens, offsets [D + 1]) of one split of a streams folder, its months' files checked against its manifest
    entry (`open_split_stream`)."""
    folder = paths.absolute(folder)
    where = paths.join(folder, MANIFEST)
    tokens, lengths = [], []
    for month, counts in entry["months"].items():
        for path, kind, n in zip(month_files(folder, split, month), ("tokens", "lengths"),
                                 (counts["tokens"], counts["documents"])):
            if not paths.exists(path):
                raise DataError(f"the {kind} file of {month} named in the manifest is missing", path)
            with paths.open(path, "rb") as f:
                try:
                    array = np.load(f, allow_pickle=False)
                except ValueError as e:
                    raise DataError(f"not a .npy file: {e}", path) from None
            if array.shape != (n,):
                raise DataError(f"holds {array.shape} values where the manifest says {n}", path)
            (tokens if kind == "tokens" else lengths).append(array)
    lengths_all = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths_all)]).astype(np.int64)
    tokens_all = np.concatenate(tokens).astype(np.int32) if tokens else np.zeros(0, np.int32)
    if offsets[-1] != len(tokens_all):
        raise DataError(f"the lengths of split {split} add up to {offsets[-1]} tokens, its files hold "
                        f"{len(tokens_all)}", where)
    return tokens_all, offsets
