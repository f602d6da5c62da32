// File: gpu/pool.cc
//
// --pool parsing and formatting, the `none` backend, and the CreatePagePool
// dispatch to the host (host_pool.cc) and cuda (cuda_pool.cc) backends.
#include "gpu/pool.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gpu/pool_internal.h"

namespace radixkv::gpu {
namespace {
constexpr char kSizeUnits[] = "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB";
// The --pool forms, as the unknown-backend error lists them.
constexpr char kPoolForms[] =
    "host,bytes=SIZE | cuda,device=N,bytes=SIZE | none,pages=N (host and "
    "cuda also take chunk_bytes=SIZE, every form page_bytes=SIZE)";
}  // namespace

bool ParseSize(absl::string_view text, uint64_t* out) {
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(text[digits])) ++digits;
  if (digits == 0 || digits > 20) return false;
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text.substr(0, digits), &value)) return false;
  std::string unit = absl::AsciiStrToLower(text.substr(digits));
  uint64_t mult = 0;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "kib") {
    mult = uint64_t{1} << 10;
  } else if (unit == "mib") {
    mult = uint64_t{1} << 20;
  } else if (unit == "gib") {
    mult = uint64_t{1} << 30;
  } else if (unit == "tib") {
    mult = uint64_t{1} << 40;
  } else if (unit == "kb") {
    mult = 1000;
  } else if (unit == "mb") {
    mult = 1000 * 1000;
  } else if (unit == "gb") {
    mult = 1000 * 1000 * 1000;
  } else if (unit == "tb") {
    mult = uint64_t{1000} * 1000 * 1000 * 1000;
  } else {
    return false;
  }
  if (value > std::numeric_limits<uint64_t>::max() / mult) return false;
  *out = value * mult;
  return true;
}

namespace {

std::string FormatSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"TiB", "GiB", "MiB", "KiB"};
  static constexpr int kShifts[] = {40, 30, 20, 10};
  for (int i = 0; i < 4; ++i) {
    uint64_t unit = uint64_t{1} << kShifts[i];
    if (bytes != 0 && bytes % unit == 0) {
      return absl::StrCat(bytes / unit, kUnits[i]);
    }
  }
  return absl::StrCat(bytes);
}

// The none backend: capacity only, no memory.
class NonePagePool final : public PagePool {
 public:
  explicit NonePagePool(uint64_t capacity) : capacity_(capacity) {}
  Backend backend() const override { return Backend::kNone; }
  uint64_t page_bytes() const override { return 0; }
  uint64_t capacity_pages() const override { return capacity_; }
  uint64_t pages_per_chunk() const override { return 0; }
  int device() const override { return -1; }
  size_t chunk_count() const override { return 0; }
  uint64_t chunk_bytes(size_t) const override { return 0; }
  int chunk_fd(size_t) const override { return -1; }
  void* host_page_address(uint64_t) const override { return nullptr; }

 private:
  const uint64_t capacity_;
};

}  // namespace

const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kNone:
      return "none";
    case Backend::kHost:
      return "host";
    case Backend::kCuda:
      return "cuda";
  }
  return "unknown";
}

absl::StatusOr<PoolSpec> ParsePoolSpec(absl::string_view spec) {
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ',');
  absl::string_view backend = absl::StripAsciiWhitespace(parts[0]);
  PoolSpec out;
  if (backend == "host") {
    out.backend = Backend::kHost;
  } else if (backend == "cuda") {
    out.backend = Backend::kCuda;
  } else if (backend == "none") {
    out.backend = Backend::kNone;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool: unknown backend '", backend, "'; accepted forms: ",
        kPoolForms));
  }
  bool have_bytes = false, have_pages = false, have_device = false,
       have_chunk = false, have_page_bytes = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    absl::string_view part = absl::StripAsciiWhitespace(parts[i]);
    size_t eq = part.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pool: '", part,
                       "' is not key=value (keys: bytes, pages, device, "
                       "chunk_bytes, page_bytes)"));
    }
    absl::string_view key = part.substr(0, eq);
    absl::string_view value = part.substr(eq + 1);
    auto duplicate = [&](bool* seen) {
      bool dup = *seen;
      *seen = true;
      return dup;
    };
    if (key == "page_bytes") {
      if (duplicate(&have_page_bytes)) {
        return absl::InvalidArgumentError("--pool: page_bytes given twice");
      }
      if (!ParseSize(value, &out.page_bytes) || out.page_bytes == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--pool: page_bytes='", value,
            "' is not a size above 0 (an integer with an optional unit: ",
            kSizeUnits, ")"));
      }
    } else if (key == "bytes" || key == "chunk_bytes") {
      bool is_bytes = key == "bytes";
      if (duplicate(is_bytes ? &have_bytes : &have_chunk)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--pool: ", key, " given twice"));
      }
      if (out.backend == Backend::kNone) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--pool: ", key, "= does not apply to none (use pages=N)"));
      }
      uint64_t v = 0;
      if (!ParseSize(value, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--pool: ", key, "='", value,
            "' is not a size (an integer with an optional unit: ", kSizeUnits,
            ")"));
      }
      if (is_bytes && v == 0) {
        return absl::InvalidArgumentError("--pool: bytes=0: must be > 0");
      }
      (is_bytes ? out.bytes : out.chunk_bytes) = v;
    } else if (key == "pages") {
      if (duplicate(&have_pages)) {
        return absl::InvalidArgumentError("--pool: pages given twice");
      }
      if (out.backend != Backend::kNone) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--pool: pages= applies only to none; ", BackendName(out.backend),
            " pools are sized with bytes=SIZE"));
      }
      uint64_t v = 0;
      if (!absl::SimpleAtoi(value, &v) || v == 0 ||
          v > internal::kMaxCapacityPages) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--pool: pages='", value, "' must be an integer in 1..",
            internal::kMaxCapacityPages));
      }
      out.pages = v;
    } else if (key == "device") {
      if (duplicate(&have_device)) {
        return absl::InvalidArgumentError("--pool: device given twice");
      }
      if (out.backend != Backend::kCuda) {
        return absl::InvalidArgumentError(
            absl::StrCat("--pool: device= applies only to cuda, not ",
                         BackendName(out.backend)));
      }
      int v = 0;
      if (!absl::SimpleAtoi(value, &v) || v < 0 || v > 1023) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--pool: device='", value, "' must be an integer in 0..1023"));
      }
      out.device = v;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pool: unknown key '", key, "' for ", BackendName(out.backend),
          " (keys: bytes, pages, device, chunk_bytes, page_bytes)"));
    }
  }
  if (out.backend == Backend::kNone && !have_pages) {
    return absl::InvalidArgumentError(
        "--pool: none needs pages=N (the index capacity in pages)");
  }
  if (out.backend != Backend::kNone && out.page_bytes > out.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool: page_bytes=", out.page_bytes, " exceeds bytes=", out.bytes));
  }
  return out;
}

std::string FormatPoolSpec(const PoolSpec& spec) {
  switch (spec.backend) {
    case Backend::kNone: {
      std::string s = absl::StrCat("none,pages=", spec.pages);
      if (spec.page_bytes != 0) {
        absl::StrAppend(&s, ",page_bytes=", FormatSize(spec.page_bytes));
      }
      return s;
    }
    case Backend::kHost:
    case Backend::kCuda: {
      std::string s = BackendName(spec.backend);
      if (spec.backend == Backend::kCuda) {
        absl::StrAppend(&s, ",device=", spec.device);
      }
      absl::StrAppend(&s, ",bytes=", FormatSize(spec.bytes));
      if (spec.chunk_bytes != 0) {
        absl::StrAppend(&s, ",chunk_bytes=", FormatSize(spec.chunk_bytes));
      }
      if (spec.page_bytes != 0) {
        absl::StrAppend(&s, ",page_bytes=", FormatSize(spec.page_bytes));
      }
      return s;
    }
  }
  return "unknown";
}

namespace internal {

absl::StatusOr<uint64_t> PagesPerChunk(uint64_t capacity, uint64_t page_bytes,
                                       uint64_t chunk_bytes,
                                       uint64_t default_chunk_bytes) {
  uint64_t target = chunk_bytes != 0 ? chunk_bytes : default_chunk_bytes;
  uint64_t per_chunk = target / page_bytes;
  if (per_chunk == 0) per_chunk = 1;
  if (per_chunk > capacity) per_chunk = capacity;
  uint64_t chunks = (capacity + per_chunk - 1) / per_chunk;
  if (chunks > kMaxChunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pool: ", capacity, " pages of ", page_bytes, " bytes need ", chunks,
        " chunks of ", per_chunk, " pages; at most ", kMaxChunks,
        " chunks fit in one attach message: raise chunk_bytes"));
  }
  return per_chunk;
}

}  // namespace internal

absl::Status CheckPoolUsable(const PoolSpec& spec) {
  if (spec.backend != Backend::kCuda) return absl::OkStatus();
  return internal::CheckCudaUsable(spec.device);
}

absl::StatusOr<std::unique_ptr<PagePool>> CreatePagePool(const PoolSpec& spec,
                                                         uint64_t page_bytes) {
  if (spec.backend == Backend::kNone) {
    if (spec.pages == 0 || spec.pages > internal::kMaxCapacityPages) {
      return absl::InvalidArgumentError(
          absl::StrCat("none pool: pages=", spec.pages, " must be in 1..",
                       internal::kMaxCapacityPages));
    }
    return std::unique_ptr<PagePool>(new NonePagePool(spec.pages));
  }
  const char* name = BackendName(spec.backend);
  if (page_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " pool: page_bytes must be > 0"));
  }
  if (page_bytes > spec.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " pool: page_bytes=", page_bytes,
                     " is larger than the pool's budget bytes=", spec.bytes));
  }
  uint64_t capacity = spec.bytes / page_bytes;
  if (capacity > internal::kMaxCapacityPages) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " pool: bytes=", spec.bytes, " / page_bytes=", page_bytes, " = ",
        capacity, " pages, more than the limit of ",
        internal::kMaxCapacityPages));
  }
  if (spec.backend == Backend::kHost) {
    return internal::CreateHostPagePool(spec, page_bytes, capacity);
  }
  return internal::CreateCudaPagePool(spec, page_bytes, capacity);
}

}  // namespace radixkv::gpu
