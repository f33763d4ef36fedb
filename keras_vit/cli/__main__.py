"""``python -m keras_vit.cli``: the ``keras-vit`` command."""

import sys

from keras_vit.cli import console_main

if __name__ == "__main__":
    sys.exit(console_main())
