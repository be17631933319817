"""Inference: the cached searches over a `next(tokens, cache, index)` step,
the translator shell and `Translator`, loading a run's weights, the plain
PyTorch step and sacreBLEU evaluation. Never imports training or export."""
