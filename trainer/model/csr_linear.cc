#include "trainer/model/csr_linear.h"

#include <cstring>
#include <vector>

#include "kernels/csr_spmm_cpu.h"

namespace dynmo::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

absl::Span<const float> Floats(const torch::Tensor& t) {
  return absl::MakeConstSpan(t.data_ptr<float>(), static_cast<size_t>(t.numel()));
}
absl::Span<float> MutableFloats(torch::Tensor& t) {
  return absl::MakeSpan(t.data_ptr<float>(), static_cast<size_t>(t.numel()));
}

void Check(const absl::Status& s) { TORCH_CHECK(s.ok(), "CsrLinear: ", s.ToString()); }

// Copies the trainable values into the kernels' matrix.
void LoadValues(CsrWeight& w, const torch::Tensor& values) {
  TORCH_CHECK(values.scalar_type() == torch::kFloat && values.dim() == 1 &&
                  values.numel() == w.matrix.nnz(),
              "CsrLinear: values must be float [", w.matrix.nnz(), "], got ",
              values.sizes());
  const torch::Tensor v = values.contiguous();
  if (v.numel() > 0) {
    std::memcpy(w.matrix.mutable_values().data(), v.data_ptr<float>(),
                sizeof(float) * static_cast<size_t>(v.numel()));
  }
}

class CsrLinearFunction : public torch::autograd::Function<CsrLinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor values,
                               torch::Tensor bias, c10::intrusive_ptr<CsrWeight> weight) {
    const int64_t in = weight->matrix.cols(), out = weight->matrix.rows();
    TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() >= 1 && x.size(-1) == in,
                "CsrLinear: x must be float [..., ", in, "], got ", x.sizes());
    LoadValues(*weight, values);
    const torch::Tensor x2 = x.reshape({-1, in}).contiguous();
    const int64_t n = x2.size(0);
    torch::Tensor y = torch::empty({n, out}, torch::kFloat);
    torch::Tensor b = bias.defined() ? bias.contiguous() : torch::Tensor();
    Check(kernels::CsrLinearForward(weight->matrix, Floats(x2), n,
                                    b.defined() ? Floats(b) : absl::Span<const float>(),
                                    MutableFloats(y)));
    ctx->save_for_backward({x2, values});
    ctx->saved_data["weight"] = c10::IValue::make_capsule(weight);
    ctx->saved_data["has_bias"] = bias.defined();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out;
    ctx->saved_data["shape"] = shape;
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x2 = saved[0];
    auto weight = c10::static_intrusive_pointer_cast<CsrWeight>(
        ctx->saved_data["weight"].toCapsule());
    LoadValues(*weight, saved[1]);  // the values the forward used
    const int64_t in = weight->matrix.cols(), out = weight->matrix.rows();
    const int64_t n = x2.size(0);
    const torch::Tensor dy = grads[0].reshape({n, out}).contiguous();
    torch::Tensor dx, dvalues, dbias;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty({n, in}, torch::kFloat);
      Check(kernels::CsrLinearBackwardInput(weight->matrix, Floats(dy), n, MutableFloats(dx)));
      std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
      shape.back() = in;
      dx = dx.view(shape);
    }
    if (ctx->needs_input_grad(1)) {
      dvalues = torch::empty({weight->matrix.nnz()}, torch::kFloat);
      Check(kernels::CsrLinearBackwardWeight(weight->matrix, Floats(dy), Floats(x2), n,
                                             MutableFloats(dvalues)));
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      dbias = dy.sum(0);
    }
    return {dx, dvalues, dbias, torch::Tensor()};
  }
};

}  // namespace

absl::StatusOr<c10::intrusive_ptr<CsrWeight>> MakeCsrWeight(int64_t rows, int64_t cols,
                                                            const torch::Tensor& row_ptr,
                                                            const torch::Tensor& col_idx) {
  if (row_ptr.scalar_type() != torch::kInt || col_idx.scalar_type() != torch::kInt ||
      row_ptr.dim() != 1 || col_idx.dim() != 1) {
    return absl::InvalidArgumentError("CSR row_ptr and col_idx must be 1-D int32");
  }
  const torch::Tensor rp = row_ptr.contiguous(), ci = col_idx.contiguous();
  std::vector<int32_t> r(rp.data_ptr<int32_t>(), rp.data_ptr<int32_t>() + rp.numel());
  std::vector<int32_t> c(ci.data_ptr<int32_t>(), ci.data_ptr<int32_t>() + ci.numel());
  std::vector<float> v(c.size(), 0.0f);
  absl::StatusOr<kernels::CsrMatrix> m =
      kernels::CsrMatrix::Create(static_cast<int32_t>(rows), static_cast<int32_t>(cols),
                                 std::move(r), std::move(c), std::move(v));
  if (!m.ok()) return m.status();
  return c10::make_intrusive<CsrWeight>(*std::move(m));
}

torch::Tensor CsrLinear(const torch::Tensor& x, const torch::Tensor& values,
                        const torch::Tensor& bias,
                        const c10::intrusive_ptr<CsrWeight>& weight) {
  return CsrLinearFunction::apply(x, values, bias, weight);
}

}  // namespace dynmo::trainer
