"""keras_vit.train.recipes: a recipe's fields are checked (names, choices,
ranges) and a short run's warmup is scaled, never the user's."""

import pytest

from testkit import bad_calls_test
from testkit import one_error_line as _one_error_line
from keras_vit import train as kt


def test_a_short_run_scales_the_recipes_warmup(capsys):
    from keras_vit.cli import train as train_cli
    from keras_vit.train import recipes

    with pytest.warns(UserWarning, match=r"warmup_steps=250 do not fit a run "
                                         r"of total_steps=7; warming up for "
                                         r"1 steps instead \(10%\)"):
        recipe = recipes.get("finetune", total_steps=7)
    assert recipe.warmup_steps == 1
    with pytest.warns(UserWarning, match="warming up for 0 steps"):
        assert recipes.get("finetune", total_steps=1).warmup_steps == 0
    assert recipes.get("finetune", total_steps=500).warmup_steps == 250
    # A warmup the user chose is never changed: the error names options.
    with pytest.raises(ValueError, match=r"warmup_steps=5 \(--warmup-steps\) "
                                         r"must be smaller than total_steps=3 "
                                         r"\(--steps\)"):
        recipes.get("finetune", total_steps=3, warmup_steps=5)
    assert train_cli.main(["fine-tune", "ViT-Ti/16", "--data", "digits",
                           "--steps", "3", "--warmup-steps", "5"]) == 2
    assert "(--warmup-steps) must be smaller" in _one_error_line(capsys)


# Bad arguments to recipes.get, one row each: (label, call,
# argument named, value echoed, suggestion or range text); a
# suggestion is checked as "Did you mean '<it>'", other text verbatim
# (testkit.check_error).
PYTHON_API = [
    ("recipe name", lambda: kt.recipes.get("fintune"), "recipe",
     "'fintune'", "finetune"),
    ("recipe field", lambda: kt.recipes.get("finetune", learning_rat=1.0),
     "field", "'learning_rat'", "did you mean 'learning_rate'"),
    ("recipe optimizer", lambda: kt.recipes.get("finetune", optimizer="adm"),
     "optimizer", "'adm'", "adam"),
    ("recipe schedule", lambda: kt.recipes.get("finetune",
                                               schedule="cosin"),
     "schedule", "'cosin'", "cosine"),
    ("recipe precision", lambda: kt.recipes.get(
        "finetune", precision="mixed_bfloat"), "precision",
     "'mixed_bfloat'", "mixed_bfloat16"),
    ("recipe classifier", lambda: kt.recipes.get("finetune",
                                                 classifier="gpa"),
     "classifier", "'gpa'", "gap"),
    ("recipe learning_rate", lambda: kt.recipes.get(
        "finetune", learning_rate=-1.0), "learning_rate", "-1.0",
     "(0.0, inf)"),
    ("recipe label_smoothing", lambda: kt.recipes.get(
        "finetune", label_smoothing=2.0), "label_smoothing", "2.0",
     "[0.0, 1.0)"),
    ("recipe batch_size", lambda: kt.recipes.get("finetune", batch_size=0),
     "batch_size", "0", "a positive integer"),
]


test_python_api_errors_name_echo_and_suggest = bad_calls_test(PYTHON_API)
