// The CUDA simulator's data type tags (library_types.h), as cuBLAS takes them.
#pragma once
enum cudaDataType_t : int {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
};
typedef cudaDataType_t cudaDataType;
enum libraryPropertyType : int { MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2 };
