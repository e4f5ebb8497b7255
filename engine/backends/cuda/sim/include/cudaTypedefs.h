// The CUDA simulator's driver entry point types (cudaTypedefs.h), for the calls runtime.cpp
// provides.
#pragma once
#include "cuda.h"

typedef CUresult (*PFN_cuGetErrorString_v6000)(CUresult, const char**);
typedef CUresult (*PFN_cuDeviceGet_v2000)(CUdevice*, int);
typedef CUresult (*PFN_cuDeviceGetAttribute_v2000)(int*, CUdevice_attribute, CUdevice);
typedef CUresult (*PFN_cuMemGetAllocationGranularity_v10020)(size_t*, const CUmemAllocationProp*,
                                                             CUmemAllocationGranularity_flags);
typedef CUresult (*PFN_cuMemAddressReserve_v10020)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                                   unsigned long long);
typedef CUresult (*PFN_cuMemAddressFree_v10020)(CUdeviceptr, size_t);
typedef CUresult (*PFN_cuMemCreate_v10020)(CUmemGenericAllocationHandle*, size_t,
                                           const CUmemAllocationProp*, unsigned long long);
typedef CUresult (*PFN_cuMemRelease_v10020)(CUmemGenericAllocationHandle);
typedef CUresult (*PFN_cuMemMap_v10020)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                        unsigned long long);
typedef CUresult (*PFN_cuMemUnmap_v10020)(CUdeviceptr, size_t);
typedef CUresult (*PFN_cuMemSetAccess_v10020)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
