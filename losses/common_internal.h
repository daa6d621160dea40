// Helpers shared by the loss implementations (not part of the public API): argument checks with
// the loss named in every message, and the masks that implement ignore_index.
//
// Note [Masking ignored elements]
// Ignored targets are replaced by class 0 before any gather, so every index is valid, and the
// per-element losses are then masked with where(), not multiplied by a 0/1 mask: the value at an
// ignored element is exactly 0 and no gradient passes the mask, whatever the (finite or not) value
// behind it. A mean over zero valid elements divides by 1 instead of 0 (nonzero()), so a chunk of
// the batch that is entirely ignored contributes 0 with a zero gradient, never NaN.
#pragma once

#include <cstdint>
#include <vector>

#include "evenflow/losses/losses.h"

namespace evenflow::losses::detail {

// A class-index target checked against logits [N, C, d1, ...] (or log-probabilities), with its
// ignore mask.
struct ClassTarget {
  Tensor valid;  // 1 where the target is not ignore_index, else 0; logits' dtype, target's shape
  Tensor clean;  // int64, the target with ignored elements set to class 0
};

// Checks logits (float, at least min_dim dims) and target (int64, logits' shape without dim 1, same
// device, classes in [0, C) or ignore_index), then builds the masks.
ClassTarget class_target(const char* loss, const Tensor& logits, const Tensor& target, int64_t ignore_index,
                         int64_t min_dim = 2);
// The same for a target of any shape, with `classes` classes (no logits to check against).
ClassTarget class_target(const char* loss, const Tensor& target, int64_t classes, int64_t ignore_index,
                         DType mask_dtype);

// Checks an optional per-class weight: 1-D [C], the logits' dtype and device.
void check_class_weight(const char* loss, const char* what, const Tensor& weight, const Tensor& logits);

// Checks input and target of an elementwise loss: float, same dtype, device and shape.
void check_same_float(const char* loss, const Tensor& input, const Tensor& target, const char* what_input,
                      const char* what_target);

// [N, C, d1, ...] float: 1 where clean == c, else 0 (a constant).
Tensor one_hot(const Tensor& clean, int64_t classes, DType dtype);

// where(mask, x, 0): see Note [Masking ignored elements]. mask broadcasts to x.
Tensor masked(const Tensor& x, const Tensor& mask);

// d where d != 0, else 1 (d is a sum of non-negative weights).
Tensor nonzero(const Tensor& d);

// The dims after the class dim of a [N, C, d1, ...] tensor: {2, 3, ...}.
Shape spatial_dims(const Tensor& logits);

// A loss before its reduction: the per-element (or per-image) losses and the divisor of their mean,
// undefined for the plain mean over them. Every loss computes this once; its function reduces it
// (reduced) and its loss object's parts() sums it (parts_of), so both agree by construction.
struct Unreduced {
  Tensor losses;
  Tensor divisor;
};
Tensor reduced(const Unreduced& u, Reduction reduction);
LossParts parts_of(const Unreduced& u);

// The per-element losses of each loss, checked as the public function checks them.
Unreduced weighted_nll(const char* loss, const Tensor& input, bool take_log_softmax, const Tensor& target,
                       const CrossEntropyOptions& o, double smoothing);
Unreduced focal(const Tensor& logits, const Tensor& target, const FocalOptions& o);
Unreduced dice(const Tensor& logits, const Tensor& target, const DiceOptions& o);
Unreduced lovasz(const Tensor& logits, const Tensor& target, const LovaszOptions& o);
Unreduced ohem(const Tensor& logits, const Tensor& target, const OhemOptions& o);
Unreduced squared_error(const Tensor& input, const Tensor& target);
Unreduced absolute_error(const Tensor& input, const Tensor& target);
Unreduced smooth_l1(const Tensor& input, const Tensor& target, double beta);
Unreduced bce_with_logits(const Tensor& logits, const Tensor& target, const BceOptions& o);

}  // namespace evenflow::losses::detail
