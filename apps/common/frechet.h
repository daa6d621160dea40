// Fréchet distance between two sets of feature vectors, each summarised by its mean and covariance
// (the FID recipe, here in the feature space of a FashionMNIST classifier, fashion_cnn.h):
//   d² = |μa - μb|² + tr(Σa) + tr(Σb) - 2·tr((Σa^½ Σb Σa^½)^½).
// Computed in double precision from a factor F of each covariance (Σ = FᵀF): the cross term is
// then the sum of the singular values of Fa·Fbᵀ (Note [Fréchet cross term]), defined for
// rank-deficient covariances too and without the square roots of rounding errors that the
// eigenvalues of Σa·Σb would give near 0.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "evenflow/data/fashion_mnist.h"
#include "evenflow/engine/tensor.h"
#include "evenflow/layers/sequential.h"

namespace evenflow::apps {

struct FeatureStats {
  int64_t dim = 0, count = 0;
  std::vector<double> mean;  // [dim]
  // A factor F [rows, dim] of the unbiased covariance, Σ = FᵀF, row-major: the centred vectors
  // / √(count - 1) where count <= dim (rows = count), else the covariance's pivoted LDLᵀ factor
  // √D·Lᵀ·P (rows = dim). The smaller of the two.
  std::vector<double> factor;
  int64_t rows() const { return dim > 0 ? static_cast<int64_t>(factor.size()) / dim : 0; }
};

// Statistics of features [N, dim] (N >= 2; any device and float dtype).
FeatureStats feature_stats(const Tensor& features);

double frechet_distance(const FeatureStats& a, const FeatureStats& b);

// The first `count` images of `set` (all, if it has fewer), as `dtype` on `device`, scaled from
// [0, 1] to [-1, 1]: a generator's range.
Tensor dataset_images(const data::FashionMNIST& set, int64_t count, DType dtype, const Device& device);

// A generator's sample quality on FashionMNIST (wgan_gp): the classifier whose features the
// distance compares, the test set's feature statistics (the reference), the floor (the distance of
// as many real training images) and the fixed noise of the periodic evaluations.
struct FashionFrechet {
  std::shared_ptr<nn::Sequential> net;
  FeatureStats reference;
  double floor = NAN;
  Tensor noise;  // fixed, so successive evaluations compare the generator, not the noise

  // The distance of `count` real training images (held out from the reference, the test set): as
  // many as the generated ones measured, since the distance's bias depends on the count.
  double floor_of(const data::FashionMNIST& train, int64_t count, DType dtype, const Device& device) const;
  // Features of images in [-1, 1] (the generator's range), in chunks of 500, in float32, on the host.
  Tensor features(const Tensor& images) const;
};

}  // namespace evenflow::apps
