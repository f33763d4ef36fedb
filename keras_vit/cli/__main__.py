"""``python -m keras_vit.cli``: the ``keras-vit`` command."""

import sys

from keras_vit.cli import console_main

sys.exit(console_main())
