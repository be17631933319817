"""Validation during `fit`: the loss and greedy BLEU on a fixed sample, the best weights.

`RunGuard` (`keras_transformer.training.guard`) calls `Validator.validate`
every `validate_every` updates; a better BLEU than any before writes
`best.weights.h5` and `best.json`.
"""

import time

from keras_transformer import runs
from keras_transformer.training.strategy import is_chief


class Validator:
    """Validation loss and greedy BLEU every `every` updates; keeps the best weights.

    Args:
        run: the `runs.RunFolder` (`best.weights.h5`, `best.json`).
        writer: the `WeightWriter`.
        every: updates between validations.
        dataset: the validation `tf.data.Dataset` (for the loss), or None.
        translator: a `Translator` over the training model, or None.
        sources, references: the fixed validation sample for BLEU.
    """

    def __init__(self, run, writer, *, every, dataset=None, translator=None, sources=(),
                 references=()):
        self.run, self.writer, self.every = run, writer, every
        self.dataset, self.translator = dataset, translator
        self.sources, self.references = list(sources), list(references)
        best = run.read_best() or {}
        self.best_bleu = best.get("bleu")
        self.chief = is_chief()

    def due(self, update):
        return bool(self.every) and update % self.every == 0

    def validate(self, model, update):
        """Returns `val_loss`, `val_<metric>`, `val_bleu` (as measured) and `val_seconds`.

        Resets the model's metrics after the loss: `evaluate` accumulates into
        the metrics that `fit` reports as training means (`TrainingLog`
        starts its means afresh when `val_loss` is among the values).
        """
        from keras_transformer.inference.evaluation import score_translations

        start = time.perf_counter()
        values = {}
        if self.dataset is not None:
            metrics = model.evaluate(self.dataset, verbose=0, return_dict=True)
            model.reset_metrics()
            values["val_loss"] = float(metrics["loss"])
            for name, value in metrics.items():
                if name != "loss":
                    values[f"val_{name}"] = float(value)
        if self.translator is not None and self.sources and self.chief:
            hypotheses = self.translator.translate(self.sources, beam_size=1)
            bleu = float(score_translations(hypotheses, self.references).bleu)
            values["val_bleu"] = bleu
            if self.best_bleu is None or bleu > self.best_bleu:
                self.best_bleu = bleu
                # The model's weights only: nothing resumes from them.
                self.writer.save(model, self.run / runs.BEST_FILE, optimizer=False,
                                 what=f"writing the best weights ({runs.BEST_FILE})")
                self.run.write_json(runs.BEST_INFO_FILE, dict(update=update, bleu=bleu))
        values["val_seconds"] = time.perf_counter() - start
        return values
