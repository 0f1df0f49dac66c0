// The rank-to-GPU rule (parallel/comm/gpu_assignment.h): local_rank % visible GPUs on hosts of 1,
// 2, 4 and 8 GPUs, with every rank seeing every GPU (mpirun -npernode G) or one GPU each (Slurm's
// --gpus-per-task=1, CUDA_VISIBLE_DEVICES per rank), and the refusal when two ranks of a host would
// share one physical GPU; a device named in train.device, and sharing where the collectives go
// through the host.
#include "parallel/comm/gpu_assignment.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

std::string uuid(int gpu) { return "GPU-0000000" + std::to_string(gpu) + "-aaaa-bbbb-cccc-dddddddddddd"; }

// `ranks` ranks that each see all `gpus` GPUs of the host, in the same order.
std::vector<VisibleGpus> every_rank_sees_all(int ranks, int gpus) {
  VisibleGpus all;
  for (int gpu = 0; gpu < gpus; ++gpu) all.push_back(uuid(gpu));
  return std::vector<VisibleGpus>(static_cast<size_t>(ranks), all);
}

// `ranks` ranks that each see only GPU `first + rank` (--gpus-per-task=1).
std::vector<VisibleGpus> one_gpu_per_rank(int ranks, int first = 0) {
  std::vector<VisibleGpus> visible;
  for (int rank = 0; rank < ranks; ++rank) visible.push_back({uuid(first + rank)});
  return visible;
}

TEST(GpuAssignment, LocalRankModuloVisibleGpus) {
  EXPECT_EQ(gpu_index_for_local_rank(0, 1), 0);
  EXPECT_EQ(gpu_index_for_local_rank(3, 1), 0);
  EXPECT_EQ(gpu_index_for_local_rank(3, 4), 3);
  EXPECT_EQ(gpu_index_for_local_rank(5, 4), 1);
  EXPECT_EQ(gpu_index_for_local_rank(7, 8), 7);
}

TEST(GpuAssignment, OneRankPerGpuWhenEveryRankSeesEveryGpu) {
  for (int gpus : {1, 2, 4, 8}) {
    std::vector<int> expected;
    for (int rank = 0; rank < gpus; ++rank) expected.push_back(rank);
    EXPECT_EQ(assign_gpus_to_local_ranks(every_rank_sees_all(gpus, gpus), "node0"), expected) << gpus << " GPUs";
  }
}

TEST(GpuAssignment, FewerRanksThanGpus) {
  EXPECT_EQ(assign_gpus_to_local_ranks(every_rank_sees_all(2, 8), "node0"), (std::vector<int>{0, 1}));
  EXPECT_EQ(assign_gpus_to_local_ranks(every_rank_sees_all(1, 4), "node0"), (std::vector<int>{0}));
}

TEST(GpuAssignment, GpusPerTaskGivesEveryRankDeviceZero) {
  for (int gpus : {1, 2, 4, 8}) {
    EXPECT_EQ(assign_gpus_to_local_ranks(one_gpu_per_rank(gpus), "node0"), std::vector<int>(gpus, 0)) << gpus;
  }
}

TEST(GpuAssignment, PerRankVisibleDevicesInAnyOrder) {
  // CUDA_VISIBLE_DEVICES=1,0 on rank 0 and 0,1 on rank 1: both take device 0 or 1 of their own
  // numbering, and the physical GPUs differ (rank 0: index 0 = GPU 1; rank 1: index 1 = GPU 1!).
  const std::vector<VisibleGpus> crossed = {{uuid(1), uuid(0)}, {uuid(0), uuid(1)}};
  const std::string message = testing::error_message([&] { assign_gpus_to_local_ranks(crossed, "node3"); });
  testing::expect_contains(message, {"host 'node3' runs 2 ranks but has 2 GPUs", "local ranks 0 and 1 would share GPU " + uuid(1)});
  const std::vector<VisibleGpus> apart = {{uuid(0), uuid(1)}, {uuid(0), uuid(1)}};
  EXPECT_EQ(assign_gpus_to_local_ranks(apart, "node3"), (std::vector<int>{0, 1}));
}

TEST(GpuAssignment, MoreRanksThanGpusIsRefusedWithTheLaunchToUse) {
  for (int gpus : {1, 2, 4, 8}) {
    const std::string message =
        testing::error_message([&] { assign_gpus_to_local_ranks(every_rank_sees_all(2 * gpus, gpus), "gpu-node-7"); });
    testing::expect_contains(message, {"host 'gpu-node-7' runs " + std::to_string(2 * gpus) + " ranks but has " +
                                           std::to_string(gpus) + (gpus == 1 ? " GPU " : " GPUs "),
                                       "local ranks 0 and " + std::to_string(gpus) + " would share GPU " + uuid(0),
                                       "mpirun -npernode " + std::to_string(gpus),
                                       "srun --ntasks-per-node=" + std::to_string(gpus) + " --gpus-per-task=1"});
  }
}

TEST(GpuAssignment, TwoRanksGivenTheSameGpuAreRefused) {
  // CUDA_VISIBLE_DEVICES=0 on both ranks of a host with 4 GPUs.
  const std::vector<VisibleGpus> same = {{uuid(0)}, {uuid(0)}};
  testing::expect_contains(testing::error_message([&] { assign_gpus_to_local_ranks(same, "n1"); }),
                           {"runs 2 ranks but has 1 GPU visible", "local ranks 0 and 1 would share GPU " + uuid(0)});
  // Ranks 0-3 on GPUs 0-3 and ranks 4-7 given GPUs 0-3 again.
  std::vector<VisibleGpus> doubled = one_gpu_per_rank(4);
  for (const VisibleGpus& visible : one_gpu_per_rank(4)) doubled.push_back(visible);
  testing::expect_contains(testing::error_message([&] { assign_gpus_to_local_ranks(doubled, "n1"); }),
                           {"runs 8 ranks but has 4 GPUs", "local ranks 0 and 4 would share"});
}

TEST(GpuAssignment, RankWithoutGpuIsNamed) {
  const std::vector<VisibleGpus> visible = {{uuid(0)}, {}};
  testing::expect_contains(testing::error_message([&] { assign_gpus_to_local_ranks(visible, "n2"); }),
                           {"host 'n2': local rank 1 sees no CUDA device", "CUDA_VISIBLE_DEVICES"});
}

// train.device: cuda:N gives every rank device N: fine with one rank a GPU (each rank sees its
// own GPU as device 0), refused where ranks of a host land on one physical GPU (naming train.device
// and the two ways out), and a device a rank does not see is named.
TEST(GpuAssignment, ANamedDeviceIsCheckedLikeTheRule) {
  GpuAssignmentOptions device_zero;
  device_zero.device = 0;
  EXPECT_EQ(assign_gpus_to_local_ranks(one_gpu_per_rank(4), "n3", device_zero), (std::vector<int>{0, 0, 0, 0}));
  testing::expect_contains(
      testing::error_message([&] { assign_gpus_to_local_ranks(every_rank_sees_all(2, 1), "n3", device_zero); }),
      {"train.device: cuda:0 puts local ranks 0 and 1 of host 'n3' on the same GPU " + uuid(0),
       "which NCCL refuses", "set train.device: cuda", "WEFT_GPU_COLLECTIVES=mpi"});
  GpuAssignmentOptions device_two;
  device_two.device = 2;
  EXPECT_EQ(assign_gpus_to_local_ranks(every_rank_sees_all(1, 4), "n3", device_two), (std::vector<int>{2}));
  testing::expect_contains(
      testing::error_message([&] { assign_gpus_to_local_ranks(one_gpu_per_rank(2), "n3", device_two); }),
      {"train.device: cuda:2, but local rank 0 of host 'n3' sees 1 CUDA device (0 to 0)"});
}

// Collectives through the host (WEFT_GPU_COLLECTIVES=mpi): ranks may share a GPU, with the rule or
// with a named device.
TEST(GpuAssignment, SharingIsAllowedWhenTheCollectivesGoThroughTheHost) {
  GpuAssignmentOptions shared;
  shared.sharing_allowed = true;
  EXPECT_EQ(assign_gpus_to_local_ranks(every_rank_sees_all(4, 1), "n4", shared), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(assign_gpus_to_local_ranks(every_rank_sees_all(3, 2), "n4", shared), (std::vector<int>{0, 1, 0}));
  shared.device = 0;
  EXPECT_EQ(assign_gpus_to_local_ranks(every_rank_sees_all(8, 1), "n4", shared), std::vector<int>(8, 0));
}

}  // namespace
}  // namespace weft
