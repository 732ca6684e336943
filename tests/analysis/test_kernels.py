"""Kernel names and classes on every distinct kernel name of both H100 fixtures, and on the
names reported by the source studies (constructed mangled names, checked to demangle)."""
from __future__ import annotations

import pytest

from tuiprof.analysis import demangle, kernel_info
from tuiprof.analysis.kernels import triton_ops

from analysis_names import (ALL_NAMES, ATEN, ATTN, COMM, COPY, CUBLAS, CUTLASS, ELT, FLASH, GEMM,
                            NCCL, OTHER, RECORDED_NAMES, RED, TRITON)

STUDY_NAMES = [
    # cuBLAS GEMV (cublasGemvParamsEx)
    ("_ZN5gemvx6kernelIii13__nv_bfloat16S1_S1_fLb0ELb1ELb1ELb0ELi7ELb0E18cublasGemvParamsExIi30"
     "cublasGemvTensorStridedBatchedIKS1_ES5_S3_IS1_EfEEEvT11_",
     CUBLAS, GEMM, "bf16", "void gemvx::kernel<int, int, __nv_bfloat16", "cuBLAS GEMV gemvx bf16"),
    # CUTLASS tensor-op GEMM
    ("_ZN7cutlass7Kernel2I68cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8"
     "EEvNT_6ParamsE", CUTLASS, GEMM, "bf16", "void cutlass::Kernel2<cutlass_80_wmma_tensorop",
     "CUTLASS GEMM 32x32 tn bf16"),
    ("_ZN2at6native20bitonicSortKVInPlaceILi2ELin1ELi16ELi16EflNS0_4LTOpIfLb1EEEjEEvNS_4cuda6detail"
     "10TensorInfoIT3_T6_EES8_S8_S8_NS6_IT4_S8_EES8_T5_", ATEN, RED, "fp32",
     "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long", "ATen sort (bitonicSortKVInPlace) fp32"),
    ("_ZN2at6native6sbtopk10gatherTopKIfjLi2ELb0EEEvNS_4cuda6detail10TensorInfoIKT_T0_EES8_S8_bS8_"
     "S8_NS5_IS6_S8_EES8_NS5_IlS8_EES8_PS8_", ATEN, RED, "fp32",
     "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>", "ATen top-k gatherTopK fp32"),
    ("_ZN5flash24flash_fwd_splitkv_kernelI23Flash_fwd_kernel_traitsILi128ELi64ELi128ELi4ELb0ELb0E"
     "N7cutlass10bfloat16_tE19Flash_kernel_traitsILi128ELi64ELi128ELi4ES3_EELb0ELb1ELb0ELb0ELb1E"
     "Lb1ELb0ELb0EEEv16Flash_fwd_params", FLASH, ATTN, "bf16",
     "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4",
     "FlashAttention fwd split-KV bf16"),
    ("_ZN5flash32flash_fwd_splitkv_combine_kernelI23Flash_fwd_kernel_traitsILi128ELi64ELi128ELi4E"
     "Lb0ELb0EN7cutlass10bfloat16_tE19Flash_kernel_traitsILi128ELi64ELi128ELi4ES3_EELi4ELi1ELb1E"
     "EEv16Flash_fwd_params", FLASH, ATTN, "bf16", "void flash::flash_fwd_splitkv_combine_kernel<",
     "FlashAttention split-KV combine bf16"),
    ("_ZN13pytorch_flash24flash_fwd_splitkv_kernelI23Flash_fwd_kernel_traitsILi128ELi64ELi128ELi4E"
     "Lb0ELb0EN7cutlass10bfloat16_tE19Flash_kernel_traitsILi128ELi64ELi128ELi4ES3_EELb0ELb1ELb0E"
     "Lb0ELb1ELb1ELb0ELb0EEEvNS_16Flash_fwd_paramsE", FLASH, ATTN, "bf16",
     "void pytorch_flash::flash_fwd_splitkv_kernel<", "FlashAttention fwd split-KV bf16"),
    ("_Z41fmha_cutlassF_bf16_aligned_64x128_rf_sm80N22PyTorchMemEffAttention15AttentionKernelIN7"
     "cutlass10bfloat16_tENS1_4arch4Sm80ELb1ELi64ELi128ELi128ELb1ELb1EE6ParamsE", ATEN, ATTN, "bf16",
     "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<",
     "ATen mem-efficient attention fwd (CUTLASS fmha) bf16"),
    ("_ZN2at6native19cunn_SoftMaxForwardILi8EN3c108BFloat16EffNS0_22SoftMaxForwardEpilogueEEEvPT2_"
     "PKT0_i", ATEN, RED, "bf16", "void at::native::cunn_SoftMaxForward<8, c10::BFloat16",
     "ATen softmax bf16"),
    ("_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE", NCCL, COMM,
     "bf16", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "NCCL AllReduce bf16 ring LL"),
]


@pytest.mark.parametrize("raw,lib,cat,dtype", ALL_NAMES, ids=[r[0][:48] for r in ALL_NAMES])
def test_recorded_names(raw, lib, cat, dtype):
    k = kernel_info(raw)
    assert (k.library, k.category, k.dtype) == (lib, cat, dtype)
    assert k.short and len(k.short) <= 70 and not k.short.endswith(" ")
    if raw.startswith("_Z"):
        assert k.demangled != raw and "(" in k.demangled


def test_recorded_names_cover_both_recordings(eager_json, compiled_json):
    names = {r[1] for d in (eager_json, compiled_json) for r in d["records"] if r[0] == "K"}
    assert names == {r[0] for r in RECORDED_NAMES}
    assert all(kernel_info(n).category != OTHER for n in names)


@pytest.mark.parametrize("raw,lib,cat,dtype,dem_prefix,short", STUDY_NAMES,
                         ids=[r[5] for r in STUDY_NAMES])
def test_study_names(raw, lib, cat, dtype, dem_prefix, short):
    k = kernel_info(raw)
    assert k.demangled.startswith(dem_prefix)
    assert (k.library, k.category, k.dtype, k.short) == (lib, cat, dtype, short)


@pytest.mark.parametrize("raw,short", [
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "cuBLAS GEMV nvjet 64x8"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "cuBLAS GEMV nvjet 64x8 split-K"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x128_1x4x1_"
     "cga1x1x1_kernel0_0", "cuDNN flash attention fprop sm80"),
    ("_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_22gpu_kernel_impl_nocastINS0_13BinaryFunctor"
     "IN3c108BFloat16ES5_S5_NS0_15binary_internal10MulFunctorIfEEEEEEvRNS_18TensorIteratorBaseERKT_"
     "EUliE_EEviT1_", "ATen elementwise mul bf16"),
    ("triton_per_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_12",
     "Triton fused add·mean·mul·pow·rsqrt #12"),
    ("triton_poi_fused__unsafe_view_mul_silu_9", "Triton fused mul·silu #9"),
])
def test_short_names(raw, short):
    assert kernel_info(raw).short == short


def test_triton_classes():
    assert kernel_info("triton_tem_fused_addmm_0").category == GEMM
    assert kernel_info("triton_tem_fused_mm_relu_3").library == TRITON
    assert kernel_info("triton_red_fused__softmax_1").category == RED
    assert kernel_info("triton_poi_fused__to_copy_1").category == COPY
    assert kernel_info("triton_poi_fused_add_mul_2").category == ELT
    assert triton_ops("triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy_add_3") == [
        "scaled_dot_product_cudnn_attention", "to_copy", "add"]
    assert triton_ops("triton_poi_fused_add_copy__17") == ["add", "copy_"]


def test_demangle_fallback_and_cache():
    bad = "_Zthis_is_not_valid"
    assert demangle(bad) == bad
    assert kernel_info(bad).raw == bad
    assert demangle("nvjet_sm90") == "nvjet_sm90"
    before = kernel_info.cache_info().hits
    kernel_info(ALL_NAMES[0][0])
    kernel_info(ALL_NAMES[0][0])
    assert kernel_info.cache_info().hits >= before + 1


@pytest.mark.parametrize("raw,short", [
    # NCCL >= 2.19 (H200, torch 2.11): collective, reduction, type, algorithm, protocol
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "NCCL AllReduce bf16 ring LL"),
    ("_Z42ncclDevKernel_AllReduce_Sum_f32_TREE_LL12824ncclDevKernelArgsStorageILm4096EE",
     "NCCL AllReduce fp32 tree LL128"),
    ("ncclDevKernel_AllGather_RING_SIMPLE(ncclDevKernelArgsStorage<4096ul>)",
     "NCCL AllGather ring Simple"),
    ("ncclDevKernel_ReduceScatter_Max_bf16_COLLNET_DIRECT_SIMPLE(ncclDevKernelArgsStorage<4096ul>)",
     "NCCL ReduceScatter max bf16 CollNet direct Simple"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "NCCL SendRecv"),
    # NCCL 2.1x: algorithm and protocol before the reduction and type
    ("ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWorkElem)", "NCCL AllReduce bf16 ring LL"),
])
def test_nccl_names_say_collective_type_algorithm_protocol(raw, short):
    k = kernel_info(raw)
    assert (k.short, k.library, k.category) == (short, NCCL, COMM)
