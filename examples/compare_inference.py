"""A trained run's test set through every inference path: BLEU, agreement and speed, fairly.

    python examples/compare_inference.py --run runs/multi30k_small \
        --data ../shared/data/multi30k --split test

Exports the run once (`--weights`, default model.keras), in a preparing
process: a SavedModel in float32, one in int8 (`export --quantize int8`) and
one in bf16 (`export --dtype bfloat16`), and CTranslate2 folders in float32
and int8. Then, in `--rounds` rounds,
each system translates `<data>/<split>.en` in a fresh process of its own
(one at a time, the order rotated each round, as `benchmark_decoding.py`
does), so that no two runtimes share the cores:

- `translator`, `translator-int8`, `translator-bf16`: `Translator` in a
  process with `KERAS_BACKEND=--backend` (default tensorflow: the search
  XLA-compiled), on the float32 model, its `keras_transformer.model.transformer.quantized`
  copy or its `with_dtype(model, "bfloat16")` copy;
- `saved-model`, `saved-model-int8`, `saved-model-bf16`: a process that imports only TensorFlow
  and TensorFlow Text loads the export (as a model server does) and calls
  `serving_default`;
  `saved-model-xla` the same for the XLA-compiled export (`export --xla`,
  its default buckets), whose load time here includes replaying its
  warm-up requests (every compiled shape), as TF Serving does at load;
- `ct2`, `ct2-int8`: `CTranslate2Translator` on the CTranslate2 exports
  (finished hypotheses ranked by our GNMT penalty at `--alpha`, or by
  CTranslate2's `|Y| ** length_penalty` with `--length-penalty`).

Every worker loads its system and answers one one-sentence request
("load to first answer s": what a server's first request waits for after
the process starts, the XLA export's warm-up replay included), translates
the split once untimed (tracing, XLA compilation, the SavedModel's first
run of each shape; "warm-up s") and once timed, each time as requests of
`--batch-size` sentences in the split's order, the same requests for every
system (each sorts the sentences of a request by length; none sees the
whole split at once, as a server does not); then it sends the first
`--latency-sentences` sentences one request each, once untimed and once
timed (batch-1 p50 and p90 latency),
and reports its peak resident memory (`ru_maxrss`: load, compilation and
both passes). The table gives per system sacreBLEU BLEU and chrF against
`<split>.de`, the share of outputs identical to `translator`'s, the
median sentences/s over rounds with the spread, the medians of the batch-1
p50 and p90 and of the time to the first answer, and the largest peak RSS;
below it, what int8 costs and gains on each path and how the served graph
compares with the in-process search (a line also names any system whose
batch-1 answers differ from its batched ones).

All systems decode with the same beam size, alpha and length limit: the
run's (its settings.json, as `export --run` takes them), else the paper's,
unless `--beam-size`, `--alpha` or `--max-extra-length` say otherwise. The SavedModel
and `Translator` run the same search (their outputs are the same in float32,
and in int8 up to the rounding of the int8 activations); CTranslate2's beam
search ranks its finished hypotheses by the same GNMT penalty
(`CTranslate2Translator` reranks them) but stops a sentence differently (see
`keras_transformer.export.ctranslate2`), so its beam outputs may differ a
little; with `--beam-size 1` they are the same.

Threads: TensorFlow and XLA keep their defaults (one thread per core);
`--threads` (default: the usable cores) goes to `torch.set_num_threads` for a
PyTorch `Translator` and to CTranslate2's `intra_threads`.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

EXAMPLES = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(EXAMPLES)
for _path in (REPO_ROOT, EXAMPLES):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmark_decoding import (  # noqa: E402
    child_environment,
    child_main,
    peak_rss_mib,
    percentile,
    rotated,
    run_child,
    usable_cores,
    wait_for_quiet,
)

SCRIPT = os.path.abspath(__file__)
# name: (kind, variant: None for float32, "int8" weights or "bf16" weights and
# arithmetic, "xla" the XLA-compiled export). The first is the reference of
# "identical".
SYSTEMS = {
    "translator": ("translator", None),
    "translator-int8": ("translator", "int8"),
    "translator-bf16": ("translator", "bf16"),
    "saved-model": ("saved_model", None),
    "saved-model-int8": ("saved_model", "int8"),
    "saved-model-bf16": ("saved_model", "bf16"),
    "saved-model-xla": ("saved_model", "xla"),
    "ct2": ("ct2", None),
    "ct2-int8": ("ct2", "int8"),
}
VARIANTS = ("int8", "bf16")
REFERENCE = "translator"
BACKENDS = ("tensorflow", "jax", "torch")


def check_decoding_flags(parser, args):
    """Refuses a bad --beam-size, --alpha or --max-extra-length in one line."""
    from keras_transformer.model.config import DecodingOptions  # no Keras

    for name in ("beam_size", "alpha", "max_extra_length"):
        if getattr(args, name) is not None:
            try:
                DecodingOptions.check(name, getattr(args, name),
                                      label=f"--{name.replace('_', '-')}")
            except ValueError as error:
                parser.error(str(error))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="training run folder")
    parser.add_argument("--data", required=True,
                        help="folder with <split>.en and <split>.de")
    parser.add_argument("--split", default="test", help="default test")
    parser.add_argument("--weights", help="final (default), averaged, best, last, "
                                          "ckpt-<update> or a .weights.h5 path")
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS),
                        metavar="SYSTEM", help=f"default all: {' '.join(SYSTEMS)}")
    parser.add_argument("--backend", choices=BACKENDS, default="tensorflow",
                        help="KERAS_BACKEND of the translator workers (default tensorflow)")
    parser.add_argument("--beam-size", type=int,
                        help="default: the run's (settings.json), else the paper's 4")
    parser.add_argument("--alpha", type=float,
                        help="our GNMT length penalty (default: the run's, else 0.6)")
    parser.add_argument("--length-penalty", type=float,
                        help="rank CTranslate2's finished hypotheses by its own "
                             "|Y| ** length_penalty (default: our GNMT penalty at --alpha)")
    parser.add_argument("--max-extra-length", type=int,
                        help="default: the run's, else 50")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="sentences per request, and the exports' and Translator's batch "
                             "size (default 32)")
    parser.add_argument("--max-sentences", type=int, help="only the first N sentences")
    parser.add_argument("--xla-batch-sizes", type=int, nargs="+", metavar="N",
                        help="saved-model-xla's batch buckets (default: the export's)")
    parser.add_argument("--xla-widths", type=int, nargs="+", metavar="N",
                        help="saved-model-xla's source-width buckets (default: the export's)")
    parser.add_argument("--latency-sentences", type=int, default=200, metavar="N",
                        help="batch-1 latency (p50, p90) over the first N sentences, one "
                             "request each (default 200; 0: none)")
    parser.add_argument("--rounds", type=int, default=3, help="default 3")
    parser.add_argument("--threads", type=int,
                        help="threads of PyTorch and CTranslate2 (default: the usable cores)")
    parser.add_argument("--ct2-threads", type=int,
                        help="CTranslate2's intra_threads (default: --threads)")
    parser.add_argument("--export-dir", help="keep the exports there (default: a temporary "
                                             "folder, removed afterwards)")
    parser.add_argument("--wait-for-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each worker, wait up to this long for other processes "
                             "to use under a quarter of a core")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds a worker may run (default 3600)")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: SYSTEM or "prepare"
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None:  # a worker imports nothing of keras_transformer it does not run
        check_decoding_flags(parser, args)
    for name in ("max_sentences", "threads", "ct2_threads", "latency_sentences"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "max_sentences" else 0):
            parser.error(f"--{name.replace('_', '-')} must be at least "
                         f"{1 if name == 'max_sentences' else 0}, received {value}")
    if args.rounds < 1 or args.batch_size < 1:
        parser.error("--rounds and --batch-size must be positive")
    return args


def read_lines(path):
    with open(path, encoding="utf-8", newline="") as f:
        return [line.rstrip("\r\n") for line in f]


def decoding_options(args):
    """How the run decodes (`run_decoding`: its settings.json, else the paper's),
    changed by the flags given; prints the line the commands print."""
    from keras_transformer.inference.loading import run_decoding

    decoding = run_decoding(args.run, beam_size=args.beam_size, alpha=args.alpha,
                            max_extra_length=args.max_extra_length)
    print(f"decoding: {decoding.describe()}", flush=True)
    return decoding.options


# --- preparing: the exports, once -----------------------------------------------------------


def prepare(spec):
    """Exports the run as SavedModels and CTranslate2 folders; their paths."""
    from keras_transformer.export.saved_model import export_from_run
    from keras_transformer.export.ctranslate2 import export_ctranslate2_from_run

    options = spec["options"]
    base = pathlib.Path(spec["export_dir"])
    paths = {}
    for name in spec["systems"]:
        kind, variant = SYSTEMS[name]
        quantize = "int8" if variant == "int8" else None
        if kind == "saved_model":
            # Chunks of the requests' batch size: each request is decoded at once.
            paths[name] = str(export_from_run(
                spec["run"], base, model_name=name, version=1, weights=spec["weights"],
                beam_size=max(options["beam_size"], 2), alpha=options["alpha"],
                max_extra_length=options["max_extra_length"], batch_size=spec["batch_size"],
                quantize=quantize, dtype="bfloat16" if variant == "bf16" else None,
                xla=variant == "xla", overwrite=True,
                **({"xla_batch_sizes": spec["xla_batch_sizes"],
                    "xla_widths": spec["xla_widths"]} if variant == "xla" else {})))
        elif kind == "ct2":
            paths[name] = str(export_ctranslate2_from_run(
                spec["run"], base, model_name="ours", weights=spec["weights"],
                quantization=quantize, overwrite=True))
    return {"paths": paths}


# --- one system's pass over the split, in its own process ------------------------------------


def _translator(spec, variant):
    from keras_transformer.model.config import DecodingOptions
    from keras_transformer.model.transformer import quantized, with_dtype
    from keras_transformer.inference.loading import load_run
    from keras_transformer.inference.translator import Translator

    import keras

    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(spec["threads"])
    model, tokenizer = load_run(spec["run"], spec["weights"])
    if variant == "int8":
        model = quantized(model, "int8")
    elif variant == "bf16":
        model = with_dtype(model, "bfloat16")
    translator = Translator(model, tokenizer, DecodingOptions(**spec["options"]),
                            batch_size=spec["batch_size"])
    info = {"backend": keras.backend.backend(), "keras": keras.__version__}
    return translator.translate, info


def _saved_model(spec, path, variant):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - registers the SentencePiece ops

    loaded = tf.saved_model.load(path)
    foreign = sorted(m for m in ("keras_transformer", "torch") if m in sys.modules)
    replay = None
    if variant == "xla":
        # As TF Serving loads a version: its warm-up requests first (every
        # compiled shape), before any request is answered. (The records are
        # read with the package's parser, after the check above: the model
        # itself needs TensorFlow and TensorFlow Text only.)
        from keras_transformer.export.warmup import replay_warmup_requests

        start = time.perf_counter()
        replay_warmup_requests(path, loaded=loaded)
        replay = round(time.perf_counter() - start, 1)
    signature = loaded.signatures["serving_default"] if spec["options"]["beam_size"] > 1 \
        else loaded.signatures["translate_greedy"]

    def translate(sentences):  # one request
        result = signature(text=tf.constant(sentences))
        return [t.decode("utf-8") for t in result["translation"].numpy()]

    info = {"tensorflow": tf.__version__, "tensorflow_text": tensorflow_text.__version__,
            "foreign_modules": foreign}
    if replay is not None:
        info["warmup_replay_seconds"] = replay
    return translate, info


def _ct2(spec, path):
    import ctranslate2

    from keras_transformer.export.ctranslate2_runtime import CTranslate2Translator

    translator = CTranslate2Translator(
        path, intra_threads=spec["ct2_threads"], batch_size=spec["batch_size"],
        max_extra_length=spec["options"]["max_extra_length"])
    options = dict(beam_size=spec["options"]["beam_size"], alpha=spec["options"]["alpha"],
                   length_penalty=spec["length_penalty"])
    info = {"ctranslate2": ctranslate2.__version__,
            "threads": f"intra_threads={spec['ct2_threads']}"}
    return (lambda sentences: translator.translate(sentences, **options)), info


def run_system(name, spec):
    """Translates the split twice (warm-up, timed); writes the outputs, returns the figures."""
    kind, variant = SYSTEMS[name]
    sources = read_lines(spec["source"])[: spec["max_sentences"]]
    start = time.perf_counter()
    if kind == "translator":
        translate, info = _translator(spec, variant)
    elif kind == "saved_model":
        translate, info = _saved_model(spec, spec["paths"][name], variant)
    else:
        translate, info = _ct2(spec, spec["paths"][name])
    load_seconds = time.perf_counter() - start
    translate(sources[:1])  # what a server's first request waits for after starting
    first_answer_seconds = time.perf_counter() - start

    def in_requests(sentences):
        # The same requests for every system: `batch_size` sentences each, in
        # the split's order, as clients send them. Each system sorts within a
        # request only: an in-process system given the whole split would sort
        # all of it, which a server never sees, and look faster than it is.
        size = spec["batch_size"]
        return [output for begin in range(0, len(sentences), size)
                for output in translate(sentences[begin:begin + size])]

    start = time.perf_counter()
    in_requests(sources)
    warmup_seconds = time.perf_counter() - start
    start = time.perf_counter()
    outputs = in_requests(sources)
    seconds = time.perf_counter() - start
    # Batch 1: one request per sentence, a warm-up pass, then each timed.
    single = sources[: spec["latency_sentences"]]
    single_outputs = [translate([sentence])[0] for sentence in single]
    latencies = []
    for sentence in single:
        start = time.perf_counter()
        translate([sentence])
        latencies.append(time.perf_counter() - start)
    pathlib.Path(spec["outputs"]).write_text(json.dumps(outputs), encoding="utf-8")
    return dict(info=info, sentences=len(sources), load_seconds=load_seconds,
                first_answer_seconds=first_answer_seconds, warmup_seconds=warmup_seconds,
                seconds=seconds, latencies=latencies,
                batch1_same_outputs=single_outputs == outputs[: len(single)],
                peak_rss_mib=peak_rss_mib())


# --- the parent --------------------------------------------------------------------------------


def summarize(systems, rounds, outputs, references):
    """Per system: BLEU, chrF, agreement with the reference, speed median and spread."""
    from keras_transformer.inference.evaluation import score_translations

    reference = outputs.get(REFERENCE)
    summary, signature = {}, None
    for name in systems:
        results = [r[name] for r in rounds if "error" not in r[name]]
        if not results or name not in outputs:
            errors = [r[name]["error"] for r in rounds if "error" in r[name]]
            summary[name] = {"error": errors[0] if errors else "no result"}
            continue
        score = score_translations(outputs[name], references)
        signature = score.bleu_signature
        speeds = [r["sentences"] / max(r["seconds"], 1e-9) for r in results]
        row = dict(bleu=score.bleu, chrf=score.chrf, sentences=results[0]["sentences"],
                   sentences_per_second=statistics.median(speeds),
                   min_sentences_per_second=min(speeds),
                   max_sentences_per_second=max(speeds),
                   warmup_seconds=statistics.median(r["warmup_seconds"] for r in results),
                   first_answer_seconds=statistics.median(r["first_answer_seconds"]
                                                          for r in results),
                   peak_rss_mib=max(r["peak_rss_mib"] for r in results),
                   batch1_same_outputs=all(r["batch1_same_outputs"] for r in results),
                   info=results[0]["info"], rounds=len(results),
                   same_outputs_every_round=all(o == outputs[name]
                                                for o in outputs.get(name + "@rounds", [])))
        if results[0]["latencies"]:
            for q in (50, 90):
                row[f"p{q}_ms"] = statistics.median(1000 * percentile(r["latencies"], q)
                                                    for r in results)
        if reference is not None:
            same = sum(a == b for a, b in zip(outputs[name], reference))
            row.update(identical=same / max(len(reference), 1), identical_count=same)
        summary[name] = row
    return summary, signature


def comparisons(summary):
    """Lines: int8 and bf16 against float32 on each path, the served graph against the search."""
    def ok(name):
        return name in summary and "error" not in summary[name]

    lines = []
    for float_name in ("translator", "saved-model", "ct2"):
        for variant in VARIANTS:
            variant_name = f"{float_name}-{variant}"
            if ok(float_name) and ok(variant_name):
                a, b = summary[float_name], summary[variant_name]
                lines.append(
                    f"{variant_name} vs {float_name}: BLEU {b['bleu'] - a['bleu']:+.2f}, "
                    f"speed {b['sentences_per_second'] / a['sentences_per_second']:.2f}x")
    for served, search in (("saved-model", "translator"), ("saved-model-xla", "translator"),
                           ("saved-model-int8", "translator-int8"),
                           ("saved-model-bf16", "translator-bf16")):
        if ok(served) and ok(search):
            ratio = summary[served]["sentences_per_second"] / \
                summary[search]["sentences_per_second"]
            line = f"{served} vs {search}: speed {ratio:.2f}x"
            if "p50_ms" in summary[served] and "p50_ms" in summary[search]:
                line += (f", batch-1 p50 {summary[served]['p50_ms']:.1f} vs "
                         f"{summary[search]['p50_ms']:.1f} ms")
            lines.append(line)
    for name in ("ct2", "ct2-int8"):
        if ok(name) and ok(REFERENCE):
            a, b = summary[REFERENCE], summary[name]
            lines.append(
                f"{name} vs {REFERENCE}: BLEU {b['bleu'] - a['bleu']:+.2f}, speed "
                f"{b['sentences_per_second'] / a['sentences_per_second']:.2f}x")
    return lines


def format_table(summary, settings, signature):
    options = settings["options"]
    lines = [f"{settings['split']}: {settings['sentences']} sentences, beam "
             f"{options['beam_size']}, alpha {options['alpha']} (CTranslate2: "
             + ("its finished hypotheses reranked by ours" if settings["length_penalty"] is None
                else f"its own length_penalty {settings['length_penalty']}")
             + f"), at most source + "
             f"{options['max_extra_length']} tokens, requests of {settings['batch_size']} "
             f"sentences in the split's order; "
             f"translator on {settings['backend']}; {settings['rounds']} round(s), each "
             f"system in its own process; threads: torch {settings['threads']}, "
             f"CTranslate2 {settings['ct2_threads']}",
             f"| system | BLEU | chrF | identical to translator | sentences/s, requests of "
             f"{settings['batch_size']} (median) | min-max | batch-1 p50 ms | batch-1 p90 ms | "
             "load to first answer s | warm-up s | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in summary.items():
        if "error" in row:
            lines.append(f"| {name} | failed: {row['error']} |" + " |" * 9)  # 11 columns
            continue
        identical = (f"{100 * row['identical']:.1f}% ({row['identical_count']})"
                     if "identical" in row else "-")
        latency = " | ".join(f"{row[k]:.1f}" if k in row else "-" for k in ("p50_ms", "p90_ms"))
        lines.append(f"| {name} | {row['bleu']:.2f} | {row['chrf']:.2f} | {identical} | "
                     f"{row['sentences_per_second']:.2f} | "
                     f"{row['min_sentences_per_second']:.2f}-"
                     f"{row['max_sentences_per_second']:.2f} | {latency} | "
                     f"{row['first_answer_seconds']:.1f} | {row['warmup_seconds']:.1f} | "
                     f"{row['peak_rss_mib']:.0f} |")
    differing = [name for name, row in summary.items()
                 if "error" not in row and not row["batch1_same_outputs"]]
    if differing:
        lines.append("batch-1 outputs differ from the batched ones: " + ", ".join(differing))
    lines += comparisons(summary)
    if signature:
        lines.append(f"BLEU signature: {signature}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(pathlib.Path(args.spec).read_text(encoding="utf-8"))
        if args.worker == "prepare":
            return child_main("preparing the exports", prepare, spec)
        return child_main(args.worker, run_system, args.worker, spec)

    data = pathlib.Path(args.data)
    source, target = data / f"{args.split}.en", data / f"{args.split}.de"
    for path in (source, target):
        if not path.is_file():
            raise SystemExit(f"compare_inference.py: error: {path} not found")
    references = read_lines(target)
    if len(read_lines(source)) != len(references):
        raise SystemExit(f"compare_inference.py: error: {source} and {target} differ in "
                         "length")
    references = references[: args.max_sentences]
    from keras_transformer.runs import RunError

    try:
        options = decoding_options(args)
    except RunError as error:
        raise SystemExit(f"compare_inference.py: error: {error}") from None
    threads = args.threads or usable_cores()
    systems = list(dict.fromkeys(args.systems))
    with tempfile.TemporaryDirectory(prefix="compare_inference_") as work:
        work = pathlib.Path(work)
        spec = dict(run=str(pathlib.Path(args.run).resolve()), weights=args.weights,
                    source=str(source.resolve()), max_sentences=args.max_sentences,
                    latency_sentences=args.latency_sentences,
                    xla_batch_sizes=args.xla_batch_sizes, xla_widths=args.xla_widths,
                    options=dict(beam_size=options.beam_size, alpha=options.alpha,
                                 max_extra_length=options.max_extra_length),
                    length_penalty=args.length_penalty,
                    batch_size=args.batch_size, threads=threads,
                    ct2_threads=args.ct2_threads or threads, systems=systems,
                    export_dir=str(pathlib.Path(args.export_dir or work / "exports")
                                   .resolve()))
        spec_file = work / "spec.json"
        spec_file.write_text(json.dumps(spec), encoding="utf-8")
        if any(SYSTEMS[name][0] != "translator" for name in systems):
            print("preparing the exports ...", flush=True)
            prepared = run_child(["--run", "-", "--data", "-", "--worker", "prepare",
                                  "--spec", str(spec_file)],
                                 child_environment("tensorflow"), args.timeout, script=SCRIPT)
            if "error" in prepared:
                raise SystemExit(f"compare_inference.py: error: {prepared['error']}")
            spec["paths"] = prepared["paths"]
        rounds, outputs = [], {}
        for index in range(args.rounds):
            results = {}
            for name in rotated(systems, index):
                if args.wait_for_quiet > 0:
                    wait_for_quiet(args.wait_for_quiet)
                worker_spec = dict(spec, outputs=str(work / f"{name}-{index}.json"))
                (work / f"{name}-spec.json").write_text(json.dumps(worker_spec),
                                                        encoding="utf-8")
                backend = args.backend if SYSTEMS[name][0] == "translator" else None
                result = run_child(["--run", "-", "--data", "-", "--worker", name, "--spec",
                                    str(work / f"{name}-spec.json")],
                                   child_environment(backend), args.timeout, script=SCRIPT)
                results[name] = result
                if "error" in result:
                    print(f"round {index + 1}/{args.rounds} {name}: failed: {result['error']}",
                          flush=True)
                    continue
                texts = json.loads(pathlib.Path(worker_spec["outputs"]).read_text(
                    encoding="utf-8"))
                if name in outputs:
                    outputs.setdefault(name + "@rounds", []).append(texts)
                else:
                    outputs[name] = texts
                p50 = (f", batch-1 p50 {1000 * percentile(result['latencies'], 50):.1f} ms"
                       if result["latencies"] else "")
                print(f"round {index + 1}/{args.rounds} {name}: "
                      f"{result['sentences'] / result['seconds']:.2f} sentences/s{p50} "
                      f"(load {result['load_seconds']:.1f} s, first answer "
                      f"{result['first_answer_seconds']:.1f} s, warm-up "
                      f"{result['warmup_seconds']:.1f} s, peak RSS "
                      f"{result['peak_rss_mib']:.0f} MiB)", flush=True)
            rounds.append(results)
    summary, signature = summarize(systems, rounds, outputs, references)
    settings = dict(split=args.split, sentences=len(references), options=spec["options"],
                    length_penalty=spec["length_penalty"], batch_size=args.batch_size,
                    backend=args.backend, rounds=args.rounds, threads=threads,
                    ct2_threads=spec["ct2_threads"])
    print()
    print(format_table(summary, settings, signature))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            dict(settings=settings, systems=summary, comparisons=comparisons(summary),
                 bleu_signature=signature, rounds=rounds), indent=2) + "\n",
            encoding="utf-8")
    return 0 if all("error" not in row for row in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
