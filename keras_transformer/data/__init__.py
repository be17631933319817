"""Data for the Transformer: tokenizer, corpus readers, prepared corpora, demo corpus.

TensorFlow-only (tf.data, tf-text, sentencepiece, tensorflow-datasets); the
datasets it builds feed `model.fit` on every Keras backend. A corpus is
prepared once (`preparation`: vocabulary, token-id shards of `records`, a
manifest), read as a `prepared.PreparedCorpus` and streamed into
length-bucketed batches (`streaming`); `corpora` says which corpus `--data`
names and prepares it.

Example:

>>> from keras_transformer.data import corpora
>>> corpus = corpora.prepare_corpus("demo", vocab_size=4000)  # or a text folder
>>> dataset = corpus.dataset("train", tokens_per_batch=4096, max_length=64,
...                          training=True, repeat=True)
>>> model.fit(dataset, steps_per_epoch=1000)
"""

from keras_transformer.data.readers import (
    CorpusError,
    ParallelText,
    load_parallel_text,
    load_wmt14,
    write_parallel_text,
)
from keras_transformer.data.streaming import (
    LengthPolicyCounts,
    bucket_batch_sizes,
    bucket_boundaries,
)
from keras_transformer.data.tokenizer import Tokenizer, train_tokenizer

__all__ = [
    "CorpusError", "LengthPolicyCounts", "ParallelText", "Tokenizer", "bucket_batch_sizes",
    "bucket_boundaries", "generate_pairs", "load_parallel_text", "load_wmt14",
    "train_tokenizer", "write_demo_corpus", "write_parallel_text",
]

_DEMO_NAMES = ("generate_pairs", "write_demo_corpus")


def __getattr__(name):
    # The demo corpus is imported on first use, not here, so that
    # `python -m keras_transformer.data.demo` does not import it twice.
    if name in _DEMO_NAMES:
        from keras_transformer.data import demo

        return getattr(demo, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
