"""ggml's CUDA kernels (llama.cpp) named and grouped: real mangled names from llama-bench of a
qwen3-0.6b-shaped model on an H200 (Q8_0 and f16, CUDA graphs on), and from the recording in
tests/data; the quantisation type read from the template's ``ggml_type``."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tuiprof.analysis import kernel_info
from tuiprof.analysis.kernels import (ATTENTION, COPY, CUBLAS, CUTLASS, ELEMENTWISE, GEMM, GGML,
                                      REDUCTION)

REAL = [
    ('_Z10k_set_rowsIfl6__halfEvPKT_PKT0_PT1_llllllllllllll5uint3S9_S9_S9_S9_',
     COPY, 'ggml set_rows (KV cache write)'),
    ('_Z11k_bin_bcastIXadL_ZN42_INTERNAL_b4c05585_11_binbcast_cu_6840010b6op_addEffEEfffJPKfEEvP'
     'KT0_PKT1_PT2_jjj5uint3SB_SB_SB_SB_jjjjjjjjjjjDpT3_',
     ELEMENTWISE, 'ggml add'),
    ('_Z12rms_norm_f32ILi1024ELb1ELb0ELb0EEvPKfPfilllfS1_lll5uint3S3_S3_S3_S1_lllS3_S3_S3_S3_f',
     REDUCTION, 'ggml rms_norm'),
    ('_Z13mul_mat_vec_fI6__halfS0_Li1ELi256ELb0ELb0EEvPKT_PKfPKi31ggml_cuda_mm_fusion_args_devic'
     'ePfi5uint3iiiSA_iiiSA_iiii',
     GEMM, 'ggml GEMV mul_mat_vec_f f16'),
    ('_Z13mul_mat_vec_qIL9ggml_type8ELi1ELb0ELb0ELb0EEvPKvS2_PKi31ggml_cuda_mm_fusion_args_devic'
     'ePfj5uint3jjjS7_jjjS7_jjjj',
     GEMM, 'ggml GEMV mul_mat_vec_q q8_0'),
    ('_Z13mul_mat_vec_qIL9ggml_type8ELi1ELb1ELb0ELb0EEvPKvS2_PKi31ggml_cuda_mm_fusion_args_devic'
     'ePfj5uint3jjjS7_jjjS7_jjjj',
     GEMM, 'ggml GEMV mul_mat_vec_q q8_0 +fused'),
    ('_Z13quantize_q8_1PKfPvlllllj5uint3', COPY, 'ggml quantize activations q8_1'),
    ('_Z16k_get_rows_floatIffEvPKT_PKiPT0_ll5uint3mmmmmmmmm', COPY, 'ggml get_rows'),
    ('_Z17quantize_mmq_q8_1IL18mmq_q8_1_ds_layout0ELb0EEvPKfPKiPvllllliii',
     COPY, 'ggml quantize activations q8_1 (mmq)'),
    ('_Z18flash_attn_ext_f16ILi128ELi128ELi32ELi2ELb0ELb0ELb0EEvPKcS1_S1_S1_S1_PKiPfP6float2ffff'
     'jfi5uint3iiiiiiiiiiiliiliiiiil',
     ATTENTION, 'ggml flash-attn (mma f16)'),
    ('_Z18flash_attn_ext_vecILi128ELi1EL9ggml_type1ELS0_1ELb0EEvPKcS2_S2_S2_S2_PKiPfP6float2ffff'
     'jfi5uint3iiiiiiiiiiiliiliiiiil',
     ATTENTION, 'ggml flash-attn (vec) f16'),
    ('_Z21rms_norm_mul_rope_f32ILi256ELb0E6__halfEvPKfPT1_illllllfS2_lll5uint3S5_S5_S5_iPKifff14'
     'rope_corr_dimsfS2_PKlib',
     REDUCTION, 'ggml rms_norm·mul·rope (fused)'),
    ('_Z21unary_gated_op_kernelIXadL_ZN38_INTERNAL_63d59a61_8_unary_cu_eb6d53667op_siluEfEEfEvPK'
     'T0_S3_PS1_llll',
     ELEMENTWISE, 'ggml silu (gated)'),
    ('_Z23convert_unary_cont_vec4I6__halffEvPKvPT0_l', COPY, 'ggml convert'),
    ('_Z24mul_mat_q_stream_k_fixupIL9ggml_type8ELi128ELb0EL9ggml_prec30EEvPKiS3_PfS4_5uint3iiiS5'
     '_iS5_iS5_',
     GEMM, 'ggml GEMM mul_mat_q stream-K fixup q8_0'),
    ('_Z26flash_attn_combine_resultsILi128EEvPKfPK6float2Pfi', ATTENTION, 'ggml flash-attn combine'),
    ('_Z33flash_attn_stream_k_fixup_uniformILi128ELi32ELi2EEvPfPK6float2iiiiii5uint3S4_S4_',
     ATTENTION, 'ggml flash-attn stream-K fixup'),
    ('_Z9mul_mat_qIL9ggml_type8ELi128ELb0EL9ggml_prec30EEvPKcPKiS5_S5_PfS6_PKf5uint3iiiiiS9_S9_ii'
     'iS9_S9_iiiS9_',
     GEMM, 'ggml GEMM mul_mat_q q8_0'),
]


@pytest.mark.parametrize("raw,cat,short", REAL, ids=[r[2] for r in REAL])
def test_real_ggml_names(raw, cat, short):
    k = kernel_info(raw)
    assert (k.library, k.category, k.short) == (GGML, cat, short)
    assert k.demangled != raw


def test_quant_type_and_batch_come_from_the_template():
    """mul_mat_vec_q<(ggml_type)12, 4, …>: a Q4_K weight times 4 tokens (a batch of 4 in one
    launch, as llama-server's slots decode together); the name says both."""
    raw = ("_Z13mul_mat_vec_qIL9ggml_type12ELi4ELb0ELb0ELb0EEvPKvS2_PKi31ggml_cuda_mm_fusion_args"
           "_devicePfj5uint3jjjS7_jjjS7_jjjj")
    k = kernel_info(raw)
    assert k.short == "ggml GEMV mul_mat_vec_q q4_K ×4 tokens" and k.category == GEMM


def test_not_ggml_names_keep_their_rules():
    """cuBLAS's and CUTLASS's kernels (llama.cpp's f16 prompt GEMMs go to cuBLAS) stay theirs,
    and a kernel that merely shares a ggml name inside a namespace is not ggml's."""
    assert kernel_info("_ZN7cutlass7Kernel2I51cutlass_80_tensorop_h16816gemm_64x64_64x6_tn_align8"
                       "EEvNT_6ParamsE").library == CUTLASS
    assert kernel_info("_ZN8cublasLt19splitKreduce_kernelILi32ELi16Ei6__halfS1_S1_S1_Lb0ES1_S1_S1_"
                       "Lb1ELb0ELb0ELb0EEEvNS_18cublasSplitKParamsIT1_EEPKT2_PKT3_PT4_PKT5_S8_PT6"
                       "_PvlPS6_Pi").library == CUBLAS
    assert kernel_info("_ZN3foo8norm_f32EPf").library != GGML


def test_every_kernel_of_the_llamacpp_recording_is_named():
    """Each kernel of the H200 recording (Q8_0 decode, graphs on and off) is ggml's and not
    'other': the decode step reads as GEMV, attention, norms and copies."""
    data = Path(__file__).resolve().parents[1] / "data" / "h200_llamacpp_q8_decode.json.gz"
    doc = json.loads(gzip.decompress(data.read_bytes()))
    names = {r[1] for part in ("graphs", "no_graphs") for r in doc[part] if r[0] == "K"}
    infos = [kernel_info(n) for n in names]
    assert all(k.library == GGML for k in infos), [k.demangled for k in infos if k.library != GGML]
    cats = {k.category for k in infos}
    assert {GEMM, ATTENTION, REDUCTION, COPY} <= cats
