// The CUDA simulator's cuBLASLt (cublasLt.h): the handle the runtime creates; no Lt call is
// simulated.
#pragma once
#include "cublas_v2.h"

typedef struct cublasLtContext* cublasLtHandle_t;
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
