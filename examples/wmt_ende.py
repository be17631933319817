"""Train and evaluate the Transformer on English-German, end to end.

A thin wrapper of `keras-transformer train` (every flag of that command
works here too; see docs/training.md):

    # Offline quick start (a few minutes on 2 CPU cores):
    python examples/wmt_ende.py --data demo --preset tiny

    # A folder with {train,valid,test}.{en,de} (e.g. Multi30k):
    python examples/wmt_ende.py --data ../shared/data/multi30k --preset small

    # The paper's base model on WMT14 (needs internet for the download, and GPUs):
    python examples/wmt_ende.py --data wmt14 --preset base

Data -> shared SentencePiece vocabulary -> token-bucketed tf.data -> the
paper's model, optimizer, schedule and label-smoothed loss -> model.fit
(re-run the same command to resume after a crash) -> average the last
checkpoints -> beam search (4, alpha 0.6) -> sacreBLEU -> a SavedModel for
TF Serving. The stages are `keras_transformer.training.job`.
"""

import sys

from keras_transformer.commands import main as command_main


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return command_main(["train"] + argv, prog="wmt_ende.py")


if __name__ == "__main__":
    sys.exit(main())
