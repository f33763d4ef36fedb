"""Every row of the family's option table (:mod:`keras_vit.base.options`)
holds for the model: it is a builder argument with the row's default, the
row's check refuses what the builder refuses (one line naming the
argument and value), and its ``parameters`` column says truly whether the
option changes the model's weights, which the count without a model
(:func:`keras_vit.base.geometry.parameter_count`) then matches.

An option added as a row without an example here fails
``test_every_row_has_an_example``: the example is how the row is proven."""

import inspect

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import keras_vit
from keras_vit.base import geometry, options
from keras_vit.models.encoder import FAMILY_DEFAULTS
from keras_vit.models.vit import VisionTransformer
from testkit import OPTION_EXAMPLES as EXAMPLES

TINY = dict(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
            num_heads=2, mlp_dim=16, num_classes=3)
def test_every_row_has_an_example():
    assert set(EXAMPLES) == set(options.ROWS)


def test_rows_are_the_builders_arguments_and_defaults():
    signature = inspect.signature(VisionTransformer.__init__).parameters
    assert FAMILY_DEFAULTS == options.DEFAULTS
    for row in options.OPTIONS:
        assert signature[row.name].default == row.default, row.name
        assert row.check(row.name, row.default) == row.default, row.name
        assert row.about, row.name


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_rows_parameter_column_is_true(name):
    value, needs = EXAMPLES[name]
    base = dict(TINY, **needs)
    plain = keras_vit.vit(**base)
    changed = keras_vit.vit(**dict(base, **{name: value}))
    assert changed.get_config()[name] == value
    weights = [{(w.path, tuple(w.shape)) for w in m.weights}
               for m in (plain, changed)]
    assert (weights[0] != weights[1]) == options.ROWS[name].parameters, name
    for model in (plain, changed):
        assert geometry.parameter_count(model.get_config()) == (
            model.count_params()), name


@settings(max_examples=25, deadline=None)
@given(chosen=st.sets(st.sampled_from(sorted(EXAMPLES)), max_size=6),
       classifier=st.sampled_from(["token", "gap", "map"]),
       representation_size=st.sampled_from([None, 6]))
def test_the_rows_count_any_mix_of_options_as_the_model_does(
        chosen, classifier, representation_size):
    """Each row counts its own parameters; together they count any mix of
    options (and poolings) as the built model holds them."""
    from hypothesis import assume

    kwargs = dict(TINY, classifier=classifier,
                  representation_size=representation_size)
    for name in chosen:
        kwargs[name] = EXAMPLES[name][0]
    try:
        model = keras_vit.vit(**kwargs)
    except ValueError:  # a mix the checks between options refuse
        assume(False)
    assert geometry.parameter_count(model.get_config()) == (
        model.count_params()), sorted(chosen)


@pytest.mark.parametrize("name", sorted(
    o.name for o in options.OPTIONS if o.weights))
def test_the_weights_an_option_adds_are_those_its_row_names(name):
    """A row's :class:`~keras_vit.base.options.Weight` paths (which the
    timm and official layouts read and write) are where the model puts
    the layers the option adds, each of them."""
    import re

    value, needs = EXAMPLES[name]
    base = dict(TINY, **needs)
    # A choice's values may add different layers (a table per block or
    # one shared): every value the row takes, together.
    row = options.ROWS[name]
    values = [v for v in getattr(row.check, "choices", [value])
              if v != row.default]
    before = {w.path for w in keras_vit.vit(**base).weights}
    added = set().union(*({w.path for w in keras_vit.vit(
        **dict(base, **{name: v})).weights} - before for v in values))
    # Each numbered field ({i}: the block, {b}: a branch) a number.
    patterns = [re.sub(r"\\\{\w+\\\}", r"\\d+", re.escape(w.path))
                + r"(/|$)" for w in options.ROWS[name].weights]
    assert added, name
    for path in added:
        assert any(re.match(p, path) for p in patterns), (name, path)
    for pattern in patterns:
        assert any(re.match(pattern, path) for path in added), pattern


# Values no row takes: the wrong type for flags and choices, out of range
# for counts and rates.
_HOSTILE = st.one_of(st.none(), st.integers(-10, 10), st.floats(-2, 2),
                     st.text(max_size=6), st.lists(st.booleans(),
                                                   max_size=2))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(options.ROWS)), value=_HOSTILE)
def test_a_value_the_row_refuses_the_builder_refuses_by_name(name, value):
    row = options.ROWS[name]
    try:
        expected = row.check(name, value)
    except ValueError as e:
        message = str(e)
        assert "\n" not in message and f"{name}=" in message, message
        value_needs = EXAMPLES[name][1]
        with pytest.raises(ValueError) as built:
            keras_vit.vit(**dict(TINY, **value_needs, **{name: value}))
        assert f"{name}=" in str(built.value)
    else:
        # Accepted values are the row's own type: bool flags stay bools.
        if isinstance(row.default, bool):
            assert expected is value


def test_the_models_guide_tabulates_every_row():
    """docs/guides/models.md's table of the family's options names each
    row (the builder's docstring lists them from the table itself)."""
    import os

    guide = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir,
                         "docs", "guides", "models.md")
    with open(guide, encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("| `")]
    for name in options.ROWS:
        assert any(f"`{name}`" in row for row in rows), name
    assert "{family_options}" not in keras_vit.vit.__doc__
    assert all(f"``{name}``" in keras_vit.vit.__doc__
               for name in options.ROWS)


@pytest.mark.parametrize("library", ["timm", "transformers", "keras_hub"])
def test_each_rows_library_field_round_trips(library):
    """A row's field in timm's arguments, transformers' or keras-hub's
    config writes the example and reads it back as the builder takes it;
    a class whose config lacks the field keeps the row's default."""
    rows = [row for row in options.OPTIONS
            if getattr(row, library) is not None]
    assert rows, library
    for row in rows:
        field = getattr(row, library).name
        value = row.check(row.name, EXAMPLES[row.name][0])
        theirs = options.write_fields(library, {row.name: value}, (field,))
        assert list(theirs) == [field], row.name
        assert options.read_fields(library, theirs, (field,))[row.name] == (
            value), row.name
        assert options.read_fields(library, theirs, ())[row.name] == (
            row.default), row.name


@pytest.mark.parametrize("kwargs, named, other", [
    (dict(rope_grid=[3, 5]), "rope_grid=[3, 5] needs rope='eva02'",
     "rope=None"),
    (dict(merge_width=8), "merge_width=8 needs a patch merger",
     "merge_size=0"),
    (dict(differential="dual", rope="dinov3"),
     "differential='dual' needs rope=None", "rope='dinov3'"),
    (dict(parallel="split", post_norm=True),
     "parallel='split' needs pre-norm blocks", "post_norm=True"),
    (dict(window_size=2), "window_size=2 needs the patches alone",
     "class_token=True"),
    (dict(global_blocks=[0]), "global_blocks=[0] needs windows",
     "window_size=0"),
    (dict(decomposed_bias=True, class_token=False, classifier="gap",
          rope="dinov3"), "decomposed_bias=True needs rope=None",
     "rope='dinov3'"),
    (dict(neck=4, class_token=False, classifier="gap", merge_size=2),
     "neck=4 needs no patch merger", "merge_size=2"),
    (dict(relative_mlp="shared", relative_bias="block"),
     "relative_mlp='shared' needs relative_bias=None", "relative_bias='block'"),
    (dict(relative_mlp_width=64), "relative_mlp_width=64 needs a relative "
     "position MLP", "relative_mlp=None"),
    # A set value that is falsy is held to the row's needs too.
    (dict(mlp_bias=False, parallel="fused"),
     "mlp_bias=False needs parallel=None", "parallel='fused'")])
def test_a_rows_needs_of_the_others_are_one_line_naming_both(kwargs, named,
                                                             other):
    """A row's ``requires`` (what it needs of the other rows) refuses a
    mix in one line naming the row's value and the other's."""
    with pytest.raises(ValueError) as refused:
        keras_vit.vit(**dict(TINY, **kwargs))
    message = str(refused.value)
    assert named in message and "\n" not in message, message
    assert message.endswith(f"received {other}"), message
