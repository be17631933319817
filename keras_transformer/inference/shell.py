"""What every translator does around its decoder: text in, text out, in order.

`TranslatorShell` owns the front and back of translation, which the Keras
`Translator` (`keras_transformer.inference.translator`) and the CTranslate2 runtime
(`keras_transformer.export.ctranslate2_runtime`) share, so that they encode,
skip, batch and detokenize alike:

- the input check (a list of sentences, `str` or `bytes`);
- `encode`: `Tokenizer.encode_source` at the model's `max_length`
  (invalid UTF-8 replaced, pieces, truncated, then EOS);
- blank (empty or all-whitespace) sentences, which get no ids, translate to
  `""` without decoding;
- the others are decoded longest first, `batch_size` at a time (the
  largest shape compiles first and memory peaks early);
- the output rows become text with `Tokenizer.decode_output` (cut at EOS,
  pad and BOS dropped, detokenized) and go back to the input order.

A subclass supplies only `decode_rows`: "decode these source id rows". The
exported SavedModel runs the same two tokenizer functions in its graph
(`keras_transformer.export.saved_model`). This module imports neither Keras nor
TensorFlow (the CTranslate2 runtime runs without them until the tokenizer
loads TensorFlow Text).
"""


class TranslatorShell:
    """Input checks, encoding, blank skipping, batching and detokenizing of a translator.

    Args:
        tokenizer: a `keras_transformer.data.Tokenizer`.
        max_length: the model's `config.max_length` (source ids are cut to
            it, EOS included).
        batch_size: sentences decoded at once.
    """

    def __init__(self, tokenizer, max_length, batch_size):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, received {batch_size!r}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size

    def encode(self, sentences):
        """Source ids of each sentence (`Tokenizer.encode_source` at `max_length`).

        Args:
            sentences: a list of `str` or `bytes`.

        Returns:
            A list of int lists: pieces, truncated, then EOS; `[]` for a blank
            sentence.
        """
        if not sentences:
            return []
        return self.tokenizer.encode_source(list(sentences), self.max_length).to_list()

    def decode_rows(self, source_ids, options):
        """Decodes one batch: the only step a translator supplies.

        Args:
            source_ids: a list of non-empty id lists, each ending with EOS.
            options: the translator's decoding options, as given to
                `translate_sentences`.

        Returns:
            `(rows, scores)`: one output id row per source (a 2-D array or
            a list of lists; EOS and padding after it are cut by
            `Tokenizer.decode_output`), and their scores (or `None`).
        """
        raise NotImplementedError

    def translate_sentences(self, sentences, options, *, caller="translate", progress=False,
                            on_batch=None):
        """Translates a list of sentences, in input order.

        Args:
            sentences: a list of `str` or `bytes`.
            options: passed to `decode_rows`.
            caller: the public method's name, for the error of a bare string.
            progress: show a `keras.utils.Progbar` over the sentences.
            on_batch: `None`, or `on_batch(indices, source_ids, rows)` called
                after each batch (e.g. for attention weights).

        Returns:
            `(translations, scores)`: lists of str and float (0.0 for a
            blank sentence, or when `decode_rows` gives no scores).
        """
        if isinstance(sentences, (str, bytes)):
            raise TypeError(f"{caller} expects a list of strings; wrap one sentence "
                            f"in a list: {caller}([sentence])")
        sentences = [s if isinstance(s, bytes) else str(s) for s in sentences]
        translations, scores = [""] * len(sentences), [0.0] * len(sentences)
        source_ids = self.encode(sentences)
        todo = [i for i, ids in enumerate(source_ids) if ids]  # blank: no ids, ""
        order = sorted(todo, key=lambda i: len(source_ids[i]), reverse=True)
        bar = None
        if progress:
            import keras

            bar = keras.utils.Progbar(len(sentences), unit_name="sentence")
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            batch_ids = [source_ids[i] for i in batch]
            rows, batch_scores = self.decode_rows(batch_ids, options)
            texts = self.tokenizer.decode_output(rows).numpy()
            for k, i in enumerate(batch):
                translations[i] = texts[k].decode("utf-8")
                if batch_scores is not None:
                    scores[i] = float(batch_scores[k])
            if on_batch is not None:
                on_batch(batch, batch_ids, rows)
            if bar is not None:
                bar.update(start + len(batch) + len(sentences) - len(todo))
        if bar is not None and not order:
            bar.update(len(sentences))
        return translations, scores
