#include "wire/layer_codec.h"

namespace dynmo::wire {

void LayerCostToSample(const core::LayerCost& cost, dynmo::v1::LayerSample* l) {
  l->set_layer(cost.id);
  l->set_fwd_s(cost.fwd_s);
  l->set_bwd_s(cost.bwd_s);
  l->set_wgrad_s(cost.wgrad_s);
  l->set_params(cost.params);
  l->set_resident_bytes(cost.resident_bytes);
  l->set_activation_bytes(cost.activation_bytes);
}

dynmo::v1::LayerSample LayerSampleFromCost(const core::LayerCost& cost) {
  dynmo::v1::LayerSample l;
  LayerCostToSample(cost, &l);
  return l;
}

}  // namespace dynmo::wire
