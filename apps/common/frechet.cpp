#include "apps/common/frechet.h"

#include <cmath>

// GCC 12 reports false (maybe-)uninitialized uses inside its own AVX-512 intrinsics (the
// _mm512_undefined_ps() idiom) where it inlines Eigen's kernels with -march=native, at the point of
// use, so the whole file ignores them (as engine/cpu/cpu_gemm.cpp does).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Cholesky>
#include <Eigen/Eigenvalues>
#include <Eigen/Householder>

#include "apps/common/fashion_cnn.h"
#include "evenflow/engine/error.h"
#include "evenflow/engine/ops.h"

namespace evenflow::apps {

namespace {
using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const Matrix>;

ConstMap factor_of(const FeatureStats& s) {
  return ConstMap(s.factor.data(), s.rows(), s.dim);
}

// F [dim, dim] with FᵀF = cov for a covariance (symmetric PSD): from the pivoted LDLᵀ = PᵀLDLᵀP,
// F = √D·Lᵀ·P (D's rounding below 0 clamped). Eigen's `matrix * transpositions` multiplies by the
// permutation's inverse, hence the transpose; test_frechet.cpp's first case checks FᵀF = cov with
// a pivoting that is not its own inverse.
Matrix covariance_factor(const Matrix& cov) {
  const Eigen::LDLT<Matrix> ldlt(cov);
  const Eigen::VectorXd root_d = ldlt.vectorD().cwiseMax(0.0).cwiseSqrt();
  const Matrix upper = root_d.asDiagonal() * Matrix(ldlt.matrixL()).transpose();
  return upper * ldlt.transpositionsP().transpose();
}

// Σ of the singular values of `p` (its nuclear norm): a Householder bidiagonalization p = U·B·Vᵀ,
// then the eigenvalues of B's Golub-Kahan form -- the symmetric tridiagonal matrix with a zero
// diagonal and B's diagonal and superdiagonal interleaved off it, a permutation of [[0, B], [Bᵀ, 0]]
// -- which are ±σ. Each σ to O(ε·|p|), as an SVD gives it, without the singular vectors an SVD
// library is built to compute: Eigen's BDCSVD made this file 5x longer to compile in Release (CI
// compiles it three times), for the same time and sums at 1024 x 1024, wgan_gp's final distance
// (docs/benchmarks.md, "The Fréchet distance's singular values").
double nuclear_norm(Matrix p) {
  if (p.rows() < p.cols()) p.transposeInPlace();  // rows >= columns: B is square, n x n
  const Eigen::Index m = p.rows(), n = p.cols();
  // B's diagonal at the even places, its superdiagonal at the odd ones.
  Eigen::VectorXd golub_kahan_off(2 * n - 1), essential, workspace(m);
  double tau = 0;
  for (Eigen::Index k = 0; k < n; ++k) {
    essential.resize(m - k - 1);  // column k below the diagonal to 0
    p.col(k).tail(m - k).makeHouseholder(essential, tau, golub_kahan_off(2 * k));
    p.block(k, k + 1, m - k, n - k - 1).applyHouseholderOnTheLeft(essential, tau, workspace.data());
    if (k + 1 < n) {  // row k right of the superdiagonal to 0
      essential.resize(n - k - 2);
      p.row(k).tail(n - k - 1).makeHouseholder(essential, tau, golub_kahan_off(2 * k + 1));
      p.block(k + 1, k + 1, m - k - 1, n - k - 1).applyHouseholderOnTheRight(essential, tau, workspace.data());
    }
  }
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver;
  solver.computeFromTridiagonal(Eigen::VectorXd::Zero(2 * n), golub_kahan_off, Eigen::EigenvaluesOnly);
  return solver.eigenvalues().cwiseAbs().sum() / 2;
}

// Note [Fréchet cross term]
// tr((Σa^½ Σb Σa^½)^½) is Σ √λ over the eigenvalues λ of Σa·Σb (similar matrices). With Σ = FᵀF,
// the nonzero eigenvalues of FaᵀFa·FbᵀFb are those of Fa·FbᵀFb·Faᵀ = (Fa·Fbᵀ)(Fa·Fbᵀ)ᵀ, the squares
// of the singular values of Fa·Fbᵀ [rows a, rows b]. So the cross term is their sum: no matrix square
// root, no square root of an eigenvalue that rounding moved off 0 (which costs ~1e-8 of the distance
// where covariances are singular, as they are with fewer vectors than dimensions). And a periodic
// distance over fewer images than the features' 1024 dimensions needs the singular values of a matrix
// of their count, not two 1024 x 1024 eigendecompositions (most of a short run's time, and of the
// programs' tests).
double cross_term(const FeatureStats& a, const FeatureStats& b) {
  return nuclear_norm(factor_of(a) * factor_of(b).transpose());
}

void check_stats(const FeatureStats& s) {
  EF_CHECK(s.dim > 0 && s.count >= 2 && s.mean.size() == static_cast<size_t>(s.dim) && s.rows() >= 1 &&
               s.factor.size() == static_cast<size_t>(s.rows() * s.dim),
           "frechet_distance: statistics of ", s.count, " vectors of ", s.dim,
           " dimensions need a mean of that size and a factor [rows, dim] (", s.factor.size(), " values)");
}
}  // namespace

FeatureStats feature_stats(const Tensor& features) {
  EF_CHECK(features.defined() && features.dim() == 2 && features.size(0) >= 2,
           "feature_stats: expected features [N >= 2, dim], got ",
           features.defined() ? shape_str(features.shape()) : "undefined");
  const int64_t n = features.size(0), d = features.size(1);
  const std::vector<double> v = features.to(cpu()).to(kFloat64).contiguous().to_vector();
  const ConstMap x(v.data(), n, d);
  const Eigen::RowVectorXd mu = x.colwise().mean();
  const Matrix scaled = (x.rowwise() - mu) / std::sqrt(static_cast<double>(n - 1));
  const Matrix factor = n <= d ? scaled : covariance_factor(scaled.transpose() * scaled);
  FeatureStats s;
  s.dim = d;
  s.count = n;
  s.mean.assign(mu.data(), mu.data() + d);
  s.factor.assign(factor.data(), factor.data() + factor.size());
  return s;
}

double frechet_distance(const FeatureStats& a, const FeatureStats& b) {
  EF_CHECK(a.dim == b.dim, "frechet_distance: feature dims differ (", a.dim, " and ", b.dim, ")");
  check_stats(a);
  check_stats(b);
  const Eigen::Map<const Eigen::VectorXd> mu_a(a.mean.data(), a.dim), mu_b(b.mean.data(), b.dim);
  return (mu_a - mu_b).squaredNorm() + factor_of(a).squaredNorm() + factor_of(b).squaredNorm() - 2.0 * cross_term(a, b);
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
