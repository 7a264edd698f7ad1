// One measured layer between the decision core (core::LayerCost) and the
// wire (dynmo.v1.LayerSample): the agent encodes its reports with it, the
// coordinator decodes them and encodes the layers of a JobStatus. Field for
// field, nothing checked here (the agent checks what it sends, the
// coordinator's validation.h what it receives). Pure; thread-safe.
#ifndef DYNMO_WIRE_LAYER_CODEC_H_
#define DYNMO_WIRE_LAYER_CODEC_H_

#include "core/cost_model.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::wire {

// id = the sample's layer.
core::LayerCost LayerCostFromSample(const dynmo::v1::LayerSample& sample);
void LayerCostToSample(const core::LayerCost& cost, dynmo::v1::LayerSample* sample);
dynmo::v1::LayerSample LayerSampleFromCost(const core::LayerCost& cost);

}  // namespace dynmo::wire

#endif  // DYNMO_WIRE_LAYER_CODEC_H_
