#include "apps/common/frechet.h"

#include <cmath>

// GCC 12 reports false (maybe-)uninitialized uses inside its own AVX-512 intrinsics (the
// _mm512_undefined_ps() idiom) where it inlines Eigen's kernels with -march=native, at the point of
// use, so the whole file ignores them (as engine/cpu/cpu_conv.cpp does).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Dense>

#include "apps/common/fashion_cnn.h"
#include "evenflow/engine/error.h"
#include "evenflow/engine/ops.h"

namespace evenflow::apps {

namespace {
using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The symmetric PSD square root, through the eigendecomposition.
Matrix psd_sqrt(const Matrix& m) {
  const Eigen::SelfAdjointEigenSolver<Matrix> eig(m);
  const Eigen::VectorXd roots = eig.eigenvalues().cwiseMax(0.0).cwiseSqrt();
  return eig.eigenvectors() * roots.asDiagonal() * eig.eigenvectors().transpose();
}
}  // namespace

FeatureStats feature_stats(const Tensor& features) {
  EF_CHECK(features.defined() && features.dim() == 2 && features.size(0) >= 2,
           "feature_stats: expected features [N >= 2, dim], got ",
           features.defined() ? shape_str(features.shape()) : "undefined");
  const int64_t n = features.size(0), d = features.size(1);
  const std::vector<double> v = features.to(cpu()).to(kFloat64).contiguous().to_vector();
  const Eigen::Map<const Matrix> x(v.data(), n, d);
  const Eigen::RowVectorXd mu = x.colwise().mean();
  const Matrix centered = x.rowwise() - mu;
  const Matrix cov = (centered.transpose() * centered) / static_cast<double>(n - 1);
  FeatureStats s;
  s.dim = d;
  s.count = n;
  s.mean.assign(mu.data(), mu.data() + d);
  s.covariance.assign(cov.data(), cov.data() + d * d);
  return s;
}

double frechet_distance(const FeatureStats& a, const FeatureStats& b) {
  EF_CHECK(a.dim == b.dim && a.dim > 0, "frechet_distance: feature dims differ (", a.dim, " and ", b.dim, ")");
  const Eigen::Map<const Eigen::VectorXd> mu_a(a.mean.data(), a.dim), mu_b(b.mean.data(), b.dim);
  const Eigen::Map<const Matrix> cov_a(a.covariance.data(), a.dim, a.dim), cov_b(b.covariance.data(), b.dim, b.dim);
  const Matrix root_a = psd_sqrt(cov_a);
  const Matrix inner = root_a * cov_b * root_a;
  const Eigen::SelfAdjointEigenSolver<Matrix> eig((inner + inner.transpose()) / 2.0, Eigen::EigenvaluesOnly);
  const double cross = eig.eigenvalues().cwiseMax(0.0).cwiseSqrt().sum();
  return (mu_a - mu_b).squaredNorm() + cov_a.trace() + cov_b.trace() - 2.0 * cross;
}

Tensor dataset_images(const data::FashionMNIST& set, int64_t count, DType dtype, const Device& device) {
  std::vector<int64_t> indices(static_cast<size_t>(std::min(count, set.size())));
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(i);
  return set.get_batch(indices).images.to(dtype).to(device) * 2.0 - 1.0;
}

double FashionFrechet::floor_of(const data::FashionMNIST& train, int64_t count, DType dtype,
                                const Device& device) const {
  return frechet_distance(feature_stats(features(dataset_images(train, count, dtype, device))), reference);
}

Tensor FashionFrechet::features(const Tensor& images) const {
  std::vector<Tensor> parts;
  for (int64_t start = 0; start < images.size(0); start += 500) {
    const Tensor chunk = narrow(images, 0, start, std::min<int64_t>(500, images.size(0) - start));
    parts.push_back(fashion_cnn_features(*net, (chunk.to(kFloat32) + 1.0) * 0.5).to(cpu()));
  }
  return cat(parts, 0);
}

}  // namespace evenflow::apps
