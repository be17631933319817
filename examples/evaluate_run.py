"""Score a training run: its weights (final, averaged, best, last, ckpt-N), beam vs greedy, several test sets.

A thin wrapper of `keras-transformer evaluate` (every flag of that command
works here too; see docs/evaluation.md):

    python examples/evaluate_run.py --run runs/multi30k_small \
        --data ../shared/data/multi30k --splits test test_2017_flickr test_2017_mscoco \
        --weights averaged last --beam-sizes 4 1

`--weights` takes final (model.keras, the default), averaged
(averaged.weights.h5), best (the best validation BLEU), last (the newest
checkpoint), ckpt-<update> or .weights.h5 paths. Prints sacreBLEU BLEU and
chrF (detokenized, 13a, mixed case) per weights, beam size and split, and a
Markdown table at the end. The logic is
`keras_transformer.inference.evaluation.evaluate_run`.
"""

import sys

from keras_transformer.commands import main as command_main


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return command_main(["evaluate"] + argv, prog="evaluate_run.py")


if __name__ == "__main__":
    sys.exit(main())
