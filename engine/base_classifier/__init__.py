"""The base classifier f: schedule, one-shot denoising, local smoothing, and the rs/dds/diffsmooth composition."""
