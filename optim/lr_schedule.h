// Learning-rate schedules: linear warmup, then cosine or linear decay (or a constant rate).
//
//   step < warmup_steps:    lr(step) = peak_lr * (step + 1) / warmup_steps
//   then, with progress = (step - warmup_steps) / (total_steps - warmup_steps), capped at 1:
//     cosine:   min_lr + (peak_lr - min_lr) * (1 + cos(pi * progress)) / 2
//     linear:   peak_lr - (peak_lr - min_lr) * progress
//     constant: peak_lr
//   where min_lr = min_lr_ratio * peak_lr. From total_steps on, a decaying schedule stays at min_lr.
//
// Steps count from 0, so the first step already trains (lr > 0) and the warmup reaches peak_lr on
// its last step; this is nanoGPT's and llm.c's schedule. The optimizer does not know the schedule:
// the training loop calls optimizer.step(schedule.at(step)).
#pragma once

#include <cstdint>
#include <string_view>

namespace weft {

enum class ScheduleKind { kCosine, kLinear, kConstant };

// Parses "cosine", "linear" or "constant"; a weft::Error listing them otherwise.
ScheduleKind parse_schedule_kind(std::string_view name);

class LearningRateSchedule {
 public:
  // peak_lr >= 0; warmup_steps >= 0; min_lr_ratio in [0, 1]; for a decaying kind,
  // total_steps >= warmup_steps. Violations are weft::Error naming the value.
  LearningRateSchedule(double peak_lr, int64_t warmup_steps, int64_t total_steps, ScheduleKind kind,
                       double min_lr_ratio = 0.0);
  LearningRateSchedule(double peak_lr, int64_t warmup_steps, int64_t total_steps, std::string_view kind,
                       double min_lr_ratio = 0.0);

  // The learning rate of step `step` (>= 0, counted from 0).
  double at(int64_t step) const;

  double peak_lr() const { return peak_lr_; }
  double min_lr() const { return peak_lr_ * min_lr_ratio_; }

 private:
  double peak_lr_;
  int64_t warmup_steps_;
  int64_t total_steps_;
  ScheduleKind kind_;
  double min_lr_ratio_;
};

}  // namespace weft
