[[ -d .devlib ]] || tar xJf build-gpu/device-bundle.tar.xz; source tools/device/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== own products, bits every run"
timeout 150 build-gpu/device-programs/cuda_fused_test --gtest_color=no --gtest_filter='CudaFused.OwnHopper*' 2>&1 | grep -E "^\[ +(OK|FAILED|PASSED) |Failure|Expected|Which is|differ|bits" | head -40
echo "== determinism probe"
SETTINGS="0 bias_gelu input_gradient gelu_backward" timeout 300 tools/device/determinism-probe
echo "== racecheck"
WEFT_SANITIZER_BUDGET_S=120 WEFT_SANITIZER_LIMIT_S=120 WEFT_SANITIZER_PROGRAMS="racecheck:cuda_fused_test:CudaFused.OwnHopper*" bash tools/device/compute-sanitizer-pass 2>&1 | tail -12
