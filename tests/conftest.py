"""Shared test fixtures: seeds, tiny configs, and the local corpora in ../shared/data."""

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


def pytest_configure(config):
    import keras

    if keras.backend.backend() == "torch":
        # Tiny test models gain nothing from intra-op threads, and torch's
        # spinning OpenMP workers slow down 10x when the 2 cores are shared
        # (measured: 45 ms vs 350-480 ms per step of the memorisation test).
        import torch

        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    import keras

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
