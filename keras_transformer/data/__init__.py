"""Data for the Transformer: tokenizer, corpus readers, tf.data pipeline, demo corpus.

TensorFlow-only (tf.data, tf-text, sentencepiece, tensorflow-datasets); the
datasets it builds feed `model.fit` on every Keras backend.

Example:

>>> from keras_transformer import data
>>> paths = data.write_demo_corpus("demo")  # or real aligned .en/.de files
>>> tokenizer = data.train_tokenizer(paths["train"], 8000, "demo/spm.model")
>>> pairs = data.load_parallel_text(*paths["train"])
>>> dataset = data.make_dataset(pairs, tokenizer, tokens_per_batch=4096,
...                             max_length=64, training=True)
>>> model.fit(dataset, epochs=10)
"""

from keras_transformer.data.pipeline import (
    BatchStatistics,
    LengthPolicyCounts,
    batch_statistics,
    bucket_batch_sizes,
    bucket_boundaries,
    count_length_policy,
    make_dataset,
)
from keras_transformer.data.readers import (
    CorpusError,
    ParallelText,
    load_parallel_text,
    load_wmt14,
    write_parallel_text,
)
from keras_transformer.data.tokenizer import Tokenizer, train_tokenizer

__all__ = [
    "BatchStatistics", "CorpusError", "LengthPolicyCounts", "ParallelText", "Tokenizer",
    "batch_statistics", "bucket_batch_sizes", "bucket_boundaries", "count_length_policy",
    "generate_pairs", "load_parallel_text", "load_wmt14", "make_dataset", "train_tokenizer",
    "write_demo_corpus", "write_parallel_text",
]

_DEMO_NAMES = ("generate_pairs", "write_demo_corpus")


def __getattr__(name):
    # The demo corpus is imported on first use, not here, so that
    # `python -m keras_transformer.data.demo` does not import it twice.
    if name in _DEMO_NAMES:
        from keras_transformer.data import demo

        return getattr(demo, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
