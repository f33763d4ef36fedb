"""``python -m keras_vit.train fine-tune|evaluate|fewshot ...``"""

import os
import sys

# Quiet TensorFlow's C++ start-up logs unless the user chose otherwise.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_vit.train.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
