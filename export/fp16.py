"""Mixed fp16 written into the graph (TensorRT 10.12+ builds strongly typed networks): Conv/MatMul/
Gemm in half, elementwise/data-movement ops follow their inputs, everything else (InstanceNorm,
softmax, reductions, graph I/O) fp32. Which ops need fp32 is decided by op type: in an fp32 trace
torch's `.float()` is a no-op Cast that says nothing about intent."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph_passes import infer_types, remove_unused

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16

HALF_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
# op -> indices of inputs carrying the data type T (None: every input).
FOLLOW_OPS: Dict[str, Optional[Sequence[int]]] = {
    "Add": None, "Sub": None, "Mul": None, "Div": None, "Max": None, "Min": None, "Neg": None,
    "Abs": None, "Relu": None, "LeakyRelu": None, "Sigmoid": None, "Tanh": None, "HardSigmoid": None,
    "Elu": None, "Identity": None, "Concat": None, "Clip": None,
    "Dropout": (0,), "Reshape": (0,), "Transpose": (0,), "Flatten": (0,), "Squeeze": (0,),
    "Unsqueeze": (0,), "Expand": (0,), "Slice": (0,), "Split": (0,), "Gather": (0,), "Tile": (0,),
    "Resize": (0,), "Pad": (0, 2), "AveragePool": (0,), "MaxPool": (0,), "GlobalAveragePool": (0,),
    "Where": (1, 2),
}
# Ops that accept any element type as-is (no cast back to fp32 needed).
ANY_TYPE_OPS = {"Shape", "Size", "Cast", "CastLike"}


class _Converter:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.types = infer_types(model)              # fp32-graph element types
        self.inits = {t.name: t for t in self.graph.initializer}
        self.cur: Dict[str, int] = {}                # element type after conversion
        self.half_inits: Dict[str, str] = {}
        self.casts: Dict[tuple, str] = {}
        self.new_nodes: List[onnx.NodeProto] = []
        self.new_inits: List[TensorProto] = []

    def type_of(self, name: str) -> int:
        return self.cur.get(name, self.types.get(name, 0))

    def is_const(self, name: str) -> bool:
        return name in self.inits

    def half_const(self, name: str) -> str:
        if name not in self.half_inits:
            arr = numpy_helper.to_array(self.inits[name])
            with np.errstate(over="ignore"):
                half = arr.astype(np.float16)
            new = f"{name}__fp16"
            self.new_inits.append(numpy_helper.from_array(half, new))
            self.half_inits[name] = new
        return self.half_inits[name]

    def cast(self, name: str, to: int) -> str:
        key = (name, to)
        if key not in self.casts:
            out = f"{name}__to_{'fp16' if to == F16 else 'fp32'}"
            self.new_nodes.append(helper.make_node("Cast", [name], [out], to=to, name=f"{out}__cast"))
            self.cur[out] = to
            self.casts[key] = out
        return self.casts[key]

    def to_half(self, node: onnx.NodeProto, indices) -> None:
        for i in indices:
            name = node.input[i]
            if not name or self.types.get(name) != F32:
                continue
            if self.is_const(name):
                node.input[i] = self.half_const(name)
            elif self.type_of(name) == F32:
                node.input[i] = self.cast(name, F16)

    @staticmethod
    def _cast_to(node: onnx.NodeProto) -> int:
        return next((a.i for a in node.attribute if a.name == "to"), 0)

    def run(self) -> onnx.ModelProto:
        for node in self.graph.node:
            op = node.op_type if node.domain in ("", "ai.onnx") else None
            n_in = len(node.input)
            if op == "Cast" and self.types.get(node.input[0]) == F32 and self._cast_to(node) == F32:
                op = "Identity"      # a no-op cast in the fp32 graph: follow the input's type
            if op in HALF_OPS:
                half = True
                data = range(n_in)
            elif op in FOLLOW_OPS:
                idx = FOLLOW_OPS[op]
                data = [i for i in (range(n_in) if idx is None else idx) if i < n_in]
                acts = [node.input[i] for i in data
                        if node.input[i] and self.types.get(node.input[i]) in (F32, F16)
                        and not self.is_const(node.input[i])]
                # Like torch's type promotion: half only when every activation input is half.
                half = bool(acts) and all(self.type_of(a) == F16 for a in acts)
            else:
                half = False
                data = ()
            if half:
                self.to_half(node, data)
                if node.op_type == "Cast":           # a no-op cast on a half tensor
                    node.op_type = "Identity"
                    del node.attribute[:]
                for o in node.output:
                    if o and self.types.get(o) == F32:
                        self.cur[o] = F16
            elif op not in ANY_TYPE_OPS:
                for i, name in enumerate(node.input):
                    if name and not self.is_const(name) and self.type_of(name) == F16:
                        node.input[i] = self.cast(name, F32)
            self.new_nodes.append(node)
        # Graph outputs stay fp32.
        for out in self.graph.output:
            if self.type_of(out.name) == F16:
                inner = f"{out.name}__fp16"
                for n in self.new_nodes:
                    for i, name in enumerate(n.input):
                        if name == out.name:
                            n.input[i] = inner
                    for i, name in enumerate(n.output):
                        if name == out.name:
                            n.output[i] = inner
                self.new_nodes.append(helper.make_node("Cast", [inner], [out.name], to=F32,
                                                       name=f"{out.name}__cast_fp32"))
        del self.graph.node[:]
        self.graph.node.extend(self.new_nodes)
        self.graph.initializer.extend(self.new_inits)
        del self.graph.value_info[:]
        remove_unused(self.model)
        return self.model


def convert_mixed_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite an fp32 graph (in place) into the mixed fp16 graph described above; returns it."""
    return _Converter(model).run()


def precision_report(model: onnx.ModelProto) -> Dict[str, Dict[str, int]]:
    """{op_type: {elem type name: count}} of the first input of each node, for checks and tests."""
    types = infer_types(model)
    out: Dict[str, Dict[str, int]] = {}
    for node in model.graph.node:
        if not node.input or not node.input[0]:
            continue
        t = TensorProto.DataType.Name(types.get(node.input[0], 0))
        out.setdefault(node.op_type, {}).setdefault(t, 0)
        out[node.op_type][t] += 1
    return out
