"""Running a trained model on images: :mod:`~vitlab.inference.evaluate` (loss, accuracy and the confusion matrix on
a test split, sharded over processes; the trainer's evaluation too) and :mod:`~vitlab.inference.predict` (the
normalisation and class names a checkpoint was trained with, top-k predictions of image files) behind ``vitlab eval``
and ``vitlab predict``."""
