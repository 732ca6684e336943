"""Names and classes of the MoE routing kernels: top-k, sort (ATen's in-place KV sorts and the
cub radix sorts) and the index gathers/scatters (DeepSeek-style decode, docs/workloads.md).

Raw names: the ``vectorized_gather_kernel``, ``gatherTopK``, ``index_kernel_impl`` /
``index_put_kernel_impl`` and cub downsweep names were reported from real runs; the others are
mangled with g++ from the kernel declarations in ATen's ``SortUtils.cuh`` / ``TensorTopK.cu`` and
cub's ``DeviceRadixSortOnesweepKernel`` (checked here to demangle to those declarations)."""
from __future__ import annotations

import pytest

from tuiprof.analysis import kernel_info

ATEN, OTHER_LIB = "PyTorch ATen", "other"
RED, COPY = "reduction/normalisation", "copy/cast"

ROUTING_NAMES = [
    # (raw, demangled prefix, library, category, dtype, short)
    ("_ZN2at6native20bitonicSortKVInPlaceILi1ELin1ELi16ELi16EllNS0_4LTOpIlLb1EEEjEEvNS_4cuda6detail"
     "10TensorInfoIT3_T6_EES8_S8_S8_NS6_IT4_S8_EES8_T5_",
     "void at::native::bitonicSortKVInPlace<1, -1, 16, 16, long, long, at::native::LTOp<long, true>",
     ATEN, RED, "int64", "ATen sort (bitonicSortKVInPlace) int64"),
    ("_ZN2at6native22warpMergeSortKVInPlaceILi2ELin1ELi128ELi32EllNS0_4LTOpIlLb1EEEjEEvNS_4cuda6detail"
     "10TensorInfoIT3_T6_EES8_S8_S8_NS6_IT4_S8_EES8_T5_S7_",
     "void at::native::warpMergeSortKVInPlace<2, -1, 128, 32, long, long",
     ATEN, RED, "int64", "ATen sort (warpMergeSortKVInPlace) int64"),
    ("_ZN2at6native18radixSortKVInPlaceILi2ELin1ELi128ELi32EfljEEvNS_4cuda6detail10TensorInfoIT3_T5_EES6_"
     "S6_S6_NS4_IT4_S6_EES6_b",
     "void at::native::radixSortKVInPlace<2, -1, 128, 32, float, long, unsigned int>",
     ATEN, RED, "fp32", "ATen sort (radixSortKVInPlace) fp32"),
    # PyTorch's wrapped cub (namespace at_cuda_detail): segmented / large sorts
    ("_ZN14at_cuda_detail3cub29DeviceRadixSortOnesweepKernelINS0_21DeviceRadixSortPolicyIlN2at4cuda3cub6"
     "detail10OpaqueTypeILi8EEEiE9Policy900ELb0ElS8_iiiEEvPT5_SC_PT3_PKSD_PT1_PKSH_PT2_PKSL_T4_ii",
     "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<",
     ATEN, RED, "int64", "ATen sort (DeviceRadixSortOnesweepKernel) int64"),
    ("_ZN14at_cuda_detail3cub29DeviceRadixSortOnesweepKernelINS0_21DeviceRadixSortPolicyIlNS0_8NullTypeEi"
     "E9Policy900ELb0ElS3_iiiEEvPT5_S7_PT3_PKS8_PT1_PKSC_PT2_PKSG_T4_ii",
     "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<long, "
     "at_cuda_detail::cub::NullType", ATEN, RED, "int64", "ATen sort (DeviceRadixSortOnesweepKernel) int64"),
    ("_ZN14at_cuda_detail3cub30DeviceRadixSortDownsweepKernelINS0_21DeviceRadixSortPolicyIiN2at4cuda3cub6"
     "detail10OpaqueTypeILi1EEEiE9Policy800ELb0ELb0EiS8_iEEvPKT2_PSB_PKT3_PSF_PT4_SJ_iiNS0_13GridEvenShare"
     "ISJ_EE", "void at_cuda_detail::cub::DeviceRadixSortDownsweepKernel<",
     ATEN, RED, None, "ATen sort (DeviceRadixSortDownsweepKernel)"),
    # cub outside PyTorch (CCCL's versioned namespace)
    ("_ZN3cub17CUB_200700_900_NS29DeviceRadixSortOnesweepKernelINS0_21DeviceRadixSortPolicyImjiE9Policy900"
     "ELb0EmjiiiEEvPT5_S6_PT3_PKS7_PT1_PKSB_PT2_PKSF_T4_ii",
     "void cub::CUB_200700_900_NS::DeviceRadixSortOnesweepKernel<", OTHER_LIB, RED, "int64",
     "sort (DeviceRadixSortOnesweepKernel)"),
    # top-k: single-block and multi-block
    ("_ZN2at6native6sbtopk10gatherTopKIfjLi2ELb0EEEvNS_4cuda6detail10TensorInfoIT_T0_EES7_S7_bS7_S7_S8_S7_"
     "NS5_IlS7_EES7_PS6_", "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>",
     ATEN, RED, "fp32", "ATen top-k gatherTopK fp32"),
    ("_ZN2at6native6mbtopk18radixFindKthValuesIfjjLi2EEEvNS_4cuda6detail10TensorInfoIKT_T0_EEjPjjS8_iijT1_"
     "PSB_SA_Ps", "void at::native::mbtopk::radixFindKthValues<float, unsigned int, unsigned int, 2>",
     ATEN, RED, "fp32", "ATen top-k radixFindKthValues fp32"),
    # gathers: x[idx] / W[idx] (vectorized row gather, and the generic index kernel)
    ("_ZN2at6native24vectorized_gather_kernelILi16ElEEvPcS2_PT0_illllb",
     "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*",
     ATEN, COPY, None, "ATen index gather (vectorized)"),
    ("_ZN2at6native24index_elementwise_kernelILi128ELi4EZNS0_16gpu_index_kernelIZNS0_17index_kernel_implINS0_"
     "10OpaqueTypeILi1EEEEEvRNS_18TensorIteratorBaseEN3c108ArrayRefIlEESA_EUlPcPKclE_EEvS7_SA_SA_RKT_bEUliE_"
     "EEvlT1_", "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::"
     "index_kernel_impl<", ATEN, COPY, "int64", "ATen index gather int64"),
    # scatter back: new_x[idxs] = outs
    ("_ZN2at6native24index_elementwise_kernelILi128ELi4EZNS0_16gpu_index_kernelIZNS0_21index_put_kernel_impl"
     "INS0_10OpaqueTypeILi2EEEEEvRNS_14TensorIteratorEN3c108ArrayRefIlEESA_EUlPcPKclE_EEvRNS_18TensorIterator"
     "BaseESA_SA_RKT_bEUliE_EEvlT1_", "void at::native::index_elementwise_kernel<128, 4, at::native::"
     "gpu_index_kernel<at::native::index_put_kernel_impl<", ATEN, COPY, "int64", "ATen index_put int64"),
]


@pytest.mark.parametrize("raw,dem_prefix,lib,cat,dtype,short", ROUTING_NAMES, ids=[r[5] for r in ROUTING_NAMES])
def test_routing_kernel_names(raw, dem_prefix, lib, cat, dtype, short):
    k = kernel_info(raw)
    assert k.demangled.startswith(dem_prefix)
    assert (k.library, k.category, k.dtype, k.short) == (lib, cat, dtype, short)


def test_every_sort_kernel_says_sort_and_no_routing_kernel_is_other():
    for raw, *_ in ROUTING_NAMES:
        k = kernel_info(raw)
        assert k.category != "other"
        if "Sort" in k.demangled.split("<", 1)[0]:
            assert "sort" in k.short and k.category == RED
        if "topk" in k.demangled.split("<", 1)[0].lower():
            assert "top-k" in k.short
