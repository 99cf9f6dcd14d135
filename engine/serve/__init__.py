"""`diffsmooth serve`: certified predictions over the Open Inference Protocol (KServe v2), docs/serving.md."""
