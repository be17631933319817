"""Train and evaluate the Transformer on English-German, end to end.

    # Offline quick start (about 10 minutes on 2 CPU cores):
    python examples/wmt_ende.py --data demo --preset tiny

    # A folder with {train,valid,test}.{en,de} (e.g. Multi30k):
    python examples/wmt_ende.py --data ../shared/data/multi30k --preset small

    # The paper's base model on WMT14 (needs internet for the download, and GPUs):
    python examples/wmt_ende.py --data wmt14 --preset base

Data -> shared SentencePiece vocabulary -> token-bucketed tf.data ->
build_model under the distribution strategy -> the paper's optimizer, schedule
and label-smoothed loss -> model.fit (re-run the same command to resume after
a crash) -> average the last checkpoints -> beam search (4, alpha 0.6) ->
sacreBLEU -> a SavedModel for TF Serving. The logic lives in
`keras_transformer.experiment`.
"""

import argparse

from keras_transformer.experiment import PRESET_DEFAULTS, JobSettings, run


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="wmt14",
                        help="wmt14 (tensorflow-datasets), demo (generated offline), or a "
                             "folder with {train,valid,test}.{en,de}")
    parser.add_argument("--preset", default="base", choices=sorted(PRESET_DEFAULTS))
    parser.add_argument("--output-dir", default=None,
                        help="default: runs/<data>_<preset>")
    parser.add_argument("--train-steps", type=int, help="optimizer updates")
    parser.add_argument("--tokens-per-batch", type=int,
                        help="token budget per batch and side, padding included")
    parser.add_argument("--vocab-size", type=int, help="shared SentencePiece vocabulary")
    parser.add_argument("--max-length", type=int, help="longest sequence in tokens")
    parser.add_argument("--checkpoint-every", type=int, help="updates between checkpoints")
    parser.add_argument("--average-last", type=int, help="checkpoints averaged at the end")
    parser.add_argument("--grad-accum-steps", type=int, default=1)
    parser.add_argument("--mixed-precision", default="none",
                        choices=["none", "mixed_float16", "mixed_bfloat16"])
    parser.add_argument("--distribute", default="auto",
                        choices=["auto", "none", "mirrored", "multiworker"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--eval-sentences", type=int,
                        help="score only the first N test sentences")
    parser.add_argument("--jit-compile", default="auto", choices=["auto", "true", "false"])
    parser.add_argument("--export-dir", default="saved_models",
                        help="TF Serving export base (<dir>/<model-name>/<version>); "
                             "'' to skip the export")
    parser.add_argument("--model-name", default="transformer")
    parser.add_argument("--verbose", type=int, default=1, choices=[0, 1, 2])
    args = parser.parse_args(argv)
    if args.output_dir is None:
        name = args.data if args.data in ("wmt14", "demo") else \
            args.data.rstrip("/").split("/")[-1]
        args.output_dir = f"runs/{name}_{args.preset}"
    return JobSettings(**{k: v for k, v in vars(args).items()})


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
