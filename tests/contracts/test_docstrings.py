"""Every example in the package's docstrings runs, so none can drift from
the code. The modules are discovered, not listed: a new module's examples
run without anyone adding it here."""

import doctest
import importlib
import pkgutil

import pytest

import keras_vit

# Modules whose examples run elsewhere or not at all, with the reason.
NOT_HERE = {
    # An entry point: importing it would run the command line.
    "keras_vit.train.__main__": "entry point",
}


# Modules that must hold at least this many examples (they document their
# functions example by example).
MIN_EXAMPLES = {"keras_vit.train.mpp": 7, "keras_vit.train.mpp.objective": 6,
                "keras_vit.train.mpp.model": 6, "keras_vit.train.vtab": 6}


def _modules():
    names = ["keras_vit"]
    for info in pkgutil.walk_packages(keras_vit.__path__, "keras_vit."):
        names.append(info.name)
    for sub in ("keras_vit.zoo", "keras_vit.export"):
        package = importlib.import_module(sub)
        names.append(sub)
        names += [info.name for info in
                  pkgutil.walk_packages(package.__path__, sub + ".")]
    return sorted(set(names) - set(NOT_HERE))


def _has_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    return any(test.examples for test in finder.find(module))


MODULES = [name for name in _modules() if _has_examples(name)]

# Modules whose examples also run on jax and torch (marked `backends`): the
# backend-specific code (engines, strategies, checkpoints, GELU, inference)
# and the jobs' helpers, a few seconds in all. The other examples stay on
# TensorFlow only:
# - keras_vit.models.compiled shows XLA's compiled predict and its batch
#   sizes, which torch has no equivalent of;
# - keras_vit.export.* convert through TensorFlow whatever the backend and
#   cost minutes per backend (tests/export/test_export_backends.py exports from
#   jax and torch);
# - the rest passed on torch when run by hand (2026-11-23) but build
#   models, train or read data, which the `backends` tests of test_vit,
#   test_analysis, test_trainer_backends, test_train and test_vtab already
#   do per backend: re-running them (keras_vit.analysis.attention alone
#   takes 35 s on jax here) would slow the backends run for no new path.
ON_EVERY_BACKEND = {
    "keras_vit.runtime.backend", "keras_vit.layers.attention",
    "keras_vit.layers.dense", "keras_vit.layers.embeddings",
    "keras_vit.analysis.embeddings",
    "keras_vit.train.checkpoints", "keras_vit.train.callbacks",
    "keras_vit.train.recipes", "keras_vit.train.distribute",
    "keras_vit.train.vtab",
}


def test_examples_are_found_in_every_part_of_the_package():
    # The discovery itself: the models, zoo, export, training and analysis
    # all hold examples; an empty list would make the test below vacuous.
    for part in ("keras_vit.models.", "keras_vit.zoo.", "keras_vit.export.",
                 "keras_vit.train.", "keras_vit.analysis."):
        assert any(name.startswith(part) for name in MODULES), part
    assert set(MIN_EXAMPLES) <= set(MODULES)
    assert ON_EVERY_BACKEND <= set(MODULES)


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.backends)
    if name in ON_EVERY_BACKEND else name for name in MODULES])
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted >= MIN_EXAMPLES.get(name, 1)
