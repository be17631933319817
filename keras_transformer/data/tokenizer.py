"""A shared source-target subword tokenizer that runs inside the TensorFlow graph.

The paper encodes both languages with one byte-pair-encoding vocabulary
(section 5.1). `train_tokenizer` trains that vocabulary with the
`sentencepiece` package; `Tokenizer` holds the trained model in a tf-text
`SentencepieceTokenizer`, so the same object tokenizes inside `tf.data` and
inside an exported SavedModel.

Training options, chosen so that `detokenize(tokenize(s)) == s`:

- `normalization_rule_name="identity"`: SentencePiece's default `nmt_nfkc`
  rewrites characters (NFKC folds e.g. the spacing acute accent U+00B4 into a
  combining one, and the full-width forms into ASCII), which breaks the round
  trip. The corpora are used as they are.
- `remove_extra_whitespaces=False`: runs of spaces, tabs and trailing spaces
  come back unchanged. Leading whitespace is the one thing that does not: the
  decoder drops it (`add_dummy_prefix=True`, the default, so that a word has
  the same pieces at the start of a sentence as elsewhere).
- `byte_fallback=True`: a character outside the vocabulary is encoded as its
  UTF-8 bytes (`<0x..>` pieces, 256 ids of the vocabulary) instead of `<unk>`,
  so rare characters (brackets in a German-trained model, soft hyphens,
  emoji, CJK) survive the round trip.

The translation front end is written once, here, as graph ops of `Tokenizer`
that every way of translating calls (`Translator`, the exported SavedModel,
`CTranslate2Translator`):

- `encode_source(text, max_length)`: invalid UTF-8 replaced by U+FFFD,
  SentencePiece pieces, the first `max_length - 1` of them, then EOS; a
  blank sentence (empty, or only whitespace as Python's `str.isspace`
  defines it) gives an empty row, which callers answer with `""` without
  decoding.
- `decode_output(ids)`: a decoder's output ids cut before the first EOS,
  pad and BOS dropped (`output_ids`), detokenized, the text valid UTF-8.
"""

import hashlib
import io
import numbers
import os
import pathlib

import sentencepiece
import tensorflow as tf
import tensorflow_text
from tensorflow_text.python.ops import sentencepiece_tokenizer as _tf_text_sentencepiece

from keras_transformer.model.config import TransformerConfig
from keras_transformer.data.readers import iter_lines
from keras_transformer.files import native_stderr_silenced

# The model's special ids (pad must be 0: the model's masks assume it).
_SPECIAL_IDS = {
    name: getattr(TransformerConfig, name)
    for name in ("pad_id", "bos_id", "eos_id", "unk_id")
}

# The characters for which Python's `str.isspace()` is true (what `str.strip()`
# removes), as an RE2 class: a sentence made of them only is blank. The
# readers and prepared corpora drop such lines with `str.strip()`, and
# `encode_source` gives them an empty row with this, in the graph.
_WHITESPACE_CLASS = (r"[\t-\r\x{1c}-\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}"
                     r"\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]")
_REPLACEMENT_CHARACTER = 0xFFFD


def _valid_utf8(text):
    """`tf.string` -> the same with every invalid UTF-8 sequence replaced by U+FFFD."""
    return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace",
                                        replacement_char=_REPLACEMENT_CHARACTER)


class _SharedModelResource(_tf_text_sentencepiece._SentencepieceModelResource):
    """tf-text's SentencePiece model resource, created under a shared name.

    tf-text creates the model as a kernel-owned resource (its TODO
    b/318839908). TensorFlow deletes such a resource whenever the eager kernel
    cache is cleared, which `tf.random.set_seed` (so also
    `keras.utils.set_random_seed`) does; every later call then fails with
    "Resource .../SentencepieceOp/... does not exist". Under a shared name
    the resource belongs to the resource manager and survives. The name is
    the model's hash, so equal models share one read-only resource.
    """

    def __init__(self, model):
        self._shared_name = (
            "keras_transformer_sentencepiece_" + hashlib.sha256(model).hexdigest()[:24]
        )
        super().__init__(model, "SentencepieceModel")

    def _create_resource(self):
        with tf.name_scope(self._name):
            return _tf_text_sentencepiece.gen_sentencepiece_tokenizer.sentencepiece_op(
                model=self._model, shared_name=self._shared_name
            )


def check_model_proto(model_proto, model_file=None):
    """Loads serialized SentencePiece bytes; raises `ValueError` unless they fit the model.

    They must parse as a SentencePiece model with the model's special ids.

    Returns:
        The `sentencepiece.SentencePieceProcessor`.
    """
    where = f"SentencePiece model {model_file}" if model_file else "model_proto"
    if not model_proto:
        raise ValueError(f"{where} is empty")
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(model_proto)
    except (RuntimeError, OSError) as error:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(f"{where} is not a SentencePiece model"
                         + (f": {detail}" if detail else "")) from None
    found = {
        "pad_id": processor.pad_id(),
        "bos_id": processor.bos_id(),
        "eos_id": processor.eos_id(),
        "unk_id": processor.unk_id(),
    }
    if found != _SPECIAL_IDS:
        raise ValueError(
            f"{where} has special ids {found}, but the model needs "
            f"{_SPECIAL_IDS}; train it with train_tokenizer() or with "
            "SentencePiece options pad_id=0, bos_id=1, eos_id=2, unk_id=3"
        )
    return processor


class Tokenizer(tf.Module):
    """A SentencePiece subword tokenizer whose ops run in the TensorFlow graph.

    Wraps a tf-text `SentencepieceTokenizer` built from the serialized model,
    so `tokenize` and `detokenize` work eagerly, inside `tf.data.Dataset.map`
    and inside a `tf.function` saved with `tf.saved_model.save` (the tokenizer
    is a `tf.Module`; attach it to the exported module). It is TensorFlow-only
    and independent of the Keras backend.

    The special ids are fixed by `keras_transformer.TransformerConfig`:
    `pad_id=0`, `bos_id=1`, `eos_id=2`, `unk_id=3`; a model trained with other
    ids is rejected.

    Args:
        model_proto: the serialized SentencePiece model (the bytes of a
            `.model` file).
        model_file: where `model_proto` was read from, if anywhere (kept
            for export code that ships the model file as an asset).
        name: name of the `tf.Module`.

    Example:

    >>> tokenizer = Tokenizer.load("ende.model")
    >>> ids = tokenizer.tokenize(["Hello world.", "Guten Morgen."])  # ragged
    >>> tokenizer.detokenize(ids).numpy()
    array([b'Hello world.', b'Guten Morgen.'], dtype=object)
    """

    def __init__(self, model_proto, *, model_file=None, name="tokenizer"):
        super().__init__(name=name)
        if not isinstance(model_proto, bytes) or not model_proto:
            raise ValueError(
                "model_proto must be the non-empty bytes of a SentencePiece "
                f"model, received {type(model_proto).__name__}"
            )
        processor = check_model_proto(model_proto, model_file)
        self._model_proto = model_proto
        self._model_file = None if model_file is None else str(model_file)
        self._vocabulary_size = processor.GetPieceSize()
        self._processor = processor
        with self.name_scope, native_stderr_silenced():
            self._sentencepiece = tensorflow_text.SentencepieceTokenizer(
                model=model_proto, out_type=tf.int32
            )
            # Replace the kernel-owned model (see _SharedModelResource).
            self._sentencepiece._model_resource = _SharedModelResource(model_proto)

    @classmethod
    def load(cls, model_file):
        """Loads a tokenizer from a SentencePiece `.model` file.

        Args:
            model_file: path of the file written by `train_tokenizer` (or by
                `sentencepiece.SentencePieceTrainer` with the model's ids).

        Returns:
            A `Tokenizer`.
        """
        path = pathlib.Path(model_file)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model file not found: {path}")
        return cls(path.read_bytes(), model_file=path)

    # --- properties ------------------------------------------------------------

    @property
    def model_proto(self):
        """The serialized SentencePiece model (bytes)."""
        return self._model_proto

    @property
    def model_file(self):
        """The path the model was loaded from or written to, or `None`."""
        return self._model_file

    @property
    def pad_id(self):
        return _SPECIAL_IDS["pad_id"]

    @property
    def bos_id(self):
        return _SPECIAL_IDS["bos_id"]

    @property
    def eos_id(self):
        return _SPECIAL_IDS["eos_id"]

    @property
    def unk_id(self):
        return _SPECIAL_IDS["unk_id"]

    def vocabulary_size(self):
        """Number of ids, special and byte-fallback ids included (a Python int)."""
        return self._vocabulary_size

    def id_to_token(self, token_id):
        """The subword piece of one id (a Python str), e.g. `"▁Haus"`."""
        if not 0 <= int(token_id) < self._vocabulary_size:
            raise ValueError(
                f"token id {token_id} is outside the vocabulary "
                f"(vocabulary_size={self._vocabulary_size})"
            )
        return self._processor.IdToPiece(int(token_id))

    # --- graph ops ---------------------------------------------------------------

    def tokenize(self, text):
        """Splits text into subword ids, without BOS or EOS.

        Args:
            text: a string, a list of strings, or a `tf.string` tensor of any
                rank (symbolic inside `tf.data` or `tf.function`).

        Returns:
            int32 ids: a dense `(num_tokens,)` tensor for a scalar input, a
            `tf.RaggedTensor` `(batch, None)` for a batch of strings.
        """
        return self._sentencepiece.tokenize(tf.convert_to_tensor(text, tf.string))

    def detokenize(self, ids):
        """Turns ids back into text.

        The pad, BOS and EOS ids are skipped, wherever they are, so a padded
        batch or a decoder output with BOS/EOS detokenizes directly.

        Args:
            ids: int ids, `(num_tokens,)` or `(batch, num_tokens)`, a dense
                tensor, a `tf.RaggedTensor` or nested Python lists.

        Returns:
            A `tf.string` tensor: a scalar for one sequence, `(batch,)` for a
            batch.
        """
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.ragged.constant(ids) if isinstance(ids, list) else ids
            ids = ids if isinstance(ids, tf.RaggedTensor) else tf.convert_to_tensor(ids)
        ids = tf.cast(ids, tf.int32)
        return self._sentencepiece.detokenize(ids)

    # --- the translation front end ---------------------------------------------

    def encode_source(self, text, max_length=None):
        """Source ids of a batch of sentences, as every translator feeds the model.

        Each sentence is made valid UTF-8 (invalid bytes become U+FFFD, so any
        input is answered, never rejected), split into SentencePiece pieces,
        cut to its first `max_length - 1` pieces and terminated with EOS: at
        most `max_length` ids, EOS included (longer sentences lose their end).
        A blank sentence (empty, or only whitespace as Python's
        `str.isspace` defines it, Unicode spaces included) gives an empty
        row instead: callers answer it with `""` without decoding.

        Graph ops only, so it runs eagerly, in `tf.data` and in an exported
        SavedModel alike.

        Args:
            text: `(batch,)` sentences: a list of `str`/`bytes` or a
                `tf.string` tensor.
            max_length: ids kept per sentence, EOS included (at least 1);
                `None` keeps every piece.

        Returns:
            An int32 `tf.RaggedTensor` `(batch, None)`.

        Example:

        >>> tokenizer.encode_source(["Hello world.", "  ", ""], max_length=64).to_list()
        [[3145, 1203, 9, 2], [], []]
        """
        if max_length is not None and (not isinstance(max_length, numbers.Integral)
                                       or isinstance(max_length, bool) or max_length < 1):
            raise ValueError(f"max_length must be a positive integer or None, "
                             f"received {max_length!r}")
        text = tf.convert_to_tensor(text, tf.string)
        if text.shape.rank != 1:
            raise ValueError("encode_source expects a (batch,) vector of sentences, "
                             f"received shape {text.shape}")
        text = _valid_utf8(text)
        pieces = self._sentencepiece.tokenize(text)  # (batch, None) ragged int32
        if max_length is not None:
            pieces = pieces[:, : int(max_length) - 1]
        eos = tf.fill(tf.stack([tf.shape(text, out_type=tf.int64)[0], 1]),
                      tf.constant(self.eos_id, tf.int32))
        ids = tf.concat([pieces, tf.RaggedTensor.from_tensor(eos)], axis=1)
        blank = tf.strings.regex_full_match(text, _WHITESPACE_CLASS + "*")
        lengths = ids.row_lengths()
        keep = tf.RaggedTensor.from_row_lengths(tf.repeat(~blank, lengths), lengths)
        return tf.ragged.boolean_mask(ids, keep)

    def output_ids(self, ids):
        """The ids a translation keeps: those before the first EOS, without pad and BOS.

        Args:
            ids: `(batch, T)` int ids of a decoder's output (BOS, EOS and pad
                wherever they are): a dense tensor or array, a
                `tf.RaggedTensor` or nested lists.

        Returns:
            An int32 `tf.RaggedTensor` `(batch, None)`.
        """
        ids = tf.cast(self._dense_ids(ids), tf.int32)
        ended = tf.cumsum(tf.cast(ids == self.eos_id, tf.int32), axis=1, exclusive=True) > 0
        special = (ids == self.pad_id) | (ids == self.bos_id) | (ids == self.eos_id)
        return tf.ragged.boolean_mask(ids, ~ended & ~special)

    def decode_output(self, ids):
        """The text of a batch of decoder outputs, as every translator answers.

        `output_ids` (cut before the first EOS, pad and BOS dropped),
        detokenized (tf-text's SentencePiece drops leading spaces), and made
        valid UTF-8 (a sequence of byte-fallback pieces that is not UTF-8
        becomes U+FFFD). An output of no kept ids is `""`.

        Args:
            ids: `(batch, T)` int ids, as for `output_ids`.

        Returns:
            A `(batch,)` `tf.string` tensor.

        Example:

        >>> tokenizer.decode_output([[1, 3145, 1203, 9, 2, 0], [2, 77, 0, 0, 0, 0]])
        <tf.Tensor: shape=(2,), dtype=string, numpy=array([b'Hello world.', b''], dtype=object)>
        """
        return _valid_utf8(self._sentencepiece.detokenize(self.output_ids(ids)))

    def _dense_ids(self, ids):
        """A dense `(batch, T)` tensor of ids, pad-filled where rows are shorter."""
        if isinstance(ids, list):
            ids = tf.ragged.constant(ids, dtype=tf.int64, ragged_rank=1) if ids \
                else tf.zeros([0, 0], tf.int64)
        if isinstance(ids, tf.RaggedTensor):
            return ids.to_tensor(default_value=tf.cast(self.pad_id, ids.dtype))
        return tf.convert_to_tensor(ids)


def train_tokenizer(files, vocab_size, model_file, *, model_type="bpe",
                    character_coverage=0.9995, byte_fallback=True,
                    max_sentences=10_000_000, seed=0, num_threads=None,
                    sentences=None, **sentencepiece_options):
    """Trains one SentencePiece model on both languages together.

    Every line of every file is one training sentence (empty lines are
    skipped; gzipped files and CRLF endings are read like `load_parallel_text`
    reads them). Pass the source and the target files of the training corpus
    to get the paper's shared vocabulary.

    Args:
        files: paths of plain UTF-8 text files, one sentence per line.
        vocab_size: vocabulary size, special and byte-fallback ids included
            (the paper: about 37,000 for English-German).
        model_file: where to write the trained model (conventionally
            `*.model`); its parent folder is created.
        model_type: `"bpe"` (the paper) or `"unigram"`.
        character_coverage: share of characters covered by single-character
            pieces; the rest fall back to bytes (or `<unk>`).
        byte_fallback: encode characters outside the vocabulary as UTF-8 byte
            pieces, so the round trip is exact; uses 256 ids.
        max_sentences: at most this many sentences, sampled at random with
            `seed`, are used (SentencePiece's `input_sentence_size`), which
            bounds the trainer's memory on WMT-sized corpora.
        seed: seed of that sampling.
        num_threads: trainer threads; default `os.cpu_count()`.
        sentences: an iterable of training sentences to read instead of
            `files` (e.g. from a `tf.data` corpus); `files` then only name
            the corpus in error messages.
        **sentencepiece_options: any other `SentencePieceTrainer` option.

    Returns:
        The trained `Tokenizer` (its `model_file` is `model_file`).

    Example:

    >>> tokenizer = train_tokenizer(
    ...     ["train.en", "train.de"], vocab_size=8000, model_file="ende.model")
    >>> tokenizer.vocabulary_size()
    8000
    """
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    files = [pathlib.Path(f) for f in files]
    if not files and sentences is None:
        raise ValueError("train_tokenizer needs at least one text file")
    for path in files if sentences is None else ():
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer training file not found: {path}")
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"model_type must be 'bpe' or 'unigram', received {model_type!r}")
    reserved = set(sentencepiece_options) & {
        "pad_id", "bos_id", "eos_id", "unk_id", "input", "model_prefix",
        "sentence_iterator", "model_writer",
    }
    if reserved:
        raise ValueError(
            f"train_tokenizer sets {sorted(reserved)} itself; the special ids "
            f"are fixed to {_SPECIAL_IDS}"
        )

    def file_sentences():
        for path in files:
            for _, line in iter_lines(path):
                if line.strip():
                    yield line

    options = dict(
        model_type=model_type,
        vocab_size=vocab_size,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        num_threads=num_threads or os.cpu_count() or 1,
        minloglevel=2,
        **_SPECIAL_IDS,
    )
    options.update(sentencepiece_options)
    sentencepiece.set_random_generator_seed(seed)
    writer = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences) if sentences is not None else file_sentences(),
            model_writer=writer, **options
        )
    except RuntimeError as error:
        names = ", ".join(str(f) for f in files)
        raise ValueError(
            f"SentencePiece training on {names} failed: {error}"
        ) from None
    model_file = pathlib.Path(model_file)
    model_file.parent.mkdir(parents=True, exist_ok=True)
    model_file.write_bytes(writer.getvalue())
    return Tokenizer(writer.getvalue(), model_file=model_file)
