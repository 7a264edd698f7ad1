// Editing one parameter's AdamW state when pruning changes which entries of
// that parameter exist, so the optimizer stays consistent with the weights:
//
//   SelectAdamWState  the parameter shrinks to the entries at `flat_index`
//                     (dense -> CSR values, or CSR values -> fewer values):
//                     exp_avg, exp_avg_sq (and max_exp_avg_sq) become the
//                     1-D gather of the surviving entries, in index order,
//                     so every surviving weight keeps its own moments.
//   MaskAdamWState    the parameter keeps its shape but entries are pruned
//                     (dense with a mask): their moments are zeroed, so a
//                     pruned weight (zero, with zero gradient) gets a zero
//                     update and stays exactly zero.
// The step count is untouched (AdamW's bias correction is per parameter).
// A parameter the optimizer has not stepped yet has no state: both return
// false and change nothing. Thread-compatible (the optimizer is not).
#ifndef DYNMO_TRAINER_MODEL_ADAMW_STATE_SELECT_H_
#define DYNMO_TRAINER_MODEL_ADAMW_STATE_SELECT_H_

#include <torch/torch.h>

namespace dynmo::trainer {

// `flat_index`: int64 indices into the state flattened (row-major).
bool SelectAdamWState(torch::optim::AdamW& optimizer, const torch::Tensor& param,
                      const torch::Tensor& flat_index);

// `keep`: bool, the state's shape; false entries are zeroed.
bool MaskAdamWState(torch::optim::AdamW& optimizer, const torch::Tensor& param,
                    const torch::Tensor& keep);

// The optimizer's key for `param`'s state: libtorch keys parameter state by
// the parameter's TensorImpl (a void* since PyTorch 2.x), which
// Tensor::set_data keeps, so restoring a layer in place keeps its state.
inline void* OptimizerStateKey(const torch::Tensor& param) {
  return param.unsafeGetTensorImpl();
}

// The AdamW state of `param`, or nullptr when it has none yet.
torch::optim::AdamWParamState* FindAdamWState(torch::optim::AdamW& optimizer,
                                              const torch::Tensor& param);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_ADAMW_STATE_SELECT_H_
