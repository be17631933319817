"""The `tf.Module` whose signatures a translation SavedModel serves.

TF Serving (`tensorflow_model_server`) runs no Python, so the whole
translation is one TensorFlow graph made of core ops and TensorFlow Text's
SentencePiece ops (which the model server links): source ids
(`Tokenizer.encode_source`: sanitise the UTF-8 -> tokenize -> truncate and
append EOS) -> sort by length -> cached beam search (or greedy decoding) in
chunks of similar length -> text (`Tokenizer.decode_output`: cut at EOS ->
detokenize). The front end is `Translator`'s: the same two graph functions
of the tokenizer, traced into the signatures. `TranslationModule` has two
signatures, both `text` (`tf.string`, `(batch,)`) -> `translation`
(`tf.string`, `(batch,)`) and `score` (`float32`, `(batch,)`):

- `serving_default`: beam search (the paper's beam 4, alpha 0.6 by default);
- `translate_greedy`: greedy decoding.

`score` is the length-normalised log-probability `log P(Y) / lp(Y)` of the
output (`keras_transformer.model.config.length_penalty`, the exported
`alpha`, EOS counted), and 0 for an empty input.

Input handling, in the graph (`Tokenizer.encode_source` and `decode_output`):

- Bytes that are not valid UTF-8 are replaced by U+FFFD before tokenizing
  (`tf.strings.unicode_transcode(..., errors="replace")`); the request is
  answered, never rejected. Outputs are valid UTF-8 as well.
- A sentence is truncated to `max_source_length` ids, EOS included (default
  `config.max_length`, as `Translator` does): longer inputs lose their end
  and are still answered, in the time of a `max_source_length`-id sentence.
- An empty or all-whitespace sentence (whitespace as Python's `str.isspace`
  defines it, as for `Translator`) translates to `""` with score 0 without
  decoding; a batch of zero sentences gives zero outputs.

Shapes: each signature holds one traced search, with a dynamic batch size
and source width (`keras_transformer.inference.decoding` reads sizes with
`ops.shape`; in this plain, uncompiled TensorFlow graph they are tensors,
and the self-attention cache grows inside the search loop). The graph sorts
the batch by length (as `Translator` does), drops the blank sentences, and
decodes the rest in chunks of at most `batch_size` sentences (default 32),
each cut to the width of its longest sentence, so a short request costs
what its own sentences cost. Padding rows and columns do not change any
sentence's output. No static shape is needed: earlier exports
(`export_options.json` without `format_version`) traced one search per
(batch bucket, width bucket) pair behind a `tf.switch_case`, 12 per
signature, a larger graph that took longer to export and to load and was
no faster; `examples/benchmark_export.py` compares two checkouts' exports,
and the current export's size, load time and speed are in docs/results.md
("Export size, load and first request").

The searches are traced uncompiled (no `jit_compile`) by default, since the
stock model server does not run XLA clusters by default; their buffer
updates then use the core op `TensorStridedSliceUpdate` rather than the
XLA-only `XlaDynamicUpdateSlice`
(`keras_transformer.model.layers.updates.slice_update`);
`keras_transformer.export.op_audit` checks the exported graph.

With `xla_buckets` (`export --xla`) the search is compiled instead, as the
in-process `Translator`'s is: tokenizing, sorting, chunking and
detokenizing stay in the plain graph (strings cannot enter a compiled
function) around a `tf.function(jit_compile=True)` on int ids, whose
`_XlaMustCompile` attribute the SavedModel keeps. XLA compiles once per
input shape, so shapes come from a few buckets: a chunk's rows are padded
up to the smallest of `XlaBuckets.batch_sizes` that holds them (all-pad
rows, skipped by the search) and its width up to the smallest of
`XlaBuckets.widths` (pad columns, which change no output), one traced
search per width behind a `tf.switch_case`; the padding rows are cut from
the answer. A one-sentence chunk takes the largest width only
(`XlaBuckets.shapes`): for one sentence the width costs nothing measurable,
and each compiled shape costs seconds of loading. The model server must run
compiled functions (`tensorflow_model_server --xla_cpu_compilation_enabled=true`
on CPU).
"""

from typing import NamedTuple

import tensorflow as tf

from keras_transformer import names

BEAM_SIGNATURE = names.BEAM_SIGNATURE
GREEDY_SIGNATURE = names.GREEDY_SIGNATURE
INPUT_NAME = names.INPUT_NAME
DEFAULT_BATCH_SIZE = 32

# The compiled export's shapes (`export --xla`): chunk rows and source widths
# are padded up to these (the widths capped at `max_source_length`, which is
# always one; a one-sentence chunk takes that largest width only). Each shape
# is one compilation per signature at load (3 to 12 s on 2 cores for the
# Multi30k model), so there are few: a beam search over 32 sentences costs
# the same at width 16 and 32 but 1.2x at 64 and 1.7x at 128, and a
# one-sentence search the same at every width; 40 holds the requests whose
# longest sentence has 33 to 40 ids, which are common (docs/serving.md,
# "XLA-compiled export", has the timings).
DEFAULT_XLA_BATCH_SIZES = (1, 32)
DEFAULT_XLA_WIDTHS = (32, 40, 64)

__all__ = ["BEAM_SIGNATURE", "DEFAULT_BATCH_SIZE", "DEFAULT_XLA_BATCH_SIZES",
           "DEFAULT_XLA_WIDTHS", "GREEDY_SIGNATURE", "TranslationModule", "XlaBuckets"]


class XlaBuckets(NamedTuple):
    """The input shapes a compiled export's searches are compiled for.

    Attributes:
        batch_sizes: chunk rows are padded up to the smallest that holds
            them; the largest is the export's `batch_size`.
        widths: source ids (EOS included) are padded up to the smallest that
            holds the chunk's longest sentence; the largest is
            `max_source_length`.
    """

    batch_sizes: tuple
    widths: tuple

    @property
    def shapes(self):
        """The `(rows, width)` pairs compiled for, in order: every batch size at
        every width, except a one-sentence batch at the largest width only."""
        return tuple((rows, width) for rows in self.batch_sizes
                     for width in (self.widths[-1:] if rows == 1 else self.widths))

    @classmethod
    def resolve(cls, batch_sizes, widths, *, batch_size, max_source_length):
        """Sorted, checked buckets that end at `batch_size` and `max_source_length`.

        `None` takes `DEFAULT_XLA_BATCH_SIZES` / `DEFAULT_XLA_WIDTHS`; sizes
        above the limit are dropped and the limit is added.

        Raises:
            ValueError: a size that is not a positive integer (a width needs 2:
                a piece and EOS).
        """
        def checked(name, values, low, limit):
            values = tuple(values)
            if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < low
                                 for v in values):
                raise ValueError(f"{name} must be integers of at least {low}, "
                                 f"received {list(values)}")
            return tuple(sorted({v for v in values if v < limit} | {limit}))

        return cls(
            checked("xla batch sizes", DEFAULT_XLA_BATCH_SIZES if batch_sizes is None
                    else batch_sizes, 1, batch_size),
            checked("xla widths", DEFAULT_XLA_WIDTHS if widths is None else widths, 2,
                    max_source_length))


class _Untracked:
    """Holds an object out of `tf.Module`'s attribute tracking."""

    def __init__(self, value):
        self.value = value


class TranslationModule(tf.Module):
    """A `tf.Module` with the translation signatures of a model and a tokenizer.

    Args:
        model: a `keras_transformer.Transformer` built under the TensorFlow
            backend.
        tokenizer: a `keras_transformer.data.Tokenizer`.
        options: the `DecodingOptions` of `serving_default` (its beam size,
            at least 2, alpha and length limit); `translate_greedy` is the
            same with beam size 1.
        max_source_length: source ids kept per sentence, EOS included.
        batch_size: sentences decoded at once; a larger request is decoded
            in chunks of this many (longest first).
        tokenizer_file: the SentencePiece model file, tracked as the
            SavedModel's asset (`assets/spm.model`); `None` for none.
        xla_buckets: an `XlaBuckets` (`XlaBuckets.resolve`) to compile the
            searches for those shapes; `None` (default) for the plain graph.
        name: the `tf.Module`'s name.

    Example:

    >>> module = TranslationModule(model, tokenizer, DecodingOptions(),
    ...                            max_source_length=256)
    >>> module.signatures()[BEAM_SIGNATURE](text=tf.constant(["Hello."]))["translation"]
    """

    def __init__(self, model, tokenizer, options, *, max_source_length,
                 batch_size=DEFAULT_BATCH_SIZE, tokenizer_file=None, xla_buckets=None,
                 name="translation"):
        super().__init__(name=name)
        config = model.config
        # Not tracked as a Keras object (only its variables are saved): the
        # SavedModel holds the translation functions, not Keras' own endpoints.
        self._untracked = _Untracked(model)
        self.tokenizer = tokenizer
        # Keras variables, tracked so that the SavedModel holds them.
        self.model_variables = list(model.variables)
        if tokenizer_file is not None:
            self.tokenizer_model = tf.saved_model.Asset(str(tokenizer_file))
        self._config = config
        self._options = options
        self._max_source_length = max_source_length
        self._batch_size = batch_size
        self._xla_buckets = xla_buckets
        self._output_width = self._buffer_length(max_source_length)
        spec = [tf.TensorSpec([None], tf.string, name=INPUT_NAME)]
        # Out of attribute tracking: saved once, as signatures (tracked
        # tf.functions would be traced a second time by `tf.saved_model.save`).
        self._functions = _Untracked({
            BEAM_SIGNATURE: tf.function(lambda text: self._translate(text, options.beam_size),
                                        input_signature=spec, autograph=False),
            GREEDY_SIGNATURE: tf.function(lambda text: self._translate(text, 1),
                                          input_signature=spec, autograph=False),
        })

    def signatures(self):
        """`{name: concrete function}` of both signatures (traced on first call)."""
        return {name: function.get_concrete_function()
                for name, function in self._functions.value.items()}

    def _buffer_length(self, width):
        length = width + self._options.max_extra_length
        if self._config.position_embedding == "learned":
            length = min(length, self._config.max_length)
        return max(length, 1)

    # --- pieces of the graph ---------------------------------------------------

    def _encode(self, text):
        """Strings -> int32 `(batch, max_source_length)` ids (pad-filled) and their lengths.

        `Tokenizer.encode_source`, as `Translator` encodes: a blank sentence
        has length 0.
        """
        ids = self.tokenizer.encode_source(text, self._max_source_length)
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        ids = ids.to_tensor(default_value=self._config.pad_id,
                            shape=[None, self._max_source_length])
        return ids, lengths

    def _search(self, source_ids, beam_size):
        """int32 (b, w) ids, both sizes dynamic -> (b, output width) tokens, (b,) scores."""
        if self._xla_buckets is not None:
            return self._compiled_search(source_ids, beam_size)
        from keras_transformer.inference.decoding import decode

        options = self._options.replace(beam_size=beam_size)
        tokens, scores = decode(self._untracked.value, source_ids, options, jit_compile=False)
        return self._full_width(tokens), tf.convert_to_tensor(scores)

    def _full_width(self, tokens):
        """Tokens padded to the signature's one output width."""
        tokens = tf.convert_to_tensor(tokens)
        pad = self._output_width - tf.shape(tokens)[1]
        tokens = tf.pad(tokens, [[0, 0], [0, pad]], constant_values=self._config.pad_id)
        return tf.ensure_shape(tokens, [None, self._output_width])

    def _compiled_search(self, source_ids, beam_size):
        """`_search` compiled by XLA on bucket shapes (`xla_buckets`).

        The rows are padded up to a batch bucket (all-pad rows, which the
        search skips) and cut from the answer; the width is padded up to a
        width bucket (the largest for one row), one traced compiled search
        per width (`tf.switch_case`) so that each is traced with a static
        width.
        """
        from keras_transformer.inference.decoding import decode

        options = self._options.replace(beam_size=beam_size)
        batch_sizes, widths = self._xla_buckets
        rows, width = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
        sizes = tf.constant(batch_sizes, tf.int32)
        padded_rows = tf.gather(sizes, tf.argmax(tf.cast(sizes >= rows, tf.int32),
                                                 output_type=tf.int32))
        bucket = tf.argmax(tf.cast(tf.constant(widths, tf.int32) >= width, tf.int32),
                           output_type=tf.int32)
        # One sentence: the largest width only (`XlaBuckets.shapes`).
        bucket = tf.where(padded_rows == 1, len(widths) - 1, bucket)

        def branch(bucket_width):
            def search():
                ids = tf.pad(source_ids, [[0, padded_rows - rows], [0, bucket_width - width]],
                             constant_values=self._config.pad_id)
                ids = tf.ensure_shape(ids, [None, bucket_width])
                tokens, scores = decode(self._untracked.value, ids, options, jit_compile=True)
                return (self._full_width(tf.convert_to_tensor(tokens)[:rows]),
                        tf.convert_to_tensor(scores)[:rows])
            return search

        return tf.switch_case(bucket, [branch(w) for w in widths])

    def _translate(self, text, beam_size):
        config = self._config
        text = tf.convert_to_tensor(text, tf.string)
        ids, lengths = self._encode(text)
        count = tf.shape(text)[0]
        # Longest first (stable), as Translator does: chunks of similar length.
        # Blank rows (length 0) come last and are not decoded.
        order = tf.argsort(-lengths, stable=True)
        ids, lengths_sorted = tf.gather(ids, order), tf.gather(lengths, order)
        todo = tf.reduce_sum(tf.cast(lengths > 0, tf.int32))
        chunk = self._batch_size
        num_chunks = (todo + chunk - 1) // chunk
        output_width = self._output_width

        def body(i, all_tokens, all_scores):
            start = i * chunk
            end = tf.minimum(start + chunk, todo)
            # The chunk cut to its longest sentence: one search, any shape.
            tokens, scores = self._search(ids[start:end, :lengths_sorted[start]], beam_size)
            return (i + 1, tf.concat([all_tokens, tokens], 0),
                    tf.concat([all_scores, scores], 0))

        _, tokens, scores = tf.while_loop(
            lambda i, *_: i < num_chunks, body,
            (tf.constant(0), tf.zeros([0, output_width], tf.int32), tf.zeros([0], tf.float32)),
            shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, output_width]),
                              tf.TensorShape([None])))
        tokens = tf.concat([tokens, tf.fill([count - todo, output_width], config.pad_id)], 0)
        scores = tf.concat([scores, tf.zeros([count - todo], tf.float32)], 0)
        inverse = tf.math.invert_permutation(order)
        tokens, scores = tf.gather(tokens, inverse), tf.gather(scores, inverse)

        # As Translator answers: cut at EOS, pad/BOS dropped, detokenized, valid
        # UTF-8 (a blank sentence's all-pad row gives "").
        translation = self.tokenizer.decode_output(tokens)
        return {"translation": tf.ensure_shape(translation, [None]),
                "score": tf.ensure_shape(tf.cast(scores, tf.float32), [None])}
