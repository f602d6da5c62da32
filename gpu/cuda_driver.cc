// File: gpu/cuda_driver.cc
#include "gpu/cuda_driver.h"

#include <cuda_runtime_api.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace radixkv::gpu::internal {
namespace {

std::string RuntimeError(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), " (", static_cast<int>(err),
                      "): ", cudaGetErrorString(err));
}

template <typename Fn>
absl::Status Fetch(const char* name, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &p, 12000,
                                                     cudaEnableDefault, &query);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda pool: no CUDA driver/device: fetching ", name, ": ",
                     RuntimeError(err)));
  }
  if (query != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda pool: the CUDA driver does not provide ", name,
                     " (driver too old for CUDA 12.0 entry points?)"));
  }
  *fn = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

absl::StatusOr<CudaDriver> Load() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda pool: no CUDA driver/device: cudaGetDeviceCount: ",
                     err != cudaSuccess ? RuntimeError(err) : "0 devices"));
  }
  CudaDriver d;
  absl::Status s;
  auto fetch = [&s](const char* name, auto* fn) {
    if (s.ok()) s = Fetch(name, fn);
  };
  fetch("cuGetErrorString", &d.GetErrorString);
  fetch("cuDeviceGet", &d.DeviceGet);
  fetch("cuDeviceGetAttribute", &d.DeviceGetAttribute);
  fetch("cuMemGetAllocationGranularity", &d.MemGetAllocationGranularity);
  fetch("cuMemCreate", &d.MemCreate);
  fetch("cuMemRelease", &d.MemRelease);
  fetch("cuMemExportToShareableHandle", &d.MemExportToShareableHandle);
  fetch("cuMemImportFromShareableHandle", &d.MemImportFromShareableHandle);
  fetch("cuMemAddressReserve", &d.MemAddressReserve);
  fetch("cuMemAddressFree", &d.MemAddressFree);
  fetch("cuMemMap", &d.MemMap);
  fetch("cuMemUnmap", &d.MemUnmap);
  fetch("cuMemSetAccess", &d.MemSetAccess);
  if (!s.ok()) return s;
  return d;
}

}  // namespace

absl::StatusOr<const CudaDriver*> GetCudaDriver() {
  static const absl::StatusOr<CudaDriver>* const driver =
      new absl::StatusOr<CudaDriver>(Load());
  if (!driver->ok()) return driver->status();
  return &**driver;
}

absl::Status UseCudaDevice(const CudaDriver& driver, int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda pool: no CUDA driver/device: cudaGetDeviceCount: ",
                     RuntimeError(err)));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda pool: device=", device, " but this machine has ",
                     count, " CUDA device(s)"));
  }
  err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaFree(nullptr);  // creates the context
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda pool: initialising device ", device, ": ", RuntimeError(err)));
  }
  CUdevice dev = 0;
  RETURN_IF_ERROR(
      CuStatus(driver, driver.DeviceGet(&dev, device), "cuDeviceGet"));
  int vmm = 0, posix_fd = 0;
  driver.DeviceGetAttribute(
      &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  driver.DeviceGetAttribute(
      &posix_fd,
      CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
  if (!vmm || !posix_fd) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda pool: device ", device,
        " does not support virtual memory management with POSIX fd handles "
        "(vmm=",
        vmm, ", posix_fd=", posix_fd, ")"));
  }
  return absl::OkStatus();
}

absl::Status CuStatus(const CudaDriver& driver, CUresult result,
                      absl::string_view what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  if (driver.GetErrorString == nullptr ||
      driver.GetErrorString(result, &text) != CUDA_SUCCESS || text == nullptr) {
    text = "unknown CUDA error";
  }
  std::string msg = absl::StrCat("cuda pool: ", what, ": ", text, " (",
                                 static_cast<int>(result), ")");
  if (result == CUDA_ERROR_OUT_OF_MEMORY) {
    return absl::ResourceExhaustedError(msg);
  }
  if (result == CUDA_ERROR_NO_DEVICE || result == CUDA_ERROR_NOT_INITIALIZED ||
      result == CUDA_ERROR_NOT_SUPPORTED) {
    return absl::FailedPreconditionError(msg);
  }
  return absl::InternalError(msg);
}

}  // namespace radixkv::gpu::internal
