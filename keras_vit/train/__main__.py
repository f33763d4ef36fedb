"""``python -m keras_vit.train fine-tune|evaluate|fewshot ...``"""

import sys

from keras_vit.cli import options as cli_options
from keras_vit.cli.train import main

if __name__ == "__main__":
    sys.exit(cli_options.start(main))
