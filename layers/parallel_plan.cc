// Parallel style names (parallel_plan.h).
#include "layers/parallel_plan.h"

#include "runtime/error.h"

namespace weft {

const char* parallel_style_name(ParallelStyle style) {
  switch (style) {
    case ParallelStyle::kColumn: return "column";
    case ParallelStyle::kRow: return "row";
    case ParallelStyle::kVocabulary: return "vocabulary";
    case ParallelStyle::kSequence: return "sequence";
  }
  return "unknown";
}

ParallelStyle parse_parallel_style(const std::string& name) {
  for (ParallelStyle style : {ParallelStyle::kColumn, ParallelStyle::kRow, ParallelStyle::kVocabulary,
                              ParallelStyle::kSequence}) {
    if (name == parallel_style_name(style)) return style;
  }
  WEFT_FAIL("parallel style '", name, "' is not one of: column, row, vocabulary, sequence");
}

}  // namespace weft
