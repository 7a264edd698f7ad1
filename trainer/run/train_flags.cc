#include "trainer/run/train_flags.h"

namespace dynmo::trainer {

absl::StatusOr<TrainerConfig> ConfigFromFlags() {
  TrainerConfig c;
  for (absl::Status (*read)(TrainerConfig&) :
       {ReadModelFlags, ReadLayoutFlags, ReadDynamismFlags, ReadJobFlags, ReadRuntimeFlags}) {
    if (absl::Status s = read(c); !s.ok()) return s;
  }
  return c;
}

}  // namespace dynmo::trainer
