"""Class names travel with the model: ``label_names`` is a constructor
argument of every model class, kept in its config, so ``.keras`` files and
``rebuild`` carry it, and a head of another size drops it."""

import numpy as np
import pytest

import keras_vit
from keras_vit.models import axial_vit, resnet_v2, vit

TINY = dict(image_size=32, patch_size=16, hidden_size=32, num_layers=1,
            num_heads=2, mlp_dim=64)
BUILDERS = {
    "vit": lambda **kw: vit(num_classes=3, **TINY, **kw),
    "axial": lambda **kw: axial_vit(num_classes=3, **TINY, **kw),
    "bit": lambda **kw: resnet_v2(32, (1, 1, 1, 1), 1, num_classes=3, **kw),
}
NAMES = ["cat", "dog", "bird"]


@pytest.mark.parametrize("family", BUILDERS)
def test_label_names_survive_config_keras_file_and_rebuild(family, tmp_path):
    import keras

    model = BUILDERS[family](label_names=NAMES)
    assert model.label_names == tuple(NAMES)
    assert model.get_config()["label_names"] == NAMES
    path = tmp_path / "m.keras"
    model.save(path)
    assert keras.saving.load_model(path).label_names == tuple(NAMES)
    assert keras_vit.rebuild(model).label_names == tuple(NAMES)
    if family != "bit":  # BiT's input size is free; the ViTs' is rebuilt
        assert keras_vit.rebuild(model, image_size=48).label_names == tuple(
            NAMES)
    # Another head: other classes, whose names the old ones are not.
    assert keras_vit.rebuild(model, num_classes=5).label_names is None
    renamed = keras_vit.rebuild(model, num_classes=2, label_names=["a", "b"])
    assert renamed.label_names == ("a", "b")


@pytest.mark.parametrize("bad,message", [
    (["cat"], "must name each of the 3 classes"),
    (["cat", "dog", "cat"], "'cat' appears twice"),
    ("cat,dog,bird", "must be a list of class names"),
    (5, "must be a list of class names"),
    (["cat", "", "bird"], "non-empty strings"),
    (["cat", 2, "bird"], "non-empty strings"),
])
@pytest.mark.parametrize("family", BUILDERS)
def test_bad_label_names_are_refused_naming_the_argument(family, bad,
                                                         message):
    with pytest.raises(ValueError, match="label_names") as e:
        BUILDERS[family](label_names=bad)
    assert message in str(e.value)


def test_label_names_need_a_head():
    with pytest.raises(ValueError, match="include_top=False"):
        vit(num_classes=3, include_top=False, label_names=NAMES, **TINY)


def test_decode_predictions_speaks_the_model_names():
    model = BUILDERS["vit"](label_names=NAMES)
    logits = np.array([[0.0, 3.0, 1.0]])
    top = keras_vit.zoo.decode_predictions(logits, top=2, labels=model)
    assert [name for _, name, _ in top[0]] == ["dog", "bird"]
