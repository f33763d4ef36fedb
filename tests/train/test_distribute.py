"""keras_vit.train.distribute: the strategy and the CPU device count are
checked before TensorFlow starts."""

import time

import pytest

from testkit import bad_calls_test
from testkit import one_error_line as _one_error_line
from keras_vit import train as kt


def test_cpu_devices_are_bounded(capsys):
    from keras_vit import train as kt
    from keras_vit.cli import train as train_cli

    start = time.monotonic()
    assert train_cli.main(["fine-tune", "ViT-Ti/16", "--data", "digits",
                           "--cpu-devices", "100000"]) == 2
    assert ("--cpu-devices must be an integer in [1, 64]; received "
            "--cpu-devices=100000") in _one_error_line(capsys)
    with pytest.raises(kt.StrategyError, match="cpu_devices=100000"):
        kt.configure_cpu_devices(100000)
    assert time.monotonic() - start < 10


# Bad arguments to strategy, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("strategy", lambda: kt.strategy("mirored"), "strategy", "'mirored'",
     "mirrored"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
