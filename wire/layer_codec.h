// One measured layer from the decision core (core::LayerCost) onto the
// wire (dynmo.v1.LayerSample): the agent encodes its reports with it, the
// coordinator the layers of a JobStatus. Field for field, nothing checked
// here (the agent checks what it sends). The way back, checked, is
// report_codec.h's ReadReport. Pure; thread-safe.
#ifndef DYNMO_WIRE_LAYER_CODEC_H_
#define DYNMO_WIRE_LAYER_CODEC_H_

#include "core/cost_model.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::wire {

// The sample's layer = cost.id.
void LayerCostToSample(const core::LayerCost& cost, dynmo::v1::LayerSample* sample);
dynmo::v1::LayerSample LayerSampleFromCost(const core::LayerCost& cost);

}  // namespace dynmo::wire

#endif  // DYNMO_WIRE_LAYER_CODEC_H_
