// Fréchet distance between two sets of feature vectors, each summarised by its mean and covariance
// (the FID recipe, here in the feature space of a FashionMNIST classifier, fashion_cnn.h):
//   d² = |μa - μb|² + tr(Σa) + tr(Σb) - 2·tr((Σa^½ Σb Σa^½)^½).
// Computed in double precision with symmetric eigendecompositions (negative eigenvalues from
// rounding are clamped to 0), so it is defined for rank-deficient covariances too.
#pragma once

#include <cstdint>
#include <vector>

#include "evenflow/engine/tensor.h"

namespace evenflow::apps {

struct FeatureStats {
  int64_t dim = 0, count = 0;
  std::vector<double> mean;        // [dim]
  std::vector<double> covariance;  // [dim, dim], row-major, unbiased (count - 1)
};

// Statistics of features [N, dim] (N >= 2; any device and float dtype).
FeatureStats feature_stats(const Tensor& features);

double frechet_distance(const FeatureStats& a, const FeatureStats& b);

}  // namespace evenflow::apps
