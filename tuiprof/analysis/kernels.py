"""Kernel naming and classes: raw CUPTI name -> :class:`KernelInfo`.

Rules (first match wins) are listed in ``docs/analysis.md``. :func:`kernel_info` is memoised:
it runs once per distinct kernel name, never per record.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..store.records import GRAPH_KERNEL
from .demangle import base_name, demangle

# Libraries
CUBLAS = "cuBLAS"
CUTLASS = "CUTLASS"
CUDNN = "cuDNN"
FLASH = "FlashAttention"
ATEN = "PyTorch ATen"
TRITON = "Triton/Inductor"
NCCL = "NCCL"
GGML = "ggml (llama.cpp)"
OTHER_LIB = "other"
LIBRARIES = (CUBLAS, CUTLASS, CUDNN, FLASH, ATEN, TRITON, NCCL, GGML, OTHER_LIB)

# What a graph-level launch record is called: the whole launch, its kernels not traced
GRAPH_LAUNCH = "CUDA graph launch (its kernels untraced)"

# Categories
GEMM = "GEMM/GEMV"
ATTENTION = "attention"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction/normalisation"
COPY = "copy/cast"
MEMCPY = "memcpy/memset"  # CUPTI memcpy/memset activities, never a kernel
COMMUNICATION = "communication"  # collectives between GPUs (NCCL kernels)
OTHER = "other"
CATEGORIES = (GEMM, ATTENTION, ELEMENTWISE, REDUCTION, COPY, MEMCPY, COMMUNICATION, OTHER)

__all__ = ["KernelInfo", "kernel_info", "LIBRARIES", "CATEGORIES", "GEMM", "ATTENTION", "GGML",
           "ELEMENTWISE", "REDUCTION", "COPY", "MEMCPY", "COMMUNICATION", "OTHER", "is_gemm_aux",
           "triton_ops", "is_communication"]


@dataclass(frozen=True, slots=True)
class KernelInfo:
    """What a kernel is: names for people, library, category and element type if known."""

    raw: str
    demangled: str
    short: str
    library: str
    category: str
    dtype: str | None = None


@lru_cache(maxsize=8192)
def kernel_info(raw: str) -> KernelInfo:
    """Classify one raw (mangled) kernel name; memoised."""
    if raw == GRAPH_KERNEL:  # a whole CUDA-graph launch, traced at graph level
        return KernelInfo(raw, raw, GRAPH_LAUNCH, OTHER_LIB, OTHER)
    dem = demangle(raw)
    if raw.startswith("triton_"):
        return _triton(raw)
    low = dem.lower()
    dtype = _dtype(dem)
    for rule in (_nvjet, _cublas, _flash, _fmha, _cudnn, _nccl, _cutlass, _aten, _ggml):
        got = rule(raw, dem, low, dtype)
        if got is not None:
            short, lib, cat, dt = got
            return KernelInfo(raw, dem, short, lib, cat, dt)
    base = base_name(dem) or raw
    cat = OTHER
    fn = base.rsplit("::", 1)[-1]
    if re.search(r"gemm|gemv", low):
        cat = GEMM
    elif _SORT_RX.search(fn):  # e.g. cub::DeviceRadixSortOnesweepKernel outside PyTorch
        return KernelInfo(raw, dem, _trim(f"sort ({fn})"), OTHER_LIB, REDUCTION, dtype)
    elif "softmax" in low or "norm" in low or "reduce" in low:
        cat = REDUCTION
    elif "attention" in low or "fmha" in low:
        cat = ATTENTION
    return KernelInfo(raw, dem, _trim(base.rsplit("::", 1)[-1]), OTHER_LIB, cat, dtype)


def is_communication(raw: str) -> bool:
    """True for a collective's kernel (NCCL): time one GPU spends exchanging with others."""
    return kernel_info(raw).category == COMMUNICATION


def is_gemm_aux(info: KernelInfo) -> bool:
    """True for the second half of a split GEMM (cuBLASLt split-K reduce): not its own matmul."""
    return info.category == GEMM and "splitKreduce" in info.demangled


# ----------------------------------------------------------------------------- helpers
_DTYPES = (
    ("bf16", re.compile(r"BFloat16|__nv_bfloat16|bfloat16|\bbf16\b|_bf16_|_bf16$")),
    ("fp8", re.compile(r"Float8_e4m3|Float8_e5m2|__nv_fp8|e4m3|e5m2")),
    ("fp16", re.compile(r"c10::Half|__half\b|half_t|_f16_|_fp16_|\bfp16\b")),
    ("fp64", re.compile(r"\bdouble\b|_dgemm")),
    ("fp32", re.compile(r"\bfloat\b|sgemm|_f32_")),
    ("int64", re.compile(r"\blong\b|<long>|int64")),
)


_SORT_RX = re.compile(r"sort", re.I)  # in a kernel's function name: a sort kernel


def _dtype(dem: str) -> str | None:
    for name, rx in _DTYPES:
        if rx.search(dem):
            return name
    return None


def _trim(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _sfx(dtype: str | None) -> str:
    return f" {dtype}" if dtype else ""


def _nvjet(raw, dem, low, dtype):
    if not raw.startswith("nvjet"):
        return None
    m = re.search(r"_(\d+)x(\d+)_", raw)
    tile = f"{m.group(1)}x{m.group(2)}" if m else ""
    kind = "GEMV" if m and min(int(m.group(1)), int(m.group(2))) <= 16 else "GEMM"
    split = " split-K" if "splitK" in raw else ""
    horiz = " (h)" if "_h_" in raw else ""
    return f"cuBLAS {kind} nvjet {tile}{split}{horiz}".replace("  ", " ").strip(), CUBLAS, GEMM, None


_CUBLAS_RX = re.compile(r"cublas|\bgemvx::|gemv2[NT]_kernel|gemvNSP|gemmSN|gemmk1_kernel|"
                        r"dot_kernel|splitKreduce|(?:ampere|volta|turing|sm\d\d)_\w*gemm|"
                        r"xmma_gemm|s16816gemm|h16816gemm|\bgemv")


def _cublas(raw, dem, low, dtype):
    if "cutlass::Kernel" in dem or not _CUBLAS_RX.search(dem):
        return None
    base = base_name(dem)
    fn = base.rsplit("::", 1)[-1]
    if "splitKreduce" in dem:
        return f"cuBLASLt split-K reduce{_sfx(dtype)}", CUBLAS, GEMM, dtype
    if base.startswith("gemvx") or "gemv" in fn.lower():
        name = base.split("::")[0] if base.startswith("gemvx") else fn.replace("_kernel", "")
        return f"cuBLAS GEMV {name}{_sfx(dtype)}", CUBLAS, GEMM, dtype
    if "dot_kernel" in fn:
        return f"cuBLAS dot{_sfx(dtype)}", CUBLAS, GEMM, dtype
    m = re.search(r"(\d+x\d+)", fn)
    tile = f" {m.group(1)}" if m else ""
    return f"cuBLAS GEMM{tile}{_sfx(dtype)}", CUBLAS, GEMM, dtype


def _flash(raw, dem, low, dtype):
    base = base_name(dem)
    if not re.search(r"(^|::)(pytorch_)?flash(::|_fwd|_bwd)|flash_fwd|flash_bwd", base):
        return None
    fn = base.rsplit("::", 1)[-1]
    if "combine" in fn:
        what = "split-KV combine"
    elif "splitkv" in fn:
        what = "fwd split-KV"
    elif "bwd" in fn:
        what = "bwd"
    else:
        what = "fwd"
    return f"FlashAttention {what}{_sfx(dtype)}", FLASH, ATTENTION, dtype


def _fmha(raw, dem, low, dtype):
    if "fmha_cutlass" not in dem and "PyTorchMemEffAttention" not in dem:
        return None
    what = "bwd" if "cutlassB" in dem else "fwd"
    return (f"ATen mem-efficient attention {what} (CUTLASS fmha){_sfx(dtype)}", ATEN, ATTENTION,
            dtype)


def _cudnn(raw, dem, low, dtype):
    if "cudnn" not in low:
        return None
    arch = re.search(r"_(sm\d+)_", raw)
    sfx = f" {arch.group(1)}" if arch else ""
    if "sdpa" in low or "attention" in low or "fmha" in low or "mha" in low:
        kind = "flash attention" if "flash" in low else "attention"
        direction = "bprop" if "bprop" in low or "bwd" in low else "fprop"
        # cuDNN names say f16 for both 16-bit types: no dtype claimed.
        return f"cuDNN {kind} {direction}{sfx}", CUDNN, ATTENTION, None
    if "gemm" in low or "matmul" in low:
        return f"cuDNN GEMM{sfx}", CUDNN, GEMM, None
    if "norm" in low:
        return f"cuDNN normalisation{sfx}", CUDNN, REDUCTION, None
    return _trim(f"cuDNN {base_name(dem).rsplit('::', 1)[-1]}"), CUDNN, OTHER, None


_NCCL_REDOPS = {"Sum", "Prod", "Min", "Max", "PreMulSum", "SumPostDiv", "Avg"}
_NCCL_ALGOS = {"RING": "ring", "TREE": "tree", "NVLS": "NVLS", "NVLSTREE": "NVLS tree",
               "COLLNET": "CollNet", "COLLNETDIRECT": "CollNet direct",
               "COLLNETCHAIN": "CollNet chain", "PAT": "PAT"}
_NCCL_PROTOS = {"LL": "LL", "LL128": "LL128", "SIMPLE": "Simple"}
_NCCL_TYPES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "fp16", "half": "fp16",
               "f32": "fp32", "float": "fp32", "f64": "fp64", "double": "fp64",
               "f8e4m3": "fp8 e4m3", "f8e5m2": "fp8 e5m2", "i8": "int8", "int8": "int8",
               "u8": "uint8", "uint8": "uint8", "i32": "int32", "int32": "int32",
               "u32": "uint32", "uint32": "uint32", "i64": "int64", "int64": "int64",
               "u64": "uint64", "uint64": "uint64"}
_NCCL_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp64": "fp64"}


def _nccl(raw, dem, low, dtype):
    """NCCL kernels: ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)`` (NCCL >= 2.19) and
    ``ncclKernel_AllReduce_RING_LL_Sum_bfloat16(...)`` (older) -> "NCCL AllReduce bf16 ring LL"."""
    if not low.startswith("nccl") and "nccl" not in base_name(dem).lower():
        return None
    m = re.search(r"nccl(?:Dev)?Kernel_(\w+)", base_name(dem))
    if not m:
        return "NCCL kernel", NCCL, COMMUNICATION, None
    parts = m.group(1).split("_")
    op, rest = parts[0], parts[1:]
    redop = typ = algo = proto = ""
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok.upper() in ("COLLNET", "NVLS") and i + 1 < len(rest) and \
                (tok + rest[i + 1]).upper() in _NCCL_ALGOS:
            algo = _NCCL_ALGOS[(tok + rest[i + 1]).upper()]
            i += 2
            continue
        if tok in _NCCL_REDOPS:
            redop = tok
        elif tok.upper() in _NCCL_ALGOS:
            algo = _NCCL_ALGOS[tok.upper()]
        elif tok.upper() in _NCCL_PROTOS:
            proto = _NCCL_PROTOS[tok.upper()]
        elif tok in _NCCL_TYPES:
            typ = _NCCL_TYPES[tok]
        i += 1
    words = ["NCCL", op, redop.lower() if redop and redop != "Sum" else "", typ, algo, proto]
    return " ".join(w for w in words if w), NCCL, COMMUNICATION, _NCCL_DTYPE.get(typ)


def _cutlass(raw, dem, low, dtype):
    if "cutlass" not in low:
        return None
    m = re.search(r"(cutlass_\w+)", dem)
    inner = m.group(1) if m else base_name(dem)
    tile = re.search(r"(\d+x\d+)_\d+x\d+", inner)
    if re.search(r"gemm|gemv|matmul", inner.lower()) or "Gemm" in dem:
        kind = "SGEMM" if "sgemm" in inner else "GEMM"
        layout = re.search(r"_(nn|nt|tn|tt)_", inner)
        parts = [f"CUTLASS {kind}", tile.group(1) if tile else "",
                 layout.group(1) if layout else "", dtype or ""]
        return " ".join(p for p in parts if p), CUTLASS, GEMM, dtype
    if "attention" in low or "fmha" in low:
        return f"CUTLASS attention{_sfx(dtype)}", CUTLASS, ATTENTION, dtype
    return _trim(f"CUTLASS {inner}"), CUTLASS, OTHER, dtype


# ATen: op name from the functor / lambda, then category from the kernel template.
_ATEN_OP_RX = (
    (re.compile(r"::(Copy)<"), None),
    (re.compile(r"CUDAFunctor(?:OnSelf)?_(\w+?)<"), None),
    (re.compile(r"(\w+?)_kernel_cuda\b"), None),
    (re.compile(r"(\w+?)(?:_tensor_scalar)?_kernel_impl\b"), None),
    (re.compile(r"(\w+?)_cuda_out\b"), None),
    (re.compile(r"::(\w+?)_kernel\("), None),
    (re.compile(r"(\w+?)Functor\b"), None),
)
_COPY_OPS = {"copy", "direct_copy", "bfloat16_copy", "fill", "index_copy", "index_put",
             "index_select", "cat", "gather", "scatter", "clone", "contiguous", "index"}
_GENERIC = {"elementwise", "vectorized_elementwise", "unrolled_elementwise", "gpu_kernel_impl",
            "gpu_kernel_impl_nocast", "index_elementwise", "elementwise_kernel_with_index",
            "Binary", "AUnary", "BUnary", "Unary", "CUDA"}


def _aten_op(dem: str) -> str | None:
    for rx, _ in _ATEN_OP_RX:
        for m in rx.finditer(dem):
            op = m.group(1)
            if op in _GENERIC or op.endswith("elementwise"):
                continue
            op = re.sub(r"^_?GLOBAL__N__\w+?_\d+", "", op)
            op = op.rsplit("_", 1)[-1] if op.startswith(("direct_", "bfloat16_")) else op
            return op.lower().strip("_") or None
    return None


def _aten(raw, dem, low, dtype):
    # at_cuda_detail::cub is PyTorch's own copy of cub (its radix/segmented sorts)
    if ("at::native" not in dem and "at::cuda" not in dem and "at_cuda_detail::" not in dem
            and not raw.startswith("_ZN2at")):
        return None
    base = base_name(dem)
    fn = base.rsplit("::", 1)[-1]
    if "reduce_kernel" in fn:
        m = re.search(r"(\w+?)Ops<", dem)
        op = m.group(1).lower() if m else "reduce"
        return f"ATen reduce {op}{_sfx(dtype)}", ATEN, REDUCTION, dtype
    if "SoftMax" in fn or "softmax" in fn.lower():
        return f"ATen softmax{_sfx(dtype)}", ATEN, REDUCTION, dtype
    if "norm" in fn.lower() or "RowwiseMoments" in fn:
        return f"ATen {fn}{_sfx(dtype)}", ATEN, REDUCTION, dtype
    if _SORT_RX.search(fn):  # bitonic/warpMerge/radixSortKVInPlace, cub radix and segmented sorts
        return _trim(f"ATen sort ({fn}){_sfx(dtype)}"), ATEN, REDUCTION, dtype
    if "topk" in base.lower():  # sbtopk::gatherTopK, mbtopk::radixFindKthValues, ...
        return _trim(f"ATen top-k {fn}{_sfx(dtype)}"), ATEN, REDUCTION, dtype
    if fn == "vectorized_gather_kernel":
        # index/index_select gather of whole rows (x[idx], W[idx]); the template's type is the
        # index type and the data are bytes, so no element type is claimed.
        return "ATen index gather (vectorized)", ATEN, COPY, None
    if "CatArrayBatchedCopy" in fn:
        vec = " (vectorized)" if "vectorized" in fn else ""
        return f"ATen cat{vec}", ATEN, COPY, dtype
    if "indexSelect" in fn:
        return f"ATen index_select{_sfx(dtype)}", ATEN, COPY, dtype
    op = _aten_op(dem) or fn
    if "copy" in op or op in _COPY_OPS:
        cast = "cast " if "LoadWithCast" in dem or "bfloat16_copy" in dem else ""
        name = "index gather" if op == "index" else op  # index_kernel_impl: x[idx]
        return f"ATen {cast}{name}{_sfx(dtype)}", ATEN, COPY, dtype
    if "elementwise" in fn or "multi_tensor_apply" in fn or "Functor" in dem:
        return f"ATen elementwise {op}{_sfx(dtype)}", ATEN, ELEMENTWISE, dtype
    return _trim(f"ATen {fn}{_sfx(dtype)}"), ATEN, OTHER, dtype


# ----------------------------------------------------------------------------- ggml
# ggml's CUDA backend (llama.cpp): free template kernels, no namespace. Each name maps to what
# it does; the quantisation type comes from the template's ``(ggml_type)N`` (ggml.h's enum).
GGML_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
              9: "q8_1", 10: "q2_K", 11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 15: "q8_K",
              16: "iq2_xxs", 17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl", 21: "iq3_s",
              22: "iq2_s", 23: "iq4_xs", 24: "i8", 25: "i16", 26: "i32", 27: "i64", 28: "f64",
              29: "iq1_m", 30: "bf16", 34: "tq1_0", 35: "tq2_0", 39: "mxfp4", 40: "nvfp4"}
_GGML_FLOAT = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}
# name -> (friendly name, category); names ending in "*" match as a prefix
_GGML_KERNELS = {
    "mul_mat_vec_q": ("GEMV mul_mat_vec_q", GEMM), "mul_mat_vec_q_moe": ("GEMV mul_mat_vec_q MoE", GEMM),
    "mul_mat_vec_f": ("GEMV mul_mat_vec_f", GEMM), "mul_mat_q": ("GEMM mul_mat_q", GEMM),
    "mul_mat_q_stream_k_fixup": ("GEMM mul_mat_q stream-K fixup", GEMM),
    "mul_mat_f": ("GEMM mul_mat_f", GEMM), "mul_mat_f_ids": ("GEMM mul_mat_f MoE", GEMM),
    "flash_attn_ext_f16": ("flash-attn (mma f16)", ATTENTION),
    "flash_attn_ext_vec": ("flash-attn (vec)", ATTENTION),
    "flash_attn_tile": ("flash-attn (tile)", ATTENTION),
    "flash_attn_combine_results": ("flash-attn combine", ATTENTION),
    "flash_attn_stream_k_fixup*": ("flash-attn stream-K fixup", ATTENTION),
    "flash_attn_mask_to_KV_max": ("flash-attn KV bound", ATTENTION),
    "flash_attn_mask_to_sparse_indices": ("flash-attn sparse mask", ATTENTION),
    "soft_max_f32*": ("softmax", REDUCTION), "rms_norm_f32": ("rms_norm", REDUCTION),
    "rms_norm_mul_rope_f32": ("rms_norm·mul·rope (fused)", REDUCTION),
    "norm_f32": ("norm", REDUCTION), "group_norm_f32": ("group_norm", REDUCTION),
    "l2_norm_f32": ("l2_norm", REDUCTION), "argmax_f32": ("argmax", REDUCTION),
    "k_argsort_f32_i32": ("argsort", REDUCTION), "reduce_rows_f32*": ("sum/mean rows", REDUCTION),
    "top_k_radix*": ("top-k", REDUCTION), "cumsum*": ("cumsum", REDUCTION),
    "topk_moe_cuda": ("MoE top-k", REDUCTION),
    "rope_norm": ("rope", ELEMENTWISE), "rope_neox": ("rope (neox)", ELEMENTWISE),
    "rope_multi": ("rope (multi)", ELEMENTWISE), "rope_vision": ("rope (vision)", ELEMENTWISE),
    "quantize_q8_1": ("quantize activations q8_1", COPY),
    "quantize_mmq_q8_1": ("quantize activations q8_1 (mmq)", COPY),
    "quantize_mmq_mxfp4": ("quantize activations mxfp4 (mmq)", COPY),
    "k_get_rows*": ("get_rows", COPY), "k_set_rows*": ("set_rows (KV cache write)", COPY),
    "cpy_*": ("copy", COPY), "convert_unary*": ("convert", COPY),
    "dequantize_block*": ("dequantize", COPY), "concat*": ("concat", COPY),
    "k_bin_bcast*": ("binary", ELEMENTWISE), "unary_op_kernel": ("unary", ELEMENTWISE),
    "unary_gated_op_kernel": ("gated", ELEMENTWISE), "scale_f32": ("scale", ELEMENTWISE),
    "swiglu_oai_kernel": ("swiglu (oai)", ELEMENTWISE), "add_id_kernel": ("add_id", ELEMENTWISE),
    "op_clamp_kernel": ("clamp", ELEMENTWISE), "softcap_f32": ("softcap", ELEMENTWISE),
    "pad_f32": ("pad", COPY), "fill_kernel": ("fill", COPY), "arange_f32": ("arange", COPY),
    "k_compute_batched_ptrs": ("batched GEMM pointers", OTHER),
    "moe_weighted_reduction_f32": ("MoE weighted sum", REDUCTION),
    "mm_ids_helper": ("MoE ids", OTHER), "ssm_conv_f32": ("ssm conv", OTHER),
    "ssm_scan_f32": ("ssm scan", OTHER), "im2col_kernel": ("im2col", COPY),
}


def _ggml_lookup(fn: str) -> tuple[str, str] | None:
    got = _GGML_KERNELS.get(fn)
    if got is not None:
        return got
    for k, v in _GGML_KERNELS.items():
        if k.endswith("*") and fn.startswith(k[:-1]):
            return v
    return None


def _ggml_args(dem: str) -> list[str]:
    """The top-level template arguments of a demangled name."""
    i = dem.find("<")
    if i < 0:
        return []
    out, depth, cur = [], 0, []
    for ch in dem[i + 1:]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def _ggml(raw, dem, low, dtype):
    base = base_name(dem)
    if "::" in base:
        return None
    got = _ggml_lookup(base)
    if got is None:
        return None
    what, cat = got
    args = _ggml_args(dem)
    quant = None
    m = re.search(r"\(ggml_type\)(\d+)", dem)
    if m:
        quant = GGML_TYPES.get(int(m.group(1)), f"type {m.group(1)}")
    elif base in ("mul_mat_vec_f", "mul_mat_f", "mul_mat_f_ids") and args:
        quant = {"__half": "f16", "float": "f32", "__nv_bfloat16": "bf16"}.get(args[0])
    dt = _GGML_FLOAT.get(quant or "")   # float parameters say nothing of the data
    extra = ""
    if base.startswith("k_bin_bcast") or base in ("unary_op_kernel", "unary_gated_op_kernel"):
        op = re.search(r"&(?:\w*::)?op_(\w+)", dem)   # &op_add, &_INTERNAL_…::op_silu
        what = f"{op.group(1)}" + (" (gated)" if "gated" in base else "") if op else what
    if base in ("mul_mat_vec_q", "mul_mat_vec_f") and len(args) >= 2:
        # the template's columns (mul_mat_vec_q<type, ncols_dst, ...>, mul_mat_vec_f<T, type_acc,
        # ncols_dst, ...>): tokens of the batch that one launch multiplies
        n = args[1] if base == "mul_mat_vec_q" else (args[2] if len(args) > 2 else "")
        if n.isdigit() and int(n) > 1:
            extra = f" ×{n} tokens"
        if base == "mul_mat_vec_q" and len(args) > 2 and args[2] in ("true", "1"):
            extra += " +fused"
    name = f"ggml {what}" + (f" {quant}" if quant else "") + extra
    return _trim(name), GGML, cat, dt


# ----------------------------------------------------------------------------- Triton
# Multi-word aten op names that appear in Inductor kernel names (leading underscores dropped).
_TRITON_VOCAB = {
    "scaled_dot_product_cudnn_attention", "scaled_dot_product_flash_attention",
    "scaled_dot_product_efficient_attention", "scaled_dot_product_attention",
    "flash_attention", "efficient_attention", "to_copy", "unsafe_view", "scalar_tensor",
    "index_copy", "index_select", "index_put", "native_layer_norm", "layer_norm", "rms_norm",
    "log_softmax", "safe_softmax", "slice_scatter", "select_scatter", "constant_pad_nd",
    "full_like", "zeros_like", "ones_like", "new_zeros", "new_ones", "new_empty",
    "embedding_dense_backward", "masked_fill", "native_dropout", "lift_fresh", "copy_",
    "var_mean", "to_dtype", "_to_copy",
}
_VIEW_OPS = {"unsafe_view", "view", "unsqueeze", "squeeze", "expand", "transpose", "permute",
             "slice", "select", "reshape", "t", "clone", "arange", "scalar_tensor", "to_copy",
             "lift_fresh", "alias", "detach", "as_strided", "full", "empty", "bmm", "mm",
             "addmm", "scaled_dot_product_cudnn_attention", "scaled_dot_product_flash_attention",
             "scaled_dot_product_efficient_attention", "scaled_dot_product_attention", "le",
             "lt", "ge", "gt", "eq", "ne", "where"}
_TRITON_COPY = {"to_copy", "copy", "copy_", "clone", "cat", "index_copy", "index_put",
                "index_select", "embedding", "gather", "slice_scatter", "select_scatter",
                "constant_pad_nd", "fill", "zeros_like", "full_like"}
_SCATTER_OPS = {"index_copy", "index_put", "slice_scatter", "select_scatter"}
_ATTN_OPS = {"scaled_dot_product_cudnn_attention", "scaled_dot_product_flash_attention",
             "scaled_dot_product_efficient_attention", "scaled_dot_product_attention",
             "flash_attention", "efficient_attention", "flex_attention"}


def triton_ops(raw: str) -> list[str]:
    """The aten op names encoded in an Inductor kernel name, in order, underscores stripped."""
    m = re.match(r"triton_(?:poi|red|per|tem|for)_fused_(.*)$", raw)
    if not m:
        m = re.match(r"triton_\w*?_fused_(.*)$", raw)
        if not m:
            return []
    body = re.sub(r"_\d+$", "", m.group(1))
    tokens = body.split("_")
    ops: list[str] = []
    i = 0
    while i < len(tokens):
        if tokens[i] == "":
            i += 1
            continue
        for n in range(min(6, len(tokens) - i), 0, -1):
            cand = "_".join(tokens[i:i + n])
            if n == 1 or cand in _TRITON_VOCAB:
                if cand == "copy" and i + 1 < len(tokens) and tokens[i + 1] == "":
                    cand = "copy_"
                ops.append(cand)
                i += n
                break
    return ops


def _triton(raw: str) -> KernelInfo:
    kind_m = re.match(r"triton_([a-z]+)_", raw)
    kind = kind_m.group(1) if kind_m else ""
    ops = triton_ops(raw)
    opset = set(ops)
    shown = [o for o in ops if o not in _VIEW_OPS] or [o for o in ops if o not in ("unsafe_view", "view")]
    if kind == "tem":
        if opset & _ATTN_OPS or "flex_attention" in raw:
            cat, what = ATTENTION, "attention"
        else:
            cat, what = GEMM, "matmul"
        label = f"Triton {what} template"
        shown = [o for o in ops if o not in ("unsafe_view", "view")]
    elif kind in ("red", "per"):
        cat = REDUCTION
        label = "Triton fused"
    else:
        meaningful = {o for o in ops if o not in _VIEW_OPS - {"to_copy", "clone"}}
        cat = COPY if meaningful and meaningful <= _TRITON_COPY else ELEMENTWISE
        # A scatter into a cache whose index is computed (cache_position + arange) is a copy.
        if meaningful & _SCATTER_OPS and meaningful <= _TRITON_COPY | {"add", "sub"}:
            cat = COPY
        label = "Triton fused"
    if not ops:
        return KernelInfo(raw, raw, _trim(f"Triton {raw[7:]}"), TRITON,
                          ELEMENTWISE if kind == "poi" else (REDUCTION if kind in ("red", "per") else OTHER),
                          None)
    body = "·".join(shown[:5]) + ("…" if len(shown) > 5 else "")
    idx = re.search(r"_(\d+)$", raw)
    num = f" #{idx.group(1)}" if idx else ""
    return KernelInfo(raw, raw, f"{label} {body}{num}".strip(), TRITON, cat, None)
