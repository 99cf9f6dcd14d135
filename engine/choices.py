"""The names a user picks from (methods, dataset kinds, presets, precisions, ...), defined once here.

Plain tuples without torch, so the command line can build its options from them without loading
the models; the modules that act on a name import it from here.
"""

from __future__ import annotations

METHODS = ("rs", "dds", "diffsmooth")                    # base classifiers: RS, DDS, DiffSmooth
LOCAL_NOISE_MODES = ("fixed", "fresh")                   # DiffSmooth's local noises: drawn once, or per sample
DATASET_KINDS = ("cifar10", "imagenet", "npz", "idx", "embedded")
PRESETS = ("cifar10", "imagenet", "demo")                # UNet architecture + schedule of a checkpoint family
SCHEDULES = ("linear", "cosine")                         # diffusion noise schedules
NORMALIZATIONS = ("normalize", "center", "none")         # the input layer in front of a classifier
STATS = ("cifar10", "imagenet", "fashion-mnist")         # mean/std tables of the normalisation
BACKENDS = ("torch", "onnxruntime", "tensorrt")
PRECISIONS = ("fp32", "fp16", "bf16")                    # torch backend
GRAPH_PRECISIONS = ("fp32", "fp16")                      # exported ONNX graphs and TensorRT plans
SEQUENTIAL_BOUNDS = ("split-cp", "mixture")              # lower bounds of a sequential run (certify/sequential.py)
