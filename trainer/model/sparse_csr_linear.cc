#include "trainer/model/sparse_csr_linear.h"

#include <vector>

namespace dynmo::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor CsrOf(const torch::Tensor& row_ptr, const torch::Tensor& col_idx,
                    const torch::Tensor& values, int64_t out, int64_t in) {
  return torch::sparse_csr_tensor(row_ptr, col_idx, values, {out, in},
                                  values.options().layout(torch::kSparseCsr));
}

class SparseCsrLinearFunction : public torch::autograd::Function<SparseCsrLinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor values,
                               torch::Tensor bias, torch::Tensor row_ptr,
                               torch::Tensor col_idx, int64_t out, int64_t in) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() >= 1 && x.size(-1) == in,
                "SparseCsrLinear: x must be float [..., ", in, "], got ", x.sizes());
    TORCH_CHECK(values.dim() == 1 && values.numel() == col_idx.numel() &&
                    row_ptr.numel() == out + 1,
                "SparseCsrLinear: CSR arrays do not match W [", out, ", ", in, "]");
    const torch::Tensor x2 = x.reshape({-1, in}).contiguous();
    const torch::Tensor w = CsrOf(row_ptr, col_idx, values.detach(), out, in);
    torch::Tensor y = torch::mm(w, x2.t()).t();
    if (bias.defined()) y = y + bias.detach();
    ctx->save_for_backward({x2, values, row_ptr, col_idx});
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["out"] = out;
    ctx->saved_data["in"] = in;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out;
    ctx->saved_data["shape"] = shape;
    return y.contiguous().view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x2 = saved[0];
    const int64_t out = ctx->saved_data["out"].toInt(), in = ctx->saved_data["in"].toInt();
    const torch::Tensor dy = grads[0].reshape({x2.size(0), out}).contiguous();
    torch::Tensor dx, dvalues, dbias;
    if (ctx->needs_input_grad(0)) {
      const torch::Tensor w = CsrOf(saved[2], saved[3], saved[1].detach(), out, in);
      std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
      shape.back() = in;
      dx = torch::mm(dy, w).contiguous().view(shape);
    }
    if (ctx->needs_input_grad(1)) {
      // (dyᵀ · x) sampled at W's pattern: the gradient of each stored value.
      const torch::Tensor pattern =
          CsrOf(saved[2], saved[3], torch::zeros_like(saved[1]), out, in);
      dvalues = torch::sparse_sampled_addmm(pattern, dy.t().contiguous(), x2, /*beta=*/0.0)
                    .values()
                    .contiguous();
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      dbias = dy.sum(0);
    }
    return {dx, dvalues, dbias, torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor SparseCsrLinear(const torch::Tensor& x, const torch::Tensor& values,
                              const torch::Tensor& bias, const torch::Tensor& row_ptr,
                              const torch::Tensor& col_idx, int64_t out, int64_t in) {
  return SparseCsrLinearFunction::apply(x, values, bias, row_ptr, col_idx, out, in);
}

}  // namespace dynmo::trainer
