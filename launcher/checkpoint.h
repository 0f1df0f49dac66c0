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
// Pruning. With checkpoint.keep: N the trainer calls prune_checkpoints after each save, which
// removes all but the N newest step folders (never the one `latest` names). Each goes by a rename to
// dir/.tmp-removing-step_N-<pid>/ first, so a crash mid-removal also leaves only a .tmp-* folder.
//
// tensors.bin, version 2 (written now), all integers little-endian:
//   "WEFTCKPT"                              8 bytes magic
//   u32 version (2)
//   u32 CRC32C of the header              (these 32 bytes, with this field read as 0)
//   u64 file bytes                          (the whole file, so truncation is named as such)
//   u64 entry count
//   per entry, in name order:
//     u32 name length, name bytes
//     u32 dtype-name length, dtype name     ("f32", "bf16", ...: runtime/dtype.h's names, so a
//                                            reordered DType enum cannot misread old files)
//     u32 rank, i64 size per dim
//     u64 byte count, raw row-major bytes   (the tensor's own dtype; contiguous; read from the CPU)
//     u32 CRC32C of the entry's bytes above (name length through the last data byte)
//
// Version 1 (still read) is the same without the checksums: its header's checksum field is 0
// (reserved), its entries have no CRC32C, and the file ends with a u64 FNV-1a 64 of every byte
// before it. Version 2 has no whole-file checksum because the header's and the entries' together
// already cover every byte once, and a second hash of every byte would more than double the time
// spent hashing (FNV-1a runs at about half the speed of launcher/crc32c.h's CRC32C); CRC32C is
// written in weft rather than taken from libxxhash so that checkpoints need no new dependency.
//
// Loading reads state.json first (its step goes into the messages), then checks, in order: magic,
// version, the header's checksum, the file size, then each entry's fields against the file's size
// and its checksum, as it is read, so that a flipped byte inside a tensor's data is reported as that
// tensor of that step being damaged, with the previous step folder to resume from. (Version 1
// files: the whole-file checksum before any field is trusted, then the fields.) Each failure is a
// weft::Error naming the file and the problem. A damaged length or size field can still be found
// by the field checks before its entry's checksum is reached; those errors name the file and the
// tensor too.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/tensor.h"

namespace weft {

// "step_00000200": the folder name of a step (8 digits, so names sort in step order).
std::string checkpoint_folder_name(int64_t step);

// Saves `tensors` and `state` (a JSON object) as step `step` in `dir`, creating `dir` when needed,
// replacing an earlier save of the same step, and pointing `dir/latest` at it. Device tensors are
// copied to the CPU first. On failure throws weft::Error; `latest` and earlier steps are untouched.
// The points of a save at which `at_phase` (tests: WEFT_FAULT, parallel/step/fault_injection.h)
// is called: after tensors.bin is written, after state.json, after the step folder is renamed into
// place, and after the new `latest` is written but before it replaces the old one. Whatever it
// throws fails the save as a failed write would (the temporary files are removed; `latest` and
// earlier steps are untouched).
enum class CheckpointPhase : uint8_t { kTensors, kState, kRename, kLatest };
void save_checkpoint(const std::string& dir, int64_t step, const std::map<std::string, Tensor>& tensors,
                     const nlohmann::json& state,
                     const std::function<void(CheckpointPhase)>& at_phase = nullptr);

struct LoadedCheckpoint {
  int64_t step = 0;
  std::map<std::string, Tensor> tensors;  // contiguous CPU tensors in the dtypes they were saved in
  nlohmann::json state;                   // state.json as saved (including "step")
  std::string path;                       // the step folder it was read from
};

// Loads a step folder, or the step that `latest` names when given a checkpoint folder.
LoadedCheckpoint load_checkpoint(const std::string& path_or_latest_dir);
// The same checks and state, without reading tensors.bin (its tensors are left empty): what a run
// needs to know of the checkpoint it resumes before it builds anything.
LoadedCheckpoint load_checkpoint_state(const std::string& path_or_latest_dir);

// The step folder `dir/latest` names, or "" when `dir` or `dir/latest` does not exist (nothing
// saved yet). Throws weft::Error when `latest` names a folder that is missing.
std::string latest_checkpoint(const std::string& dir);

// checkpoint.keep: once a save has completed and `latest` names it, removes the oldest step folders
// of `dir` so that at most `keep` remain (keep <= 0 keeps all). The one `latest` names is always
// kept, with the `keep` - 1 newest others by step; only folders named as checkpoint_folder_name
// names them are ever touched. A folder that cannot be removed is a warning (to `warn`, or stderr
// when it is empty), not an error: a full disk should not also stop the run. Returns the names of
// the folders removed.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep,
                                           const std::function<void(const std::string&)>& warn = {});

}  // namespace weft
