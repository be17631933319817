"""Scoring translations with sacreBLEU: a test file, or a finished run's weights.

About comparing with the paper: its 27.3 (base) and 28.4 (big) BLEU on
newstest2014 English-German are *tokenized* BLEU, computed after Moses
tokenization and with compounds split at hyphens ("##AT##-##AT##"), as
tensor2tensor's `get_ende_bleu.sh` does. sacreBLEU scores the detokenized
output with its own fixed tokenization (`13a`) and does not reproduce that:
tensor2tensor's released base model scores about 27.5 sacreBLEU against 29.0
tokenized BLEU. `evaluate_bleu` reports sacreBLEU (with its signature), which
is what recent papers report and what can be compared across systems.
Beside it, `bleu_lowercase` is the same BLEU on lowercased text (sacreBLEU
`--lowercase`, tokenization 13a): the footing of papers that report
lowercased BLEU (many Multi30k results do), labelled by its own signature.
"""

import dataclasses
import itertools
import logging
import pathlib
import time

logger = logging.getLogger("keras_transformer")


@dataclasses.dataclass
class BleuResult:
    """sacreBLEU scores of a translated test set.

    Attributes:
        bleu: corpus BLEU (0-100) on detokenized text, sacreBLEU defaults.
        chrf: corpus chrF2 (0-100).
        bleu_signature: sacreBLEU's signature of the BLEU setting, e.g.
            `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`.
        chrf_signature: the same for chrF.
        num_sentences: number of scored sentences.
        hypotheses: the translations, in file order.
        bleu_lowercase: the BLEU of lowercased hypotheses and references
            (sacreBLEU `--lowercase`, tokenization 13a).
        bleu_lowercase_signature: its signature (`case:lc`).
    """

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    num_sentences: int
    hypotheses: list
    bleu_lowercase: float = None
    bleu_lowercase_signature: str = None

    def __str__(self):
        text = (f"BLEU = {self.bleu:.2f} ({self.bleu_signature})\n"
                f"chrF2 = {self.chrf:.2f} ({self.chrf_signature})")
        if self.bleu_lowercase is not None:
            text += (f"\nBLEU, lowercased = {self.bleu_lowercase:.2f} "
                     f"({self.bleu_lowercase_signature})")
        return text


def read_lines(path):
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    with open(path, encoding="utf-8", newline="") as f:
        return [line.rstrip("\r\n") for line in f]


def score_translations(hypotheses, references):
    """sacreBLEU BLEU and chrF of detokenized hypotheses against one reference each.

    Args:
        hypotheses: list of translated strings.
        references: list of reference strings, aligned with `hypotheses`.

    Returns:
        A `BleuResult`.
    """
    from sacrebleu.metrics import BLEU, CHRF

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references"
        )
    bleu, chrf, lowercase = BLEU(), CHRF(), BLEU(lowercase=True)
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    lowercase_score = lowercase.corpus_score(hypotheses, [references])
    return BleuResult(
        bleu=float(bleu_score.score),
        chrf=float(chrf_score.score),
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        num_sentences=len(hypotheses),
        hypotheses=hypotheses,
        bleu_lowercase=float(lowercase_score.score),
        bleu_lowercase_signature=str(lowercase.get_signature()),
    )


def evaluate_bleu(translator, source_file, reference_file, *, beam_size=None, alpha=None,
                  max_sentences=None, output_file=None, progress=False, verbose=True):
    """Translates a source file and scores it with sacreBLEU (BLEU and chrF).

    The scores are computed on detokenized output with sacreBLEU's defaults
    (13a tokenization, mixed case), and the signature is printed so that the
    number can be compared with published sacreBLEU scores. They are not the
    paper's tokenized, compound-split BLEU (27.3 for the base model on
    newstest2014): see the module docstring.

    Args:
        translator: a `Translator` (or any object with
            `translate(list_of_str, beam_size=..., alpha=..., progress=...)`).
        source_file: plain text, one source sentence per line (e.g.
            `wmt14_newstest/test.en`).
        reference_file: the aligned references (e.g. `test.de`).
        beam_size: beam width (default: the translator's options, the
            paper's 4).
        alpha: length penalty (default: the translator's, the paper's 0.6).
        max_sentences: score only the first this many lines.
        output_file: write the translations there, one per line.
        progress: show a progress bar while translating.
        verbose: print the scores and sacreBLEU's signatures.

    Returns:
        A `BleuResult` with `bleu`, `chrf`, the signatures and the hypotheses.

    Example:

    >>> result = evaluate_bleu(translator, "wmt14_newstest/test.en",
    ...                        "wmt14_newstest/test.de")
    BLEU = 27.12 (nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0)
    chrF2 = 56.80 (nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0)
    >>> result.bleu
    27.12
    """
    sources = read_lines(source_file)
    references = read_lines(reference_file)
    if len(sources) != len(references):
        raise ValueError(
            f"{source_file} has {len(sources)} lines but {reference_file} has "
            f"{len(references)}; they must be aligned line by line"
        )
    if max_sentences is not None:
        sources, references = sources[:max_sentences], references[:max_sentences]
    hypotheses = translator.translate(sources, beam_size=beam_size, alpha=alpha,
                                      progress=progress)
    if output_file is not None:
        output_file = pathlib.Path(output_file)
        output_file.parent.mkdir(parents=True, exist_ok=True)
        output_file.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    result = score_translations(hypotheses, references)
    if verbose:
        print(result)
    return result



def evaluate_run(run_dir, corpus_dir, *, splits=("test",), weights=("final",),
                 beam_sizes=None, alpha=None, quantize=None, max_sentences=None,
                 verbose=True):
    """Scores a run's weights on test splits with sacreBLEU.

    Loads the model and tokenizer of `run_dir` (`loading.load_run`), then for
    every weights name, beam size and split translates
    `<corpus_dir>/<split>.en` and scores it against `<split>.de`.

    Args:
        run_dir: a training run folder, e.g. `runs/multi30k_small`.
        corpus_dir: folder with `<split>.en` / `<split>.de` files.
        splits: file stems, e.g. `("test", "test_2017_flickr")`.
        weights: names understood by `loading.resolve_weights` (`"final"`,
            `"averaged"`, `"best"`, `"last"`, `"ckpt-2000"`, or paths).
        beam_sizes: a sequence of beam sizes, 1 is greedy decoding; default
            the run's (`loading.run_decoding`: its `settings.json`, else the
            paper's 4).
        alpha: length penalty of beam search (default the run's, else the
            paper's 0.6), or a sequence of them: one row per value (tuning
            on a validation split). The length limit is always the run's
            `max_extra_length` (else the paper's 50).
        quantize: `"int8"` scores a quantized copy of each weights
            (`keras_transformer.model.transformer.quantized`).
        max_sentences: score only the first lines of each split.
        verbose: log each row as it is measured.

    Returns:
        A list of dicts with `weights`, `beam_size`, `alpha`, `split`, `bleu`,
        `chrf`, `bleu_lowercase`, `num_sentences`, `seconds`, the signatures
        (`bleu_signature`, `bleu_lowercase_signature`) and
        `chrf_signature`.
    """
    from keras_transformer.inference import loading
    from keras_transformer.model.config import DecodingOptions
    from keras_transformer.model.transformer import quantized
    from keras_transformer.inference.translator import Translator

    run_dir, corpus_dir = pathlib.Path(run_dir), pathlib.Path(corpus_dir)
    loading.check_run(run_dir)
    files = {}
    for split in splits:
        source, reference = corpus_dir / f"{split}.en", corpus_dir / f"{split}.de"
        if not (source.exists() and reference.exists()):
            raise FileNotFoundError(f"split {split!r} needs {source} and {reference}")
        files[split] = (source, reference)
    alphas = (None if alpha is None else [float(a) for a in alpha]
              if isinstance(alpha, (list, tuple)) else [float(alpha)])
    # What is not given is the run's settings.json, else the paper's.
    decoding = loading.run_decoding(
        run_dir, beam_size=None if beam_sizes is None else list(beam_sizes), alpha=alphas,
        labels={"beam_size": "--beam-sizes"})
    values = {name: value if isinstance(value, list) else [value]
              for name, value in decoding.values.items()}
    beam_sizes, alphas = values["beam_size"], values["alpha"]
    options = DecodingOptions(max_extra_length=decoding.values["max_extra_length"])
    weight_paths = {name: loading.resolve_weights(run_dir, name) for name in weights}
    model, tokenizer = loading.load_run(run_dir)
    if verbose:  # once the run has loaded: a damaged run's error is the only line
        logger.info(f"decoding: {decoding.describe()}")
    final = [w.numpy() if hasattr(w, "numpy") else w for w in model.get_weights()]
    rows = []
    for name, path in weight_paths.items():
        if path is None:
            model.set_weights(final)
        else:
            loading.load_model_weights(model, path)
        translator = Translator(quantized(model, quantize) if quantize else model, tokenizer,
                                options)
        for beam_size, alpha_, (split, (source, reference)) in itertools.product(
                beam_sizes, alphas, files.items()):
            start = time.time()
            result = evaluate_bleu(translator, source, reference, beam_size=beam_size,
                                   alpha=alpha_, max_sentences=max_sentences, verbose=False)
            row = dict(weights=name, beam_size=beam_size, alpha=alpha_, split=split,
                       quantize=quantize, bleu=result.bleu, chrf=result.chrf,
                       num_sentences=result.num_sentences, seconds=time.time() - start,
                       bleu_signature=result.bleu_signature,
                       chrf_signature=result.chrf_signature,
                       bleu_lowercase=getattr(result, "bleu_lowercase", None),
                       bleu_lowercase_signature=getattr(
                           result, "bleu_lowercase_signature", None))
            rows.append(row)
            if verbose:
                logger.info(f"{name:>10s}  beam {beam_size}  alpha {alpha_:g}  {split:18s} "
                            f"BLEU {row['bleu']:6.2f}  chrF {row['chrf']:6.2f}  "
                            f"({row['num_sentences']} sentences, {row['seconds']:.0f} s)")
    return rows
