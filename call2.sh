[[ -d .devlib ]] || tar xJf build-gpu/device-bundle.tar.xz; source tools/device/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== attention determinism"
timeout 120 build-gpu/device-programs/cuda_cudnn_attention_test --gtest_color=no 2>&1 | grep -E "^\[ +(OK|FAILED|PASSED) |Failure|Expected|Which is|differed|selection|refused|error" | head -40
echo "== determinism probe, deterministic attention"
WEFT_ATTENTION_DETERMINISTIC=1 WEFT_ATTENTION_VERBOSE=0 SETTINGS="0 bias_gelu,input_gradient,swiglu,swiglu_backward" timeout 200 tools/device/determinism-probe
echo "== GPU tests"
OUT=$OUT/tests WEFT_SKIP_KERNEL_BENCHMARKS=1 WEFT_SKIP_GPT2=1 WEFT_TEST_LIMIT_S=100 timeout 250 bash tools/device/run-gpu-tests 2>&1 | grep -vE "^\s*$" | tail -30
