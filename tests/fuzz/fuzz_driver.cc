// A plain driver for the fuzz targets, for builds without libFuzzer (gcc, CI): runs a target's
// LLVMFuzzerTestOneInput over its seed corpus, then over deterministic random mutations of the
// seeds (bit flips, boundary values, truncations, insertions, deletions, splices of two seeds).
//
//   checkpoint_fuzz [--runs N] [--seconds S] [--seed K] [--crash-file PATH] CORPUS_FOLDER_OR_FILE...
//
// The mutations come from a fixed seed, so a run is the same run every time, cut short only by
// --seconds. It has no coverage feedback, so it finds what lies within a few edits of a seed; the
// libFuzzer build (tests/fuzz/README.md) searches far deeper. The input being run when a target
// crashes, aborts or lets an exception out is written to --crash-file (default fuzz-crash-input),
// and running the driver on that file alone replays it.
#include <signal.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_input.h"

namespace {

using Bytes = std::vector<uint8_t>;

constexpr size_t kLargestInput = 1 << 16;

// The input being run and where to save it, for the crash handler (which may only make
// async-signal-safe calls, so both are kept ready as plain pointers).
const Bytes* current_input = nullptr;
std::string crash_file = "fuzz-crash-input";

void save_current_input() {
  if (current_input == nullptr) return;
  const int descriptor = ::open(crash_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (descriptor < 0) return;
  if (!current_input->empty() && ::write(descriptor, current_input->data(), current_input->size()) < 0) {
    // Nothing more can be done from a crash handler.
  }
  ::close(descriptor);
  static const char message[] = "fuzz_driver: the input that failed is in the crash file\n";
  if (::write(STDERR_FILENO, message, sizeof(message) - 1) < 0) {
  }
}

void on_crash(int signal_number) {
  save_current_input();
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

Bytes read_file(const std::filesystem::path& path) {
  std::ifstream stream(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
}

// Values at the edges of integer fields: where length, count and size checks go wrong.
constexpr uint64_t kBoundaryValues[] = {0,           1,           2,          7,          8,
                                        0x7f,        0x80,        0xff,       0x7fff,     0x8000,
                                        0xffff,      0x7fffffff,  0x80000000, 0xffffffff, 0x100000000ull,
                                        1ull << 62,  1ull << 63,  ~0ull,      ~0ull - 1,  0x7fffffffffffffffull};

// Deterministic everywhere: mt19937_64 is fully specified, and ranges are taken by plain modulo
// (the standard distributions may differ between standard libraries).
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : random_(seed) {}

  uint64_t below(uint64_t bound) { return bound == 0 ? 0 : random_() % bound; }

  void mutate(Bytes& input, const std::vector<Bytes>& seeds) {
    const uint64_t edits = 1 + below(4);
    for (uint64_t edit = 0; edit < edits; ++edit) mutate_once(input, seeds);
    if (input.size() > kLargestInput) input.resize(kLargestInput);
  }

 private:
  void mutate_once(Bytes& input, const std::vector<Bytes>& seeds) {
    switch (below(10)) {
      case 0:  // flip one bit
        if (!input.empty()) input[below(input.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:  // one random byte
        if (!input.empty()) input[below(input.size())] = static_cast<uint8_t>(random_());
        break;
      case 2: {  // a boundary value over a 1-, 2-, 4- or 8-byte little-endian field
        const size_t width = size_t{1} << below(4);
        if (input.size() < width) break;
        const uint64_t value = kBoundaryValues[below(std::size(kBoundaryValues))];
        const size_t offset = below(input.size() - width + 1);
        for (size_t index = 0; index < width; ++index) input[offset + index] = static_cast<uint8_t>(value >> (8 * index));
        break;
      }
      case 3:  // truncate
        input.resize(below(input.size() + 1));
        break;
      case 4: {  // insert 1 to 8 random bytes
        const size_t offset = below(input.size() + 1);
        const size_t count = 1 + below(8);
        for (size_t index = 0; index < count; ++index) {
          input.insert(input.begin() + static_cast<std::ptrdiff_t>(offset), static_cast<uint8_t>(random_()));
        }
        break;
      }
      case 5: {  // delete a range
        if (input.empty()) break;
        const size_t offset = below(input.size());
        const size_t count = 1 + below(std::min<size_t>(input.size() - offset, 16));
        input.erase(input.begin() + static_cast<std::ptrdiff_t>(offset),
                    input.begin() + static_cast<std::ptrdiff_t>(offset + count));
        break;
      }
      case 6: {  // copy a range of the input to another place in it
        if (input.empty()) break;
        const size_t from = below(input.size());
        const size_t count = 1 + below(std::min<size_t>(input.size() - from, 32));
        const Bytes chunk(input.begin() + static_cast<std::ptrdiff_t>(from),
                          input.begin() + static_cast<std::ptrdiff_t>(from + count));
        const size_t to = below(input.size() + 1);
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(to), chunk.begin(), chunk.end());
        break;
      }
      case 7: {  // insert a range of another seed (brings in its keys, names and values)
        const Bytes& other = seeds[below(seeds.size())];
        if (other.empty()) break;
        const size_t from = below(other.size());
        const size_t count = 1 + below(std::min<size_t>(other.size() - from, 32));
        const size_t to = below(input.size() + 1);
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(to), other.begin() + static_cast<std::ptrdiff_t>(from),
                     other.begin() + static_cast<std::ptrdiff_t>(from + count));
        break;
      }
      case 8: {  // splice: this input's head, another seed's tail
        const Bytes& other = seeds[below(seeds.size())];
        const size_t cut = below(std::min(input.size(), other.size()) + 1);
        input.resize(cut);
        input.insert(input.end(), other.begin() + static_cast<std::ptrdiff_t>(cut), other.end());
        break;
      }
      default:  // a NUL (the targets' separator between parts) or a newline
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(below(input.size() + 1)),
                     below(2) == 0 ? uint8_t{0} : uint8_t{'\n'});
        break;
    }
  }

  std::mt19937_64 random_;
};

// Runs one input; a failure other than a crash (an exception out of the target) saves it and exits.
void run(const Bytes& input) {
  current_input = &input;
  try {
    LLVMFuzzerTestOneInput(input.data(), input.size());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "fuzz_driver: the target let an exception out: %s\n", error.what());
    save_current_input();
    std::exit(1);
  } catch (...) {
    std::fprintf(stderr, "fuzz_driver: the target let an exception out that is not a std::exception\n");
    save_current_input();
    std::exit(1);
  }
  current_input = nullptr;
}

int usage(const char* program) {
  std::fprintf(stderr, "usage: %s [--runs N] [--seconds S] [--seed K] [--crash-file PATH] CORPUS_FOLDER_OR_FILE...\n",
               program);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t runs = 10000;
  double seconds = 5;
  uint64_t seed = 1;
  std::vector<std::filesystem::path> sources;
  for (int index = 1; index < argc; ++index) {
    const std::string argument = argv[index];
    const bool has_value = index + 1 < argc;
    if (argument == "--runs" && has_value) {
      runs = std::strtoull(argv[++index], nullptr, 10);
    } else if (argument == "--seconds" && has_value) {
      seconds = std::strtod(argv[++index], nullptr);
    } else if (argument == "--seed" && has_value) {
      seed = std::strtoull(argv[++index], nullptr, 10);
    } else if (argument == "--crash-file" && has_value) {
      crash_file = argv[++index];
    } else if (argument.rfind("--", 0) == 0) {
      return usage(argv[0]);
    } else {
      sources.emplace_back(argument);
    }
  }
  if (sources.empty()) return usage(argv[0]);

  // Seeds in name order, so that the mutations (which pick seeds by index) are the same everywhere.
  std::vector<std::filesystem::path> files;
  for (const std::filesystem::path& source : sources) {
    if (std::filesystem::is_directory(source)) {
      for (const auto& entry : std::filesystem::directory_iterator(source)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else if (std::filesystem::is_regular_file(source)) {
      files.push_back(source);
    } else {
      std::fprintf(stderr, "fuzz_driver: no such corpus folder or file '%s'\n", source.c_str());
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<Bytes> seeds;
  for (const auto& file : files) seeds.push_back(read_file(file));
  if (seeds.empty()) seeds.emplace_back();  // an empty corpus still fuzzes, from the empty input

  // The handler runs on a stack of its own: a stack overflow (a reader recursing once per level of a
  // deeply nested input) leaves none on the thread's stack, and the input would not be saved.
  static std::vector<char> handler_stack(1 << 16);
  stack_t alternate_stack{};
  alternate_stack.ss_sp = handler_stack.data();
  alternate_stack.ss_size = handler_stack.size();
  ::sigaltstack(&alternate_stack, nullptr);
  struct sigaction action {};
  action.sa_handler = on_crash;
  action.sa_flags = SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (const int signal_number : {SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL}) ::sigaction(signal_number, &action, nullptr);

  const auto start = std::chrono::steady_clock::now();
  for (const Bytes& input : seeds) run(input);
  Mutator mutator(seed);
  Bytes input;
  uint64_t done = 0;
  for (; done < runs; ++done) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) break;
    // Half the time a fresh seed, otherwise the last mutant again, so that edits can pile up.
    if (input.empty() || mutator.below(2) == 0) input = seeds[mutator.below(seeds.size())];
    mutator.mutate(input, seeds);
    run(input);
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz_driver: %zu seeds and %llu of %llu mutations (seed %llu) in %.1f s: no failures\n", seeds.size(),
              static_cast<unsigned long long>(done), static_cast<unsigned long long>(runs),
              static_cast<unsigned long long>(seed), elapsed);
  return 0;
}
