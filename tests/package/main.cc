// Adds two tensors through an installed weft and checks the sum: proves that the installed headers,
// library and CMake package config are complete enough to build and run a program.
#include <cstdio>
#include <exception>
#include <vector>

#include "runtime/ops/elementwise.h"
#include "runtime/tensor.h"

int main() {
  try {
    const std::vector<float> a_values = {1, 2, 3, 4, 5, 6};
    const std::vector<float> b_values = {10, 20, 30, 40, 50, 60};
    const weft::Tensor a = weft::Tensor::from_vector(a_values, {2, 3});  // [2, 3]
    const weft::Tensor b = weft::Tensor::from_vector(b_values, {2, 3});  // [2, 3]
    const weft::Tensor sum = weft::add(a, b);                           // [2, 3]

    const std::vector<double> expected = {11, 22, 33, 44, 55, 66};
    if (sum.dim() != 2 || sum.size(0) != 2 || sum.size(1) != 3 || sum.to_vector() != expected) {
      std::fprintf(stderr, "weft::add gave %s, expected [[11, 22, 33], [44, 55, 66]]\n",
                   sum.to_string().c_str());
      return 1;
    }
    std::printf("weft::add through the installed package: %s\n", sum.to_string().c_str());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "weft threw: %s\n", error.what());
    return 1;
  }
}
