"""Translating a batch of source ids: greedy decoding and beam search.

The public entry points of decoding. `greedy_decode` and `beam_search` run
the encoder once, then a search (`keras_transformer.inference.search`) over
the decoder's cached step (`keras_transformer.inference.steps`), compiled
once per model and setting under TensorFlow and JAX
(`keras_transformer.inference.compiled`); `decode` picks one of them as a
`DecodingOptions` says, for every caller (`Translator`, the exported
SavedModel, the benchmarks).

Lengths: a sentence's output (the generated tokens, EOS included, BOS not)
has at most `source_length + max_extra_length` tokens, where
`source_length` counts its non-pad source ids (EOS included), as in the
paper (section 6.1: "maximum output length to input length + 50");
`output_length_limits` computes them.
"""

from keras import ops

from keras_transformer.inference.compiled import compiled_search
from keras_transformer.inference.search import run_beam_search, run_greedy_search
from keras_transformer.inference.steps import cache_lengths, make_step_fn
from keras_transformer.model.config import DecodingOptions, length_penalty


def output_length_limits(source_ids, config, max_extra_length=DecodingOptions.max_extra_length):
    """Per-sentence output length limits and the static buffer length.

    Args:
        source_ids: `(batch, S)` int source ids, `config.pad_id`-padded.
        config: the model's `TransformerConfig`.
        max_extra_length: a sentence may produce up to its source length
            (non-pad ids) plus this many tokens.

    Returns:
        `(max_lengths, buffer_length)`: int32 `(batch,)` limits (0 for an
        all-pad row, which is then skipped) and `S + max_extra_length`, the
        largest possible limit: a Python int when `S` is static, an int32
        scalar tensor when it is not (a TensorFlow graph traced with an
        unknown width). With learned position embeddings both are capped at
        `config.max_length`, the size of the position table.
    """
    DecodingOptions.check("max_extra_length", max_extra_length)
    source_length = ops.shape(source_ids)[1]
    if source_length is None:  # a symbolic KerasTensor
        raise ValueError("source_ids needs a known length (its second dimension)")
    lengths = ops.sum(ops.cast(ops.not_equal(source_ids, config.pad_id), "int32"), axis=1)
    max_lengths = ops.where(lengths > 0, lengths + max_extra_length, 0)
    if config.position_embedding == "learned":
        max_lengths = ops.minimum(max_lengths, config.max_length)
    if isinstance(source_length, int):
        buffer_length = source_length + max_extra_length
        if config.position_embedding == "learned":
            buffer_length = min(buffer_length, config.max_length)
        return ops.cast(max_lengths, "int32"), max(buffer_length, 1)
    buffer_length = ops.cast(source_length, "int32") + max_extra_length
    if config.position_embedding == "learned":
        buffer_length = ops.minimum(buffer_length, config.max_length)
    return ops.cast(max_lengths, "int32"), ops.maximum(buffer_length, 1)


def _check_model(model):
    for name in ("config", "encoder", "decoder", "source_embedding",
                 "target_embedding", "project"):
        if not hasattr(model, name):
            raise TypeError(
                "model must be a keras_transformer.Transformer (from build_model), "
                f"received {type(model).__name__} without `{name}`"
            )


def greedy_decode(model, source_ids, *, max_extra_length=DecodingOptions.max_extra_length,
                  min_length=0, use_cache=True,
                  return_step_log_probs=False, jit_compile=None):
    """Translates a batch greedily, one cached decoder step per token.

    Args:
        model: a `keras_transformer.Transformer`.
        source_ids: int `(batch, S)` source ids, each row subword ids then
            EOS, padded with 0; rows may have different lengths. An all-pad
            row gets an empty output.
        max_extra_length: a sentence's output has at most its source length
            (non-pad ids, EOS included) plus this many tokens.
        min_length: EOS is forbidden below this output length. Meant for
            benchmarks that force a fixed output length; leave at 0.
        use_cache: `False` runs the slow reference that re-decodes the whole
            prefix at every step (for tests and benchmarks).
        return_step_log_probs: also return the per-token log-probabilities.
        jit_compile: compile the search (`None`: yes under TensorFlow and JAX,
            no under PyTorch). Compiled once per model, setting and shape.

    Returns:
        int32 `(batch, L)` generated ids, `L = S + max_extra_length`: EOS
        included, 0 after it (no BOS); with `return_step_log_probs`, also the
        float32 `(batch, L)` log-probabilities of those tokens (0 after the
        end). Backend tensors.

    Example:

    >>> model = build_model(preset="tiny", vocab_size=100)
    >>> source_ids = np.array([[5, 6, 7, 2], [8, 2, 0, 0]], "int32")
    >>> greedy_decode(model, source_ids, max_extra_length=5).shape
    (2, 9)
    """
    _check_model(model)
    # Checked here (`DecodingOptions.check`), before anything is traced.
    DecodingOptions(beam_size=1, max_extra_length=max_extra_length, min_length=min_length)
    source_ids = ops.convert_to_tensor(source_ids, "int32")

    def impl(model, source_ids, dynamic_prefix=False):
        config = model.config
        max_lengths, buffer_length = output_length_limits(source_ids, config,
                                                          max_extra_length)
        segments = cache_lengths(buffer_length) if use_cache else None
        next_fn, cache = make_step_fn(model, source_ids, buffer_length=buffer_length,
                                      use_cache=use_cache, dynamic_prefix=dynamic_prefix,
                                      cache_length=segments[0] if segments else None)
        tokens, step_log_probs = run_greedy_search(
            next_fn, cache, max_lengths, buffer_length=buffer_length,
            bos_id=config.bos_id, eos_id=config.eos_id, pad_id=config.pad_id,
            min_length=min_length, segments=segments,
            grow_fn=model.decoder.grow_self_attention_cache)
        return (tokens, step_log_probs) if return_step_log_probs else tokens

    key = ("greedy", max_extra_length, min_length, use_cache, return_step_log_probs)
    return compiled_search(model, key, impl, jit_compile)(source_ids)


def beam_search(model, source_ids, *, beam_size=DecodingOptions.beam_size,
                alpha=DecodingOptions.alpha, max_extra_length=DecodingOptions.max_extra_length,
                min_length=0, use_cache=True, return_all_beams=False,
                return_step_log_probs=False, jit_compile=None):
    """Translates a batch with beam search and GNMT length normalisation.

    The paper's decoding (section 6.1): beam size 4, alpha 0.6, outputs of at
    most input length + 50 tokens, stopping early when no hypothesis can
    improve. The encoder runs once, the decoder once per step for all beams
    with a key/value cache. See `run_beam_search` for the search itself.

    Args:
        model: a `keras_transformer.Transformer`.
        source_ids: int `(batch, S)` source ids (EOS-terminated, 0-padded).
        beam_size: K, hypotheses kept per sentence.
        alpha: length penalty `lp(Y) = ((5 + |Y|) / 6) ** alpha`; 0 ranks by
            plain log-probability.
        max_extra_length: output length limit is source length plus this.
        min_length: EOS forbidden below this output length (benchmarks only).
        use_cache: `False` is the slow uncached reference.
        return_all_beams: return the K finished hypotheses, best first.
        return_step_log_probs: also return per-token log-probabilities.
        jit_compile: as in `greedy_decode`.

    Returns:
        `(tokens, scores)`: int32 `(batch, L)` ids (EOS included, 0 after
        it, no BOS) and float32 `(batch,)` scores `log P(Y) / lp(Y)`; plus the
        float32 `(batch, L)` per-token log-probabilities if requested. With
        `return_all_beams`: `(batch, K, L)`, `(batch, K)`, `(batch, K, L)`.

    Example:

    >>> tokens, scores = beam_search(model, source_ids, beam_size=4, alpha=0.6)

    References:
        Vaswani et al., 2017, section 6.1; Wu et al., 2016, section 7.
    """
    _check_model(model)
    # Checked here (`DecodingOptions.check`), before anything is traced; alpha a float.
    alpha = DecodingOptions(beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length,
                            min_length=min_length).alpha
    source_ids = ops.convert_to_tensor(source_ids, "int32")

    def impl(model, source_ids, dynamic_prefix=False):
        config = model.config
        max_lengths, buffer_length = output_length_limits(source_ids, config,
                                                          max_extra_length)
        segments = cache_lengths(buffer_length) if use_cache else None
        next_fn, cache = make_step_fn(model, source_ids, buffer_length=buffer_length,
                                      beam_size=beam_size, use_cache=use_cache,
                                      dynamic_prefix=dynamic_prefix,
                                      cache_length=segments[0] if segments else None)
        return run_beam_search(
            next_fn, cache, max_lengths, buffer_length=buffer_length,
            beam_size=beam_size, alpha=alpha, bos_id=config.bos_id,
            eos_id=config.eos_id, pad_id=config.pad_id, min_length=min_length,
            return_all_beams=return_all_beams,
            return_step_log_probs=return_step_log_probs, segments=segments,
            grow_fn=model.decoder.grow_self_attention_cache)

    key = ("beam", beam_size, alpha, max_extra_length, min_length, use_cache,
           return_all_beams, return_step_log_probs)
    return compiled_search(model, key, impl, jit_compile)(source_ids)


def decode(model, source_ids, options=None, *, jit_compile=None):
    """Translates a batch of source ids as `options` say: the search of every caller.

    `Translator`, the exported SavedModel and the benchmarks decode through
    this function, so greedy and beam search give the same outputs and the
    same scores everywhere.

    Args:
        model: a `keras_transformer.Transformer`.
        source_ids: int `(batch, S)` source ids (EOS-terminated, 0-padded).
        options: a `DecodingOptions` (default: the paper's).
        jit_compile: as in `greedy_decode`.

    Returns:
        `(tokens, scores)`: int32 `(batch, S + max_extra_length)` generated ids
        (EOS included, 0 after it, no BOS) and float32 `(batch,)` scores
        `log P(Y) / lp(|Y|)` with `lp` = `length_penalty` at `options.alpha`
        and `|Y|` counting EOS when generated. For greedy decoding the score
        is that formula applied to the greedy output. Backend tensors.

    Example:

    >>> tokens, scores = decode(model, source_ids, DecodingOptions(beam_size=1))
    """
    options = DecodingOptions() if options is None else options
    if not isinstance(options, DecodingOptions):
        raise TypeError(f"options must be a DecodingOptions, received {type(options).__name__}")
    if not options.greedy:
        return beam_search(model, source_ids, beam_size=options.beam_size,
                           alpha=options.alpha, max_extra_length=options.max_extra_length,
                           min_length=options.min_length, jit_compile=jit_compile)
    tokens, step_log_probs = greedy_decode(
        model, source_ids, max_extra_length=options.max_extra_length,
        min_length=options.min_length, return_step_log_probs=True, jit_compile=jit_compile)
    # The generated ids (EOS included) are the non-pad ones.
    lengths = ops.sum(ops.cast(ops.not_equal(tokens, model.config.pad_id), "int32"), axis=1)
    scores = ops.sum(ops.cast(step_log_probs, "float32"), axis=1) / length_penalty(
        ops.cast(ops.maximum(lengths, 1), "float32"), options.alpha)
    return tokens, scores
