"""Benchmark: does the default run's best transfer to data the run never read?

A measurement script, not a test. For search seeds 0 .. N-1 it runs the README's main command
(``evolve run --bench beam`` with ``--search-seed S``, arguments after ``--`` added; each run in
a runs folder of its own, :func:`default_run.one_run`, as ``bench/seeds.py`` does), exports
each run's best, and then scores the starting program and every best on each dataset the data
folder holds, one ``evolve compare --json`` per dataset:

- BEAM-100K holdout (``--split holdout``: no run reads it),
- BEAM-500K (``--split all:500K``, every conversation present),
- BEAM-1M test (``--split test``, every conversation present),
- LoCoMo (``--bench locomo --split all``: the full file or the one-conversation sample).

A run evolves on BEAM-100K train and valid; its default guards read the LoCoMo sample and the
first BEAM-500K conversation, so the LoCoMo row shows that a guard held, not that the program
transfers. BEAM-1M and the other BEAM-500K conversations are data no run reads. BEAM-10M is
left out (about 100M tokens to encode on first use). It prints, per dataset, the start's
coverage and ceiling, each seed's best and gain, and the gains' mean, standard deviation and
range; ``--json FILE`` also writes every figure. ``--conversations N`` scores BEAM-500K and
BEAM-1M on their first N conversations only, and says so in each row's name.

``--work DIR`` keeps the runs, bests and a ``transfer.json`` in DIR; given a DIR that already
holds ``runs-S`` folders, those runs are read back instead of run again (their wall time is
then not known), so a long measurement can be continued.

    python bench/transfer.py --data-dir ../shared/data --seeds 5
    python bench/transfer.py --data-dir ../shared/data --seeds 2 --datasets holdout locomo
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from default_run import evolve, one_run, read_back


@dataclass(frozen=True)
class Dataset:
    """One place a best is scored: its bench and split, and the path under the data folder
    that must exist for it to be scored."""

    name: str
    bench: str
    split: str
    needs: tuple[str, ...]  # any one of these paths under the data folder


DATASETS = {
    "holdout": Dataset("BEAM-100K holdout", "beam", "holdout", ("beam/chats/100K",)),
    "500K": Dataset("BEAM-500K all", "beam", "all:500K", ("beam/chats/500K",)),
    "1M": Dataset("BEAM-1M test", "beam", "test", ("beam/chats/1M",)),
    "locomo": Dataset(
        "LoCoMo all", "locomo", "all", ("locomo/locomo10.json", "locomo/locomo-sample.json")
    ),
}


def present(data_dir: Path, names: list[str]) -> list[Dataset]:
    """The named datasets whose data the folder holds."""
    chosen = [DATASETS[n] for n in names]
    return [d for d in chosen if any((data_dir / path).exists() for path in d.needs)]


def compare(
    dataset: Dataset, programs: list[str], common: list[str], first: int | None
) -> dict[str, Any]:
    """``evolve compare --json`` of ``programs`` on ``dataset`` (its first ``first``
    conversations; None: all), with its seconds."""
    began = time.perf_counter()
    sliced = [] if first is None else ["--conversations", str(first)]
    out = evolve("compare", *programs, "--bench", dataset.bench, "--split", dataset.split,
                 *sliced, *common, "--json", "--no-progress")  # fmt: skip
    rows = json.loads(out)["programs"]
    name = dataset.name if first is None else f"{dataset.name}, first {first}"
    failed = [f"{Path(r['program']).name}: {r['errors']} ({r['first_error']})"
              for r in rows if r["errors"]]  # fmt: skip
    if failed:  # a failed question scores 0: the figures would not compare programs
        raise SystemExit(f"{name}: questions failed, no figures kept: {'; '.join(failed)}")
    return {"dataset": name, "bench": dataset.bench, "split": dataset.split,
            "seconds": time.perf_counter() - began, "questions": rows[0]["latency_questions"],
            "start": rows[0]["fitness"], "ceiling": rows[0]["ceiling"],
            "bests": [r["fitness"] for r in rows[1:]],
            "by_capability": [r["by_capability"] for r in rows],
            "context_chars": [r["context_chars"] for r in rows]}  # fmt: skip


def summary(gains: list[float]) -> str:
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    return (f"mean {100 * statistics.mean(gains):+.2f} pp, sd {100 * spread:.2f}, range "
            f"{100 * min(gains):+.2f} .. {100 * max(gains):+.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=5, help="search seeds 0 .. N-1")
    parser.add_argument("--datasets", nargs="*", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--cache-dir", type=Path, help="shared cache (default: a new one)")
    parser.add_argument("--work", type=Path, help="runs, bests and results (default: a new one)")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument(
        "--conversations",
        type=int,
        help="score BEAM-500K and BEAM-1M on their first N conversations only (a slice: "
        "their first encoding takes hours on a small machine); default all",
    )
    parser.add_argument("extra", nargs="*", help="after --: more `evolve run` arguments")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    data_dir = args.data_dir.resolve()
    datasets = present(data_dir, args.datasets)
    if not datasets:
        parser.error(f"none of {', '.join(args.datasets)} is under {data_dir}")
    work = args.work or Path(tempfile.mkdtemp(prefix="transfer-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = args.cache_dir or work / "cache"
    common = ["--data-dir", str(data_dir), "--cache-dir", str(cache.resolve())]
    print(f"work folder {work}", flush=True)
    rows = []
    for seed in range(args.seeds):
        done = (work / f"runs-{seed}").is_dir()
        rows.append(read_back(seed, work) if done else one_run(seed, common, work, args.extra))
        wall = "read back" if rows[-1]["wall"] is None else f"{rows[-1]['wall']:.0f} s"
        print(f"seed {seed}: {rows[-1]['best']} (valid {rows[-1]['valid']:.3f}; "
              f"{rows[-1]['message']}), {wall}", flush=True)  # fmt: skip
    programs = [str(rows[0]["start"]), *(str(r["path"]) for r in rows)]
    results = []
    for dataset in datasets:
        first = args.conversations if dataset.split in ("all:500K", "test") else None
        results.append(compare(dataset, programs, common, first))
        got = results[-1]
        gains = [b - got["start"] for b in got["bests"]]
        print(f"\n{got['dataset']} ({got['questions']} questions, {got['seconds']:.0f} s): start "
              f"{got['start']:.4f} of a possible {got['ceiling']:.3f}", flush=True)  # fmt: skip
        for row, best, gain in zip(rows, got["bests"], gains, strict=True):
            print(f"  seed {row['seed']}: {row['best']:6s} {best:.4f}  {100 * gain:+6.2f} pp")
        print(f"  gain: {summary(gains)}", flush=True)
    print(f"\n{'dataset':20s} {'start':>6s} {'best mean':>9s} {'gain pp (mean, sd, range)':s}")
    for got in results:
        gains = [b - got["start"] for b in got["bests"]]
        print(f"{got['dataset']:20s} {got['start']:6.3f} {statistics.mean(got['bests']):9.3f} "
              f"{summary(gains)}")  # fmt: skip
    record = {"runs": [{**r, "path": str(r["path"]), "start": str(r["start"])} for r in rows],
              "datasets": results}  # fmt: skip
    (work / "transfer.json").write_text(json.dumps(record, indent=2))
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
