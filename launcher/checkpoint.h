// Checkpoints: named tensors plus a JSON state, saved so that no crash can leave a broken one.
//
// Layout. A checkpoint folder `dir` holds one folder per saved step and a pointer to the newest:
//
//   dir/step_00000200/tensors.bin   every tensor (format below)
//   dir/step_00000200/state.json    the caller's state object (data position, RNG seed, the config
//                                   dump, ...) with "step" set to the step
//   dir/latest                      one line: the folder name of the last save ("step_00000200")
//
// Crash safety. save_checkpoint writes both files into dir/.tmp-step_N-<pid>/, fsyncs them and
// the folder, then renames it to dir/step_N (exchanging it atomically with an existing step_N, so
// that a `latest` naming that step never dangles), and only then replaces `latest` through a
// temporary file and a rename. A crash at any point leaves `latest` naming a complete checkpoint
// (or absent, before the first save) and at worst a stray .tmp-* folder, which loading ignores.
//
// tensors.bin, all integers little-endian:
//   "WEFTCKPT"                              8 bytes magic
//   u32 version (1), u32 0, u64 file bytes  (the whole file, so truncation is named as such)
//   u64 entry count
//   per entry, in name order:
//     u32 name length, name bytes
//     u32 dtype-name length, dtype name     ("f32", "bf16", ...: runtime/dtype.h's names, so a
//                                            reordered DType enum cannot misread old files)
//     u32 rank, i64 size per dim
//     u64 byte count, raw row-major bytes   (the tensor's own dtype; contiguous; read from the CPU)
//   u64 FNV-1a 64 of every byte before it
//
// Loading checks, in order: magic, version, the file size, the checksum (so a flipped or lost byte anywhere is
// reported as corruption before any field is trusted), then every size against the file's, then
// state.json's JSON. Each failure is a weft::Error naming the file and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/tensor.h"

namespace weft {

// "step_00000200": the folder name of a step (8 digits, so names sort in step order).
std::string checkpoint_folder_name(int64_t step);

// Saves `tensors` and `state` (a JSON object) as step `step` in `dir`, creating `dir` when needed,
// replacing an earlier save of the same step, and pointing `dir/latest` at it. Device tensors are
// copied to the CPU first. On failure throws weft::Error; `latest` and earlier steps are untouched.
void save_checkpoint(const std::string& dir, int64_t step, const std::map<std::string, Tensor>& tensors,
                     const nlohmann::json& state);

struct LoadedCheckpoint {
  int64_t step = 0;
  std::map<std::string, Tensor> tensors;  // contiguous CPU tensors in the dtypes they were saved in
  nlohmann::json state;                   // state.json as saved (including "step")
  std::string path;                       // the step folder it was read from
};

// Loads a step folder, or the step that `latest` names when given a checkpoint folder.
LoadedCheckpoint load_checkpoint(const std::string& path_or_latest_dir);

// The step folder `dir/latest` names, or "" when `dir` or `dir/latest` does not exist (nothing
// saved yet). Throws weft::Error when `latest` names a folder that is missing.
std::string latest_checkpoint(const std::string& dir);

}  // namespace weft
