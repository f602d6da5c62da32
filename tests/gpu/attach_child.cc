// attach_child: a worker process for the attach tests. It attaches to a pool
// through client/attach.h, checks one page and writes another.
//
//   attach_child SOCKET SESSION PAGE_TO_READ BYTE PAGE_TO_WRITE BYTE
//
// Exit codes: 0 ok; 2 usage; 3 attach refused (PERMISSION_DENIED); 4 other
// attach error; 5 the read page does not hold the expected byte everywhere;
// 6 a page index is out of range.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "client/attach.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: %s SOCKET SESSION READ_PAGE BYTE WRITE_PAGE BYTE\n",
                 argv[0]);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<radixkv::gpu::MappedPool>> pool =
      radixkv::AttachPool(argv[1], argv[2], absl::Seconds(30));
  if (!pool.ok()) {
    std::fprintf(stderr, "attach_child: %s\n",
                 pool.status().ToString().c_str());
    return absl::IsPermissionDenied(pool.status()) ? 3 : 4;
  }
  uint64_t read_page = std::strtoull(argv[3], nullptr, 10);
  int read_byte = std::atoi(argv[4]);
  uint64_t write_page = std::strtoull(argv[5], nullptr, 10);
  int write_byte = std::atoi(argv[6]);
  const unsigned char* r =
      static_cast<const unsigned char*>((*pool)->page_address(read_page));
  unsigned char* w =
      static_cast<unsigned char*>((*pool)->page_address(write_page));
  if (r == nullptr || w == nullptr) return 6;
  for (uint64_t i = 0; i < (*pool)->page_bytes(); ++i) {
    if (r[i] != read_byte) {
      std::fprintf(stderr, "attach_child: page %llu byte %llu is %d, want %d\n",
                   static_cast<unsigned long long>(read_page),
                   static_cast<unsigned long long>(i), r[i], read_byte);
      return 5;
    }
  }
  std::memset(w, write_byte, (*pool)->page_bytes());
  return 0;
}
