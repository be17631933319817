"""The cached decoder step in plain PyTorch, for decoding under the torch backend.

Under the PyTorch backend the searches of `keras_transformer.inference.search`
run eagerly, one step at a time, and a step through the Keras layers makes
dozens of `Layer.__call__`s and a few hundred `keras.ops` calls, whose Python
overhead outweighs the step's matrix products (docs/inference.md, "Fast
inference"; the speeds in docs/results.md). `make_step_fn` here returns the
same step function as `steps.make_step_fn` (same contract, same cache
layout, same numbers to float32 rounding) computed with
`torch.nn.functional` on the tensors of the Keras variables themselves: no
copy of the weights, no per-layer machinery.
The self-attention's query, key and value projections run as one matrix
product, the attention as `scaled_dot_product_attention` over the cache
positions filled so far, and the cache is written in place.

`steps.make_step_fn` picks this step when it can: torch backend, cached
decoding, a float32 model, and either float32 weights or Keras' int8
weights (`model.quantize("int8")`, reproduced here with the same per-row
activation scales, `torch._int_mm` (float32 products where this CPU's
`_int_mm` is not exact) and the same rescaling as Keras' int8
`Dense` and `ReversibleEmbedding`). Anything else (mixed precision, other
quantization modes, a layer whose weights it does not know) keeps the Keras
step; `supports(model)` says which, and why.

The Keras step is the reference: `tests/inference/test_torch_step.py` checks the
log-probabilities and caches of both step by step.
"""

import math

__all__ = ["make_step_fn", "supports"]

from keras_transformer.model.layers.multi_head_attention import _MASK_LOGIT

_INT8 = "int8"


def supports(model):
    """`(True, "")` if `make_step_fn` can decode `model`, else `(False, reason)`."""
    import keras

    if keras.backend.backend() != "torch":
        return False, "not the torch backend"
    policy = model.dtype_policy
    if policy.compute_dtype != "float32" or policy.variable_dtype != "float32":
        return False, f"dtype policy {policy.name} (the plain step is float32)"
    for layer in _projection_layers(model):
        mode = getattr(layer, "quantization_mode", None)
        if mode not in (None, _INT8):
            return False, f"layer {layer.name} is quantized as {mode}"
        if mode == _INT8 and getattr(layer, "inputs_quantizer", None) is None:
            return False, f"layer {layer.name} has int8 weights without int8 inputs"
    return True, ""


def _projection_layers(model):
    """Every Dense / embedding layer the decoder step multiplies with."""
    layers = [model.target_embedding]
    if model.output_projection is not None:
        layers.append(model.output_projection)
    for block in model.decoder.stack:
        for attention in (block.self_attention, block.cross_attention):
            layers += [attention.query_dense, attention.key_dense, attention.value_dense,
                       attention.output_dense]
        layers += [block.ffn_inner, block.ffn_output]
    return layers


# --- matrix products: float32, or Keras' int8 ---------------------------------------


def _quantize_rows(x):
    """Keras' per-row `AbsMaxQuantizer`: int8 values and the scale they were multiplied by."""
    import keras
    import torch

    absmax = torch.linalg.vector_norm(x, ord=math.inf, dim=-1, keepdim=True)
    scale = 127.0 / (absmax + keras.backend.epsilon())
    return torch.round(x * scale).clamp_(-127, 127).to(torch.int8), scale


_INT_MM_EXACT = None


def _int_mm_is_exact():
    """Whether `torch._int_mm` computes exact int32 sums on this CPU (probed once).

    oneDNN's int8 kernels for CPUs without VNNI (AVX2, AVX-512 without VNNI)
    add pairs of u8 x s8 products in saturating int16 (`vpmaddubsw`): large
    values come back wrong by tens of thousands. Keras' own CPU path casts to
    int32 and is exact, so where the probe fails the products are taken in
    float32 instead.
    """
    global _INT_MM_EXACT
    if _INT_MM_EXACT is None:
        import torch

        generator = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (32, 64), generator=generator, dtype=torch.int8)
        b = torch.randint(-127, 128, (64, 32), generator=generator, dtype=torch.int8)
        a[0], b[:, 0] = 127, 127  # the largest same-sign pairs
        a[1], b[:, 1] = -127, -127
        exact = a.to(torch.int32) @ b.to(torch.int32)
        try:
            _INT_MM_EXACT = bool(torch.equal(torch._int_mm(a, b), exact))
        except RuntimeError:
            _INT_MM_EXACT = False
    return _INT_MM_EXACT


def _int8_matmul(x, kernel, kernel_scale, bias=None):
    """`x @ kernel (+ bias)` as Keras' int8 `Dense` computes it: `(xq @ kq) / (x_scale * k_scale)`.

    `x` float32 `(M, K)`, `kernel` int8 `(K, N)`, `kernel_scale` `(N,)`.
    """
    import torch

    xq, x_scale = _quantize_rows(x)
    if _int_mm_is_exact():
        y = torch._int_mm(xq, kernel).to(torch.float32)
    else:
        # int8 x int8 products summed in float32: exact while the sums stay
        # below 2**24, rounding-level beyond (as Keras' own int8 path on GPU).
        y = xq.to(torch.float32) @ kernel.to(torch.float32)
    output_scale = x_scale * kernel_scale
    if bias is None:
        return y.div_(output_scale)
    return torch.addcdiv(bias, y, output_scale)


class _Linear:
    """`x @ kernel + bias` of a Keras `Dense` (float32 or int8), on `(M, K)` rows."""

    def __init__(self, dense, *, fused=None):
        import torch

        layers = fused or [dense]
        self.int8 = getattr(layers[0], "quantization_mode", None) == _INT8
        if any((getattr(l, "quantization_mode", None) == _INT8) != self.int8 for l in layers):
            raise ValueError("cannot fuse float32 and int8 projections")
        if self.int8:
            self.kernel = torch.cat([l._kernel.value for l in layers], dim=1).contiguous()
            self.scale = torch.cat([l.kernel_scale.value.reshape(-1) for l in layers])
        else:
            self.kernel = torch.cat([l.kernel.value for l in layers], dim=1) \
                if len(layers) > 1 else layers[0].kernel.value
        biases = [l.bias.value for l in layers if l.use_bias]
        if biases and len(biases) != len(layers):
            raise ValueError("cannot fuse projections with and without biases")
        self.bias = (torch.cat(biases) if len(biases) > 1 else biases[0]) if biases else None
        activation = getattr(dense, "activation", None)
        name = getattr(activation, "__name__", "linear")
        if name not in ("linear", "relu"):
            raise ValueError(f"unsupported activation {name} of {dense.name}")
        self.relu = name == "relu"

    def __call__(self, x):
        import torch

        if self.int8:
            y = _int8_matmul(x, self.kernel, self.scale, self.bias)
        elif self.bias is not None:
            y = torch.addmm(self.bias, x, self.kernel)
        else:
            y = torch.mm(x, self.kernel)
        return torch.relu(y) if self.relu else y


class _Embedding:
    """`SharedEmbedding`'s lookup (with the sqrt(d_model) scale) and its reverse projection."""

    def __init__(self, layer):
        self.int8 = getattr(layer, "quantization_mode", None) == _INT8
        if self.int8:
            self.matrix = layer._embeddings.value  # int8 (V, d)
            self.scale = layer.embeddings_scale.value.reshape(-1)  # (V,)
            self.matrix_t = self.matrix.t().contiguous()  # (d, V) for _int_mm
        else:
            self.matrix = layer.embeddings.value  # (V, d)
        self.factor = math.sqrt(layer.d_model) if layer.scale else 1.0

    def lookup(self, ids):
        import torch

        if self.int8:
            rows = self.matrix[ids].to(torch.float32) / self.scale[ids][:, None]
        else:
            rows = self.matrix[ids]
        return rows * self.factor

    def reverse(self, x):
        import torch

        if self.int8:
            return _int8_matmul(x, self.matrix_t, self.scale)
        return torch.mm(x, self.matrix.t())


class _LayerNorm:
    def __init__(self, layer):
        self.gamma = layer.gamma.value if layer.scale else None
        self.beta = layer.beta.value if layer.center else None
        self.epsilon = layer.epsilon

    def __call__(self, x):
        import torch

        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.gamma, self.beta,
                                              self.epsilon)


class _Block:
    """One `DecoderLayer`'s weights, prepared for the step."""

    def __init__(self, block):
        self_attention, cross = block.self_attention, block.cross_attention
        self.heads, self.key_dim = self_attention.num_heads, self_attention.key_dim
        self.value_dim = self_attention.value_dim
        self.qkv = _Linear(self_attention.query_dense,
                           fused=[self_attention.query_dense, self_attention.key_dense,
                                  self_attention.value_dense])
        self.self_output = _Linear(self_attention.output_dense)
        self.self_norm = _LayerNorm(block.self_attention_norm)
        self.cross_query = _Linear(cross.query_dense)
        self.cross_output = _Linear(cross.output_dense)
        self.cross_norm = _LayerNorm(block.cross_attention_norm)
        self.ffn_inner = _Linear(block.ffn_inner)
        self.ffn_output = _Linear(block.ffn_output)
        self.ffn_norm = _LayerNorm(block.ffn_norm)
        if not self.ffn_inner.relu or self.ffn_output.relu:
            raise ValueError(f"{block.name}: expected a ReLU feed-forward network")
        self.norm_first = block.norm_first


def make_step_fn(model, source_ids, *, buffer_length, beam_size=1, cache_length=None):
    """The cached step of `steps.make_step_fn`, computed in plain PyTorch.

    Args:
        model: a float32 `keras_transformer.Transformer` under the torch
            backend (`supports(model)`).
        source_ids: `(batch, S)` int source ids (EOS-terminated, 0-padded).
        buffer_length: L, the most decoder positions a search will feed.
        beam_size: K; the step works on `batch * K` rows.
        cache_length: steps of the initial self-attention cache (default L).

    Returns:
        `(next_fn, initial_cache)` as `steps.make_step_fn(use_cache=True)`.
        `next_fn` writes the new keys and values into the cache tensors it is
        given (in place) and returns them: a search that keeps the cache of
        an earlier step must copy it (the beam searches' reordering does).

    Example:

    >>> next_fn, cache = make_step_fn(model, source_ids, buffer_length=20)
    >>> log_probs, cache = next_fn(tokens, cache, 0)  # (batch, vocab_size)
    """
    import torch
    from keras import ops

    ok, reason = supports(model)
    if not ok:
        raise ValueError(f"the plain PyTorch step cannot decode this model: {reason}")
    config = model.config
    decoder = model.decoder
    with torch.no_grad():
        embedding = _Embedding(model.target_embedding)
        source_ids = ops.convert_to_tensor(source_ids, "int32").to(embedding.matrix.device)
        batch_size = source_ids.shape[0]
        rows = batch_size * beam_size
        source_mask = source_ids != config.pad_id
        # The encoder runs once per batch: through Keras.
        encoder_output = model.encoder(model.source_embedding(source_ids),
                                       padding_mask=source_mask, training=False)
        cross_cache = decoder.compute_cross_attention_cache(encoder_output)
        if beam_size > 1:
            source_mask = source_mask.repeat_interleave(beam_size, dim=0)
            cross_cache = [tuple(t.repeat_interleave(beam_size, dim=0) for t in layer)
                           for layer in cross_cache]
        # Added to the logits: 0 at real source tokens, -1e9 at padding, as in
        # the Keras attention (an all-pad row then attends uniformly, not NaN).
        cross_mask = torch.where(source_mask, 0.0, _MASK_LOGIT)[:, None, None, :]  # (N, 1, 1, S)
        cache = decoder.init_self_attention_cache(rows, cache_length or buffer_length)

    return _Step(model, embedding, rows=rows, cross_cache=cross_cache, cross_mask=cross_mask,
                 buffer_length=buffer_length), cache


class _Step:
    """`make_step_fn`'s `next_fn`: one decoder position for every row, in plain PyTorch.

    Args:
        model: the Keras model whose weights the step reads (as torch tensors).
        embedding: its target `_Embedding`.
        rows: N, the rows of every step (`batch * beam_size`).
        cross_cache: per-layer `(keys, values)` of the encoder output.
        cross_mask: `(N, 1, 1, S)` additive mask of the source padding.
        buffer_length: the most positions a search feeds (the sinusoid's rows).
    """

    def __init__(self, model, embedding, *, rows, cross_cache, cross_mask, buffer_length):
        import torch

        from keras_transformer.model.layers.positional_encoding import sinusoid

        decoder = model.decoder
        self.embedding, self.rows = embedding, rows
        self.cross_cache, self.cross_mask = cross_cache, cross_mask
        with torch.no_grad():
            self.blocks = [_Block(block) for block in decoder.stack]
            self.output = (_Linear(model.output_projection)
                           if model.output_projection is not None else None)
            self.final_norm = (_LayerNorm(decoder.final_norm)
                               if decoder.final_norm is not None else None)
            positions = decoder.positional_encoding
            if positions.learned:
                self.position_table = positions.position_embeddings.value
            else:
                self.position_table = sinusoid(torch.arange(buffer_length), decoder.d_model)
        self.torch = torch
        self.sdpa = torch.nn.functional.scaled_dot_product_attention

    def _attend(self, block, query, keys, values, mask):
        # query (N, h * dk) -> (N, h, 1, dk); keys (N, h, T, dk) -> context (N, h * dv)
        query = query.view(self.rows, block.heads, 1, block.key_dim)
        context = self.sdpa(query, keys, values, attn_mask=mask)
        return context.reshape(self.rows, block.heads * block.value_dim)

    @staticmethod
    def _residual(x, y, norm, norm_first):
        # Post-norm (the paper): LayerNorm(x + y); pre-norm: x + y, y from LayerNorm(x).
        return x + y if norm_first else norm(x + y)

    def _block(self, block, x, step, keys, values, cross_keys, cross_values):
        h, dk, dv = block.heads, block.key_dim, block.value_dim
        pre = block.norm_first
        # Masked self-attention over positions 0..step (the causal mask of one query).
        y = block.self_norm(x) if pre else x
        q, k, v = self.torch.split(block.qkv(y), [h * dk, h * dk, h * dv], dim=-1)
        keys[:, :, step] = k.view(self.rows, h, dk)
        values[:, :, step] = v.view(self.rows, h, dv)
        y = self._attend(block, q, keys[:, :, : step + 1], values[:, :, : step + 1], None)
        x = self._residual(x, block.self_output(y), block.self_norm, pre)
        # Encoder-decoder attention.
        y = block.cross_norm(x) if pre else x
        y = self._attend(block, block.cross_query(y), cross_keys, cross_values,
                         self.cross_mask)
        x = self._residual(x, block.cross_output(y), block.cross_norm, pre)
        # Feed-forward network.
        y = block.ffn_norm(x) if pre else x
        return self._residual(x, block.ffn_output(block.ffn_inner(y)), block.ffn_norm, pre)

    def __call__(self, tokens, cache, index):
        torch = self.torch
        with torch.no_grad():
            step = int(index)
            x = self.embedding.lookup(tokens[:, step]) + self.position_table[step]  # (N, d)
            for block, (keys, values), (cross_keys, cross_values) in zip(
                    self.blocks, cache, self.cross_cache):
                x = self._block(block, x, step, keys, values, cross_keys, cross_values)
            if self.final_norm is not None:
                x = self.final_norm(x)
            logits = self.output(x) if self.output is not None else self.embedding.reverse(x)
            return torch.log_softmax(logits.to(torch.float32), dim=-1), cache
