"""Every public function of the package's front doors checks its argument:
a value of the wrong type stops the call with the package's error (a
ValueError, TypeError or OSError) naming the argument, never an
AttributeError from deep inside or a message that does not say which
argument was wrong.

The functions are found, not listed: each public name of keras_vit,
keras_vit.models, .zoo, .export, .train and .analysis whose signature has
exactly one required argument is called with hostile values of it."""

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import keras_vit
from keras_vit import analysis, export, models, train, zoo

MODULES = {"keras_vit": keras_vit, "keras_vit.models": models,
           "keras_vit.zoo": zoo, "keras_vit.export": export,
           "keras_vit.train": train, "keras_vit.analysis": analysis}


class Hostile:
    """An object no function of the package takes."""

    def __repr__(self):
        return "<hostile>"


def _one_argument_functions():
    found = []
    for module_name, module in MODULES.items():
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.ismodule(obj) or not callable(
                    obj):
                continue
            params = [p for p in inspect.signature(obj).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY,
                                    p.POSITIONAL_OR_KEYWORD)
                      and p.default is p.empty]
            if len(params) == 1:
                found.append(pytest.param(obj, params[0].name,
                                          id=f"{module_name}.{name}"))
    return found


FUNCTIONS = _one_argument_functions()
# Parameters whose errors name them as the user knows them elsewhere (the
# command line's MODEL and --data, the strategy's cpu_devices).
NAMED_AS = {"spec": ("model=", "data="), "count": ("cpu_devices=",)}
HOSTILE = st.one_of(st.builds(Hostile), st.none(), st.integers(-3, 3),
                    st.lists(st.text(max_size=3), min_size=1, max_size=2),
                    st.dictionaries(st.text(max_size=2), st.integers(),
                                    max_size=1))


def test_the_front_doors_have_functions_to_check():
    names = {p.id for p in FUNCTIONS}
    assert {"keras_vit.train.compile_for_finetune",
            "keras_vit.models.feature_model",
            "keras_vit.export.read_label_names"} <= names, names


@pytest.mark.parametrize("function, argument", FUNCTIONS)
@settings(max_examples=12, deadline=None)
@given(value=HOSTILE)
def test_a_hostile_argument_is_refused_naming_it(function, argument, value):
    if function.__name__ == "configure_cpu_devices" and isinstance(
            value, int) and value > 0:
        return  # a valid count would split this process's CPU devices
    try:
        function(value)
    except (ValueError, TypeError, OSError) as e:
        names = (argument, *NAMED_AS.get(argument, ()))
        assert any(n in str(e) for n in names), (
            f"{function.__name__}({value!r}) raised {type(e).__name__} "
            f"without naming {argument!r}: {e}")
    # Some values are valid (an int image size, a list of names): taking
    # them is right; anything else than the three kinds above fails here.
