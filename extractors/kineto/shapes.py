"""Shape features and dtype of an operator from its recorded `Input Dims` / `Input type` / `Concrete Inputs`.

Each primitive fills the FEATURE_COLUMNS that describe it (a GEMM's m, n, k, batch; attention's batch, heads,
kv_heads, seq, seq_kv, head_dim, causal; a norm's rows and width; ...) and leaves the others absent.
TensorList inputs nest one level deeper; they count as their total element count.
"""
from __future__ import annotations

import math
from functools import lru_cache

import orjson

from tracekit.core.samples import FSDP_COPIES

#: Trace dtype spellings (op `Input type` and comm `dtype`) → tracekit dtype names and sizes in bytes.
DTYPES = {
    "float": "fp32", "Float": "fp32", "c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16",
    "double": "fp64", "Double": "fp64", "long int": "int64", "long": "int64", "Long": "int64", "int": "int32",
    "Int": "int32", "short int": "int16", "short": "int16", "Short": "int16", "unsigned char": "uint8", "Byte": "uint8",
    "signed char": "int8", "Char": "int8", "bool": "bool", "Bool": "bool",
    "c10::Float8_e4m3fn": "fp8_e4m3", "Float8_e4m3fn": "fp8_e4m3", "c10::Float8_e5m2": "fp8_e5m2",
    "Float8_e5m2": "fp8_e5m2", "c10::complex<float>": "complex64", "ComplexFloat": "complex64",
}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8, "int64": 8, "int32": 4, "int16": 2, "uint8": 1,
               "int8": 1, "bool": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "complex64": 8}

_SDPA_CAUSAL_ARG = {  # op → index of is_causal in its arguments; layout [batch, heads, seq, head_dim]
    "aten::scaled_dot_product_attention": 5,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
}
_FLASH_CAUSAL_ARG = {  # layout [batch, seq, heads, head_dim]
    "aten::_flash_attention_forward": 8,
    "flash_attn::_flash_attn_forward": 5,
    "FlashAttnFunc": None,
}


def dtype_name(spelling: str | None) -> str | None:
    if not spelling:
        return None
    return DTYPES.get(spelling, spelling.replace("c10::", "").lower())


def json_list(blob: bytes) -> list:
    """A JSON list recorded in a trace argument (Input Dims, Input type, ...); [] when absent or not a list."""
    if not blob:
        return []
    try:
        value = orjson.loads(blob)
    except orjson.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []


def _is_shape(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) for v in value)


def _numel(shape) -> int:
    if _is_shape(shape):
        return math.prod(shape) if shape else 1
    if isinstance(shape, list):  # TensorList
        return sum(_numel(s) for s in shape if isinstance(s, list))
    return 0


def _tensors(dims: list, types: list) -> list:
    """Shapes of the tensor arguments (non-empty dims, or typed as tensors), in order."""
    out = []
    for i, shape in enumerate(dims):
        kind = types[i] if i < len(types) else ""
        if kind in ("Scalar", "ScalarList", "", "None") and not (isinstance(shape, list) and shape):
            continue
        if isinstance(shape, list) and (shape or kind not in ("Scalar", "ScalarList", "")):
            out.append(shape)
    return out


def _first_dtype(types: list) -> str | None:
    for kind in types:
        if isinstance(kind, str) and kind and kind not in ("Scalar", "ScalarList", "TensorList", "None", "GenericList"):
            return dtype_name(kind)
    return None


def _truthy(concrete: list, index: int | None) -> float | None:
    if index is None or index >= len(concrete):
        return None
    value = str(concrete[index]).strip().lower()
    if value in ("true", "1"):
        return 1.0
    if value in ("false", "0"):
        return 0.0
    return None


def _gemm(op: str, shapes: list) -> dict:
    mats = [s for s in shapes if _is_shape(s)]
    base = op.split("::")[-1]
    if base in ("addmm", "_addmm_activation", "baddbmm", "addmv", "addbmm") and len(mats) >= 3:
        mats = mats[1:]
    if base == "linear" and len(mats) >= 2:
        x, w = mats[0], mats[1]
        if len(x) >= 1 and len(w) == 2:
            return {"m": math.prod(x[:-1]) if len(x) > 1 else 1, "k": x[-1], "n": w[0], "batch": 1}
        return {}
    if len(mats) < 2:
        return {}
    a, b = mats[0], mats[1]
    if len(a) == 1:
        a = [1] + a
    if len(b) == 1:
        b = b + [1]
    if len(a) < 2 or len(b) < 2:
        return {}
    batch_a, batch_b = a[:-2], b[:-2]
    batch = math.prod(batch_a) if len(batch_a) >= len(batch_b) else math.prod(batch_b)
    m, k, n = a[-2], a[-1], b[-1]
    if base == "matmul" and len(a) > 2 and len(b) == 2:  # [..., m, k] @ [k, n] folds into one GEMM
        return {"m": m * math.prod(a[:-2]), "k": k, "n": n, "batch": 1}
    return {"m": m, "n": n, "k": k, "batch": max(batch, 1)}


def _attention(op: str, shapes: list, concrete: list) -> dict:
    qkv = [s for s in shapes if _is_shape(s) and len(s) in (3, 4)]
    if not qkv:
        return {}
    q = qkv[0]
    k = qkv[1] if len(qkv) > 1 else q
    flash_layout = op in _FLASH_CAUSAL_ARG or "flash_attn" in op.lower() and op not in _SDPA_CAUSAL_ARG
    if len(q) == 3:  # varlen [total_tokens, heads, head_dim]
        out = {"batch": 1, "seq": q[0], "heads": q[1], "head_dim": q[2], "seq_kv": k[0], "kv_heads": k[1]}
    elif flash_layout:
        out = {"batch": q[0], "seq": q[1], "heads": q[2], "head_dim": q[3], "seq_kv": k[1], "kv_heads": k[2]}
    else:
        out = {"batch": q[0], "heads": q[1], "seq": q[2], "head_dim": q[3], "kv_heads": k[1], "seq_kv": k[2]}
    causal = _truthy(concrete, _SDPA_CAUSAL_ARG.get(op, _FLASH_CAUSAL_ARG.get(op)))
    if causal is not None:
        out["causal"] = causal
    return out


def _rows_width(shapes: list) -> dict:
    first = next((s for s in shapes if _is_shape(s) and s), None)
    if first is None:
        numel = sum(_numel(s) for s in shapes)
        return {"numel": numel} if numel else {}
    return {"rows": math.prod(first[:-1]) if len(first) > 1 else 1, "width": first[-1], "numel": math.prod(first)}


#: FSDP2's copies (tracekit.core.samples.FSDP_COPIES) and the aten ops they call, without namespace (classify.py
#: makes them elementwise).
FSDP_COPY_OPS = frozenset({name.split("::", 1)[-1] for name in FSDP_COPIES} | {"_chunk_cat"})


def _copied(dims: list) -> dict:
    """An FSDP2 copy moves the elements of its tensor-list argument (the shards copied in, the parameters copied
    out, the gradients copied in), as one flat buffer (the features `tracekit sample` and the predictor give it)."""
    numel = next((_numel(d) for d in dims if isinstance(d, list) and d and all(isinstance(x, list) for x in d)), 0)
    return {"rows": numel, "width": 1, "numel": numel} if numel else {}


def _embedding(op: str, shapes: list, concrete: list) -> dict:
    """A lookup moves the rows it gathers, not the table: `embedding(weight [V, D], indices)` and
    `index_select(table [V, D], 0, index [N])` (its dim a concrete 0: along another dim it gathers columns) gather
    N rows of D (the table's V is `params`)."""
    mats = [s for s in shapes if _is_shape(s)]
    dim = concrete[1] if len(concrete) > 1 else None
    rows_of_table = op.endswith("index_select") and str(dim) == "0" and len(mats) >= 2 and len(mats[1]) == 1
    if (op.endswith("embedding") or rows_of_table) and len(mats) >= 2 and len(mats[0]) == 2:
        weight, idx = mats[0], mats[1]
        return {"params": weight[0], "width": weight[1], "rows": math.prod(idx) if idx else 1,
                "numel": (math.prod(idx) if idx else 1) * weight[1]}
    return _rows_width(shapes)


@lru_cache(maxsize=65536)
def op_features(op: str, primitive: str, dims_blob: bytes, types_blob: bytes, concrete_blob: bytes) -> tuple:
    """(dtype, ((feature, value), ...)) for one op call; cached on its exact recorded arguments."""
    dims, types = json_list(dims_blob), json_list(types_blob)
    types = [t if isinstance(t, str) else "" for t in types]
    shapes = _tensors(dims, types)
    dtype = _first_dtype(types)
    feats: dict = {}
    if primitive in ("gemm", "bmm"):
        feats = _gemm(op, shapes)
    elif primitive == "attention":
        feats = _attention(op, shapes, json_list(concrete_blob))
    elif primitive == "embedding":
        feats = _embedding(op, shapes, json_list(concrete_blob))
    elif primitive == "optimizer":
        numel = sum(_numel(s) for s in shapes[:1])
        feats = {"params": numel, "numel": numel} if numel else {}
    elif op.split("::", 1)[-1] in FSDP_COPY_OPS:
        feats = _copied(dims)
    elif primitive not in ("memcpy", "memset"):
        feats = _rows_width(shapes)
    if primitive in ("gemm", "bmm") and feats and "numel" not in feats:
        feats["numel"] = feats["m"] * feats["n"] * feats["batch"]
    return dtype, tuple((k, float(v)) for k, v in feats.items() if v is not None)


def tensor_bytes(dims_blob: bytes, types_blob: bytes, count: int | None = None) -> tuple[int | None, str | None]:
    """(bytes, dtype) of the tensors an op was given (its first `count` arguments, default all), e.g. a gen-(a)
    collective's message; (None, None) if unknown."""
    dims, types = json_list(dims_blob)[:count], json_list(types_blob)
    types = [t if isinstance(t, str) else "" for t in types]
    total, dtype = 0, None
    for i, shape in enumerate(dims):
        kind = types[i] if i < len(types) else ""
        name = dtype_name(kind) if kind not in ("Scalar", "ScalarList", "", "TensorList") else None
        if name in DTYPE_BYTES and isinstance(shape, list):
            total += _numel(shape) * DTYPE_BYTES[name]
            dtype = dtype or name
    return (total, dtype) if dtype else (None, None)
