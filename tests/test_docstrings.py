"""Examples in docstrings are run, so they cannot drift from the code."""

import doctest
import importlib

import pytest

MODULES = ["keras_vit", "keras_vit.models.vit", "keras_vit.models.variants",
           "keras_vit.models.features",
           "keras_vit.zoo", "keras_vit.zoo.api", "keras_vit.zoo.registry",
           "keras_vit.errors", "keras_vit.zoo.lazy_npz",
           "keras_vit.atomic", "keras_vit._quiet", "keras_vit.zoo.timm_hub",
           "keras_vit.zoo.preprocessing", "keras_vit.hardware",
           "keras_vit.models.compiled", "keras_vit.backend"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0, f"{name} has no example"
