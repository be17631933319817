"""Data for the Transformer: tokenizer, corpus readers, tf.data pipeline, demo corpus.

TensorFlow-only (tf.data, tf-text, sentencepiece, tensorflow-datasets); the
datasets it builds feed `model.fit` on every Keras backend.
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
