"""A run directory's own files as a hostile hand or a killed process leaves
them: ``history.jsonl`` and ``run.json`` are read through one schema each,
so a row or record of the wrong shape is refused naming the file, the line
or field and the value, and a killed process's cut-off last row is
skipped."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_vit.base.errors import ConfigError
from keras_vit.train import run_dir

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=5), inner, max_size=3), max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(value=JSON)
def test_a_history_line_is_a_row_or_refused_naming_the_line(value, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    path = run_dir.history_path(str(out))
    with open(path, "w") as f:
        f.write('{"step": 1, "loss": 0.5}\n' + json.dumps(value) + "\n")
    try:
        rows = run_dir.read_history(str(out))
    except ConfigError as e:
        assert f"{path} line 2" in str(e) and "\n" not in str(e)
        return
    assert rows[0] == {"step": 1, "loss": 0.5}
    assert isinstance(rows[1], dict) and isinstance(rows[1]["step"], int)
    assert rows[1]["step"] >= 0 and not isinstance(rows[1]["step"], bool)


def test_only_a_cut_off_last_line_is_skipped(tmp_path):
    path = run_dir.history_path(str(tmp_path))
    with open(path, "w") as f:
        f.write('{"step": 1}\n{"step": 2, "lo')  # killed mid-append
    assert run_dir.read_history(str(tmp_path)) == [{"step": 1}]
    with open(path, "w") as f:
        f.write('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ConfigError, match="line 2 is not valid JSON"):
        run_dir.read_history(str(tmp_path))
    with open(path, "w") as f:
        f.write('{"step": 1}\n[1, 2]\n')
    with pytest.raises(ConfigError, match=r"line 2 is a JSON list"):
        run_dir.read_history(str(tmp_path))
    # Truncating on resume reads the same way.
    with pytest.raises(ConfigError, match="line 2"):
        run_dir.truncate_history(str(tmp_path), 1)


@pytest.mark.parametrize("record, field", [
    ([1, 2], None),
    ({"label_names": 5}, "label_names"),
    ({"label_names": ["cat", 3]}, r"label_names\[1\]"),
    ({"recipe": [1]}, "recipe"),
    ({"total_steps": "many"}, "total_steps"),
    ({"image_size": [32, 32, 3]}, "image_size"),
    ({"num_classes": True}, "num_classes"),
])
def test_a_run_record_of_the_wrong_shape_is_refused(tmp_path, record, field):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError) as info:
        run_dir.read_run_record(str(path))
    message = str(info.value)
    assert message.startswith(str(path)) and "\n" not in message
    if field:
        assert f"field {field.replace(chr(92), '')}" in message
    # The record a checkpoint keeps is read by the same rules.
    with pytest.raises(ConfigError):
        run_dir.read_run_record("the checkpoint", json.dumps(record))


def test_resume_refuses_a_record_it_cannot_read(tmp_path):
    (tmp_path / "run.json").write_text('{"recipe": {}, "recipe": {}}')
    with pytest.raises(ConfigError, match="recipe"):
        run_dir.check_resume(str(tmp_path), {}, recorded=None,
                             resumed_from=3, resume=True, say=print)
