"""Class names compare as people read them (keras_vit.base.names): one
spelling per name everywhere a name is kept or compared, and messages that
show the code points of names that only look alike."""

import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from keras_vit.base.names import class_name, shown_apart
from keras_vit.models import vit
from keras_vit.train.data.sources import ArraySource
from keras_vit.train.evaluation import class_mapping

TINY = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=1,
            num_heads=2, mlp_dim=32)
FORMS = ("NFC", "NFD", "NFKC", "NFKD")
# Letters with accents, so the forms differ; no compatibility characters,
# which NFKC would turn into other names.
LETTERS = st.text(alphabet="aceinouyzAEÅéèêëçñøüÿžǅ", min_size=1,
                  max_size=8).filter(lambda t: t.strip())


@settings(max_examples=60, deadline=None)
@given(name=LETTERS, form=st.sampled_from(("NFC", "NFD")))
def test_every_spelling_of_a_name_is_one_name(name, form):
    spelled = unicodedata.normalize(form, name)
    assert class_name(spelled) == class_name(name)
    assert class_name(class_name(spelled)) == class_name(spelled)


@pytest.fixture(scope="module")
def model():
    # The model's names in NFD: it keeps them in NFC.
    names = [unicodedata.normalize("NFD", n) for n in ("café", "crème", "x")]
    return vit(num_classes=3, label_names=names, **TINY)


def test_a_model_keeps_its_names_in_one_spelling(model):
    assert model.label_names == ("café", "crème", "x")
    assert all(unicodedata.is_normalized("NFC", n) for n in model.label_names)


@settings(max_examples=20, deadline=None)
@given(order=st.permutations([0, 1, 2]), form=st.sampled_from(FORMS[:2]))
def test_data_names_in_any_spelling_map_by_name(model, order, form):
    names = [unicodedata.normalize(form, model.label_names[i]) for i in order]
    source = ArraySource(np.zeros((3, 16, 16, 3)), np.array([0, 1, 2]),
                         class_names=names)
    mapping, how = class_mapping(model, source)
    # None: data label i is output i.
    got = [0, 1, 2] if mapping is None else mapping.tolist()
    assert got == list(order)
    assert mapping is None or "by name" in how


def test_a_name_that_only_looks_alike_is_shown_by_its_code_points(model):
    cyrillic = "cаfé"  # the second letter is U+0430
    source = ArraySource(np.zeros((1, 16, 16, 3)), np.array([0]),
                         class_names=[cyrillic])
    with pytest.raises(ValueError) as e:
        class_mapping(model, source)
    message = str(e.value)
    assert "\n" not in message
    assert "U+0430" in message  # the data's name
    assert "c a f U+00E9" in message  # and the model's it looks like
    # A name unlike every other is shown as it is.
    assert shown_apart("dog", ["cat"]) == "'dog'"


def test_a_folder_holding_one_name_in_two_spellings_is_refused(tmp_path):
    from keras_vit.train.data.folders import FolderSource
    from testkit import jpeg

    for form in ("NFC", "NFD"):
        folder = tmp_path / unicodedata.normalize(form, "café")
        folder.mkdir()
        jpeg(folder / "1.jpg", (16, 16))
    with pytest.raises(Exception) as e:
        FolderSource(str(tmp_path), verbose=False)
    assert "two Unicode spellings" in str(e.value)
    assert "U+0301" in str(e.value)  # the NFD folder's combining accent
