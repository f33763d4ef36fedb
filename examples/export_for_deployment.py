"""Export a zoo model for deployment and run each artifact in its own
runtime: a SavedModel for TF Serving that takes encoded JPEG/PNG files,
ONNX (onnxruntime, any CPU) and a full-int8 LiteRT file (phones, small
CPUs). Every export is verified against Keras before it is written (the
report's figures are printed), then each artifact classifies two photos
and prints their top-5.

At full size::

    python examples/export_for_deployment.py --model ViT-B/16 --out exported/

(``--weights none --image-size 64`` is a quick dry run with random weights.)

TF Serving then serves ``exported/vit_saved_model``::

    docker run -p 8501:8501 -v $PWD/exported/vit_saved_model:/models/vit/1 \\
        -e MODEL_NAME=vit tensorflow/serving

and a client sends the file's bytes, any size, base64 in JSON::

    import base64, json, urllib.request
    jpeg = open("cat.jpg", "rb").read()
    body = {"instances": [{"image_bytes": {"b64": base64.b64encode(jpeg).decode()}}]}
    request = urllib.request.Request("http://localhost:8501/v1/models/vit:predict",
                                     json.dumps(body).encode())
    print(json.load(urllib.request.urlopen(request))["predictions"][0]["labels"])

In Python, without a server::

    loaded = tf.saved_model.load("exported/vit_saved_model")
    out = loaded.signatures["serving_default"](image_bytes=tf.constant([jpeg]))
    out["labels"], out["scores"]  # top-5 names and probabilities, best first
"""

import argparse
import io
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
    from PIL import Image

    from keras_vit import export, zoo

    weights = None if args.weights.lower() == "none" else args.weights
    model = zoo.load(args.model, weights=weights, image_size=args.image_size)
    size = model.input_shape[1]
    os.makedirs(args.out, exist_ok=True)
    # Two photos as a client has them: JPEG files of their own size.
    try:
        from skimage import data
        photos = [data.astronaut(), data.chelsea()]
    except ImportError:
        rng = np.random.default_rng(0)
        photos = [rng.integers(0, 256, (300, 400, 3)).astype("uint8")] * 2
    jpegs = []
    for photo in photos:
        buffer = io.BytesIO()
        Image.fromarray(photo).save(buffer, "JPEG", quality=90)
        jpegs.append(buffer.getvalue())
    # What the ONNX and LiteRT files take: uint8 pixels at the model's
    # size (the model's own input normalisation runs inside them).
    decoded = [np.asarray(Image.open(io.BytesIO(j)).convert("RGB"))
               for j in jpegs]
    pixels = np.stack([zoo.preprocess_input(d, size, scale=False)
                       for d in decoded]).round().astype("uint8")

    # Class names: the weights' list (ImageNet for a 1000-class head), so
    # that all three artifacts print the same names.
    _, rows = zoo.preprocessing.model_labels(model, model.output_shape[-1])
    names = [name for _, name in rows] if rows else None

    paths = {
        "saved_model": os.path.join(args.out, "vit_saved_model"),
        "onnx": os.path.join(args.out, "vit.onnx"),
        "tflite_int8": os.path.join(args.out, "vit_int8.tflite"),
    }
    # Each call converts, runs the artifact against Keras and only then
    # writes it; the report holds the agreement figures.
    reports = {
        "saved_model": export.to_saved_model(
            model, paths["saved_model"], input="image_bytes", top_k=5,
            labels=names),
        "onnx": export.to_onnx(model, paths["onnx"], uint8_input=True),
        "tflite_int8": export.to_tflite(model, paths["tflite_int8"],
                                        quantization="int8",
                                        uint8_input=True),
    }

    # Each artifact in its runtime: (logits, top-5 names of photo 0).
    def labels_of(classes):
        return [names[c] if names else str(c) for c in classes]

    import tensorflow as tf

    loaded = tf.saved_model.load(paths["saved_model"])
    out = loaded.signatures["serving_default"](image_bytes=tf.constant(jpegs))
    results = {"saved_model": (
        out["logits"].numpy(),
        [s.decode() for s in out["labels"].numpy()[0]])}

    import onnxruntime

    session = onnxruntime.InferenceSession(
        paths["onnx"], providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"images": pixels})
    results["onnx"] = logits, labels_of(np.argsort(-logits[0])[:5])

    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(paths["tflite_int8"]).get_signature_runner(
        "serving_default")
    logits = runner(images=pixels)["logits"]
    results["tflite_int8"] = logits, labels_of(np.argsort(-logits[0])[:5])

    # Keras on the same pixels, normalised as the model's weights expect
    # (its own input_normalization: [-1, 1] for the 2020 ViT, ImageNet's
    # or CLIP's mean and std for others; none if it normalises itself).
    from keras_vit.data.normalization import model_input

    reference = np.asarray(model.predict(
        model_input(model, pixels.astype("float32")), verbose=0))
    for name, (logits, top_names) in results.items():
        logits = np.asarray(logits, "float32")
        top = np.argsort(-logits, axis=-1)[:, :5]
        agree = float(np.mean(top[:, 0] == np.argmax(reference, -1)))
        report = reports[name]
        print(f"{name}: {paths[name]}: top-1 as Keras on {agree:.0%} of "
              f"{len(pixels)} photos; at export: max |logit diff| "
              f"{report['max_abs_diff']['logits']:.2e}, top-1 agreement "
              f"{report['top1_agreement']:.2f}; photo 0's top-5 labels "
              f"{top_names}, top-5 classes {top[0].tolist()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
