// The cuBLASLt algorithms that matmul autotuning chose (matmul.cu), kept in a file so that a later
// process on the same kind of GPU, with the same cuBLASLt, starts without timing them again (about
// 6 s at the 1.3B shape). Host code only: no CUDA type appears here, so the file handling is tested
// on machines without a GPU.
//
// Why a choice may be reused: autotuning keeps only an algorithm that writes exactly the bits the
// heuristic's first algorithm writes, and the heuristic's answer depends on the device, the library
// and the problem, all of which the entry's signature and key name. A reused choice therefore
// computes what tuning again (or not tuning) would, bit for bit; what it saves is the timing.
//
// The file: one line per choice, "weft-matmul-tuning 1 <signature> <key: 24 integers> <algorithm:
// 8 hexadecimal 64-bit words>". Lines are appended whole with one write to a file opened for
// appending, under an exclusive flock, after reading the lines other processes appended since: so
// processes that tune at once (the ranks of a host, which tune the same products) add whole lines,
// one per signature and key, and a process that finds its product already there takes that line's
// choice. A line that does not parse (a process killed mid-write, another format) is skipped and
// counted, never fatal. The first line for a signature and key wins. Where the file cannot be read
// or written the cache works in memory only and says so once on stderr.
//
// Where: WEFT_MATMUL_TUNING_CACHE=<path>, or "off" for none; by default
// $XDG_CACHE_HOME/weft/matmul-tuning.txt, else $HOME/.cache/weft/matmul-tuning.txt.
// Not thread-safe: matmul.cu calls it under its own lock.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace weft::cuda {

class MatmulTuningCache {
 public:
  using Key = std::array<int64_t, 24>;         // matmul.cu's problem key, device index zeroed
  using Algorithm = std::array<uint64_t, 8>;  // a cublasLtMatmulAlgo_t's bytes

  // Reads `path` now (an empty path: no file, choices kept in memory only).
  explicit MatmulTuningCache(std::string path);

  // The path the environment names (see the file comment); empty for "off" or with no home.
  static std::string path_from_environment();

  std::optional<Algorithm> find(const std::string& signature, const Key& key) const;

  // Keeps a choice and appends its line to the file, unless another process has written one for
  // the same signature and key since this one read the file: then that choice is kept instead
  // (find() returns it). `signature` must hold no whitespace.
  void add(const std::string& signature, const Key& key, const Algorithm& algorithm);

  const std::string& path() const { return path_; }
  int skipped_lines() const { return skipped_lines_; }
  size_t size() const { return choices_.size(); }

 private:
  void warn_once(const std::string& message);
  // Reads the whole lines of the open file past read_offset_ into choices_ and in_file_.
  void read_new_lines(int descriptor);

  std::string path_;
  std::map<std::pair<std::string, Key>, Algorithm> choices_;
  std::set<std::pair<std::string, Key>> in_file_;  // the choices the file has a line for
  off_t read_offset_ = 0;                          // the file's bytes read so far (whole lines)
  int skipped_lines_ = 0;
  bool warned_ = false;
};

}  // namespace weft::cuda
