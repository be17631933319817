"""Checkpoint averaging (section 6.1): the mean of a run's last checkpoints.

`keras-transformer average` and the job's `final_weights = "averaged"`
(`keras_transformer.training.job.finalize_weights`) use it.
"""

import io
import os
import pathlib

import numpy as np

from keras_transformer.files import write_bytes


def average_checkpoints(paths, output_path):
    """Averages the model weights of several `.weights.h5` checkpoints.

    Every floating-point weight outside the optimizer is replaced by its
    arithmetic mean over `paths`; everything else (optimizer state, integer
    variables) is copied from the last checkpoint. The result loads with
    `model.load_weights(output_path)` into the model that wrote the inputs
    (section 6.1: the base models average the last 5 checkpoints).

    Args:
        paths: checkpoint files written by `model.save_weights`.
        output_path: where to write the averaged weights (`*.weights.h5`).

    Returns:
        `output_path`.
    """
    import h5py

    paths = [str(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path")
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"checkpoint not found: {path}")
    if not str(output_path).endswith(".weights.h5"):
        raise ValueError(f"output_path must end with .weights.h5, received {output_path}")

    def datasets(handle):
        names = []
        handle.visititems(lambda name, obj: names.append(name)
                          if isinstance(obj, h5py.Dataset) else None)
        return names

    sources = [h5py.File(p, "r") for p in paths]
    try:
        reference = sources[-1]
        names = datasets(reference)
        for path, source in zip(paths, sources):
            if sorted(datasets(source)) != sorted(names):
                raise ValueError(
                    f"checkpoint {path} does not hold the same variables as {paths[-1]}"
                )
        # Built in memory, then written with plain file I/O (see
        # `files.weights_bytes`: HDF5 meeting a full disk crashes the process).
        buffer = io.BytesIO(pathlib.Path(paths[-1]).read_bytes())
        with h5py.File(buffer, "r+") as out:
            for name in names:
                data = reference[name]
                if name.split("/")[0] == "optimizer" or not np.issubdtype(data.dtype,
                                                                            np.floating):
                    continue
                stacked = np.stack([np.asarray(s[name], dtype="float64") for s in sources])
                out[name][...] = stacked.mean(axis=0).astype(data.dtype)
        write_bytes(output_path, buffer.getvalue(), what=f"writing the averaged weights "
                    f"{output_path}")
    finally:
        for source in sources:
            source.close()
    return output_path
