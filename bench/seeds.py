"""Benchmark: how much the default run's outcome varies with its search seed.

A measurement script, not a test. It runs the README's main command, ``evolve run --bench
beam``, once per search seed (``--search-seed 0 .. N-1``, arguments after ``--`` added to each
run), all into one cache and each into a runs folder of its own, exports each run's best
program (``evolve export``) and scores the starting program and every best on ``--split``
(holdout by default: no run reads it) in one ``evolve compare --json``. It prints, per seed,
the run's wall time, its best (id, valid fitness as the run selected it, the change that made
it), its coverage on the split and the gain over the starting program; then the gains' mean,
standard deviation, range and how many reach ``--goal``.

A run with search seed 0 is the README's command itself, so its row is what a newcomer gets;
the others show what the same command could have found. The spread is search-path noise: the
seeds change which tunables the proposer moves, never how candidates are scored or selected.
Each run is :func:`default_run.one_run`, shared with ``bench/transfer.py`` (which scores the
bests on every dataset the data folder holds, not one split).

    python bench/seeds.py --data-dir ../shared/data --seeds 5
    python bench/seeds.py --data-dir ../shared/data --seeds 3 -- --seed OTHER.py --rounds 2,8,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from default_run import evolve, one_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=5, help="search seeds 0 .. N-1")
    parser.add_argument("--split", default="holdout", help="where the bests are compared")
    parser.add_argument("--goal", type=float, default=0.15, help="gain to count (0.15: 15 pp)")
    parser.add_argument("--cache-dir", type=Path, help="shared cache (default: a new one)")
    parser.add_argument("extra", nargs="*", help="after --: more `evolve run` arguments")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="seeds-"))
    cache = args.cache_dir or work / "cache"
    common = ["--data-dir", str(args.data_dir.resolve()), "--cache-dir", str(cache.resolve())]
    rows = []
    for seed in range(args.seeds):
        rows.append(one_run(seed, common, work, args.extra))
        print(f"seed {seed}: {rows[-1]['best']} (valid {rows[-1]['valid']:.3f}) in "
              f"{rows[-1]['wall']:.0f} s", flush=True)  # fmt: skip
    programs = [str(rows[0]["start"]), *(str(r["path"]) for r in rows)]
    compared = json.loads(evolve("compare", *programs, "--split", args.split, *common, "--json",
                                 "--no-progress"))["programs"]  # fmt: skip
    start, bests = compared[0], compared[1:]
    print(f"\n{args.split}: start {start['fitness']:.4f} of a possible {start['ceiling']:.3f}")
    print(f"{'seed':>4s}  {'wall s':>6s}  {'best':14s}  {'valid':>5s}  {args.split:>7s}  "
          f"{'gain pp':>7s}  change")  # fmt: skip
    gains = []
    for row, got in zip(rows, bests, strict=True):
        gains.append(got["fitness"] - start["fitness"])
        print(f"{row['seed']:4d}  {row['wall']:6.0f}  {row['best']:14s}  {row['valid']:.3f}  "
              f"{got['fitness']:7.4f}  {100 * gains[-1]:+7.2f}  {row['message']}")  # fmt: skip
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    reached = sum(g >= args.goal for g in gains)
    print(f"gain: mean {100 * statistics.mean(gains):+.2f} pp, sd {100 * spread:.2f}, range "
          f"{100 * min(gains):+.2f} .. {100 * max(gains):+.2f}; {reached} of {len(gains)} reach "
          f"+{100 * args.goal:.0f} pp")  # fmt: skip


if __name__ == "__main__":
    main()
