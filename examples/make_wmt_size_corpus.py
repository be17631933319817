"""Writes a WMT14-size English-German corpus from the real data in ../shared/data.

WMT14's training data (4.5M pairs, about 1.3 GB of text) cannot be downloaded
here, so the paper-scale data path is measured on a corpus of the same size
made from real sentence pairs that are here: the Europarl v7 sample, the
news test sets 2009-2011 and 2015-2020 (42,602 pairs, about 300 bytes per
pair, as in WMT14: 4.5M pairs make 1.3 GB), repeated in a seeded random order
until `--pairs` pairs are written. Validation is newstest2012, test newstest2014 (the paper's test
set). The repetition makes the corpus useless for measuring quality; its
length distribution and byte size are those of real news and parliament
text, which is what the data pipeline's cost depends on.

Usage:

    python examples/make_wmt_size_corpus.py --output data/wmt_size           # 4.5M pairs
    python examples/make_wmt_size_corpus.py --output /tmp/c --pairs 100000
"""

import argparse
import os
import pathlib
import random
import shutil
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
SHARED_DATA = pathlib.Path(
    os.environ.get("KT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
NEWS_YEARS = (2009, 2010, 2011, 2015, 2016, 2017, 2018, 2019, 2020)


def source_pairs(shared=SHARED_DATA):
    """The real training pairs this script repeats, as a list of (en, de) lines."""
    from keras_transformer.data import load_parallel_text

    stems = [shared / "europarl_v7_sample" / "train"]
    stems += [shared / "newstest_extra" / f"newstest{year}" for year in NEWS_YEARS]
    pairs = []
    for stem in stems:  # checked aligned; pairs with an empty side left out
        pairs.extend(load_parallel_text(stem.with_suffix(".en"), stem.with_suffix(".de")))
    return pairs


def write_corpus(output, num_pairs, *, seed=0, shared=SHARED_DATA):
    """Writes `{train,valid,test}.{en,de}` into `output`; returns the training pairs written."""
    output = pathlib.Path(output)
    output.mkdir(parents=True, exist_ok=True)
    pairs = source_pairs(shared)
    rng = random.Random(seed)
    written = 0
    with open(output / "train.en", "w", encoding="utf-8") as english, \
            open(output / "train.de", "w", encoding="utf-8") as german:
        while written < num_pairs:
            order = list(range(len(pairs)))
            rng.shuffle(order)
            for index in order[:num_pairs - written]:
                english.write(pairs[index][0] + "\n")
                german.write(pairs[index][1] + "\n")
            written += min(len(order), num_pairs - written)
    for split, stem in (("valid", shared / "newstest_extra" / "newstest2012"),
                        ("test", shared / "wmt14_newstest" / "test")):
        for lang in ("en", "de"):
            shutil.copyfile(stem.with_suffix(f".{lang}"), output / f"{split}.{lang}")
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not (SHARED_DATA / "europarl_v7_sample" / "train.en").is_file():
        sys.exit(f"the real data is not at {SHARED_DATA}; set KT_SHARED_DATA")
    start = time.time()
    written = write_corpus(args.output, args.pairs, seed=args.seed)
    size = sum(p.stat().st_size for p in pathlib.Path(args.output).glob("train.*"))
    print(f"{args.output}: {written:,} training pairs, {size / 2**30:.2f} GiB of text, "
          f"in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
