"""keras_vit.train.few_shot: its counts and regularisation are
bounded."""

import numpy as np
import pytest

from testkit import bad_calls_test
from testkit import tiny as _tiny
from keras_vit import train as kt


def test_fewshot_num_seeds_is_bounded():
    from keras_vit import train as kt

    with pytest.raises(ValueError, match="num_seeds=0"):
        kt.fewshot(_tiny(), "digits:train", "digits:test", num_seeds=0)
    with pytest.raises(ValueError, match=r"\[1, 1000\]; received "
                                         r"num_seeds=10000"):
        kt.fewshot(_tiny(), "digits:train", "digits:test", num_seeds=10000)


# Bad arguments to the few-shot fit, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("fewshot l2_reg", lambda: kt.fit_least_squares(
        np.zeros((4, 2)), np.zeros(4, int), 2, l2_reg=-1.0), "l2_reg",
     "-1.0", None),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
