#include "launcher/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "launcher/crc32c.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

namespace weft {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'W', 'E', 'F', 'T', 'C', 'K', 'P', 'T'};
// Version 1: one FNV-1a 64 of the whole file at its end. Version 2 (written now): a CRC32C of the
// header and one of each entry, so that damage is named down to the tensor.
constexpr uint32_t kWholeFileChecksumVersion = 1;
constexpr uint32_t kVersion = 2;
// magic, version, header checksum (reserved in version 1), file bytes, entry count.
constexpr uint64_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;
constexpr uint64_t kHeaderChecksumOffset = 8 + 4;
constexpr uint64_t kEntryChecksumBytes = 4;
constexpr uint64_t kWholeFileChecksumBytes = 8;  // version 1 only

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

// Writes a file through a raw descriptor, so that it can be fsynced, keeping the CRC32C of what was
// written since the last restart_checksum() (one tensor entry's checksum).
class SyncedFileWriter {
 public:
  explicit SyncedFileWriter(std::string path) : path_(std::move(path)) {
    descriptor_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    WEFT_CHECK(descriptor_ >= 0, "save_checkpoint: cannot create '", path_, "': ", std::strerror(errno));
  }
  ~SyncedFileWriter() {
    if (descriptor_ >= 0) ::close(descriptor_);
  }
  SyncedFileWriter(const SyncedFileWriter&) = delete;
  SyncedFileWriter& operator=(const SyncedFileWriter&) = delete;

  void write(const void* data, size_t size) {
    checksum_ = crc32c(checksum_, data, size);
    const auto* bytes = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t written = ::write(descriptor_, bytes, size);
      if (written < 0 && errno == EINTR) continue;
      WEFT_CHECK(written > 0, "save_checkpoint: writing '", path_, "' failed: ", std::strerror(errno));
      bytes += written;
      size -= static_cast<size_t>(written);
    }
  }
  template <class T>
  void write_value(const T& value) {
    write(&value, sizeof(value));
  }
  void write_string(const std::string& text) {
    write_value(static_cast<uint32_t>(text.size()));
    write(text.data(), text.size());
  }
  void restart_checksum() { checksum_ = 0; }
  uint32_t checksum() const { return checksum_; }
  // fsync, then close: the data is on disk before anything renames the file into place.
  void finish() {
    WEFT_CHECK(::fsync(descriptor_) == 0, "save_checkpoint: cannot flush '", path_, "' to disk: ",
               std::strerror(errno));
    const int descriptor = descriptor_;
    descriptor_ = -1;
    WEFT_CHECK(::close(descriptor) == 0, "save_checkpoint: closing '", path_, "' failed: ", std::strerror(errno));
  }

 private:
  std::string path_;
  int descriptor_ = -1;
  uint32_t checksum_ = 0;
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
  SyncedFileWriter writer(path);
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
  uint64_t file_bytes = kHeaderBytes;
  for (const auto& [name, tensor] : tensors) {
    WEFT_CHECK(tensor.defined(), "save_checkpoint: the tensor '", name, "' is undefined");
    Tensor contiguous = tensor.detach().to(Device::cpu()).contiguous();
    const std::string dtype(dtype_name(contiguous.dtype()));
    file_bytes += 4 + name.size() + 4 + dtype.size() + 4 + 8 * contiguous.shape().size() + 8 +
                  static_cast<uint64_t>(contiguous.numel() * contiguous.element_size()) + kEntryChecksumBytes;
    host.emplace_back(name, std::move(contiguous));
  }

  // The header's checksum is taken with its own field as 0, then stored in that field.
  char header[kHeaderBytes] = {};
  const uint64_t entries = host.size();
  std::memcpy(header, kMagic, sizeof(kMagic));
  std::memcpy(header + 8, &kVersion, 4);
  std::memcpy(header + 16, &file_bytes, 8);
  std::memcpy(header + 24, &entries, 8);
  const uint32_t header_checksum = crc32c(0, header, sizeof(header));
  std::memcpy(header + kHeaderChecksumOffset, &header_checksum, 4);

  SyncedFileWriter writer(path);
  writer.write(header, sizeof(header));
  for (const auto& [name, tensor] : host) {
    writer.restart_checksum();
    writer.write_string(name);
    writer.write_string(std::string(dtype_name(tensor.dtype())));
    writer.write_value(static_cast<uint32_t>(tensor.shape().size()));
    for (const int64_t size : tensor.shape()) writer.write_value(size);
    const auto bytes = static_cast<uint64_t>(tensor.numel() * tensor.element_size());
    writer.write_value(bytes);
    if (bytes > 0) writer.write(tensor.raw_data(), bytes);
    const uint32_t entry_checksum = writer.checksum();
    writer.write_value(entry_checksum);
  }
  writer.finish();
}

// Reads tensors.bin, checking each field against the file (see the header comment for the order).
// `step` and `advice` go into the messages about damaged bytes: which save it was, and what to do.
class TensorFileReader {
 public:
  TensorFileReader(std::string path, int64_t step, std::string advice)
      : path_(std::move(path)), step_(step), advice_(std::move(advice)), stream_(path_, std::ios::binary) {
    WEFT_CHECK(stream_, "load_checkpoint: cannot open '", path_, "': ", std::strerror(errno));
    stream_.seekg(0, std::ios::end);
    file_bytes_ = static_cast<uint64_t>(stream_.tellg());
    stream_.seekg(0);
  }

  std::map<std::string, Tensor> read_all() {
    WEFT_CHECK(file_bytes_ >= kHeaderBytes, "load_checkpoint: '", path_, "' is ", file_bytes_,
               " bytes, shorter than any checkpoint (", kHeaderBytes, "): the file is truncated");
    char header[kHeaderBytes];
    read(header, sizeof(header));
    WEFT_CHECK(std::memcmp(header, kMagic, sizeof(kMagic)) == 0, "load_checkpoint: '", path_,
               "' does not start with \"WEFTCKPT\": it is not a weft checkpoint (or is corrupt)");
    version_ = header_field<uint32_t>(header, 8);
    WEFT_CHECK(version_ == kWholeFileChecksumVersion || version_ == kVersion, "load_checkpoint: '", path_,
               "' is checkpoint format version ", version_, "; this weft reads versions ", kWholeFileChecksumVersion,
               " and ", kVersion);
    if (version_ == kVersion) {
      // Before the file size, so that a damaged size field is reported as damage, not truncation.
      const auto stored = header_field<uint32_t>(header, kHeaderChecksumOffset);
      std::memset(header + kHeaderChecksumOffset, 0, 4);
      WEFT_CHECK(crc32c(0, header, sizeof(header)) == stored, "load_checkpoint: '", path_, "': the header of step ",
                 step_, " does not match its checksum: the file was damaged after it was saved. ", advice_);
    }
    trailer_bytes_ = version_ == kWholeFileChecksumVersion ? kWholeFileChecksumBytes : 0;
    WEFT_CHECK(file_bytes_ >= kHeaderBytes + trailer_bytes_, "load_checkpoint: '", path_, "' is ", file_bytes_,
               " bytes, shorter than any checkpoint (", kHeaderBytes + trailer_bytes_, "): the file is truncated");
    const auto recorded_bytes = header_field<uint64_t>(header, 16);
    WEFT_CHECK(file_bytes_ >= recorded_bytes, "load_checkpoint: '", path_, "' is ", file_bytes_,
               " bytes but was written with ", recorded_bytes, ": the file is truncated");
    WEFT_CHECK(file_bytes_ == recorded_bytes, "load_checkpoint: '", path_, "' is ", file_bytes_,
               " bytes but was written with ", recorded_bytes, ": the file is corrupt");
    if (version_ == kWholeFileChecksumVersion) {
      verify_whole_file_checksum();
      stream_.seekg(static_cast<std::streamoff>(kHeaderBytes));
      offset_ = kHeaderBytes;
    }

    const auto entries = header_field<uint64_t>(header, 24);
    std::map<std::string, Tensor> tensors;
    for (uint64_t entry = 0; entry < entries; ++entry) {
      entry_checksum_ = 0;
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
      // The sizes' product with each 0 taken as 1, in bytes: what the strides of the tensor reach,
      // so a shape whose product overflows int64 is an error here, not undefined behaviour later.
      int64_t extent = dtype_size(dtype);
      for (int64_t& size : shape) {
        size = read_value<int64_t>();
        WEFT_CHECK(size >= 0, "load_checkpoint: '", path_, "': the tensor '", name, "' has a negative size ", size);
        WEFT_CHECK(!__builtin_mul_overflow(extent, std::max<int64_t>(size, 1), &extent), "load_checkpoint: '",
                   path_, "': the tensor '", name, "' has a size ", size,
                   " that makes it larger than any tensor can be: the file is corrupt");
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
      if (version_ == kVersion) {
        const uint32_t computed = entry_checksum_;
        const auto stored = read_value<uint32_t>();
        WEFT_CHECK(stored == computed, "load_checkpoint: '", path_, "': the tensor '", name, "' of step ", step_,
                   " does not match its checksum: the file was damaged after it was saved. ", advice_);
      }
      WEFT_CHECK(tensors.emplace(name, std::move(tensor)).second, "load_checkpoint: '", path_,
                 "' holds the tensor '", name, "' twice");
    }
    WEFT_CHECK(remaining() == 0, "load_checkpoint: '", path_, "' has ", remaining(),
               " bytes after its last tensor: the file is corrupt");
    return tensors;
  }

 private:
  // Bytes before version 1's trailing checksum not read yet.
  uint64_t remaining() const { return file_bytes_ - trailer_bytes_ - offset_; }

  template <class T>
  static T header_field(const char* header, uint64_t offset) {
    T value;
    std::memcpy(&value, header + offset, sizeof(value));
    return value;
  }

  void read(void* destination, uint64_t size) {
    WEFT_CHECK(size <= file_bytes_ - offset_, "load_checkpoint: '", path_, "' ends early: the file is truncated");
    stream_.read(static_cast<char*>(destination), static_cast<std::streamsize>(size));
    WEFT_CHECK(stream_, "load_checkpoint: reading '", path_, "' failed: ", std::strerror(errno));
    offset_ += size;
    if (version_ == kVersion) entry_checksum_ = crc32c(entry_checksum_, destination, size);
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

  // Version 1: reads the whole file once more, in blocks, before any field past the header is trusted.
  void verify_whole_file_checksum() {
    stream_.seekg(0);
    offset_ = 0;
    std::vector<char> block(1 << 20);
    uint64_t hash = kFnvOffsetBasis;
    uint64_t left = file_bytes_ - kWholeFileChecksumBytes;
    while (left > 0) {
      const uint64_t take = std::min<uint64_t>(left, block.size());
      read(block.data(), take);
      hash = fnv1a(hash, block.data(), take);
      left -= take;
    }
    const auto stored = read_value<uint64_t>();
    WEFT_CHECK(hash == stored, "load_checkpoint: '", path_, "' (step ", step_,
               "): checksum mismatch: the file is corrupt or truncated. ", advice_);
  }

  std::string path_;
  int64_t step_;
  std::string advice_;
  std::ifstream stream_;
  uint64_t file_bytes_ = 0;
  uint64_t offset_ = 0;
  uint32_t version_ = 0;
  uint64_t trailer_bytes_ = 0;
  uint32_t entry_checksum_ = 0;  // of the entry being read (version 2)
};

std::string read_whole_file(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  WEFT_CHECK(stream, "load_checkpoint: cannot open '", path, "': ", std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
}

// The step a folder name stands for when checkpoint_folder_name(step) gives exactly that name, or -1
// (so "step_1", "step_00000001.bak" and "step_000000001" are not step folders).
int64_t step_of_folder_name(const std::string& name) {
  constexpr std::string_view prefix = "step_";
  constexpr size_t kMostDigits = 18;  // int64_t holds every 18-digit number
  if (name.size() < prefix.size() + 8 || name.size() > prefix.size() + kMostDigits ||
      name.compare(0, prefix.size(), prefix) != 0) {
    return -1;
  }
  int64_t step = 0;
  for (size_t index = prefix.size(); index < name.size(); ++index) {
    if (name[index] < '0' || name[index] > '9') return -1;
    step = step * 10 + (name[index] - '0');
  }
  return checkpoint_folder_name(step) == name ? step : -1;
}

// The step folders directly in `dir` (real folders, not links), in step order.
std::vector<std::pair<int64_t, std::string>> step_folders(const fs::path& dir) {
  std::vector<std::pair<int64_t, std::string>> folders;
  std::error_code error;
  for (fs::directory_iterator entry(dir, error), end; !error && entry != end; entry.increment(error)) {
    const std::string name = entry->path().filename().string();
    const int64_t step = step_of_folder_name(name);
    if (step >= 0 && entry->symlink_status(error).type() == fs::file_type::directory) folders.emplace_back(step, name);
  }
  std::sort(folders.begin(), folders.end());
  return folders;
}

// What to do about a damaged checkpoint: resume from the newest earlier step beside it, if any.
std::string resume_advice(const std::string& folder, int64_t step) {
  fs::path path = fs::path(folder).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();  // "ckpt/step_00000005/"
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::string previous;
  for (const auto& [other_step, name] : step_folders(dir)) {
    if (other_step < step) previous = (dir / name).string();
  }
  if (previous.empty()) {
    return str("There is no earlier checkpoint in '", dir.string(), "' to resume from; restore the file from a copy "
               "or start the run again.");
  }
  return str("Resume from the previous checkpoint instead: checkpoint.resume: ", previous);
}

void print_warning(const std::string& message) { std::fprintf(stderr, "weft: warning: %s\n", message.c_str()); }

}  // namespace

std::string checkpoint_folder_name(int64_t step) {
  WEFT_CHECK(step >= 0, "checkpoint: the step must not be negative, got ", step);
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

void save_checkpoint(const std::string& dir, int64_t step, const std::map<std::string, Tensor>& tensors,
                     const nlohmann::json& state, const std::function<void(CheckpointPhase)>& at_phase) {
  auto reached = [&at_phase](CheckpointPhase phase) {
    if (at_phase) at_phase(phase);
  };
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
    reached(CheckpointPhase::kTensors);
    nlohmann::json saved = state.is_null() ? nlohmann::json::object() : state;
    saved["step"] = step;
    write_text_file((fs::path(temporary) / "state.json").string(), saved.dump(2) + "\n");
    reached(CheckpointPhase::kState);
    sync_folder(temporary);
    move_into_place(temporary, final_path);
    sync_folder(dir);
    reached(CheckpointPhase::kRename);
    fs::remove_all(temporary, error);  // the replaced step, if there was one

    const std::string latest_temporary = (fs::path(dir) / (".latest.tmp-" + pid)).string();
    write_text_file(latest_temporary, name + "\n");
    reached(CheckpointPhase::kLatest);
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
  LoadedCheckpoint checkpoint = load_checkpoint_state(path_or_latest_dir);
  checkpoint.tensors = TensorFileReader((fs::path(checkpoint.path) / "tensors.bin").string(), checkpoint.step,
                                        resume_advice(checkpoint.path, checkpoint.step))
                           .read_all();
  return checkpoint;
}

LoadedCheckpoint load_checkpoint_state(const std::string& path_or_latest_dir) {
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
  // state.json first: it is small, and its step goes into the messages about damaged tensors.
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

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep,
                                           const std::function<void(const std::string&)>& warn) {
  const auto& report = warn ? warn : print_warning;
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  std::string latest;
  try {
    latest = latest_checkpoint(dir);
  } catch (const Error& error) {
    report(str("checkpoint.keep: not removing old checkpoints: ", error.what()));
    return removed;
  }
  if (latest.empty()) return removed;  // nothing saved yet, so nothing is known to be safe to remove
  const std::string latest_name = fs::path(latest).filename().string();

  // Kept: `latest` and the newest others until `keep` remain. The rest go, oldest first.
  std::vector<std::string> doomed_names;
  int64_t kept = 1;  // the one `latest` names
  const auto folders = step_folders(dir);
  for (auto folder = folders.rbegin(); folder != folders.rend(); ++folder) {
    if (folder->second == latest_name) continue;
    if (kept < keep) {
      ++kept;
    } else {
      doomed_names.insert(doomed_names.begin(), folder->second);
    }
  }
  const std::string pid = std::to_string(::getpid());
  for (const std::string& name : doomed_names) {
    // Renamed first, in one atomic step, so that a crash halfway through the removal leaves a
    // .tmp-* folder (ignored, like a crashed save's) and never a step folder missing files.
    const fs::path source = fs::path(dir) / name;
    const fs::path doomed = fs::path(dir) / (".tmp-removing-" + name + "-" + pid);
    std::error_code error;
    fs::rename(source, doomed, error);
    if (error) {
      report(str("checkpoint.keep: cannot remove the old checkpoint '", source.string(), "': ", error.message()));
      continue;
    }
    removed.push_back(name);
    fs::remove_all(doomed, error);
    if (error) {
      report(str("checkpoint.keep: the old checkpoint '", source.string(), "' was moved to '", doomed.string(),
                 "' but could not be deleted: ", error.message(), "; delete it by hand"));
    }
  }
  return removed;
}

}  // namespace weft
