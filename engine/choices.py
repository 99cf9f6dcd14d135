"""The names a user picks from (methods, dataset kinds, presets, precisions, ...), the defaults of a run's
numbers and the ranges they must lie in, defined once here.

Plain values without torch, so the command line can build its options from them without loading
the models; the modules that act on a name or a number import it from here.
"""

from __future__ import annotations

# The built-in base classifiers, the one place each is listed: engine/base_classifier/methods/NAME.py defines its
# class, which methods/__init__.py imports and registers in this order (the command line's help reads this list
# without loading torch; it accepts every registered method, a plug-in's too).
METHODS = ("rs", "dds", "diffsmooth", "densepure")
LOCAL_NOISE_MODES = ("fixed", "fresh")                   # DiffSmooth's local noises: drawn once, or per sample
DATASET_KINDS = ("cifar10", "imagenet", "npz", "idx", "embedded")
PRESETS = ("cifar10", "imagenet", "demo")                # UNet architecture + schedule of a checkpoint family
SCHEDULES = ("linear", "cosine")                         # diffusion noise schedules
NORMALIZATIONS = ("normalize", "center", "none")         # the input layer in front of a classifier
STATS = ("cifar10", "imagenet", "fashion-mnist")         # mean/std tables of the normalisation
BACKENDS = ("torch", "onnxruntime", "tensorrt")
RUN_PRECISIONS = ("fp32", "fp16", "bf16")                # what a run may ask for; the torch backend runs each
GRAPH_PRECISIONS = ("fp32", "fp16")                      # exported ONNX graphs and TensorRT engine files
SEQUENTIAL_BOUNDS = ("reach-cp", "split-cp", "mixture")              # lower bounds of a sequential run (certify/sequential.py)

# The ranges a number a user gives must lie in (checked once where options enter: the command line's option
# types, RunRequest, the table spec), each set by what the engine can do, not by taste.
MAX_SEED = 2 ** 63 - 1              # seeds key 64-bit noise streams; seed + k offsets (train-demo) stay in range
MAX_SAMPLES = 2 ** 32               # Monte Carlo samples of one image: Philox's 32-bit sample counter (certify/noise.py)
MAX_BATCH = 2 ** 20                 # samples per forward batch: buffers of this size are allocated up front
MAX_WINDOW = 2 ** 20                # images in flight
MAX_THREADS = 1024                  # torch / worker threads (more would only be spawned, never used)
MAX_LOCAL_NOISES = 1024             # DiffSmooth's m: m classifier calls per sample, an m x C x H x W noise tensor
MAX_DIFFUSION_STEPS = 100_000       # a schedule's steps (the papers' checkpoints use 1000 or 4000)

# The defaults of a run's numbers, the paper's: `certify`'s options, RunRequest and a table spec
# (engine/table/spec.py; the table's own defaults are engine/table/defaults.py) read them from here.
DEFAULT_METHOD = "diffsmooth"
DEFAULT_N0 = 100                    # selection samples (CERTIFY's n0)
DEFAULT_N = 10_000                  # estimation samples (CERTIFY's n; a table's n_max)
DEFAULT_ALPHA = 0.001               # failure probability of CERTIFY and PREDICT
DEFAULT_SEED = 0
DEFAULT_SIGMA = 0.5                 # the smoothing noise of `certify` without --sigma
DEFAULT_LOCAL_SIGMA = 0.25          # DiffSmooth's sigma' of `certify` without --local-sigma
DEFAULT_M = 5                       # DiffSmooth's local noises per sample (m)
DEFAULT_LOCAL_NOISE = LOCAL_NOISE_MODES[0]              # "fixed": drawn once
FIXED_LOCAL_NOISE_SEED = 42         # the reference draws its fixed local noises with seed 42 (certify/noise.py)
DEFAULT_SPLIT = "test"
DEFAULT_SKIP = 1                    # every image of the split
