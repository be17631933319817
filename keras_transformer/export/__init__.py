"""Export: the SavedModel for TF Serving and its warm-up records, and the
CTranslate2 converter and runtime. Never imports training."""
