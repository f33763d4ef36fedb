"""Runs documentation snippets in one Python process, offline and tiny.

``python journey_runner.py JOBS.json RESULTS.json``. The test
(``test_readme_and_guides.py``) writes the jobs; this script runs in any
environment that has keras_vit (the fresh venv of the README's install
among them) and imports nothing of the test suite.

Before the first job it makes every run small and offline:

* the size table of ``keras_vit.base.variants`` is shrunk (ViT widths 16 to
  48 from Ti to H, "B" 32; MLP twice the width, 2 heads, 1 layer; every
  ResNet one unit per stage), so that
  "ViT-B/16" or "R50+ViT-B/16" builds in a second with the same names,
  patch sizes, resolutions and head sizes; timm's architectures (the
  package's table of them) as the shrunk "B";
* ``keras_vit.zoo.download.fetch.fetch`` is replaced by a fake that, for the
  URL of a released checkpoint, writes a random checkpoint in the official
  layout for that record (its architecture, resolution, head and
  ``pre_logits``) into the cache. The real downloader is tested against
  local HTTP servers in tests/zoo/test_download.py; any other URL fails.

Each job runs in its own folder and, for a Python block, its own globals,
as a reader pastes a block into a fresh interpreter. A job is a Python
block (``code``) or a ``keras-vit`` command line (``argv``, run through
``keras_vit.cli.main``); ``setup`` (Python) first makes what the docs
leave to the reader (a ``photo``, a ``pets/`` folder, a ``model``), and
``expect`` lists Python expressions that must be true afterwards (a shell
job sees ``status``, ``out`` and ``err``; every job sees its captured
``out``). The results are written after every job, so a crash leaves the
earlier ones.
"""

import contextlib
import io
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

# Each size keeps a width of its own, so that a name read back from a model
# (save_pretrained's timm architecture) is still the one it was built from.
TINY_WIDTHS = {"Ti": 16, "S": 24, "B": 32, "L": 40, "H": 48}
FETCHED = []


def shrink_architectures():
    from keras_vit.base import variants

    for letter, row in variants.VIT_SIZES.items():
        width = TINY_WIDTHS[letter]
        row.update(hidden_size=width, mlp_dim=2 * width, num_heads=2,
                   num_layers=1)
    for depth in list(variants.RESNET_DEPTHS):
        variants.RESNET_DEPTHS[depth] = (1, 1, 1, 1)
    # timm's names size their models from the package's table of timm's
    # architectures: every one as the shrunk ViT-B (the docs' hub
    # repositories are vit_base ones, written that small).
    from keras_vit.zoo.timm import arguments as timm_arguments

    for entry in timm_arguments.table()["architectures"].values():
        if "backbone" not in entry["args"]:
            entry["args"].update(embed_dim=TINY_WIDTHS["B"], depth=1,
                                 num_heads=2, mlp_ratio=2.0)


def _random_like(arrays, seed):
    """Random values in the shapes of ``arrays``: LayerNorm/GroupNorm
    scales near 1, everything else small, heads included (a zero head
    would make every prediction a tie)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for key, value in arrays.items():
        noise = rng.standard_normal(value.shape).astype("float32")
        if key.endswith(("scale", "gamma")):
            out[key] = 1.0 + 0.1 * noise
        else:
            fan_in = value.shape[0] if value.ndim >= 2 else 1
            out[key] = noise * (0.5 / max(1.0, fan_in ** 0.5))
    return out


def _write_checkpoint(path, name, record):
    import numpy as np

    from keras_vit import zoo
    from keras_vit.zoo import convert

    options = {}
    if record.representation_size:
        options["representation_size"] = record.representation_size
    model = zoo.load(name, weights=None, image_size=record.image_size,
                     num_classes=record.num_classes, **options)
    arrays = _random_like(convert.export_arrays(model), len(FETCHED))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part.npz")
    np.savez(partial, **arrays)
    os.replace(partial, path)


def fake_fetch(url, *, sha256=None, cache_dir=None, progress=None,
               timeout=60.0, deadline=None):
    """Stands in for ``keras_vit.zoo.download.fetch.fetch``: a released file's
    URL gives a random checkpoint in that file's layout, once per URL."""
    from keras_vit.zoo import registry
    from keras_vit.zoo.download import cache as download_cache

    path = download_cache.cache_path_for(url, cache_dir)
    if path.is_file():
        return path
    for name, records in registry.WEIGHTS.items():
        for record in records:
            if record.url == url:
                FETCHED.append(url)
                _write_checkpoint(path, name, record)
                return path
    raise RuntimeError(
        f"journeys: no released checkpoint has url={url!r}; the journeys "
        "fake only the zoo's own files (tests/zoo/test_download.py tests the "
        "downloader)")


def install_fakes():
    shrink_architectures()
    from keras_vit.zoo.download import fetch as download

    download.fetch = fake_fetch


class Helpers:
    """What a job's ``setup`` uses to make the files and objects a doc
    leaves to the reader. Images are random, with a colour per class."""

    def __init__(self, seed=0):
        import numpy as np

        self.rng = np.random.default_rng(seed)

    def photo(self, height=60, width=80):
        """An RGB uint8 array of any size, as a decoded photo is."""
        return self.rng.integers(0, 256, (height, width, 3), dtype="uint8")

    def image_file(self, path, height=60, width=80):
        from PIL import Image

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(self.photo(height, width)).save(path)
        return str(path)

    def image_folder(self, path, classes=("cat", "dog"), per_class=4,
                     height=40, width=48, flat=False):
        """One sub-folder of PNGs per class (or, ``flat``, every image in
        ``path`` itself)."""
        import numpy as np
        from PIL import Image

        for c, name in enumerate(classes):
            folder = Path(path) if flat else Path(path) / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                base = np.zeros((height, width, 3), "uint8") + np.array(
                    [60 + 120 * c, 90, 200 - 120 * c], "uint8")
                noise = self.rng.integers(0, 40, (height, width, 3))
                Image.fromarray((base + noise).astype("uint8")).save(
                    folder / f"{name}_{i}.png")
        return str(path)

    def dataset(self, image_size, num_classes, count=8, batch=4):
        """A ``tf.data`` dataset of (images in [-1, 1], labels), batched."""
        import tensorflow as tf

        x = self.rng.uniform(-1, 1, (count, image_size, image_size, 3))
        y = self.rng.integers(0, num_classes, count)
        return tf.data.Dataset.from_tensor_slices(
            (x.astype("float32"), y.astype("int32"))).batch(batch)

    def tiny_model(self, num_classes=10, image_size=32):
        """A small zoo ViT with random weights (the shrunk ViT-Ti/16)."""
        from keras_vit import zoo

        return zoo.load("ViT-Ti/16", weights=None, image_size=image_size,
                        num_classes=num_classes)


def _tail(text, n=4000):
    return text if len(text) <= n else "...\n" + text[-n:]


def run_job(job, root):
    cwd = Path(root) / job["cwd"]
    cwd.mkdir(parents=True, exist_ok=True)
    for dest, src in job.get("files", {}).items():
        target = cwd / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            if os.path.isdir(src):
                import shutil

                shutil.copytree(src, target)
            else:
                target.write_bytes(Path(src).read_bytes())
    here = os.getcwd()
    os.chdir(cwd)
    out, err = io.StringIO(), io.StringIO()
    result = {"ok": False, "error": "", "status": None}
    # The setup and the expectations see a few modules; the block sees
    # only what the setup made, so a block that forgets an import fails.
    tools = {"journey": Helpers(), "os": os, "Path": Path, "json": json,
             "re": re}
    namespace = {"__name__": "__main__"}
    start, cpu = time.perf_counter(), time.process_time()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if job.get("setup"):
                setup = dict(tools)
                exec(compile(job["setup"], f"<setup of {job['id']}>",
                             "exec"), setup)
                namespace.update((k, v) for k, v in setup.items()
                                 if k not in tools or v is not tools[k])
                namespace.pop("__builtins__", None)
            if "code" in job:
                exec(compile(job["code"], job["id"], "exec"), namespace)
            else:
                from keras_vit import cli

                namespace["status"] = cli.main(job["argv"][1:])
                result["status"] = namespace["status"]
        namespace.update(tools, out=out.getvalue(), err=err.getvalue())
        failed = [e for e in job.get("expect", ())
                  if not eval(e, namespace)]  # noqa: S307 - the test's own
        if failed:
            result["error"] = "expectation(s) not met: " + "; ".join(failed)
        else:
            result["ok"] = True
    except BaseException:  # noqa: B036 - SystemExit is a failure here too
        result["error"] = traceback.format_exc()
    finally:
        os.chdir(here)
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["cpu"] = round(time.process_time() - cpu, 2)
    result["stdout"] = _tail(out.getvalue())
    result["stderr"] = _tail(err.getvalue())
    if "keras" in sys.modules:
        sys.modules["keras"].backend.clear_session()
    return result


def main(jobs_path, results_path):
    spec = json.loads(Path(jobs_path).read_text())
    install_fakes()
    results = {}
    for job in spec["jobs"]:
        results[job["id"]] = run_job(job, spec["root"])
        results[job["id"]]["fetched"] = list(FETCHED)
        Path(results_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
