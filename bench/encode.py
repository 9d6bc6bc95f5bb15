"""Benchmark: MiniLM encoding speed and deviation per setting (a measurement script, not a test).

Encodes the same real BEAM-100K texts (message texts of the train conversations, which are
what indexing and evidence scoring embed, plus 1,000-character blocks cut from them, which is
what scoring embeds of retrieved text) in fp32 (the vectors before bf16) and with each variant
— bf16 autocast (:func:`evolve.models.embed.precision`), other batch sizes — in this process,
no cache, and prints wall and CPU seconds (CPU is the fairer figure on a shared machine) and
the deviation of every variant's vectors from fp32's (max and mean of ``1 - cos``).

    python bench/encode.py --data-dir ../shared/data [--texts 1000] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from evolve.benches.registry import bench
from evolve.environment import folder
from evolve.models.embed import Embedder, precision


def real_texts(data_dir: Path, n: int) -> list[str]:
    """About ``n`` texts: three quarters messages, a quarter 2,000-character blocks."""
    tasks = bench("beam").load_taskset(data_dir, "train")
    messages = [m.text() for c in tasks.conversations for _, m in c.messages().values()]
    blocks = ["\n\n".join(messages[i : i + 8])[:1000] for i in range(0, len(messages), 8)]
    return messages[: n - n // 4] + blocks[: n // 4]


Encode = Callable[[list[str]], np.ndarray]


def timed(encode: Encode, texts: list[str]) -> tuple[float, float, np.ndarray]:
    """Wall and CPU seconds of encoding ``texts`` (after a warm-up call), and the vectors."""
    encode(texts[:8])  # warm-up: first call pays one-time costs
    wall, cpu = time.perf_counter(), time.process_time()
    vecs = encode(texts)
    return time.perf_counter() - wall, time.process_time() - cpu, vecs


def with_precision(name: str) -> Encode:
    embedder = Embedder()
    embedder.precision = name
    return embedder._encode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(folder("DATA") or ""))
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()}, default precision {precision()}")  # fmt: skip
    texts = sorted(real_texts(args.data_dir, args.texts), key=len, reverse=True)
    print(f"{len(texts)} texts, {sum(map(len, texts)):,} characters")
    base_wall, base_cpu, base = timed(with_precision("fp32"), texts)
    print(f"fp32 (before): {base_wall:.1f} s wall, {base_cpu:.1f} s CPU")
    model = Embedder()._load()
    variants = {"bf16": with_precision("bf16")}
    for batch in (32, 128):
        variants[f"fp32, batch {batch}"] = lambda t, b=batch: model.encode(
            t, batch_size=b, convert_to_numpy=True, normalize_embeddings=True
        )
    for name, encode in variants.items():
        wall, cpu, vecs = timed(encode, texts)
        dev = 1.0 - np.sum(vecs * base, axis=1)
        print(f"{name}: {wall:.1f} s wall, {cpu:.1f} s CPU ({base_cpu / cpu:.2f}x less CPU), "
              f"1-cos max {dev.max():.1e} mean {dev.mean():.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
