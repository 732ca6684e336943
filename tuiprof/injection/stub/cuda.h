/* The few CUDA driver types the CUPTI headers name, so that tuiprof's injection library builds
 * against the CUPTI headers of the nvidia-cuda-cupti package alone (that package ships no
 * cuda.h). Only handles, enums and one 16-byte struct: the library reads no field of these
 * types, and their sizes are those of the driver's ABI (a pointer, an int, 16 bytes). */
#ifndef __cuda_cuda_h__
#define __cuda_cuda_h__
#define TUIPROF_CUDA_STUB 1

#include <stddef.h>
#include <stdint.h>

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
typedef struct CUaccessPolicyWindow_st CUaccessPolicyWindow;      /* used through a pointer */
typedef union CUlaunchAttributeValue_union CUstreamAttrValue;     /* used through a pointer */
typedef enum CUdevice_attribute_enum { TUIPROF_CU_DEVICE_ATTRIBUTE_ = 0 } CUdevice_attribute;
typedef enum CUgraphNodeType_enum { TUIPROF_CU_GRAPH_NODE_TYPE_ = 0 } CUgraphNodeType;
typedef enum CUlaunchAttributeID_enum { TUIPROF_CU_LAUNCH_ATTRIBUTE_ = 0 } CUstreamAttrID;
typedef enum cudaError_enum { CUDA_SUCCESS = 0 } CUresult;

#endif
