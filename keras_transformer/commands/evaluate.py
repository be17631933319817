"""`keras-transformer evaluate`: sacreBLEU of a run's weights on test splits."""

import json

from keras_transformer import names
from keras_transformer.commands.common import check_decoding_argument, setup_logging
from keras_transformer.model.config import DecodingOptions


def add_parser(commands):
    decoding = DecodingOptions()
    p = commands.add_parser(
        "evaluate", help="score a run's weights on test splits with sacreBLEU",
        description="Translates <data>/<split>.en with a run folder's weights and scores "
                    "it against <split>.de (sacreBLEU BLEU and chrF, detokenized, 13a, "
                    "mixed case, and BLEU lowercased); one row per weights, beam size and "
                    "split, and a "
                    "Markdown table at the end. The beam size, alpha and length limit are "
                    "the run's settings.json (else the paper's) unless given; a log line "
                    "says which were used.")
    p.add_argument("--run", required=True, help="a training run folder")
    p.add_argument("--data", required=True, help="folder with <split>.en / <split>.de files")
    p.add_argument("--splits", nargs="+", default=["test"], help="default: test")
    p.add_argument("--weights", nargs="+", default=["final"],
                   help="final (model.keras), averaged, best, last, ckpt-<update> or "
                        ".weights.h5 paths (default: final)")
    p.add_argument("--beam-sizes", nargs="+", type=int,
                   help="1 = greedy (default the run's settings.json, else "
                        f"{decoding.beam_size})")
    p.add_argument("--alpha", nargs="+", type=float,
                   help=f"length penalty (default the run's settings.json, else "
                        f"{decoding.alpha:g}); several values give a row each "
                        "(tune it on a validation split, not on the test set)")
    p.add_argument("--quantize", choices=names.KERAS_QUANTIZATIONS,
                   help="score int8 weights (Keras' model.quantize on a copy)")
    p.add_argument("--max-sentences", type=int, help="score only the first N lines")
    p.add_argument("--json", help="also write the rows to this file")
    p.set_defaults(func=run_evaluate)
    return p


def run_evaluate(args):
    for beam_size in args.beam_sizes or ():
        check_decoding_argument("beam_size", beam_size, flag="--beam-sizes")
    for alpha in args.alpha or ():
        check_decoding_argument("alpha", alpha)
    setup_logging()
    from keras_transformer.inference.evaluation import evaluate_run

    rows = evaluate_run(args.run, args.data, splits=args.splits, weights=args.weights,
                        beam_sizes=args.beam_sizes, alpha=args.alpha,
                        quantize=args.quantize, max_sentences=args.max_sentences)
    print("| weights | beam | alpha | split | sacreBLEU | chrF2 | BLEU, lowercased |\n"
          "|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['weights']} | {row['beam_size']} | {row['alpha']:g} | {row['split']} | "
              f"{row['bleu']:.2f} | {row['chrf']:.2f} | {row['bleu_lowercase']:.2f} |")
    print(f"\nsacreBLEU signature: {rows[0]['bleu_signature']}")
    print(f"lowercased BLEU signature: {rows[0]['bleu_lowercase_signature']}")
    print(f"chrF signature: {rows[0]['chrf_signature']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)
    return 0
