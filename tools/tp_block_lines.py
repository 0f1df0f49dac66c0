#!/usr/bin/env python3
"""Lines of code of the tensor-parallel transformer block in each comm mode (docs/architecture.md).

manual: the Megatron-style block under parallel/manual/ — the region functions, the column- and
        row-parallel linears, parallel attention and MLPs and the block: everything is parallel code.
auto:   the plain block of layers/ is the one-process code; what tensor parallelism adds to it is
        the declared plans (tensor_parallel_plan()) and the lines that read local head counts.
Counts non-blank lines that are not only comments.
    usage: tools/tp_block_lines.py [REPOSITORY_ROOT]
"""
import re
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)


def code_lines(text):
    return [l for l in text.splitlines() if l.strip() and not l.strip().startswith("//")]


def function_bodies(path, name):
    """The definitions of `name` in a file: from the line naming it to its closing brace."""
    lines, out, depth, inside = (root / path).read_text().splitlines(), [], 0, False
    for line in lines:
        if not inside and re.search(rf"\b{name}\(\) const", line) and "{" in line:
            inside = True
        if inside:
            out.append(line)
            depth += line.count("{") - line.count("}")
            if depth <= 0 and "}" in line:
                inside, depth = False, 0
    return "\n".join(out)


manual_files = [f"parallel/manual/{name}.{ext}" for name in ("mappings", "column_parallel_linear",
                "row_parallel_linear", "parallel_attention", "parallel_mlp", "parallel_transformer_block")
                for ext in ("h", "cc")]
manual = sum(len(code_lines((root / f).read_text())) for f in manual_files)

plans = "\n".join(function_bodies(path, "tensor_parallel_plan") for path in
                  ("layers/attention.cc", "layers/mlp.cc", "layers/layer_norm.h", "layers/rms_norm.h"))
attention = (root / "layers/attention.cc").read_text()
local_sizes = [l for l in attention.splitlines() if "shards" in l and "//" not in l.split("shards")[0]]
auto = len(code_lines(plans)) + len(local_sizes)
plain_block = sum(len(code_lines((root / f).read_text())) for f in
                  ("layers/attention.cc", "layers/mlp.cc", "layers/transformer_block.cc"))

print(f"{'block':42s} {'lines':>6s}")
print(f"{'manual: parallel/manual/ (whole block)':42s} {manual:6d}")
print(f"{'auto: plans + local-size lines in layers/':42s} {auto:6d}")
print(f"{'  (the plain one-process block it adds to)':42s} {plain_block:6d}")
print(f"auto / manual = {auto / manual:.3f}")
