// Matrix products: matmul (one batched GEMM, its operands described by their strides, copied only
// where those do not allow it) and linear. Their backward is again matmul: closed under
// differentiation. Their bfloat16 compute rounds operands with operand_for (ops_internal.h).
#include "evenflow/engine/ops.h"

#include <algorithm>

#include "evenflow/engine/ops_internal.h"

namespace evenflow {

using detail::backend_of;
using detail::Grads;
using detail::operand_for;

// --- matmul --------------------------------------------------------------------------------------------

namespace {

// One operand of a batched GEMM: a pointer, whether the stored matrix is transposed, its row
// stride and its batch stride (0 when shared by every batch entry). `keep` owns any copy made.
struct GemmOperand {
  Tensor keep;
  const void* data = nullptr;
  bool trans = false;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

// Describes t, broadcast to batch_shape + its own last two dims, without copying when its strides
// allow: a row-major or column-major matrix, batch dims that collapse to one stride.
GemmOperand gemm_operand(const Tensor& t_in, const Shape& batch_shape) {
  Tensor t = t_in.detach();
  const int64_t rows = t.size(-2), cols = t.size(-1);
  Shape full = batch_shape;
  full.push_back(rows);
  full.push_back(cols);
  if (t.shape() != full) t = expand(t, full);
  auto layout_ok = [&](const Tensor& m, bool& trans, int64_t& ld) {
    const int64_t rs = m.strides()[m.strides().size() - 2], cs = m.strides().back();
    if ((cs == 1 || cols == 1) && rs >= cols) {
      trans = false;
      ld = std::max<int64_t>(rs, std::max<int64_t>(cols, 1));
      return true;
    }
    if ((rs == 1 || rows == 1) && cs >= rows) {
      trans = true;
      ld = std::max<int64_t>(cs, std::max<int64_t>(rows, 1));
      return true;
    }
    return false;
  };
  // Batch dims must collapse to a single stride (all-zero strides count: a broadcast operand).
  auto batch_stride_of = [&](const Tensor& m, int64_t& stride) {
    stride = 0;
    bool first = true;
    int64_t expected = 0;
    for (size_t i = batch_shape.size(); i-- > 0;) {
      if (m.shape()[i] == 1) continue;
      const int64_t s = m.strides()[i];
      if (first) {
        stride = s;
        expected = s * m.shape()[i];
        first = false;
      } else {
        if (s != expected) return false;
        expected = s * m.shape()[i];
      }
    }
    return true;
  };
  GemmOperand op;
  if (!layout_ok(t, op.trans, op.ld) || !batch_stride_of(t, op.batch_stride)) {
    t = clone(t);
    layout_ok(t, op.trans, op.ld);
    batch_stride_of(t, op.batch_stride);
  }
  op.keep = t;
  op.data = t.data_ptr();
  return op;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& o) {
  detail::check_float("matmul", a, "first input");
  detail::check_compatible("matmul", a, b);
  EF_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: expected tensors with at least 2 dims, got ", shape_str(a.shape()),
           " and ", shape_str(b.shape()));
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  EF_CHECK(b.size(-2) == k, "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
           " cannot be multiplied (", k, " vs ", b.size(-2), ")");
  // [..., M, K] x [K, N]: one GEMM with the batch folded into M (its gradients follow the same path).
  if (b.dim() == 2 && a.dim() > 2) {
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    out_shape.push_back(n);
    return reshape(matmul(reshape(a, {-1, k}), b, o), out_shape);
  }
  const Shape batch = detail::broadcast_shapes("matmul", Shape(a.shape().begin(), a.shape().end() - 2),
                                               Shape(b.shape().begin(), b.shape().end() - 2));
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor y = detail::empty_like_shape(a, out_shape);
  if (y.numel() > 0) {
    if (k == 0) {
      backend_of(a).fill(y.view(), 0.0);
    } else {
      // Note [bfloat16 compute]: the unrounded operands where the backend multiplies in bfloat16
      // itself (oneDNN's matmul), else operand_for's rounded ones on the float32 kernel.
      const auto args_for = [&](const Tensor& ta, const Tensor& tb, GemmOperand& oa, GemmOperand& ob) {
        oa = gemm_operand(ta, batch);
        ob = gemm_operand(tb, batch);
        GemmArgs g;
        g.dtype = a.dtype();
        g.m = m;
        g.n = n;
        g.k = k;
        g.batch = numel_of(batch);
        g.a = oa.data;
        g.trans_a = oa.trans;
        g.lda = oa.ld;
        g.stride_a = oa.batch_stride;
        g.b = ob.data;
        g.trans_b = ob.trans;
        g.ldb = ob.ld;
        g.stride_b = ob.batch_stride;
        g.c = y.data_ptr();
        g.ldc = n;
        g.stride_c = m * n;
        return g;
      };
      GemmOperand oa, ob;
      GemmArgs g;
      if (o.compute == kBFloat16) {
        for (const Tensor* t : {&a, &b})
          EF_CHECK(t->dtype() == kFloat32, "matmul: bfloat16 compute takes float32 operands, got ",
                   dtype_name(t->dtype()));
        g = args_for(a, b, oa, ob);
        g.compute = DType::BFloat16;
        if (!backend_of(a).bf16_gemm(g))
          g = args_for(operand_for("matmul", a, o.compute), operand_for("matmul", b, o.compute), oa, ob);
      } else {
        g = args_for(a, b, oa, ob);
      }
      backend_of(a).gemm(g);
    }
  }
  // dA = g·Bᵀ [M,N]x[N,K], dB = Aᵀ·g [K,M]x[M,N], each summed over broadcast batch dims.
  record("matmul", {y}, {a, b}, {a, b}, [a, b, o](const Grads& g) {
    return Grads{input_grad_needed(0) ? sum_to(matmul(g[0], transpose(b, -1, -2), o), a.shape()) : Tensor(),
                 input_grad_needed(1) ? sum_to(matmul(transpose(a, -1, -2), g[0], o), b.shape()) : Tensor()};
  });
  return y;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const MatmulOptions& o) {
  detail::check_float("linear", x);
  detail::check_compatible("linear", x, weight, "input", "weight");
  EF_CHECK(weight.dim() == 2, "linear: weight must be 2-D [out, in], got ", shape_str(weight.shape()));
  EF_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input has ", x.dim() ? x.size(-1) : 0,
           " features, weight expects ", weight.size(1));
  const int64_t in = weight.size(1), out = weight.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out;
  const Tensor flat = reshape(x, {-1, in});  // [N, in]: the batch dims folded
  Tensor y;
  {
    NoGradGuard no_grad;
    y = matmul(flat, transpose(weight, 0, 1), o);  // y = x·Wᵀ [N,in]x[in,out]
  }
  // dx = g·W [N,out]x[out,in]; dW = gᵀ·x [out,N]x[N,in], computed in the weight's own layout, so
  // the accumulated gradient needs no copy (Note [Gradient layout] in autograd.cpp), as matmul's
  // transposed Aᵀ·g would.
  record("linear", {y}, {flat, weight}, {flat, weight}, [flat, weight, o](const Grads& g) {
    return Grads{input_grad_needed(0) ? matmul(g[0], weight, o) : Tensor(),
                 input_grad_needed(1) ? matmul(transpose(g[0], 0, 1), flat, o) : Tensor()};
  });
  y = reshape(y, out_shape);
  if (bias.defined()) {
    detail::check_compatible("linear", x, bias, "input", "bias");
    EF_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias has shape ", shape_str(bias.shape()),
             ", expected [", weight.size(0), "]");
    y = y + bias;
  }
  return y;
}

}  // namespace evenflow
