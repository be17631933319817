"""`python -m keras_transformer ...` is the `keras-transformer` command."""

import sys

from keras_transformer.commands import main

if __name__ == "__main__":
    sys.exit(main())
