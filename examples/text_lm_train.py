"""Train a small language model on text shards, tokenized in the dali_shards workers and bucketed by
length, so that batches carry little padding.

The text is real and ships with Python: the docstrings of the standard library's modules, classes
and functions (one sample each, a few words to a few pages). They are written at start into
WebDataset-style shards (``<key>.txt``). A word-level tokenizer is fitted on them in the main
process and handed to the pipeline as a bound method (``map=tokenizer.encode``): its vocabulary
travels to the worker processes with it (pickled with dill), where every sample is tokenized.
``bucket_by`` groups samples of similar length into the same batches; DALI pads each batch to its
longest sample (``fn.pad``). A GRU language model then trains for a few steps, on the GPU if there
is one.

    python examples/text_lm_train.py                      # a few hundred steps on the CPU, in about a minute
    python examples/text_lm_train.py --no-bucket          # the same without bucketing, for comparison

Printed per epoch: the loss, tokens/s, the padding fraction of the batches with bucketing and without
(the same data, one pass each), and the fraction of time spent waiting for data; a JSON line each in
``--out-dir`` (default ``runs/text_lm_train/train_log.jsonl``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sysconfig
import time
from collections import Counter
from typing import Dict, List

import numpy as np
import torch
from nvidia.dali import fn

from dali_shards import ShardWriter, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator

PAD, UNK, BOS = 0, 1, 2
WORD = re.compile(r"\w+|[^\w\s]")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps-per-epoch", type=int, default=None, help="stop each epoch early (smoke runs)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2, help="dali_shards Python workers")
    ap.add_argument("--bucket-window", type=int, default=512, help="samples per worker bucketed at once")
    ap.add_argument("--no-bucket", action="store_true", help="train without bucketing")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens kept per sample")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--modules", type=int, default=120, help="standard-library files read for text")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=os.path.join("runs", "text_lm_train"))
    return ap.parse_args(argv)


def stdlib_docstrings(limit: int) -> List[str]:
    """Docstrings of the standard library (modules, classes, functions), in a fixed order."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in os.listdir(root) if f.endswith(".py"))[:limit]
    texts = []
    for name in files:
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= 3:
                    texts.append(doc)
    return texts


class Tokenizer:
    """Words and punctuation, the ``size`` most frequent of the corpus; others are UNK."""

    def __init__(self, texts: List[str], size: int, max_tokens: int):
        counts = Counter(w for t in texts for w in WORD.findall(t.lower()))
        self.vocab: Dict[str, int] = {w: i + 3 for i, (w, _) in enumerate(counts.most_common(size - 3))}
        self.max_tokens = max_tokens

    def __len__(self) -> int:
        return len(self.vocab) + 3

    def encode(self, sample: dict) -> dict:
        """The map: a sample's text as token ids (BOS first), at most ``max_tokens``."""
        ids = [BOS] + [self.vocab.get(w, UNK) for w in WORD.findall(sample["txt"].lower())]
        return {"tokens": np.asarray(ids[: self.max_tokens], dtype=np.int64)}


def token_count(out: dict) -> int:
    """bucket_by: a sample's length in tokens."""
    return len(out["tokens"])


def write_text_shards(texts: List[str], folder: str, seed: int) -> str:
    """The texts as shards of 500 samples, in a shuffled order; the manifest's path."""
    order = np.random.default_rng(seed).permutation(len(texts))
    with ShardWriter(os.path.join(folder, "text-%05d.tar"), max_count=500) as writer:  # + manifest.json
        for i in order:
            writer.write({"__key__": f"{i:06d}", "txt": texts[i]})
    return writer.manifest_path


def make_loader(manifest, tokenizer, args, bucket: bool, seed: int):
    extra = dict(bucket_by=token_count, bucket_window=args.bucket_window) if bucket else {}

    @sharded_pipeline(manifest, fields=("txt",), map=tokenizer.encode, batch_size=args.batch_size,
                      py_num_workers=args.workers, shuffle=True, seed=seed, num_threads=2,
                      device_id=None, **extra)  # fmt: skip
    def text(tokens):
        return fn.pad(tokens, fill_value=PAD), tokens.shape()

    return DALIShardedIterator(text(), ["tokens", "lengths"])


def padding_fraction(loader) -> float:
    """Padded slots over all token slots, one epoch of ``loader``."""
    padded = total = 0
    for (batch,) in loader:
        padded += batch["tokens"].numel() - int(batch["lengths"].sum())
        total += batch["tokens"].numel()
    return padded / max(total, 1)


class LanguageModel(torch.nn.Module):
    def __init__(self, vocab: int, width: int = 128):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width, padding_idx=PAD)
        self.rnn = torch.nn.GRU(width, width, batch_first=True)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        return self.head(self.rnn(self.embed(tokens))[0])


def train_epoch(model, optimizer, loader, device, max_steps):
    """One epoch: (mean loss, tokens/s, data-wait fraction, steps)."""
    losses, tokens, wait, steps = [], 0, 0.0, 0
    start = time.perf_counter()
    batches = iter(loader)
    while max_steps is None or steps < max_steps:
        t0 = time.perf_counter()
        try:
            (batch,) = next(batches)
        except StopIteration:
            break
        wait += time.perf_counter() - t0
        x = batch["tokens"].to(device)
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        tokens += int(batch["lengths"].sum())
        steps += 1
    if max_steps is not None and steps == max_steps:
        loader.reset()  # leave the epoch early; the next starts afresh
    elapsed = time.perf_counter() - start
    return float(np.mean(losses)), tokens / elapsed, wait / elapsed, steps


def main(argv=None) -> List[dict]:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = os.path.join(args.out_dir, "shards")
    os.makedirs(data, exist_ok=True)
    texts = stdlib_docstrings(args.modules)
    tokenizer = Tokenizer(texts, args.vocab, args.max_tokens)
    manifest = write_text_shards(texts, data, args.seed)
    # the loaders start their worker processes before torch touches the GPU
    plain = make_loader(manifest, tokenizer, args, bucket=False, seed=args.seed)
    bucketed = make_loader(manifest, tokenizer, args, bucket=True, seed=args.seed)
    train = plain if args.no_bucket else bucketed
    print(f"{len(texts)} docstrings of the standard library, vocabulary {len(tokenizer)}, batch {args.batch_size}, "
          f"{args.workers} workers, {'no bucketing' if args.no_bucket else f'bucket window {args.bucket_window}'}, {device}")  # fmt: skip
    model = LanguageModel(len(tokenizer)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    log, results = os.path.join(args.out_dir, "train_log.jsonl"), []
    for epoch in range(args.epochs):
        pad_plain, pad_bucketed = padding_fraction(plain), padding_fraction(bucketed)
        loss, rate, wait, steps = train_epoch(model, optimizer, train, device, args.steps_per_epoch)
        result = {"epoch": epoch, "steps": steps, "loss": loss, "tokens_per_s": rate, "data_wait_fraction": wait,
                  "padding_fraction_plain": pad_plain, "padding_fraction_bucketed": pad_bucketed,
                  "padding_reduction": pad_plain / max(pad_bucketed, 1e-9)}  # fmt: skip
        results.append(result)
        with open(log, "a") as f:
            f.write(json.dumps(result) + "\n")
        print(f"epoch {epoch}: loss {loss:.3f}, {rate:.0f} tokens/s, padding {100 * pad_bucketed:.1f}% bucketed vs "
              f"{100 * pad_plain:.1f}% without ({result['padding_reduction']:.1f}x less), "
              f"waiting for data {100 * wait:.0f}% of the time", flush=True)  # fmt: skip
    return results


if __name__ == "__main__":
    main()
