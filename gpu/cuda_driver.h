// File: gpu/cuda_driver.h
//
// The CUDA driver-API entry points the cuda pool needs, fetched at run time
// with cudaGetDriverEntryPointByVersion. Only cudart is linked, never
// libcuda, so binaries start on machines without an NVIDIA driver and the
// cuda backend reports FAILED_PRECONDITION there instead.
//
// Compiled only when the CUDA toolkit is found (RADIXKV_GPU_WITH_CUDA).
//
// Thread safety: GetCudaDriver() loads once (thread-safe static init) and
// returns an immutable table.
#ifndef RADIXKV_GPU_CUDA_DRIVER_H_
#define RADIXKV_GPU_CUDA_DRIVER_H_

#include <cuda.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace radixkv::gpu::internal {

struct CudaDriver {
  decltype(&::cuGetErrorString) GetErrorString = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) MemGetAllocationGranularity =
      nullptr;
  decltype(&::cuMemCreate) MemCreate = nullptr;
  decltype(&::cuMemRelease) MemRelease = nullptr;
  decltype(&::cuMemExportToShareableHandle) MemExportToShareableHandle =
      nullptr;
  decltype(&::cuMemImportFromShareableHandle) MemImportFromShareableHandle =
      nullptr;
  decltype(&::cuMemAddressReserve) MemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) MemAddressFree = nullptr;
  decltype(&::cuMemMap) MemMap = nullptr;
  decltype(&::cuMemUnmap) MemUnmap = nullptr;
  decltype(&::cuMemSetAccess) MemSetAccess = nullptr;
};

// The driver table, or FAILED_PRECONDITION "cuda pool: no CUDA driver/device:
// ..." when the runtime finds no driver or no device (error 35 on machines
// without a driver), or a driver entry point is missing.
absl::StatusOr<const CudaDriver*> GetCudaDriver();

// Checks that `device` exists and supports VMM with POSIX-fd handles, makes
// it current on the calling thread and initialises its primary context.
// FAILED_PRECONDITION naming the device and the device count otherwise.
absl::Status UseCudaDevice(const CudaDriver& driver, int device);

// OK for CUDA_SUCCESS; otherwise a status "cuda pool: <what>: <error name>"
// (RESOURCE_EXHAUSTED for out-of-memory, INTERNAL otherwise).
absl::Status CuStatus(const CudaDriver& driver, CUresult result,
                      absl::string_view what);

}  // namespace radixkv::gpu::internal

#endif  // RADIXKV_GPU_CUDA_DRIVER_H_
