// safetensors reading and writing (safetensors.h).
#include "launcher/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "nlohmann/json.hpp"
#include "runtime/error.h"

namespace weft {
namespace {

// The safetensors library refuses headers above 100 MB; a larger length is a damaged file.
constexpr uint64_t kMaximumHeaderBytes = 100'000'000;
// A header nests 3 deep (header, entry, shape). The JSON parser takes any depth, but printing a
// value (the error messages do) recurses once per level, so a damaged header of a million '[' would
// overflow the stack: deeper than this is an error at parse time.
constexpr int kMaximumHeaderDepth = 64;
constexpr char kMetadataKey[] = "__metadata__";

struct DTypeName {
  const char* name;
  DType dtype;
};
// What weft reads (floating) and writes (also integers, should a caller store ids).
constexpr DTypeName kReadable[] = {{"F32", kFloat32}, {"F16", kFloat16}, {"BF16", kBFloat16}, {"F64", kFloat64}};
constexpr DTypeName kWritable[] = {{"F32", kFloat32}, {"F16", kFloat16}, {"BF16", kBFloat16},
                                   {"F64", kFloat64}, {"I32", kInt32},   {"I64", kInt64}};

// A non-negative integer of the header, or an error naming the field.
int64_t header_integer(const nlohmann::json& value, const std::string& what) {
  WEFT_CHECK(value.is_number_unsigned() ||
                 (value.is_number_integer() && value.get<int64_t>() >= 0),
             what, " must be a non-negative integer, got ", value.dump());
  const uint64_t number = value.get<uint64_t>();
  WEFT_CHECK(number <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), what, " is too large: ", number);
  return static_cast<int64_t>(number);
}

// fsync through a descriptor opened for it: the folder after a rename.
void sync_path(const std::string& path) {
  const int descriptor = ::open(path.c_str(), O_RDONLY);
  if (descriptor < 0) return;
  ::fsync(descriptor);
  ::close(descriptor);
}

}  // namespace

DType safetensors_dtype(const std::string& name, const std::string& what) {
  for (const DTypeName& entry : kReadable) {
    if (name == entry.name) return entry.dtype;
  }
  WEFT_FAIL(what, " has dtype '", name, "', which weft does not read; weft reads F32, F16, BF16 and F64 "
            "(convert the file's weights to one of them)");
}

std::string safetensors_dtype_name(DType dtype) {
  for (const DTypeName& entry : kWritable) {
    if (dtype == entry.dtype) return entry.name;
  }
  WEFT_FAIL("safetensors: no dtype name for ", dtype_name(dtype));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int descriptor = ::open(path.c_str(), O_RDONLY);
  WEFT_CHECK(descriptor >= 0, "cannot open safetensors file '", path, "': ", std::strerror(errno));
  struct stat status {};
  if (::fstat(descriptor, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(descriptor);
    WEFT_FAIL("safetensors file '", path, "' is not a regular file");
  }
  file_bytes_ = static_cast<int64_t>(status.st_size);
  if (file_bytes_ < 8) {
    ::close(descriptor);
    WEFT_FAIL("safetensors file '", path, "' is ", file_bytes_, " bytes, shorter than the 8-byte header length: "
              "the file is truncated or not a safetensors file");
  }
  void* mapped = ::mmap(nullptr, static_cast<size_t>(file_bytes_), PROT_READ, MAP_PRIVATE, descriptor, 0);
  ::close(descriptor);  // the mapping keeps the file
  WEFT_CHECK(mapped != MAP_FAILED, "cannot map safetensors file '", path, "': ", std::strerror(errno));
  mapped_ = static_cast<const uint8_t*>(mapped);

  // From here on a failure must unmap: the destructor does not run for a throwing constructor.
  try {
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, mapped_, 8);  // little-endian, as the hosts weft runs on
    WEFT_CHECK(header_bytes <= static_cast<uint64_t>(file_bytes_ - 8), "safetensors file '", path,
               "': the header length ", header_bytes, " reaches beyond the end of the file (", file_bytes_,
               " bytes): the file is truncated or not a safetensors file");
    WEFT_CHECK(header_bytes <= kMaximumHeaderBytes, "safetensors file '", path, "': the header length ", header_bytes,
               " is above the format's limit of ", kMaximumHeaderBytes, " bytes: the file is damaged");
    data_start_ = 8 + static_cast<int64_t>(header_bytes);
    const int64_t data_bytes = file_bytes_ - data_start_;

    nlohmann::json header;
    try {
      header = nlohmann::json::parse(
          reinterpret_cast<const char*>(mapped_) + 8, reinterpret_cast<const char*>(mapped_) + data_start_,
          [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
            WEFT_CHECK(depth <= kMaximumHeaderDepth, "safetensors file '", path, "': the header nests deeper than ",
                       kMaximumHeaderDepth, " levels (a safetensors header nests 3): the file is damaged or not a "
                       "safetensors file");
            return true;
          });
    } catch (const nlohmann::json::exception& error) {
      WEFT_FAIL("safetensors file '", path, "': the header is not valid JSON (", error.what(),
                "): the file is damaged or not a safetensors file");
    }
    WEFT_CHECK(header.is_object(), "safetensors file '", path, "': the header must be a JSON object, got ",
               header.type_name());

    for (const auto& [name, value] : header.items()) {
      if (name == kMetadataKey) {
        WEFT_CHECK(value.is_object() || value.is_null(), "safetensors file '", path,
                   "': __metadata__ must be an object of text values");
        if (value.is_null()) continue;
        for (const auto& [key, text] : value.items()) {
          WEFT_CHECK(text.is_string(), "safetensors file '", path, "': __metadata__ entry '", key,
                     "' must be text, got ", text.dump());
          metadata_[key] = text.get<std::string>();
        }
        continue;
      }
      const std::string what = str("safetensors file '", path, "', tensor '", name, "'");
      WEFT_CHECK(value.is_object(), what, ": its entry must be an object with dtype, shape and data_offsets");
      for (const char* field : {"dtype", "shape", "data_offsets"}) {
        WEFT_CHECK(value.contains(field), what, ": the entry has no '", field, "'");
      }
      SafetensorsEntry entry;
      entry.name = name;
      WEFT_CHECK(value.at("dtype").is_string(), what, ": dtype must be text, got ", value.at("dtype").dump());
      entry.dtype = value.at("dtype").get<std::string>();
      const DType dtype = safetensors_dtype(entry.dtype, what);
      const nlohmann::json& shape = value.at("shape");
      WEFT_CHECK(shape.is_array(), what, ": shape must be a list of sizes, got ", shape.dump());
      int64_t elements = 1;
      // The sizes' product with each 0 taken as 1, in bytes: what the tensor's strides reach. A
      // shape such as [0, 2^62, 2^62] holds no element, yet its strides would overflow int64.
      int64_t extent = dtype_size(dtype);
      for (const nlohmann::json& size : shape) {
        const int64_t dimension = header_integer(size, what + " shape entry");
        WEFT_CHECK(!__builtin_mul_overflow(extent, std::max<int64_t>(dimension, 1), &extent), what, ": shape ",
                   shape.dump(), " is too large for any tensor: the file is damaged");
        elements *= dimension;  // at most extent / dtype size, so it cannot overflow
        entry.shape.push_back(dimension);
      }
      const nlohmann::json& offsets = value.at("data_offsets");
      WEFT_CHECK(offsets.is_array() && offsets.size() == 2, what, ": data_offsets must be [BEGIN, END], got ",
                 offsets.dump());
      entry.begin = header_integer(offsets[0], what + " data_offsets BEGIN");
      entry.end = header_integer(offsets[1], what + " data_offsets END");
      WEFT_CHECK(entry.begin <= entry.end, what, ": data_offsets [", entry.begin, ", ", entry.end,
                 "] end before they begin");
      WEFT_CHECK(entry.end <= data_bytes, what, ": data_offsets [", entry.begin, ", ", entry.end,
                 "] reach beyond the data, which is ", data_bytes, " bytes: the file is truncated or damaged");
      const int64_t expected_bytes = elements * dtype_size(dtype);
      WEFT_CHECK(entry.end - entry.begin == expected_bytes, what, ": shape ", shape_string(entry.shape), " of ",
                 entry.dtype, " is ", expected_bytes, " bytes, but data_offsets [", entry.begin, ", ", entry.end,
                 "] hold ", entry.end - entry.begin);
      entries_[name] = std::move(entry);
    }

    // No two tensors may share bytes: sorted by start, each must begin at or after the previous end.
    std::vector<const SafetensorsEntry*> by_offset;
    for (const auto& [name, entry] : entries_) {
      if (entry.end > entry.begin) by_offset.push_back(&entry);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const SafetensorsEntry& previous = *by_offset[i - 1];
      const SafetensorsEntry& current = *by_offset[i];
      WEFT_CHECK(current.begin >= previous.end, "safetensors file '", path, "': tensor '", current.name,
                 "' (bytes [", current.begin, ", ", current.end, "]) overlaps tensor '", previous.name, "' (bytes [",
                 previous.begin, ", ", previous.end, "]): the file is damaged");
    }
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(mapped_), static_cast<size_t>(file_bytes_));
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapped_ != nullptr) ::munmap(const_cast<uint8_t*>(mapped_), static_cast<size_t>(file_bytes_));
}

Tensor SafetensorsFile::read(const std::string& name, DType dtype) const {
  const auto found = entries_.find(name);
  WEFT_CHECK(found != entries_.end(), "safetensors file '", path_, "' has no tensor '", name, "'");
  const SafetensorsEntry& entry = found->second;
  const DType stored = safetensors_dtype(entry.dtype, str("safetensors file '", path_, "', tensor '", name, "'"));
  Tensor tensor = Tensor::empty(entry.shape, stored);
  if (entry.end > entry.begin) {
    std::memcpy(tensor.raw_data(), mapped_ + data_start_ + entry.begin, static_cast<size_t>(entry.end - entry.begin));
  }
  return stored == dtype ? tensor : tensor.to(dtype);
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Contiguous host copies first: the header holds every offset before the first data byte.
  std::vector<std::pair<std::string, Tensor>> host;
  nlohmann::ordered_json header;
  nlohmann::ordered_json header_metadata = nlohmann::ordered_json::object();
  std::map<std::string, std::string> all_metadata = metadata;
  all_metadata["format"] = "pt";
  for (const auto& [key, text] : all_metadata) header_metadata[key] = text;
  header[kMetadataKey] = header_metadata;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {  // std::map: sorted names
    WEFT_CHECK(name != kMetadataKey, "write_safetensors: '", kMetadataKey, "' cannot name a tensor");
    WEFT_CHECK(tensor.defined(), "write_safetensors: the tensor '", name, "' is undefined");
    Tensor contiguous = tensor.detach().to(Device::cpu()).contiguous();
    const int64_t bytes = contiguous.numel() * contiguous.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(contiguous.dtype())},
                    {"shape", std::vector<int64_t>(contiguous.shape().begin(), contiguous.shape().end())},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    host.emplace_back(name, std::move(contiguous));
  }
  std::string header_text = header.dump();
  // The data starts 8-byte aligned, so a reader may map f64 tensors in place.
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');

  const std::filesystem::path target(path);
  const std::filesystem::path folder = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  const std::string temporary =
      (folder / str(".", target.filename().string(), ".tmp-", ::getpid())).string();
  const int descriptor = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  WEFT_CHECK(descriptor >= 0, "write_safetensors: cannot create '", temporary, "': ", std::strerror(errno),
             "; check that the folder '", folder.string(), "' exists and is writable");
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::close(descriptor);
    ::unlink(temporary.c_str());
    WEFT_FAIL("write_safetensors: cannot ", what, " '", path, "': ", reason);
  };
  auto write_all = [&](const void* data, size_t bytes) {
    const auto* cursor = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t written = ::write(descriptor, cursor, bytes);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) fail("write");
      cursor += written;
      bytes -= static_cast<size_t>(written);
    }
  };
  const uint64_t header_bytes = header_text.size();
  write_all(&header_bytes, 8);
  write_all(header_text.data(), header_text.size());
  for (const auto& [name, tensor] : host) {
    write_all(tensor.raw_data(), static_cast<size_t>(tensor.numel() * tensor.element_size()));
  }
  if (::fsync(descriptor) != 0) fail("flush to disk");
  if (::close(descriptor) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temporary.c_str());
    WEFT_FAIL("write_safetensors: cannot close '", temporary, "': ", reason);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temporary.c_str());
    WEFT_FAIL("write_safetensors: cannot rename '", temporary, "' to '", path, "': ", reason);
  }
  sync_path(folder.string());
}

}  // namespace weft
