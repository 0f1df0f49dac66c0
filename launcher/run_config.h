// RunConfig: everything one training run is told, section by section, as in the YAML file.
//
// The section and key names are part of weft's interface (configs, docs and users' files use
// them); keep them. launcher/config_options.cc declares every key once — type, default, help line,
// validation — and fills this struct from layered YAML files plus --set overrides.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "layers/model_config.h"

namespace weft {

struct TrainConfig {
  std::string device = "cpu";         // cpu | cuda | cuda:N
  std::string dtype = "f32";          // f32 | bf16: compute dtype (master weights stay f32)
  int64_t batch_size = 8;             // sequences per optimizer step (global batch)
  int64_t micro_batches = 1;          // gradient accumulation steps per optimizer step
  int64_t steps = 200;                // optimizer steps
  std::string optimizer = "adamw";    // adamw | sgd
  double lr = 3e-3;                   // peak learning rate
  double min_lr_ratio = 0.1;          // final lr as a fraction of lr (cosine/linear)
  std::string schedule = "cosine";    // cosine | linear | constant
  int64_t warmup_steps = 10;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double momentum = 0.9;              // sgd
  double grad_clip = 1.0;             // global grad-norm clip (0: off)
  uint64_t seed = 1;
  std::string on_nan = "stop";        // stop | skip
  std::string recompute = "none";     // none | selective | full: activations rerun in backward (ModelConfig::recompute)
  // Steps issued before the oldest one's loss is read: 1, 2, or 0 for the run's choice (2 on GPUs,
  // 1 on the CPU and wherever 2 is refused: on_nan skip, pipelines). Strategy::issue_step says why.
  int64_t steps_in_flight = 0;
  // The same bits on every repeat of a run on the same GPU, at some speed (runtime/determinism.h);
  // CPU runs always repeat.
  bool deterministic = false;
};

struct DataConfig {
  std::string train = "/usr/share/games/fortunes";  // file or folder
  std::string val;                    // empty: hold out the tail of train
  std::string format = "text";        // text (bytes) | tokens (llm.c .bin shards; a glob is allowed)
  double val_fraction = 0.05;         // for text without a val path
  int64_t val_every = 50;             // steps between validation losses (0: never)
  int64_t val_batches = 4;
  // How weft-generate turns text into the model's ids and back: auto | bytes | gpt2 | ids (auto:
  // bytes for format text, gpt2 for format tokens with model.vocab >= 50257, ids otherwise).
  std::string tokenizer = "auto";
  std::string tokenizer_dir;          // gpt2's encoder.json + vocab.bpe (empty: Gpt2Tokenizer::default_directory)
};

struct ParallelConfig {
  int64_t dp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  std::string pp_schedule = "1f1b";   // gpipe | 1f1b | interleaved | zero_bubble
  int64_t pp_virtual = 1;             // model chunks per rank (interleaved: >= 2; others: 1)
  // Transformer blocks per virtual stage (pp * pp_virtual entries; stage 0 also holds the
  // embedding, the last the head); empty: balanced by cost (parallel/pipeline/stage_partition.h).
  std::vector<int64_t> pp_layers;
  // How activations and gradients cross stages: host (tagged MPI messages; CUDA tensors through host
  // memory) | direct (send/recv of a group per direction: NCCL device to device; auto mode only).
  std::string pp_transport = "host";
  int64_t zero = 0;                   // 0 | 1 | 2 (data parallel)
  bool sp = false;                    // sequence parallelism over the tp group
  std::map<std::string, std::string> tp_plan;  // module name ("*" per part) -> style, auto mode
};

struct CommConfig {
  std::string mode = "manual";        // manual | auto
  double bucket_mb = 0.0;             // data-parallel gradient bucket size in MB; 0: by device (strategy.h)
  std::string calibrate = "auto";     // auto (in comm.mode auto) | on | off: measure links and compute at start-up
  std::string calibration_file;       // figures to use instead of measuring, or where a measurement is written
  std::string dp_all_reduce = "auto"; // auto (by the cost model) | flat | hierarchical (across hosts)
  std::string collective_matmul = "auto";  // auto (by the cost model; ring without one) | ring | single
};

struct CheckpointConfig {
  std::string dir;                    // empty: no checkpoints
  int64_t every = 0;                  // steps between checkpoints (0: only at the end when dir is set)
  double every_minutes = 0.0;         // minutes between checkpoints, by rank 0's clock (0: off)
  std::string resume;                 // "", "latest", or a checkpoint path
  std::string on_save_error = "stop"; // stop | continue: what a failed save (a full disk) does
  bool async = false;                 // write checkpoints on a background thread while training goes on
  int64_t keep = 0;                   // step folders kept after each save, the newest (0: all)
};

struct LogConfig {
  int64_t every = 10;                 // steps between printed lines
  std::string metrics_file;           // JSON lines, one object per step
  std::string trace_file;             // every step's timeline (Chrome trace event JSON)
  std::string graph_file;             // the first step's graph: .json or .dot (Graphviz)
  std::string progress = "auto";      // auto | bar | plain
};

struct RunConfig {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
  CommConfig comm;
  CheckpointConfig checkpoint;
  LogConfig log;
};

}  // namespace weft
