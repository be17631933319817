"""A real `Tokenizer` whose pieces are whole words, for tests that need known ids.

A SentencePiece word model (`model_type="word"`) holds exactly the given
words (`"w0"`, `"w1"`, ...) after the model's four special ids, so a test can
write sentences of known pieces and read the ids of any output back from its
text (the sentencepiece Python library on the same model is the reference).
"""

import io

import sentencepiece

PAD, BOS, EOS, UNK = 0, 1, 2, 3


def words(count):
    return [f"w{i}" for i in range(count)]


def word_model_proto(vocabulary):
    """The serialized SentencePiece word model of `vocabulary` (and the special ids)."""
    sentences = [" ".join(vocabulary[(i + j) % len(vocabulary)] for j in range(7))
                 for i in range(10 * len(vocabulary))]
    writer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=writer, model_type="word",
        vocab_size=len(vocabulary) + 4, use_all_vocab=True, pad_id=PAD, bos_id=BOS,
        eos_id=EOS, unk_id=UNK, normalization_rule_name="identity", minloglevel=2)
    return writer.getvalue()


def word_tokenizer(vocabulary):
    """`(Tokenizer, sentencepiece.SentencePieceProcessor)` of the same word model."""
    from keras_transformer.data.tokenizer import Tokenizer

    proto = word_model_proto(vocabulary)
    return Tokenizer(proto), sentencepiece.SentencePieceProcessor(model_proto=proto)
