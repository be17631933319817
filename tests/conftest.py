"""Shared test fixtures: seeds, tiny configs, and the local corpora in ../shared/data."""

import contextlib
import importlib.util
import os
import pathlib

import numpy as np
import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(
    os.environ.get("KT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data")
)
# CI sets KT_REQUIRE_SHARED_DATA=1 so that a missing ../shared/data fails
# instead of silently skipping the tests that use real corpora.
REQUIRE_SHARED_DATA = os.environ.get("KT_REQUIRE_SHARED_DATA", "") not in ("", "0")


def load_example(name):
    """The module of `examples/<name>.py` (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def shared_data():
    """Path of ../shared/data; skips (or fails under CI) when it is absent."""
    if not (SHARED_DATA / "README.md").exists():
        message = (
            f"real corpora not found at {SHARED_DATA} (a plain clone has none; "
            "set KT_SHARED_DATA to point at them)"
        )
        if REQUIRE_SHARED_DATA:
            pytest.fail(message + " and KT_REQUIRE_SHARED_DATA is set")
        pytest.skip(message)
    return SHARED_DATA


def copy_corpus_head(source, folder, counts):
    """Writes the first lines of a corpus folder's splits into `folder`.

    `counts` holds `(split, source_split, number_of_lines)`; both languages
    are copied, so the pairs stay aligned.
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, origin, count in counts:
        for lang in ("en", "de"):
            lines = (source / f"{origin}.{lang}").read_text(encoding="utf-8").splitlines()
            (folder / f"{split}.{lang}").write_text("\n".join(lines[:count]) + "\n",
                                                    encoding="utf-8")
    return folder


def multi30k_head(folder, counts):
    """`copy_corpus_head` of ../shared/data/multi30k; skips (fails under CI) without it."""
    source = SHARED_DATA / "multi30k"
    if not (source / "train.en").exists():
        if REQUIRE_SHARED_DATA:
            pytest.fail(f"{source} not found and KT_REQUIRE_SHARED_DATA is set")
        pytest.skip(f"{source} not found")
    return copy_corpus_head(source, folder, counts)


def subprocess_env(*paths, **variables):
    """The environment of a `keras-transformer` child: this checkout first on PYTHONPATH.

    `paths` go before the checkout (e.g. a folder with a `sitecustomize.py`);
    `variables` are added.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1", **variables)
    env["PYTHONPATH"] = os.pathsep.join(
        str(p) for p in (*paths, REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return env


def tiny_train_command(corpus, run_dir, *extra):
    """`keras-transformer train` of the tiny preset on a small corpus, in seconds.

    Vocabulary 500, 1,024 tokens per update, a checkpoint every 10 updates, a
    log row every 5, 4 validation and test sentences, greedy test, no export;
    `extra` flags come last (they override these).
    """
    import sys

    return [sys.executable, "-m", "keras_transformer", "train", "--data", str(corpus),
            "--preset", "tiny", "--vocab-size", "500", "--max-length", "48",
            "--tokens-per-batch", "1024", "--checkpoint-every", "10", "--log-every", "5",
            "--validation-bleu-sentences", "4", "--eval-sentences", "4", "--beam-size", "1",
            "--export-dir", "", "--output-dir", str(run_dir), *extra]


# Tests whose outcome cannot depend on KERAS_BACKEND: they exercise TensorFlow,
# tf.data, tf-text or plain Python only, or run every model in a subprocess
# that sets KERAS_BACKEND itself. They get the `backend_independent` marker,
# and with KT_SKIP_BACKEND_INDEPENDENT=1 they are deselected, so that
# run_all_backends.sh runs them under the first backend only. Entries are
# module file names; a test of those modules that does use the current
# backend is marked `every_backend` (it always runs).
BACKEND_INDEPENDENT_MODULES = {
    # the documentation's text against the argparse parsers and settings.markdown_table().
    "test_readme.py",
    # Pure-Python demo corpus generator (its CLI subprocess writes text only).
    "test_data_demo.py",
    # Text readers, gzip/encoding handling and TFDS loading: Python and tf.data.
    "test_data_readers.py",
    # SentencePiece training and tf-text graph ops; keras.utils.set_random_seed
    # calls tf.random.set_seed under every backend, and the test calls it too.
    "test_data_tokenizer.py",
    # tf.data bucketing/batching, plus a MirroredStrategy subprocess pinned to
    # KERAS_BACKEND=tensorflow (one test fits a model: see the exceptions).
    "test_data_streaming.py",
    # Sampled segmentations (SentencePiece) and continued tf.data streams.
    "test_data_sampling.py",
    # Where each shared name and default comes from (names.py), and that the
    # quantization modes agree; quantizing per backend is test_quantization.py.
    "test_names.py",
    # the package layout, read from the source with ast.
    "test_layout.py",
    # files.py: atomic writes, appends, staged folders, weights made in memory
    # (file I/O around Keras' own saving; nothing in it depends on the backend).
    "test_files.py",
    # Prepared corpora: SentencePiece, TFRecord shards, tf.data streaming, and
    # the prepare / train commands in subprocesses.
    "test_data_prepared.py",
    # The WMT-size corpus generator and the data benchmark (subprocesses).
    "test_benchmark_data.py",
    # Every test runs its models in subprocesses with KERAS_BACKEND set
    # explicitly (tensorflow for tf.distribute, jax for data parallelism).
    "test_distributed.py",
}
# Slow end-to-end tests (`slow`: whole commands and scripts in subprocesses,
# minutes each) run under the first backend only, unless marked
# `every_backend`: what they add per backend (the model, its training step,
# decoding, saving and loading) is covered under every backend by the fast
# tests and by the `every_backend` ones (resuming a run, training to
# memorisation, weights across backends, fitting on tf.data).

# Modules whose module-scoped fixtures are expensive (an export, a trained
# run) go to one pytest-xdist worker each (`--dist loadgroup`), so that the
# fixture is built once; test_export.py's export is shared with test_cli.py
# test_translate_command.py and test_xla_export.py through `exported()`, so the four
# are one group.
XDIST_GROUPS = {
    "test_export.py": "export",
    "test_cli.py": "export",
    "test_translate_command.py": "export",
    "test_xla_export.py": "export",
    "test_serving_warmup.py": "serving_warmup",
    "test_ctranslate2.py": "ctranslate2",
    "test_data_prepared.py": "prepared",
    "test_data_sampling.py": "data_sampling",
    "test_data_demo.py": "data_demo",
    "test_decoding.py": "decoding",
    "test_faults.py": "faults",
}
SKIP_BACKEND_INDEPENDENT = os.environ.get("KT_SKIP_BACKEND_INDEPENDENT", "") not in ("", "0")


def _is_backend_independent(item):
    if item.get_closest_marker("every_backend") is not None:
        return False
    if item.get_closest_marker("backend_independent") is not None:
        return True  # marked in the test module itself
    if item.get_closest_marker("slow") is not None:
        return True  # the first backend's run stands for the others (above)
    return item.path.name in BACKEND_INDEPENDENT_MODULES


@pytest.hookimpl(tryfirst=True)  # before `-m` selection, so the marker is usable there
def pytest_collection_modifyitems(config, items):
    independent = []
    for item in items:
        group = XDIST_GROUPS.get(item.path.name)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if _is_backend_independent(item):
            item.add_marker(pytest.mark.backend_independent)
            independent.append(item)
    if SKIP_BACKEND_INDEPENDENT and independent:
        chosen = set(map(id, independent))
        config.hook.pytest_deselected(items=independent)
        items[:] = [item for item in items if id(item) not in chosen]


def pytest_report_header(config):
    if SKIP_BACKEND_INDEPENDENT:
        return ("KT_SKIP_BACKEND_INDEPENDENT=1: deselecting backend-independent modules "
                + ", ".join(sorted(BACKEND_INDEPENDENT_MODULES)))
    return None


def pytest_configure(config):
    import keras

    if keras.backend.backend() == "torch":
        # Tiny test models gain nothing from intra-op threads, and torch's
        # spinning OpenMP workers slow down 10x when the 2 cores are shared
        # (measured: 45 ms vs 350-480 ms per step of the memorisation test).
        import torch

        torch.set_num_threads(1)


@contextlib.contextmanager
def _keeping_tensorflow_caches():
    """Leaves TensorFlow's eager caches alone while the seeds are set.

    `tf.random.set_seed` (so `keras.utils.set_random_seed`) clears the eager
    context's caches, so every instantiated function is built again: a
    module-scoped SavedModel's signature then spends 10-12 s on its first call
    of every test (measured on 2 cores), the largest cost of the suite. The
    tests draw TensorFlow random numbers from Keras' stateless ops and
    explicitly seeded tf.data shuffles only, which the cache does not touch;
    the seeds are set as before. Where TensorFlow's internals differ, the
    caches are cleared as usual (slower, same seeds).
    """
    try:
        from tensorflow.python import pywrap_tfe

        clear = pywrap_tfe.TFE_ContextClearCaches
    except (ImportError, AttributeError):
        yield
        return
    pywrap_tfe.TFE_ContextClearCaches = lambda handle: None
    try:
        yield
    finally:
        pywrap_tfe.TFE_ContextClearCaches = clear


@pytest.fixture(autouse=True)
def _package_logger():
    """Puts the `keras_transformer` logger back as it was after each test.

    A command run in-process (`commands.main`) calls `setup_logging`, which
    adds a handler on the test's captured stderr and stops propagation: left
    in place, later tests of the same worker would log into a closed stream
    and `caplog` would see nothing.
    """
    import logging

    logger = logging.getLogger("keras_transformer")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(autouse=True)
def _seed():
    import keras

    with _keeping_tensorflow_caches():
        keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield


@pytest.fixture
def tiny_config():
    """A very small config for fast numeric tests (not a preset: tests only)."""
    from keras_transformer import TransformerConfig

    return TransformerConfig.preset(
        "tiny", vocab_size=50, num_layers=2, d_model=32, num_heads=4, d_ff=64,
        dropout=0.0, max_length=64,
    )


def backend():
    import keras

    return keras.backend.backend()
