"""Mixed fp16 written into the graph (TensorRT 10.12+ builds strongly typed networks), by
onnxconverter-common's float16 converter: everything in half except the ops in FP32_OPS
(normalisation, softmax, reductions, powers/exp/log) and graph I/O, which stay fp32."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .graph_passes import _skeleton

# Ops kept in fp32: statistics (InstanceNorm/GroupNorm/LayerNorm, reductions), softmax, and the
# numerically touchy elementwise ops. Sigmoid (SiLU) runs in half, as under torch autocast: blocking
# it adds 46 Casts to the demo UNet (170 vs 124) for no accuracy gain (same max error vs fp32).
# `Resize` must be blocked too: converted, its `scales`
# constant becomes fp16, which ONNX Runtime rejects (measured with onnxconverter-common 1.16.0,
# docs/performance.md). The library's own default block list (ML ops,
# TopK, Range, ...) is kept as well.
FP32_OPS = ("InstanceNormalization", "GroupNormalization", "LayerNormalization", "BatchNormalization",
            "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceMax",
            "ReduceMin", "ReduceL2", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Erf", "Resize")
FP16_MAX = float(np.finfo(np.float16).max)
FP16_TINY = float(np.finfo(np.float16).smallest_subnormal)


def convert_mixed_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The mixed fp16 graph of an fp32 graph (a new model; fp32 inputs and outputs).

    Types are inferred on a weight-less skeleton first and handed to the converter as value_info,
    so graphs over the 2 GiB protobuf limit convert too (onnx's shape inference takes a serialized
    model); constants are converted faithfully (fp16's full range, not the library's 1e4 clamp)."""
    from onnxconverter_common import float16
    inferred = onnx.shape_inference.infer_shapes(_skeleton(model))
    known = {v.name for v in model.graph.value_info}
    model.graph.value_info.extend(v for v in inferred.graph.value_info if v.name not in known)
    blocked = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(FP32_OPS))
    outputs = {o.name for o in model.graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT}
    half = float16.convert_float_to_float16(model, min_positive_val=FP16_TINY, max_finite_val=FP16_MAX,
                                            keep_io_types=True, disable_shape_infer=True,
                                            op_block_list=blocked)
    _fp32_outputs(half, outputs)
    _casts_match_value_info(half)
    return half


def _casts_match_value_info(model: onnx.ModelProto) -> None:
    """Hand-written fix-up: onnxconverter-common 1.16.0 retypes a Cast(to=float) node's output to fp16
    in value_info but leaves the node's `to` attribute at float (seen on timm's BEiT attention), so
    the graph fails shape inference. Make the node produce what the converter declared its output to be."""
    declared = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    for node in model.graph.node:
        if node.op_type != "Cast" or declared.get(node.output[0]) != TensorProto.FLOAT16:
            continue
        for a in node.attribute:
            if a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16


def _fp32_outputs(model: onnx.ModelProto, names) -> None:
    """Hand-written fix-up: with onnxconverter-common 1.16.0, a graph output produced by a blocked op
    (the DiffSmooth head's ReduceMean) comes out as fp16 despite keep_io_types=True (the converter
    appends a Cast to fp16; measured on this project's classifier graph). Cast it back to fp32."""
    for out in model.graph.output:
        if out.name not in names or out.type.tensor_type.elem_type == TensorProto.FLOAT:
            continue
        producer = next((n for n in model.graph.node if out.name in n.output), None)
        if producer is not None and producer.op_type == "Cast":
            for a in producer.attribute:
                if a.name == "to":
                    a.i = TensorProto.FLOAT
        else:
            inner = f"{out.name}__fp16"
            for n in model.graph.node:
                n.output[:] = [inner if o == out.name else o for o in n.output]
                n.input[:] = [inner if i == out.name else i for i in n.input]
            model.graph.node.append(onnx.helper.make_node("Cast", [inner], [out.name], to=TensorProto.FLOAT,
                                                          name=f"{out.name}__to_fp32"))
        out.type.tensor_type.elem_type = TensorProto.FLOAT
