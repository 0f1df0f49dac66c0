# Sourced by the weft-train test scripts: a fresh work folder with what a small training run reads.
#   source "$(dirname "$0")/../support/training_work_dir.sh"; prepare_training_work_dir "$work"
# leaves $work empty but for text.txt (a small repetitive text: the runs must not depend on
# packages being installed) and run.yaml (a GPT; the scripts set the sizes with --set).
prepare_training_work_dir() {
  local work=$1
  rm -rf "$work" && mkdir -p "$work"
  for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog $((i % 7))."; done > "$work/text.txt"
  printf 'model:\n  type: gpt\n' > "$work/run.yaml"
}
