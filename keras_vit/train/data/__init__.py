"""Training data: labelled images as sources, and the input pipelines
that turn a source into batches with the paper's preprocessing.

A *source* is a labelled collection of images
(:class:`~keras_vit.train.data.sources.ImageSource`); the pipelines turn
it into batches of images normalised as the model they feed says
(``dataset(source, model, batch_size)``; without a model, the official
[-1, 1]):

- training: inception crop (random area and aspect ratio), random
  horizontal flip, resize to the training resolution;
- evaluation: optional central crop, resize.

Everything random is seeded per epoch and per example (stateless ops), so
an epoch is the same batches in the same order every time it is built; a
resumed run rebuilds the epoch it stopped in and skips what it consumed.

The modules, one job each:

- :mod:`~keras_vit.train.data.sources`: the source interface, numpy
  arrays and scikit-learn's digits (offline), and :class:`DataError`;
- :mod:`~keras_vit.train.data.folders`: a folder of images, one
  sub-folder per class;
- :mod:`~keras_vit.train.data.image_checks`: the scan that keeps the files
  the decoder reads and says why it skips the others;
- :mod:`~keras_vit.train.data.tfds_source`: a prepared
  tensorflow-datasets split;
- :mod:`~keras_vit.train.data.load`: :func:`load_data`, a source from a
  short description (what the command line takes);
- :mod:`~keras_vit.train.data.pipeline`: the ``tf.data`` pipelines
  (:func:`dataset`, crops, resizes, steps per epoch).

>>> import keras_vit.train as kt
>>> train = kt.digits("train")
>>> train.num_examples, train.num_classes
(1347, 10)
>>> images, labels = next(iter(kt.dataset(train, image_size=16,
...                                       batch_size=4, training=False)))
>>> tuple(images.shape), float(images.numpy().min()) >= -1.0
((4, 16, 16, 3), True)
"""
