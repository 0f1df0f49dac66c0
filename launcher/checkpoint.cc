#include "launcher/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace weft {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'W', 'E', 'F', 'T', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
// magic, version, reserved, file bytes, entry count.
constexpr uint64_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;
constexpr uint64_t kChecksumBytes = 8;

constexpr uint64_t kFnvOffsetBasis = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t fnv1a(uint64_t hash, const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t index = 0; index < size; ++index) {
    hash ^= bytes[index];
    hash *= kFnvPrime;
  }
  return hash;
}

// Writes a file through a raw descriptor, so that it can be fsynced, hashing every byte written.
class HashingFileWriter {
 public:
  explicit HashingFileWriter(std::string path) : path_(std::move(path)) {
    descriptor_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    WEFT_CHECK(descriptor_ >= 0, "save_checkpoint: cannot create '", path_, "': ", std::strerror(errno));
  }
  ~HashingFileWriter() {
    if (descriptor_ >= 0) ::close(descriptor_);
  }
  HashingFileWriter(const HashingFileWriter&) = delete;
  HashingFileWriter& operator=(const HashingFileWriter&) = delete;

  void write(const void* data, size_t size) {
    hash_ = fnv1a(hash_, data, size);
    write_unhashed(data, size);
  }
  template <class T>
  void write_value(const T& value) {
    write(&value, sizeof(value));
  }
  void write_string(const std::string& text) {
    write_value(static_cast<uint32_t>(text.size()));
    write(text.data(), text.size());
  }
  // The checksum itself is not part of what it sums.
  void write_checksum() {
    const uint64_t checksum = hash_;
    write_unhashed(&checksum, sizeof(checksum));
  }
  // fsync, then close: the data is on disk before anything renames the file into place.
  void finish() {
    WEFT_CHECK(::fsync(descriptor_) == 0, "save_checkpoint: cannot flush '", path_, "' to disk: ",
               std::strerror(errno));
    const int descriptor = descriptor_;
    descriptor_ = -1;
    WEFT_CHECK(::close(descriptor) == 0, "save_checkpoint: closing '", path_, "' failed: ", std::strerror(errno));
  }

 private:
  void write_unhashed(const void* data, size_t size) {
    const auto* bytes = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t written = ::write(descriptor_, bytes, size);
      if (written < 0 && errno == EINTR) continue;
      WEFT_CHECK(written > 0, "save_checkpoint: writing '", path_, "' failed: ", std::strerror(errno));
      bytes += written;
      size -= static_cast<size_t>(written);
    }
  }

  std::string path_;
  int descriptor_ = -1;
  uint64_t hash_ = kFnvOffsetBasis;
};

// A rename is only durable once the folder that holds the entry is synced.
void sync_folder(const std::string& path) {
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  WEFT_CHECK(descriptor >= 0, "save_checkpoint: cannot open the folder '", path, "': ", std::strerror(errno));
  const int result = ::fsync(descriptor);
  const int error = errno;
  ::close(descriptor);
  WEFT_CHECK(result == 0, "save_checkpoint: cannot flush the folder '", path, "' to disk: ", std::strerror(error));
}

void write_text_file(const std::string& path, const std::string& text) {
  HashingFileWriter writer(path);
  writer.write(text.data(), text.size());
  writer.finish();
}

// Puts the complete folder `source` at `target`. When `target` exists (the same step saved again),
// the two are exchanged in one atomic step, so a `latest` that names the step never sees it missing;
// `source` then holds the old folder, which the caller removes.
void move_into_place(const std::string& source, const std::string& target) {
  if (!fs::exists(target)) {
    WEFT_CHECK(::rename(source.c_str(), target.c_str()) == 0, "save_checkpoint: cannot rename '", source, "' to '",
               target, "': ", std::strerror(errno));
    return;
  }
  if (::renameat2(AT_FDCWD, source.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) return;
  // Some file systems (older NFS, overlay setups) cannot exchange; move the old one aside first.
  // A crash between the two renames leaves no step_N, which only matters if `latest` names it.
  WEFT_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP, "save_checkpoint: cannot replace '", target,
             "': ", std::strerror(errno));
  const std::string aside = source + ".old";
  WEFT_CHECK(::rename(target.c_str(), aside.c_str()) == 0, "save_checkpoint: cannot move the old '", target,
             "' aside: ", std::strerror(errno));
  WEFT_CHECK(::rename(source.c_str(), target.c_str()) == 0, "save_checkpoint: cannot rename '", source, "' to '",
             target, "': ", std::strerror(errno));
  WEFT_CHECK(::rename(aside.c_str(), source.c_str()) == 0, "save_checkpoint: cannot rename '", aside, "': ",
             std::strerror(errno));
}

void write_tensors(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  // Copied to contiguous CPU tensors first: the header records the file size, which needs every
  // byte count before the first byte is written.
  std::vector<std::pair<std::string, Tensor>> host;
  uint64_t file_bytes = kHeaderBytes + kChecksumBytes;
  for (const auto& [name, tensor] : tensors) {
    WEFT_CHECK(tensor.defined(), "save_checkpoint: the tensor '", name, "' is undefined");
    Tensor contiguous = tensor.detach().to(Device::cpu()).contiguous();
    const std::string dtype(dtype_name(contiguous.dtype()));
    file_bytes += 4 + name.size() + 4 + dtype.size() + 4 + 8 * contiguous.shape().size() + 8 +
                  static_cast<uint64_t>(contiguous.numel() * contiguous.element_size());
    host.emplace_back(name, std::move(contiguous));
  }

  HashingFileWriter writer(path);
  writer.write(kMagic, sizeof(kMagic));
  writer.write_value(kVersion);
  writer.write_value(uint32_t{0});
  writer.write_value(file_bytes);
  writer.write_value(static_cast<uint64_t>(host.size()));
  for (const auto& [name, tensor] : host) {
    writer.write_string(name);
    writer.write_string(std::string(dtype_name(tensor.dtype())));
    writer.write_value(static_cast<uint32_t>(tensor.shape().size()));
    for (const int64_t size : tensor.shape()) writer.write_value(size);
    const auto bytes = static_cast<uint64_t>(tensor.numel() * tensor.element_size());
    writer.write_value(bytes);
    if (bytes > 0) writer.write(tensor.raw_data(), bytes);
  }
  writer.write_checksum();
  writer.finish();
}

// Reads tensors.bin, checking each field against the file (see the header comment for the order).
class TensorFileReader {
 public:
  explicit TensorFileReader(std::string path) : path_(std::move(path)), stream_(path_, std::ios::binary) {
    WEFT_CHECK(stream_, "load_checkpoint: cannot open '", path_, "': ", std::strerror(errno));
    stream_.seekg(0, std::ios::end);
    file_bytes_ = static_cast<uint64_t>(stream_.tellg());
    stream_.seekg(0);
  }

  std::map<std::string, Tensor> read_all() {
    WEFT_CHECK(file_bytes_ >= kHeaderBytes + kChecksumBytes, "load_checkpoint: '", path_, "' is ", file_bytes_,
               " bytes, shorter than any checkpoint (", kHeaderBytes + kChecksumBytes,
               "): the file is truncated");
    char magic[sizeof(kMagic)];
    read(magic, sizeof(magic));
    WEFT_CHECK(std::memcmp(magic, kMagic, sizeof(kMagic)) == 0, "load_checkpoint: '", path_,
               "' does not start with \"WEFTCKPT\": it is not a weft checkpoint (or is corrupt)");
    const auto version = read_value<uint32_t>();
    WEFT_CHECK(version == kVersion, "load_checkpoint: '", path_, "' is checkpoint format version ", version,
               "; this weft reads version ", kVersion);
    read_value<uint32_t>();  // reserved
    const auto recorded_bytes = read_value<uint64_t>();
    WEFT_CHECK(file_bytes_ >= recorded_bytes, "load_checkpoint: '", path_, "' is ", file_bytes_,
               " bytes but was written with ", recorded_bytes, ": the file is truncated");
    WEFT_CHECK(file_bytes_ == recorded_bytes, "load_checkpoint: '", path_, "' is ", file_bytes_,
               " bytes but was written with ", recorded_bytes, ": the file is corrupt");
    verify_checksum();

    stream_.seekg(static_cast<std::streamoff>(kHeaderBytes - 8));
    offset_ = kHeaderBytes - 8;
    const auto entries = read_value<uint64_t>();
    std::map<std::string, Tensor> tensors;
    for (uint64_t entry = 0; entry < entries; ++entry) {
      const std::string name = read_string("a tensor name");
      const std::string dtype_text = read_string("a dtype name");
      DType dtype;
      try {
        dtype = parse_dtype(dtype_text);
      } catch (const Error&) {
        WEFT_FAIL("load_checkpoint: '", path_, "': the tensor '", name, "' has the unknown dtype '", dtype_text, "'");
      }
      const auto rank = read_value<uint32_t>();
      WEFT_CHECK(static_cast<uint64_t>(rank) * 8 <= remaining(), "load_checkpoint: '", path_, "': the tensor '",
                 name, "' has rank ", rank, ", more than the file can hold");
      std::vector<int64_t> shape(rank);
      int64_t numel = 1;
      for (int64_t& size : shape) {
        size = read_value<int64_t>();
        WEFT_CHECK(size >= 0, "load_checkpoint: '", path_, "': the tensor '", name, "' has a negative size ", size);
        numel *= size;
      }
      const auto bytes = read_value<uint64_t>();
      const auto expected = static_cast<uint64_t>(numel * dtype_size(dtype));
      WEFT_CHECK(bytes == expected, "load_checkpoint: '", path_, "': the tensor '", name, "' stores ", bytes,
                 " bytes, but ", numel, " elements of ", dtype_text, " take ", expected);
      WEFT_CHECK(bytes <= remaining(), "load_checkpoint: '", path_, "': the tensor '", name, "' needs ", bytes,
                 " bytes, more than the ", remaining(), " left in the file");
      Tensor tensor = Tensor::empty(shape, dtype);
      if (bytes > 0) read(tensor.raw_data(), bytes);
      WEFT_CHECK(tensors.emplace(name, std::move(tensor)).second, "load_checkpoint: '", path_,
                 "' holds the tensor '", name, "' twice");
    }
    WEFT_CHECK(remaining() == 0, "load_checkpoint: '", path_, "' has ", remaining(),
               " bytes after its last tensor: the file is corrupt");
    return tensors;
  }

 private:
  // Bytes before the checksum not read yet.
  uint64_t remaining() const { return file_bytes_ - kChecksumBytes - offset_; }

  void read(void* destination, uint64_t size) {
    WEFT_CHECK(size <= file_bytes_ - offset_, "load_checkpoint: '", path_, "' ends early: the file is truncated");
    stream_.read(static_cast<char*>(destination), static_cast<std::streamsize>(size));
    WEFT_CHECK(stream_, "load_checkpoint: reading '", path_, "' failed: ", std::strerror(errno));
    offset_ += size;
  }
  template <class T>
  T read_value() {
    T value;
    read(&value, sizeof(value));
    return value;
  }
  std::string read_string(const char* what) {
    const auto size = read_value<uint32_t>();
    WEFT_CHECK(size <= remaining(), "load_checkpoint: '", path_, "': ", what, " of ", size,
               " bytes runs past the end of the file");
    std::string text(size, '\0');
    read(text.data(), size);
    return text;
  }

  // Reads the whole file once more, in blocks, before any field past the header is trusted.
  void verify_checksum() {
    stream_.seekg(0);
    offset_ = 0;
    std::vector<char> block(1 << 20);
    uint64_t hash = kFnvOffsetBasis;
    uint64_t left = file_bytes_ - kChecksumBytes;
    while (left > 0) {
      const uint64_t take = std::min<uint64_t>(left, block.size());
      read(block.data(), take);
      hash = fnv1a(hash, block.data(), take);
      left -= take;
    }
    const auto stored = read_value<uint64_t>();
    WEFT_CHECK(hash == stored, "load_checkpoint: '", path_, "': checksum mismatch: the file is corrupt or truncated");
  }

  std::string path_;
  std::ifstream stream_;
  uint64_t file_bytes_ = 0;
  uint64_t offset_ = 0;
};

std::string read_whole_file(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  WEFT_CHECK(stream, "load_checkpoint: cannot open '", path, "': ", std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
}

}  // namespace

std::string checkpoint_folder_name(int64_t step) {
  WEFT_CHECK(step >= 0, "checkpoint: the step must not be negative, got ", step);
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

void save_checkpoint(const std::string& dir, int64_t step, const std::map<std::string, Tensor>& tensors,
                     const nlohmann::json& state) {
  WEFT_CHECK(state.is_object() || state.is_null(), "save_checkpoint: the state must be a JSON object, got ",
             state.type_name());
  const std::string name = checkpoint_folder_name(step);
  std::error_code error;
  const bool created = fs::create_directories(dir, error);
  WEFT_CHECK(!error, "save_checkpoint: cannot create the checkpoint folder '", dir, "': ", error.message());
  if (created) {
    // The new folder's own entry must reach the disk too, or a crash could lose every step in it.
    fs::path folder = fs::absolute(dir);
    if (!folder.has_filename()) folder = folder.parent_path();  // "ckpt/" names "ckpt"
    sync_folder(folder.parent_path().string());
  }

  const std::string pid = std::to_string(::getpid());
  const std::string temporary = (fs::path(dir) / (".tmp-" + name + "-" + pid)).string();
  const std::string final_path = (fs::path(dir) / name).string();
  fs::remove_all(temporary, error);  // left by an earlier crash of a process with this pid
  fs::create_directory(temporary, error);
  WEFT_CHECK(!error, "save_checkpoint: cannot create '", temporary, "': ", error.message());
  try {
    write_tensors((fs::path(temporary) / "tensors.bin").string(), tensors);
    nlohmann::json saved = state.is_null() ? nlohmann::json::object() : state;
    saved["step"] = step;
    write_text_file((fs::path(temporary) / "state.json").string(), saved.dump(2) + "\n");
    sync_folder(temporary);
    move_into_place(temporary, final_path);
    sync_folder(dir);
    fs::remove_all(temporary, error);  // the replaced step, if there was one

    const std::string latest_temporary = (fs::path(dir) / (".latest.tmp-" + pid)).string();
    write_text_file(latest_temporary, name + "\n");
    const std::string latest = (fs::path(dir) / "latest").string();
    WEFT_CHECK(::rename(latest_temporary.c_str(), latest.c_str()) == 0, "save_checkpoint: cannot rename '",
               latest_temporary, "' to '", latest, "': ", std::strerror(errno));
    sync_folder(dir);
  } catch (...) {
    fs::remove_all(temporary, error);
    fs::remove((fs::path(dir) / (".latest.tmp-" + pid)), error);
    throw;
  }
}

std::string latest_checkpoint(const std::string& dir) {
  const fs::path latest = fs::path(dir) / "latest";
  std::error_code error;
  if (!fs::exists(latest, error)) return "";
  std::string name = read_whole_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  // `latest` holds a folder name, never a path, so a hand-edited one cannot point outside `dir`.
  WEFT_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
             "checkpoint: '", latest.string(), "' should hold a step folder name such as 'step_00000200', not '",
             name, "'");
  const fs::path folder = fs::path(dir) / name;
  WEFT_CHECK(fs::is_directory(folder, error), "checkpoint: '", latest.string(), "' names '", name,
             "', but there is no folder '", folder.string(), "'");
  return folder.string();
}

LoadedCheckpoint load_checkpoint(const std::string& path_or_latest_dir) {
  std::error_code error;
  const fs::path given(path_or_latest_dir);
  WEFT_CHECK(fs::is_directory(given, error), "load_checkpoint: no such checkpoint folder '", path_or_latest_dir,
             "'");
  std::string folder = path_or_latest_dir;
  if (!fs::exists(given / "tensors.bin", error)) {
    WEFT_CHECK(fs::exists(given / "latest", error), "load_checkpoint: '", path_or_latest_dir,
               "' is neither a checkpoint step folder (it has no tensors.bin) nor a checkpoint folder (it has no "
               "'latest' file)");
    folder = latest_checkpoint(path_or_latest_dir);
  }

  LoadedCheckpoint checkpoint;
  checkpoint.path = folder;
  checkpoint.tensors = TensorFileReader((fs::path(folder) / "tensors.bin").string()).read_all();

  const std::string state_path = (fs::path(folder) / "state.json").string();
  WEFT_CHECK(fs::exists(state_path, error), "load_checkpoint: '", folder, "' has no state.json: the checkpoint is "
             "incomplete");
  try {
    checkpoint.state = nlohmann::json::parse(read_whole_file(state_path));
  } catch (const nlohmann::json::exception& exception) {
    WEFT_FAIL("load_checkpoint: '", state_path, "' is not valid JSON (", exception.what(),
              "): the file is corrupt or was edited");
  }
  WEFT_CHECK(checkpoint.state.is_object() && checkpoint.state.contains("step") &&
                 checkpoint.state["step"].is_number_integer(),
             "load_checkpoint: '", state_path, "' has no integer \"step\"");
  checkpoint.step = checkpoint.state["step"].get<int64_t>();
  return checkpoint;
}

}  // namespace weft
