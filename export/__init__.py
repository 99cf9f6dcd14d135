"""Export to ONNX and TensorRT, and validation of exported graphs against torch."""
