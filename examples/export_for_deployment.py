"""Export a zoo model for deployment and run each artifact in its own
runtime: a SavedModel for TF Serving, ONNX (onnxruntime, any CPU) and a
full-int8 LiteRT file (phones, small CPUs). Every export is verified
against Keras before it is written (the report's figures are printed).

At full size::

    python examples/export_for_deployment.py --model ViT-B/16 --out exported/

TF Serving then serves ``exported/vit_saved_model`` (``docker run -p
8501:8501 -v $PWD/exported/vit_saved_model:/models/vit/1 -e MODEL_NAME=vit
tensorflow/serving``); a REST request is ``POST
/v1/models/vit:predict`` with ``{"instances": [<H x W x 3 uint8 pixels>]}``
(the export takes uint8 pixels and scales them inside, so clients send
raw decoded images at the model's resolution).
"""

import argparse
import os


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-B/16")
    p.add_argument("--weights", default="auto",
                   help="'auto' (the released ones), a tag, a file, or none")
    p.add_argument("--image-size", type=int, default=None,
                   help="default: the weights' resolution")
    p.add_argument("--out", default="exported")
    args = p.parse_args(argv)

    import numpy as np

    from keras_vit import export, zoo
    from keras_vit.export import onnx as onnx_export
    from keras_vit.export import saved_model, tflite

    weights = None if args.weights == "none" else args.weights
    model = zoo.load(args.model, weights=weights, image_size=args.image_size)
    size = model.input_shape[1]
    os.makedirs(args.out, exist_ok=True)
    # Two photos at the model's resolution, as uint8 pixels.
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (2, size, size, 3)).astype("uint8")
    try:
        from skimage import data
        pixels = np.stack([
            zoo.preprocess_input(photo, size, scale=False)
            for photo in (data.astronaut(), data.chelsea())
        ]).round().astype("uint8")
    except ImportError:
        pass
    reference = np.asarray(model.predict(zoo.preprocess_input(pixels),
                                         verbose=0))

    paths = {
        "saved_model": os.path.join(args.out, "vit_saved_model"),
        "onnx": os.path.join(args.out, "vit.onnx"),
        "tflite_int8": os.path.join(args.out, "vit_int8.tflite"),
    }
    # Each call converts, runs the artifact against Keras and only then
    # writes it; the report holds the agreement figures.
    reports = {
        "saved_model": export.to_saved_model(model, paths["saved_model"],
                                             uint8_input=True),
        "onnx": export.to_onnx(model, paths["onnx"], uint8_input=True),
        "tflite_int8": export.to_tflite(model, paths["tflite_int8"],
                                        quantization="int8",
                                        uint8_input=True),
    }
    runners = {
        # tf.saved_model.load(path).signatures["serving_default"](images=...)
        "saved_model": saved_model.open_artifact(paths["saved_model"]),
        # onnxruntime.InferenceSession(path).run(None, {"images": ...})
        "onnx": onnx_export.open_artifact(paths["onnx"]),
        # ai_edge_litert.interpreter.Interpreter(path).get_signature_runner()
        "tflite_int8": tflite.open_artifact(paths["tflite_int8"]),
    }
    for name, run in runners.items():
        logits = np.asarray(run(pixels)["logits"], "float32")
        top = np.argsort(-logits, axis=-1)[:, :5]
        agree = float(np.mean(top[:, 0] == np.argmax(reference, -1)))
        report = reports[name]
        print(f"{name}: {paths[name]}: top-1 as Keras on {agree:.0%} of "
              f"{len(pixels)} photos; at export: max |logit diff| "
              f"{report['max_abs_diff']['logits']:.2e}, top-1 agreement "
              f"{report['top1_agreement']:.2f}; photo 0's top-5 classes "
              f"{top[0].tolist()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
