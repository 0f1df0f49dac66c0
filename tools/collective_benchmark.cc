// collective_benchmark: weft's collectives (parallel/comm/process_group.h) over the world, timed
// the way nccl-tests times NCCL's, so that a run can be set against a peer's bus bandwidth measured
// in the same call (tools/collective_benchmark.sh: PyTorch's torch.distributed next to it).
//
//   mpirun -np N collective_benchmark [--device cpu|cuda] [--dtype f32|bf16]
//          [--min-bytes B] [--max-bytes B] [--factor F] [--iters N] [--warmup N]
//          [--ops all_reduce,reduce_scatter,all_gather,send_recv] [--json FILE]
//
// Sizes run from --min-bytes to --max-bytes, multiplied by --factor; a size is the whole buffer
// (all_reduce's tensor, reduce_scatter's input, all_gather's output, what each rank of a send/recv
// pair sends). At each size every op runs --warmup times, then --iters times back to back on one
// stream (CPU: MPI on the calling thread; CUDA: NCCL on a stream of the rank's GPU, synchronized at
// the end), timed on the host; the slowest rank's time counts. Bandwidths as nccl-tests defines
// them: algbw = bytes / time; busbw = algbw * 2(n-1)/n for all_reduce, * (n-1)/n for reduce_scatter
// and all_gather, and = algbw for send_recv (ranks 0-1, 2-3, ... exchange at once; an odd last rank
// idles).
//
// Every op checks what it received against what it must hold (rank r fills its buffer with r + 1,
// or with the chunk owner's value), so a wrong result stops the run with a message naming the op,
// the size and the element, and the program exits non-zero: a bandwidth is only printed for
// collectives that worked. Rank 0 prints the table; --json writes one object per (op, size).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "parallel/comm/gpu_assignment.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/process_group.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

#if defined(WEFT_HAVE_CUDA)
#include "runtime/cuda/stream.h"
#endif

namespace weft {
namespace {

struct Options {
  std::string device = "cpu";
  DType dtype = kFloat32;
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = 1 << 24;
  int64_t factor = 4;
  int iterations = 20;
  int warmup = 5;
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "send_recv"};
  std::string json;
};

struct Row {
  std::string op;
  int64_t bytes = 0;
  double microseconds = 0.0;
  double algbw = 0.0;  // GB/s
  double busbw = 0.0;  // GB/s
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    WEFT_CHECK(i + 1 < argc, "collective_benchmark: ", flag, " needs a value");
    const std::string value = argv[++i];
    if (flag == "--device") {
      options.device = value;
    } else if (flag == "--dtype") {
      options.dtype = parse_dtype(value);
    } else if (flag == "--min-bytes") {
      options.min_bytes = std::stoll(value);
    } else if (flag == "--max-bytes") {
      options.max_bytes = std::stoll(value);
    } else if (flag == "--factor") {
      options.factor = std::stoll(value);
    } else if (flag == "--iters") {
      options.iterations = std::stoi(value);
    } else if (flag == "--warmup") {
      options.warmup = std::stoi(value);
    } else if (flag == "--ops") {
      options.ops = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (flag == "--json") {
      options.json = value;
    } else {
      WEFT_FAIL("collective_benchmark: unknown flag ", flag,
                " (flags: --device --dtype --min-bytes --max-bytes --factor --iters --warmup --ops --json)");
    }
  }
  WEFT_CHECK(options.device == "cpu" || options.device == "cuda", "--device is cpu or cuda, got ", options.device);
  WEFT_CHECK(options.dtype == kFloat32 || options.dtype == kBFloat16, "--dtype is f32 or bf16");
  WEFT_CHECK(options.min_bytes > 0 && options.max_bytes >= options.min_bytes && options.factor >= 2,
             "--min-bytes must be positive, --max-bytes at least it, --factor at least 2");
  WEFT_CHECK(options.iterations >= 1 && options.warmup >= 0, "--iters at least 1, --warmup at least 0");
  for (const std::string& op : options.ops) {
    WEFT_CHECK(op == "all_reduce" || op == "reduce_scatter" || op == "all_gather" || op == "send_recv",
               "--ops: unknown op '", op, "' (all_reduce, reduce_scatter, all_gather, send_recv)");
  }
  return options;
}

// Stops with a message when `tensor` (on any device) is not `expected` everywhere in [begin, end).
// The values are small integers, exact in bf16 too.
void expect_values(const Tensor& tensor, int64_t begin, int64_t end, double expected, const std::string& what) {
  const std::vector<double> values = tensor.to(Device::cpu()).to(kFloat64).to_vector();
  for (int64_t i = begin; i < end; ++i) {
    WEFT_CHECK(values[static_cast<size_t>(i)] == expected, "collective_benchmark: ", what, ": element ", i, " is ",
               values[static_cast<size_t>(i)], ", expected ", expected);
  }
}

class Benchmark {
 public:
  Benchmark(const Options& options, std::shared_ptr<ProcessGroup> world, Device device)
      : options_(options), world_(std::move(world)), device_(device) {
#if defined(WEFT_HAVE_CUDA)
    if (device_.is_cuda()) {
      stream_ = std::make_unique<cuda::Stream>(device_.index);
      comm_stream_ = CommStream::cuda(stream_->get(), device_.index);
    }
#endif
  }

  // Times `op` on buffers of `bytes` and checks its result; rank 0's row (every rank computes it).
  Row run(const std::string& op, int64_t bytes) {
    const int size = world_->size(), rank = world_->rank();
    const int64_t element = dtype_size(options_.dtype);
    // Whole elements, a multiple of the group size (reduce_scatter and all_gather split by rank).
    int64_t count = std::max<int64_t>(bytes / element / size, 1) * size;
    const int64_t chunk = count / size;
    const std::string what = op + " of " + std::to_string(count * element) + " bytes";
    Tensor buffer = Tensor::full({count}, rank + 1.0, options_.dtype, device_);
    Tensor piece = Tensor::full({chunk}, rank + 1.0, options_.dtype, device_);
    const int partner = (rank % 2 == 0) ? rank + 1 : rank - 1;
    const bool paired = op != "send_recv" || partner < size;
    Tensor received = Tensor::full({count}, 0.0, options_.dtype, device_);
    backend_for(device_).synchronize(device_);  // the fills, before another stream reads them
    auto issue = [&] {
      if (op == "all_reduce") {
        // Max keeps the values fixed over repeats (a sum would grow them).
        return world_->all_reduce(buffer, Reduction::kMax, comm_stream_);
      }
      if (op == "reduce_scatter") return world_->reduce_scatter(buffer, piece, Reduction::kMax, comm_stream_);
      if (op == "all_gather") return world_->all_gather(piece, buffer, comm_stream_);
      return world_->exchange(buffer, partner, received, partner, comm_stream_);
    };
    if (paired) {
      for (int i = 0; i < options_.warmup; ++i) issue();
      synchronize();
    }
    world_->barrier(CommStream())->synchronize();
    const auto start = std::chrono::steady_clock::now();
    if (paired) {
      for (int i = 0; i < options_.iterations; ++i) issue();
      synchronize();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / options_.iterations;
    // The slowest rank's time.
    Tensor slowest = Tensor::full({1}, paired ? seconds : 0.0, kFloat64, device_);
    world_->all_reduce(slowest, Reduction::kMax, CommStream())->synchronize();
    const double time = slowest.item();

    if (op == "all_reduce") {
      expect_values(buffer, 0, count, size, what);
    } else if (op == "reduce_scatter") {
      // Max over ranks of rank + 1 at every element: the group size.
      expect_values(piece, 0, chunk, size, what);
    } else if (op == "all_gather") {
      for (int r = 0; r < size; ++r) expect_values(buffer, r * chunk, (r + 1) * chunk, r + 1.0, what);
    } else if (paired) {
      expect_values(received, 0, count, partner + 1.0, what);
    }

    Row row;
    row.op = op;
    row.bytes = count * element;
    row.microseconds = time * 1e6;
    row.algbw = static_cast<double>(row.bytes) / time / 1e9;
    const double n = size;
    const double factor = op == "all_reduce" ? 2.0 * (n - 1.0) / n : op == "send_recv" ? 1.0 : (n - 1.0) / n;
    row.busbw = row.algbw * factor;
    return row;
  }

 private:
  void synchronize() {
#if defined(WEFT_HAVE_CUDA)
    if (device_.is_cuda()) {
      comm_stream_.synchronize();
      return;
    }
#endif
  }

  Options options_;
  std::shared_ptr<ProcessGroup> world_;
  Device device_;
  CommStream comm_stream_;  // the caller (CPU) or the rank's own CUDA stream
#if defined(WEFT_HAVE_CUDA)
  std::unique_ptr<cuda::Stream> stream_;
#endif
};

int main_with_mpi(int argc, char** argv) {
  const Options options = parse(argc, argv);
  const Device device = options.device == "cuda" ? Device::cuda(gpu_of_this_rank()) : Device::cpu();
  std::shared_ptr<ProcessGroup> world = make_world_process_group(device);
  const bool leader = world->rank() == 0;
  Benchmark benchmark(options, world, device);
  std::vector<Row> rows;
  if (leader) {
    std::printf("weft collectives over %d ranks on %s, %s (slowest rank, %d iterations after %d warm-up)\n",
                world->size(), options.device.c_str(), std::string(dtype_name(options.dtype)).c_str(),
                options.iterations, options.warmup);
    std::printf("%-15s %14s %12s %12s %12s\n", "op", "bytes", "time us", "algbw GB/s", "busbw GB/s");
  }
  for (const std::string& op : options.ops) {
    for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= options.factor) {
      const Row row = benchmark.run(op, bytes);
      rows.push_back(row);
      if (leader) {
        std::printf("%-15s %14lld %12.1f %12.2f %12.2f\n", row.op.c_str(), static_cast<long long>(row.bytes),
                    row.microseconds, row.algbw, row.busbw);
        std::fflush(stdout);
      }
    }
  }
  if (leader && !options.json.empty()) {
    std::ofstream out(options.json);
    for (const Row& row : rows) {
      out << "{\"op\": \"" << row.op << "\", \"bytes\": " << row.bytes << ", \"us\": " << row.microseconds
          << ", \"algbw\": " << row.algbw << ", \"busbw\": " << row.busbw << ", \"ranks\": " << world->size()
          << ", \"side\": \"weft\"}\n";
    }
    WEFT_CHECK(out.good(), "collective_benchmark: cannot write --json ", options.json);
  }
  return 0;
}

}  // namespace
}  // namespace weft

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);  // a world of one when not started by mpirun
  try {
    return weft::main_with_mpi(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "collective_benchmark (rank %d): %s\n", mpi.world_rank(), error.what());
    // A failed check on one rank must not leave the others waiting in a collective.
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
