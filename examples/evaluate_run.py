"""Score a finished training run: averaged vs single checkpoints, beam vs greedy, several test sets.

    python examples/evaluate_run.py --run runs/multi30k_small \
        --data ../shared/data/multi30k --splits test test_2017_flickr test_2017_mscoco \
        --weights averaged last --beam-sizes 4 1

Prints sacreBLEU BLEU and chrF (detokenized, 13a, mixed case) per weights
file, beam size and split, and a Markdown table at the end. The logic is
`keras_transformer.experiment.evaluate_run`.
"""

import argparse
import json

from keras_transformer.experiment import evaluate_run


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="output folder of wmt_ende.py")
    parser.add_argument("--data", required=True,
                        help="folder with <split>.en / <split>.de files")
    parser.add_argument("--splits", nargs="+", default=["test"])
    parser.add_argument("--weights", nargs="+", default=["averaged"],
                        help="averaged, last, ckpt-<update> or .weights.h5 paths")
    parser.add_argument("--beam-sizes", nargs="+", type=int, default=[4],
                        help="1 = greedy")
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--max-sentences", type=int)
    parser.add_argument("--json", help="also write the rows here")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    rows = evaluate_run(args.run, args.data, splits=args.splits, weights=args.weights,
                        beam_sizes=args.beam_sizes, alpha=args.alpha,
                        max_sentences=args.max_sentences)
    print("\n| weights | beam | split | sacreBLEU | chrF2 |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['weights']} | {row['beam_size']} | {row['split']} | "
              f"{row['bleu']:.2f} | {row['chrf']:.2f} |")
    print(f"\nsacreBLEU signature: {rows[0]['bleu_signature']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)
    return rows


if __name__ == "__main__":
    main()
