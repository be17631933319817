"""Translating text with a trained model.

`Translator` turns sentences into translations: the shell of
`keras_transformer.inference.shell` (source ids by `Tokenizer.encode_source`,
length-sorted batches, text by `Tokenizer.decode_output`, original order)
around beam search (`keras_transformer.inference.decoding`). Scoring them is
`keras_transformer.inference.evaluation`.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_transformer.inference.decoding import decode
from keras_transformer.inference.shell import TranslatorShell
from keras_transformer.model.config import DecodingOptions


def _round_up(value, multiple):
    return int(math.ceil(value / multiple) * multiple)


class Translator(TranslatorShell):
    """Translates lists of sentences with a `Transformer` and a subword tokenizer.

    Sentences become source ids with the tokenizer's `encode_source`
    (invalid UTF-8 replaced, pieces, truncated to the model's
    `config.max_length` ids with EOS: longer sentences lose their end), are
    sorted by length and decoded in batches of `batch_size` with beam search
    (or greedy decoding for `beam_size=1`); the outputs become text with
    `decode_output` (cut at EOS, pad and BOS dropped, detokenized) and are
    returned in the input order. Blank (empty or all-whitespace) sentences,
    which `encode_source` gives no ids, translate to `""` without decoding.
    The exported SavedModel and `CTranslate2Translator` call the same two
    functions.

    Under TensorFlow and JAX the search is compiled once per batch shape:
    the source width is padded up to a multiple of `length_multiple` and a
    short batch gets empty rows up to a power of two (padding does not
    change any sentence's translation), which bounds the number of shapes.

    Args:
        model: a `keras_transformer.Transformer`.
        tokenizer: a `keras_transformer.data.Tokenizer` (its special ids
            must be the model's config's, its vocabulary no larger).
        options: the default `DecodingOptions` of `translate` (beam size,
            alpha, length limit); default the paper's (beam 4, alpha 0.6,
            source length + 50).
        batch_size: sentences per batch (beam search runs
            `batch_size * beam_size` hypotheses at once).
        max_extra_length: shorthand for `options.max_extra_length`.
        length_multiple: source widths are padded to a multiple of this.
        jit_compile: passed to the decoding functions (`None`: compile under
            TensorFlow and JAX).

    Example:

    >>> translator = Translator(model, Tokenizer.load("ende.model"))
    >>> translator.translate(["Hello world.", "How are you?"], beam_size=4, alpha=0.6)
    ['Hallo Welt.', 'Wie geht es dir?']
    """

    def __init__(self, model, tokenizer, options=None, *, batch_size=32,
                 max_extra_length=None, length_multiple=8, jit_compile=None):
        from keras_transformer.data.tokenizer import Tokenizer

        config = getattr(model, "config", None)
        if config is None:
            raise TypeError(
                "model must be a keras_transformer.Transformer, received "
                f"{type(model).__name__}"
            )
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(
                "tokenizer must be a keras_transformer.data.Tokenizer, received "
                f"{type(tokenizer).__name__}"
            )
        for name in ("pad_id", "bos_id", "eos_id"):
            if getattr(tokenizer, name) != getattr(config, name):
                raise ValueError(
                    f"tokenizer.{name}={getattr(tokenizer, name)} differs from the "
                    f"model's config.{name}={getattr(config, name)}"
                )
        size = int(tokenizer.vocabulary_size())
        if size > config.vocab_size:
            raise ValueError(
                f"tokenizer has {size} ids but the model's vocabulary has "
                f"only {config.vocab_size}"
            )
        if not isinstance(length_multiple, int) or length_multiple < 1:
            raise ValueError("length_multiple must be a positive integer, received "
                             f"{length_multiple!r}")
        super().__init__(tokenizer, config.max_length, batch_size)
        self.model = model
        options = DecodingOptions() if options is None else options
        if not isinstance(options, DecodingOptions):
            raise TypeError("options must be a keras_transformer.DecodingOptions, "
                            f"received {type(options).__name__}")
        self.options = options.replace(max_extra_length=max_extra_length)
        self.length_multiple = length_multiple
        self.jit_compile = jit_compile
        # Fixed batch shapes only matter where the search is compiled.
        self._pad_batches = keras.backend.backend() != "torch" and jit_compile is not False

    # --- decoding ids ---------------------------------------------------------

    def _batch_array(self, rows):
        width = _round_up(max(len(r) for r in rows), self.length_multiple)
        count = len(rows)
        if self._pad_batches:
            count = min(self.batch_size, 2 ** int(math.ceil(math.log2(count))))
            count = max(count, len(rows))
        array = np.zeros((count, width), "int32")  # all-pad rows decode to nothing
        for i, row in enumerate(rows):
            array[i, : len(row)] = row
        return array

    @property
    def max_extra_length(self):
        """`options.max_extra_length`: outputs have at most source length + this."""
        return self.options.max_extra_length

    def decode_rows(self, source_ids, options):
        """NumPy `(tokens, scores)` of one batch (`TranslatorShell.decode_rows`).

        The rows are padded to the batch's shape (`_batch_array`) and searched
        by `decoding.decode`; the padding rows are dropped again.
        """
        source = self._batch_array(source_ids)
        tokens, scores = decode(self.model, source, options, jit_compile=self.jit_compile)
        count = len(source_ids)
        return (ops.convert_to_numpy(tokens)[:count],
                ops.convert_to_numpy(scores).astype("float32")[:count])

    # --- public API --------------------------------------------------------------

    def translate(self, sentences, *, beam_size=None, alpha=None, progress=False,
                  return_attention=False):
        """Translates a list of sentences.

        Args:
            sentences: a list of strings.
            beam_size: beam width; 1 is greedy decoding (default
                `options.beam_size`).
            alpha: length-penalty strength (see `beam_search`; default
                `options.alpha`).
            progress: show a `keras.utils.Progbar` over the sentences.
            return_attention: also return, per sentence, the attention
                weights of a teacher-forced pass over the chosen translation.

        Returns:
            The list of translations, in input order. With
            `return_attention`, `(translations, attentions)`, where each
            attention is a dict (or `None` for an empty sentence) with
            `"source_tokens"` (subword pieces, EOS included),
            `"target_tokens"` (output pieces, EOS included when generated),
            and float32 NumPy arrays `"encoder_self_attention"`
            `(num_layers, num_heads, S, S)`, `"cross_attention"`
            `(num_layers, num_heads, T, S)` and `"decoder_self_attention"`
            `(num_layers, num_heads, T, T)`; row t of the decoder-side arrays
            is the attention while predicting target token t. Pass one to
            `plot_attention`.

        Example:

        >>> translations, attention = translator.translate(
        ...     ["The cat sat."], return_attention=True)
        >>> plot_attention(attention[0], "cat.png", kind="cross")
        """
        translations, _, attentions = self._translate(
            sentences, beam_size, alpha, progress, with_scores=False,
            return_attention=return_attention, caller="translate")
        return (translations, attentions) if return_attention else translations

    def translate_with_scores(self, sentences, *, beam_size=None, alpha=None, progress=False):
        """Translates a list of sentences and scores each translation.

        The translations are those of `translate` with the same arguments.
        A score is the length-normalised log-probability of the output,
        `log P(Y) / lp(|Y|)` with `lp` = `keras_transformer.model.config.
        length_penalty` at this `alpha` and `|Y|` counting EOS (when
        generated): the value beam search ranks its hypotheses by, and, for
        greedy decoding (`beam_size=1`), the same formula applied to the greedy
        output. This is the `score` output of an exported SavedModel
        (`keras_transformer.export.saved_model`) with the same beam size and alpha. An
        empty (or all-whitespace) sentence scores 0.

        Args:
            sentences: a list of strings.
            beam_size: beam width; 1 is greedy decoding (default
                `options.beam_size`).
            alpha: length-penalty strength, `>= 0` (for greedy decoding it
                only normalises the score; default `options.alpha`).
            progress: show a `keras.utils.Progbar` over the sentences.

        Returns:
            `(translations, scores)`: lists of str and float, in input order.

        Example:

        >>> translations, scores = translator.translate_with_scores(["Hello."])
        >>> scores[0] < 0
        True
        """
        translations, scores, _ = self._translate(
            sentences, beam_size, alpha, progress, with_scores=True, return_attention=False,
            caller="translate_with_scores")
        return translations, scores

    def _translate(self, sentences, beam_size, alpha, progress, *, with_scores,
                   return_attention, caller):
        """`translate_sentences`, with the attention weights of each batch when asked.

        Returns `(translations, scores or None, attentions or None)`.
        """
        # A bad beam size or alpha is refused here (`DecodingOptions.check`).
        options = self.options.replace(beam_size=beam_size, alpha=alpha)
        attentions = {}

        def attend(indices, source_ids, tokens):
            eos = self.model.config.eos_id
            outputs = self.tokenizer.output_ids(tokens).to_list()
            targets = [out + [eos] if eos in row.tolist() else out
                       for out, row in zip(outputs, tokens)]
            attentions.update(zip(indices, self.attention_weights(source_ids, targets)))

        translations, scores = self.translate_sentences(
            sentences, options, caller=caller, progress=progress,
            on_batch=attend if return_attention else None)
        return (translations, scores if with_scores else None,
                [attentions.get(i) for i in range(len(translations))]
                if return_attention else None)

    def attention_weights(self, source_ids, target_ids):
        """Attention weights of a teacher-forced pass over given outputs.

        Args:
            source_ids: list of source id lists (EOS-terminated, unpadded).
            target_ids: list of output id lists (no BOS; EOS if generated).

        Returns:
            One dict per sentence, as described in `translate`.
        """
        config = self.model.config
        source = self._batch_array(source_ids)[: len(source_ids)]
        width = max(1, max(len(t) for t in target_ids))
        decoder_input = np.zeros((len(target_ids), width), "int32")
        for i, target in enumerate(target_ids):
            shifted = ([config.bos_id] + target)[:width]
            decoder_input[i, : len(shifted)] = shifted
        source_mask = source != config.pad_id
        model = self.model
        encoder_output, encoder_scores = model.encoder(
            model.source_embedding(source), padding_mask=source_mask,
            return_attention_scores=True, training=False)
        _, decoder_scores = model.decoder(
            model.target_embedding(decoder_input), encoder_output,
            decoder_padding_mask=decoder_input != config.pad_id,
            encoder_padding_mask=source_mask,
            return_attention_scores=True, training=False)

        def stack(scores):  # per-layer (B, h, Tq, Tk) -> (B, N, h, Tq, Tk)
            return np.stack([ops.convert_to_numpy(ops.cast(s, "float32"))
                             for s in scores], axis=1)

        encoder_self = stack(encoder_scores)
        cross = stack([s["cross_attention"] for s in decoder_scores])
        decoder_self = stack([s["self_attention"] for s in decoder_scores])
        records = []
        for i, (src, tgt) in enumerate(zip(source_ids, target_ids)):
            s, t = len(src), len(tgt)
            records.append({
                "source_tokens": [self._piece(x) for x in src],
                "target_tokens": [self._piece(x) for x in tgt],
                "encoder_self_attention": encoder_self[i, :, :, :s, :s],
                "cross_attention": cross[i, :, :, :t, :s],
                "decoder_self_attention": decoder_self[i, :, :, :t, :t],
            })
        return records

    def _piece(self, token_id):
        return str(self.tokenizer.id_to_token(int(token_id)))
