// compare_checkpoints A B [RELATIVE_TOLERANCE]: exits 0 when every model tensor of checkpoint A
// matches B's within the tolerance (max |a - b| / max |b| per tensor), printing the worst one.
// Used by the data-parallel equivalence test: N ranks against one process.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "launcher/checkpoint.h"
#include "runtime/error.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: compare_checkpoints A B [RELATIVE_TOLERANCE]\n");
    return 2;
  }
  const double tolerance = argc > 3 ? std::atof(argv[3]) : 1e-4;
  try {
    const weft::LoadedCheckpoint a = weft::load_checkpoint(argv[1]);
    const weft::LoadedCheckpoint b = weft::load_checkpoint(argv[2]);
    double worst = 0;
    std::string worst_name;
    int compared = 0;
    for (const auto& [name, tensor] : b.tensors) {
      if (name.rfind("model.", 0) != 0) continue;
      if (a.tensors.count(name) == 0) {
        std::fprintf(stderr, "%s is missing from %s\n", name.c_str(), argv[1]);
        return 1;
      }
      const std::vector<double> x = a.tensors.at(name).to_vector(), y = tensor.to_vector();
      if (x.size() != y.size()) {
        std::fprintf(stderr, "%s: %zu vs %zu elements\n", name.c_str(), x.size(), y.size());
        return 1;
      }
      double difference = 0, scale = 1e-30;
      for (size_t i = 0; i < x.size(); ++i) {
        difference = std::max(difference, std::fabs(x[i] - y[i]));
        scale = std::max(scale, std::fabs(y[i]));
      }
      const double relative = std::isnan(difference) ? INFINITY : difference / scale;
      if (relative > worst || worst_name.empty()) {
        worst = relative;
        worst_name = name;
      }
      ++compared;
    }
    std::printf("%d model tensors compared; worst relative difference %.3g (%s), tolerance %.3g\n", compared, worst,
                worst_name.c_str(), tolerance);
    return compared > 0 && worst <= tolerance ? 0 : 1;
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "compare_checkpoints: %s\n", error.what());
    return 1;
  }
}
