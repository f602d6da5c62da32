// CUDA pool tests (ctest label `gpu`): a cuda pool created in this process,
// its chunks exported as POSIX fds, served over the attach socket and
// imported by a second process, which reads what this one wrote and writes
// a page this one then reads. Skips (GTEST_SKIP) without a CUDA device.
//
// The same binary is the second process: `cuda_pool_test --child SOCKET
// SESSION READ_PAGE BYTE WRITE_PAGE BYTE` (exit 0 ok, 3 attach failed,
// 4 CUDA error, 5 wrong bytes).
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/attach.h"
#include "daemon/rpc/attach_server.h"
#include "gpu/mapped_pool.h"
#include "gpu/pool.h"
#include "gtest/gtest.h"

extern char** environ;

namespace {

using radixkv::gpu::Backend;
using radixkv::gpu::MappedPool;
using radixkv::gpu::PagePool;

constexpr uint64_t kMiB = uint64_t{1} << 20;
// Not a multiple of the 2 MiB granularity, so chunks need rounding.
constexpr uint64_t kPageBytes = kMiB + 4096;

std::string g_self;

bool HaveDevice() {
  int n = 0;  // cudaGetDeviceCount leaves it unset on error 35 (no driver)
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

bool PageHolds(const MappedPool& pool, uint64_t page, unsigned char byte) {
  std::vector<unsigned char> host(pool.page_bytes());
  if (cudaMemcpy(host.data(), pool.page_address(page), host.size(),
                 cudaMemcpyDeviceToHost) != cudaSuccess) {
    return false;
  }
  for (unsigned char b : host) {
    if (b != byte) return false;
  }
  return true;
}

int ChildMain(int argc, char** argv) {
  if (argc != 8) return 2;
  absl::StatusOr<std::unique_ptr<MappedPool>> pool =
      radixkv::AttachPool(argv[2], argv[3], absl::Seconds(60));
  if (!pool.ok()) {
    std::fprintf(stderr, "child: %s\n", pool.status().ToString().c_str());
    return 3;
  }
  if ((*pool)->backend() != Backend::kCuda) return 3;
  uint64_t read_page = std::strtoull(argv[4], nullptr, 10);
  int read_byte = std::atoi(argv[5]);
  uint64_t write_page = std::strtoull(argv[6], nullptr, 10);
  int write_byte = std::atoi(argv[7]);
  if (!PageHolds(**pool, read_page, static_cast<unsigned char>(read_byte))) {
    return 5;
  }
  if (cudaMemset((*pool)->page_address(write_page), write_byte,
                 (*pool)->page_bytes()) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    return 4;
  }
  return 0;
}

TEST(CudaPoolTest, CreateExportAndImportInTwoProcesses) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<radixkv::gpu::PoolSpec> spec = radixkv::gpu::ParsePoolSpec(
      "cuda,device=0,bytes=96MiB,chunk_bytes=32MiB");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<std::unique_ptr<PagePool>> pool =
      radixkv::gpu::CreatePagePool(*spec, kPageBytes);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const PagePool& p = **pool;
  EXPECT_EQ(p.backend(), Backend::kCuda);
  EXPECT_EQ(p.device(), 0);
  EXPECT_EQ(p.capacity_pages(), 96 * kMiB / kPageBytes);
  EXPECT_EQ(p.pages_per_chunk(), 32 * kMiB / kPageBytes);
  EXPECT_EQ(p.host_page_address(0), nullptr);
  for (size_t c = 0; c < p.chunk_count(); ++c) {
    EXPECT_GE(p.chunk_fd(c), 0);
    EXPECT_EQ(p.chunk_bytes(c) % (2 * kMiB), 0u) << "chunk " << c;
  }

  // This process maps its own exported chunks, as a worker would.
  absl::StatusOr<std::unique_ptr<MappedPool>> local = MappedPool::MapLocal(p);
  ASSERT_TRUE(local.ok()) << local.status();
  const uint64_t last = p.capacity_pages() - 1;
  ASSERT_EQ(cudaMemset((*local)->page_address(3), 0x5a, kPageBytes),
            cudaSuccess);
  ASSERT_EQ(cudaMemset((*local)->page_address(last), 0, kPageBytes),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  radixkv::daemon::AttachServer::Options opts;
  opts.path = absl::StrCat("/tmp/rkv-cuda-", ::getpid(), ".sock");
  absl::StatusOr<std::unique_ptr<radixkv::daemon::AttachServer>> server =
      radixkv::daemon::AttachServer::Start(
          opts, [&p](absl::string_view id) -> const PagePool* {
            return id == "cuda-session" ? &p : nullptr;
          });
  ASSERT_TRUE(server.ok()) << server.status();

  std::vector<std::string> args = {g_self,
                                   "--child",
                                   opts.path,
                                   "cuda-session",
                                   "3",
                                   std::to_string(0x5a),
                                   std::to_string(last),
                                   std::to_string(0x77)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  ASSERT_EQ(::posix_spawn(&pid, g_self.c_str(), nullptr, nullptr, argv.data(),
                          environ),
            0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(PageHolds(**local, last, 0x77));
  EXPECT_TRUE(PageHolds(**local, 3, 0x5a));
  EXPECT_EQ((*server)->stats().served, 1u);
}

}  // namespace

int main(int argc, char** argv) {
  g_self = "/proc/self/exe";
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) g_self.assign(buf, static_cast<size_t>(n));
  if (argc > 1 && std::strcmp(argv[1], "--child") == 0) {
    return ChildMain(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
