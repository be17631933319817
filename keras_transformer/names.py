"""Names shared by the run folder, prepared corpora, the exports and the commands.

Each file name, folder default, signature name and quantization mode is
written here once. No Keras and no TensorFlow: the commands read it before
anything heavy is imported.
"""

# Files.
TOKENIZER_FILE = "spm.model"  # the SentencePiece model: in a run, a prepared corpus, an export
CONFIG_FILE = "config.json"  # the model's TransformerConfig

# Default folders (relative to the working directory).
RUNS_ROOT = "runs"  # run folders: runs/<data>_<preset>
PREPARED_ROOT = f"{RUNS_ROOT}/prepared"  # prepared corpora: where `prepare` and `train` look
EXPORT_ROOT = "saved_models"  # SavedModels (<root>/<name>/<version>) and CTranslate2 folders

# The SavedModel's signatures: (batch,) strings named INPUT_NAME in.
BEAM_SIGNATURE = "serving_default"
GREEDY_SIGNATURE = "translate_greedy"
SIGNATURES = (BEAM_SIGNATURE, GREEDY_SIGNATURE)
INPUT_NAME = "text"

# Weight quantization: of the Keras model (`model.quantized`, the SavedModel)
# and of a CTranslate2 export (CTranslate2's `quantization` weight types).
KERAS_QUANTIZATIONS = ("int8",)
# What a Keras model decodes in (`model.with_dtype`, the SavedModel's `dtype`).
DECODING_DTYPES = ("float32", "bfloat16")
CTRANSLATE2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                             "float16", "bfloat16")
