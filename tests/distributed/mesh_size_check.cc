// Started by ctest under mpirun -np 3 with dp=2: every rank must exit non-zero at once, and rank 0
// alone prints the world-size message (tests/distributed/expect_failure.sh checks both).
#include <cstdio>
#include <cstdlib>

#include "parallel/mesh.h"
#include "parallel/comm/mpi_environment.h"

int main(int argc, char** argv) {
  weft::MpiEnvironment mpi(&argc, &argv);
  const int dp = argc > 1 ? std::atoi(argv[1]) : 2;
  const int pp = argc > 2 ? std::atoi(argv[2]) : 1;
  const int tp = argc > 3 ? std::atoi(argv[3]) : 1;
  weft::Mesh mesh = weft::make_mesh_or_exit(dp, pp, tp);
  std::printf("rank %d: mesh %s fits\n", mpi.world_rank(), mesh.to_string().c_str());
  return 0;
}
