// File: worker/matmul.h
//
// The reference worker's CPU GEMM: C[M][N] (+)= A[M][K] * B[K][N], all fp32
// row-major. B is the weight matrix stored input-major ([in][out]), so the
// innermost loop runs over contiguous output columns and vectorises without
// reassociating any sum.
//
// Blocking: rows in blocks of kRowBlock (A block stays in cache), columns in
// strips of 8 computed by a 4x8 register micro-kernel; work items (row block,
// column group) are spread over threads with gpu::ParallelFor.
//
// Determinism: every C element is summed over k in increasing order with one
// accumulator, whatever M, the blocking or the thread count, so a row's
// result does not depend on which other rows are in the batch (a cached
// prefix + suffix prefill reproduces a full prefill's numbers).
//
// Thread safety: reentrant; C must not alias A or B.
#ifndef RADIXKV_CLIENT_WORKER_MATMUL_H_
#define RADIXKV_CLIENT_WORKER_MATMUL_H_

#include <cstddef>

namespace radixkv::worker {

// C = A * B (accumulate == false) or C += A * B (accumulate == true).
void MatMul(const float* a, const float* b, float* c, size_t m, size_t k,
            size_t n, bool accumulate);

}  // namespace radixkv::worker

#endif  // RADIXKV_CLIENT_WORKER_MATMUL_H_
