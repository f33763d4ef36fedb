"""keras_vit.models.features: feature_model refuses what it does not
offer, naming it."""

from testkit import cached_tiny_vit as _tiny_model
from testkit import bad_calls_test
import keras_vit


# Bad arguments to feature_model, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("feature_model outputs", lambda: keras_vit.models.feature_model(
        _tiny_model(), "tokns"), "outputs", "'tokns'", "tokens"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
