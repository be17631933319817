"""Our `Translator` against its CTranslate2 export (float32 and int8): BLEU, agreement, speed.

    python examples/compare_ctranslate2.py --run runs/multi30k_small \
        --data ../shared/data/multi30k --split test --beam-size 4 --alpha 0.6

Exports the run (`--weights`, default model.keras) with
`keras_transformer.export_ctranslate2` as float32 and int8 folders (under
`--export-dir`, default a temporary folder), translates
`<data>/<split>.en` with `Translator` in this process and with each export
(`CTranslate2Translator`) in a process of its own, so that TensorFlow's
thread pools and CTranslate2's do not share one process, and prints for each:
sacreBLEU BLEU and chrF against `<split>.de`, the share of outputs identical
to `Translator`'s, and sentences per second.

The same beam size is used everywhere; CTranslate2's `length_penalty`
(`--length-penalty`, default `--alpha`) divides by `|Y| ** length_penalty`
where ours divides by `((5 + |Y|) / 6) ** alpha` (see
`keras_transformer.export_ctranslate2`), so beam outputs may differ a little;
with `--beam-size 1` they are the same. `Translator`'s time includes its
XLA compilation (one per batch shape) unless `--warmup`; both sides exclude
loading. `--threads N` limits every library to N threads (0: their defaults).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

SYSTEMS = ("Translator", "CTranslate2 float32", "CTranslate2 int8")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="training run folder")
    parser.add_argument("--data", required=True, help="folder with <split>.en and <split>.de")
    parser.add_argument("--split", default="test", help="default test")
    parser.add_argument("--weights", help="final (default), averaged, best, last, "
                                          "ckpt-<update> or a .weights.h5 path")
    parser.add_argument("--beam-size", type=int, default=4, help="default 4")
    parser.add_argument("--alpha", type=float, default=0.6,
                        help="our GNMT length penalty (default 0.6)")
    parser.add_argument("--length-penalty", type=float,
                        help="CTranslate2's length_penalty (default: --alpha)")
    parser.add_argument("--max-extra-length", type=int, default=50, help="default 50")
    parser.add_argument("--batch-size", type=int, default=32, help="default 32")
    parser.add_argument("--max-sentences", type=int, help="only the first N sentences")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads per library (default 0: each library's default)")
    parser.add_argument("--warmup", action="store_true",
                        help="translate once untimed first (Translator compiles then)")
    parser.add_argument("--export-dir", help="keep the exports there (default: a temporary "
                                             "folder, removed afterwards)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one CTranslate2 run
    return parser.parse_args(argv)


def limit_threads(threads):
    """Environment settings that bound TensorFlow/XLA/OpenMP threads, before any import."""
    if threads > 0:
        for name in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
            os.environ[name] = str(threads)
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_multi_thread_eigen=false").strip()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def read_lines(path):
    with open(path, encoding="utf-8", newline="") as f:
        return [line.rstrip("\r\n") for line in f]


# --- one CTranslate2 run, in its own process -----------------------------------------


def run_worker(spec_file):
    """Translates `spec["sources"]` with `spec["model_dir"]`; writes outputs and seconds."""
    from keras_transformer.export_ctranslate2 import CTranslate2Translator

    spec = json.loads(pathlib.Path(spec_file).read_text(encoding="utf-8"))
    translator = CTranslate2Translator(
        spec["model_dir"], intra_threads=spec["threads"], batch_size=spec["batch_size"],
        max_extra_length=spec["max_extra_length"])
    options = dict(beam_size=spec["beam_size"], length_penalty=spec["length_penalty"])
    if spec["warmup"]:
        translator.translate(spec["sources"], **options)
    start = time.perf_counter()
    outputs = translator.translate(spec["sources"], **options)
    seconds = time.perf_counter() - start
    pathlib.Path(spec_file).write_text(json.dumps({"outputs": outputs, "seconds": seconds}),
                                       encoding="utf-8")


def translate_in_subprocess(model_dir, sources, args, work):
    spec_file = pathlib.Path(work) / f"{pathlib.Path(model_dir).name}.json"
    spec_file.write_text(json.dumps(dict(
        model_dir=str(model_dir), sources=sources, threads=args.threads,
        batch_size=args.batch_size, max_extra_length=args.max_extra_length,
        beam_size=args.beam_size, warmup=args.warmup,
        length_penalty=(args.alpha if args.length_penalty is None
                        else args.length_penalty))), encoding="utf-8")
    subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--run", "-",
                    "--data", "-", "--threads", str(args.threads), "--worker",
                    str(spec_file)], check=True)
    result = json.loads(spec_file.read_text(encoding="utf-8"))
    return result["outputs"], result["seconds"]


# --- the comparison -----------------------------------------------------------------------


def compare(args, work):
    from keras_transformer.export_ctranslate2 import export_ctranslate2
    from keras_transformer.runs import load_run
    from keras_transformer.translate import Translator, score_translations

    data = pathlib.Path(args.data)
    sources = read_lines(data / f"{args.split}.en")
    references = read_lines(data / f"{args.split}.de")
    if len(sources) != len(references):
        raise SystemExit(f"{args.split}.en and {args.split}.de differ in length")
    if args.max_sentences:
        sources, references = sources[:args.max_sentences], references[:args.max_sentences]

    model, tokenizer = load_run(args.run, args.weights)
    export_dir = pathlib.Path(args.export_dir or work)
    folders = {}
    for quantization in (None, "int8"):
        folder = export_dir / ("ct2-" + (quantization or "float32"))
        export_ctranslate2(model, tokenizer, folder, quantization=quantization,
                           overwrite=True, source={"run": str(args.run),
                                                   "weights": args.weights})
        folders[quantization or "float32"] = folder

    translator = Translator(model, tokenizer, batch_size=args.batch_size,
                            max_extra_length=args.max_extra_length)
    options = dict(beam_size=args.beam_size, alpha=args.alpha)
    if args.warmup:
        translator.translate(sources, **options)
    start = time.perf_counter()
    outputs = {SYSTEMS[0]: translator.translate(sources, **options)}
    seconds = {SYSTEMS[0]: time.perf_counter() - start}
    for name, key in zip(SYSTEMS[1:], ("float32", "int8")):
        outputs[name], seconds[name] = translate_in_subprocess(folders[key], sources, args,
                                                               work)

    rows, signature = [], None
    reference_outputs = outputs[SYSTEMS[0]]
    for name in SYSTEMS:
        score = score_translations(outputs[name], references)
        signature = score.bleu_signature
        same = sum(a == b for a, b in zip(outputs[name], reference_outputs))
        rows.append(dict(system=name, bleu=score.bleu, chrf=score.chrf,
                         identical=same / max(len(sources), 1), identical_count=same,
                         sentences=len(sources), seconds=seconds[name],
                         sentences_per_second=len(sources) / max(seconds[name], 1e-9)))
    return rows, signature


def print_rows(rows, args, signature):
    length_penalty = args.alpha if args.length_penalty is None else args.length_penalty
    print(f"{args.split}: {rows[0]['sentences']} sentences, beam {args.beam_size}, "
          f"alpha {args.alpha} (GNMT, ours), length_penalty {length_penalty} (CTranslate2), "
          f"threads {args.threads or 'default'}")
    print("| system | BLEU | chrF | identical to Translator | sentences/s |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['system']} | {row['bleu']:.2f} | {row['chrf']:.2f} | "
              f"{100 * row['identical']:.1f}% ({row['identical_count']}) | "
              f"{row['sentences_per_second']:.1f} |")
    print(f"BLEU signature: {signature}")


def main(argv=None):
    args = parse_args(argv)
    limit_threads(args.threads)
    if args.worker:
        run_worker(args.worker)
        return 0
    with tempfile.TemporaryDirectory(prefix="compare_ct2_") as work:
        rows, signature = compare(args, work)
    print_rows(rows, args, signature)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2) + "\n",
                                           encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
