"""`keras-transformer prepare`: a corpus's vocabulary and token-id shards, made once.

    keras-transformer prepare --data wmt14 --preset base
    keras-transformer prepare --data ../shared/data/multi30k --vocab-size 8000 \
        --prepared-dir runs/prepared/multi30k_v8000
    keras-transformer train --data ../shared/data/multi30k --vocab-size 8000 \
        --prepared-dir runs/prepared/multi30k_v8000   # reuses it
    keras-transformer train --data runs/prepared/multi30k_v8000 --preset small

`train --data <text folder>` prepares the folder itself (into the same
default place, `runs/prepared/<corpus>_v<vocab-size>`) and reuses it, so this
command is needed only to prepare ahead of time, elsewhere, or with other
options (shards, tokenizer sample). The prepared folder is `--prepared-dir`
in both commands. See `keras_transformer.data.preparation`.
"""

import argparse
import pathlib

from keras_transformer.commands.common import CommandError, say, setup_logging


def add_parser(commands):
    p = commands.add_parser(
        "prepare", help="encode a corpus once into token-id shards for training",
        description="Trains the shared SentencePiece vocabulary on a sample, encodes "
                    "every pair once into shuffled TFRecord shards and writes a manifest "
                    "(counts, length histograms, hashes). Reuses an up-to-date "
                    "preparation (checking its shards); prepares again when an input "
                    "file or the vocabulary size changed.")
    p.add_argument("--data", required=True,
                   help="demo, wmt14 (tensorflow-datasets) or a folder with "
                        "{train,valid,test}.{en,de}")
    p.add_argument("--preset", default="base", help="gives the default --vocab-size "
                   "(base/big 37000, small 8000, tiny 4000)")
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--max-length", type=int, default=None,
                   help="report the length policy for this length (preset default); "
                        "the shards keep every pair")
    p.add_argument("--prepared-dir", default=None,
                   help="the prepared folder (default runs/prepared/<corpus>_v<vocab-size>, "
                        "where `train --data` looks; `train --prepared-dir` names the same "
                        "folder)")
    # The flag's old name (CHANGELOG.md): still read, with a warning.
    p.add_argument("--output", dest="old_output", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", default=None,
                   help="encode with this SentencePiece model instead of training one")
    p.add_argument("--num-shards", type=int, default=None,
                   help="training shards (default: one per 32 MiB of text)")
    p.add_argument("--tokenizer-sample", type=int, default=None,
                   help="sentences sampled to train the vocabulary (default 2,000,000)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_prepare)
    return p


def run_prepare(args):
    setup_logging()
    from keras_transformer.data import corpora, preparation, prepared

    if args.old_output is not None:
        if args.prepared_dir is not None:
            raise CommandError("--output is the old name of --prepared-dir; give one of them")
        say(args.called_as, "warning: --output is now --prepared-dir (the flag train takes "
            "for the same folder); --output will be removed", error=False)
        args.prepared_dir = args.old_output
    from keras_transformer.training.settings import PRESET_DEFAULTS

    if args.preset not in PRESET_DEFAULTS:
        raise CommandError(f"--preset {args.preset!r} is not one of "
                           f"{', '.join(sorted(PRESET_DEFAULTS))}")
    for name in ("vocab_size", "num_shards", "tokenizer_sample", "max_length"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be >= 1, received {value}")
    if args.tokenizer and not pathlib.Path(args.tokenizer).is_file():
        raise CommandError(f"--tokenizer {args.tokenizer} does not exist")
    if args.data != "wmt14" and args.data != "demo" and prepared.is_prepared(args.data):
        raise CommandError(f"--data {args.data} is already a prepared corpus; name its "
                           "text folder")
    vocab_size = args.vocab_size or PRESET_DEFAULTS[args.preset]["vocab_size"]
    max_length = args.max_length or PRESET_DEFAULTS[args.preset]["max_length"]
    inputs = corpora.corpus_inputs(args.data, seed=args.seed)
    output = args.prepared_dir or corpora.default_prepared_dir(inputs, vocab_size, args.tokenizer)
    options = dict(seed=args.seed, max_length=max_length, num_shards=args.num_shards)
    if args.tokenizer_sample:
        options["tokenizer_sample"] = args.tokenizer_sample
    # A reused preparation's shards are checked by sha256.
    corpus = preparation.ensure_prepared(inputs, output, vocab_size=vocab_size,
                                         tokenizer_file=args.tokenizer, verify=True,
                                         **options)
    counts = corpus.length_policy("train", max_length)
    print(f"{corpus.directory}: {corpus.summary()}; the length policy (max {max_length} "
          f"tokens) drops {counts.num_over_long:,} training pairs"
          f"{' (up to date, shards verified)' if corpus.reused else ''}")
    return 0
