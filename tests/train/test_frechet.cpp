// apps/common/frechet.h, the Fréchet distance wgan_gp's sample-quality figures rest on, against known
// answers: identical statistics give 0; Gaussians with diagonal covariances have the closed form
// |μa - μb|² + Σ (σa - σb)²; one case against the formula as pytorch-fid writes it with scipy's
// sqrtm (float64). Each through both forms of the covariance's factor (the centred vectors where
// there are no more of them than dimensions, else LDLT's) and their mixture.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "apps/common/frechet.h"
#include "tests/testing/helpers.h"

namespace ef = evenflow;
using ef::apps::feature_stats;
using ef::apps::FeatureStats;
using ef::apps::frechet_distance;

namespace {

// Rows of `rows` (each of the same length) padded with zeros to `dim` columns, as a float64 tensor:
// extra dimensions where every vector is 0 change neither statistic's distance nor its answer, but
// with dim >= rows they make feature_stats keep the factor instead of the covariance.
ef::Tensor features(const std::vector<std::vector<double>>& rows, int64_t dim) {
  std::vector<double> values;
  for (const auto& row : rows) {
    for (int64_t j = 0; j < dim; ++j) values.push_back(j < static_cast<int64_t>(row.size()) ? row[j] : 0.0);
  }
  return ef::from_vector(values, {static_cast<int64_t>(rows.size()), dim}, {.dtype = ef::kFloat64});
}

// 2k vectors μ ± c_j·e_j: mean μ, covariance diag(2c_j² / (2k - 1)).
std::vector<std::vector<double>> axis_pairs(const std::vector<double>& mu, const std::vector<double>& c) {
  std::vector<std::vector<double>> rows;
  for (size_t j = 0; j < c.size(); ++j) {
    for (double sign : {1.0, -1.0}) {
      std::vector<double> row = mu;
      row[j] += sign * c[j];
      rows.push_back(row);
    }
  }
  return rows;
}

// 2n vectors with the mean and the covariance of the n `rows`: μ ± k(x - μ) for each row x, with
// k = √((2n - 1) / (2(n - 1))) to keep the unbiased covariance. More vectors than dimensions where
// `rows` had as many: the same statistics in the other form.
std::vector<std::vector<double>> mirrored(const std::vector<std::vector<double>>& rows) {
  const size_t n = rows.size(), d = rows[0].size();
  std::vector<double> mu(d, 0.0);
  for (const auto& row : rows) {
    for (size_t j = 0; j < d; ++j) mu[j] += row[j] / static_cast<double>(n);
  }
  const double k = std::sqrt((2.0 * n - 1) / (2.0 * (n - 1)));
  std::vector<std::vector<double>> out;
  for (const auto& row : rows) {
    for (double sign : {1.0, -1.0}) {
      std::vector<double> r(d);
      for (size_t j = 0; j < d; ++j) r[j] = mu[j] + sign * k * (row[j] - mu[j]);
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("frechet: statistics hold a factor of the covariance: the centred vectors, or LDLT's") {
  // 5 vectors of 4 dimensions whose covariance pivoting reorders with a cycle, not a lone swap (a
  // lone swap is its own inverse and would hide a permutation applied the wrong way round).
  const std::vector<std::vector<double>> rows = {
      {1, 2, 0, 1}, {3, -1, 2, 0}, {0, 0, 1, 5}, {2, 5, -3, 1}, {-1, 1, 1, 2}};
  const double mean[4] = {1.0, 1.4, 0.2, 1.8};
  for (int64_t dim : {4, 6}) {  // more vectors than dimensions (LDLT's factor, 4 rows), then fewer (5)
    const FeatureStats s = feature_stats(features(rows, dim));
    CAPTURE(dim);
    CHECK(s.rows() == (dim == 4 ? 4 : 5));
    for (int64_t i = 0; i < dim; ++i) {
      CHECK(s.mean[i] == doctest::Approx(i < 4 ? mean[i] : 0.0).epsilon(1e-15));
      for (int64_t j = 0; j < dim; ++j) {
        double gram = 0, covariance = 0;  // (FᵀF)_ij, and Σ (x - μ)_i (x - μ)_j / (n - 1)
        for (int64_t r = 0; r < s.rows(); ++r) gram += s.factor[r * dim + i] * s.factor[r * dim + j];
        if (i < 4 && j < 4) {
          for (const auto& x : rows) covariance += (x[i] - mean[i]) * (x[j] - mean[j]) / 4.0;
        }
        CHECK(gram == doctest::Approx(covariance).epsilon(1e-14).scale(1));
      }
    }
  }
}

TEST_CASE("frechet: identical statistics give 0, in either form and mixed") {
  const std::vector<std::vector<double>> rows = {
      {1, 2, 0, 1}, {3, -1, 2, 0}, {0, 0, 1, 5}, {2, 5, -3, 1}, {-1, 1, 1, 2}};
  // 5 vectors (and their 10 mirrored): at 4 dimensions both LDLT factors, at 5 the vectors against
  // LDLT's, at 10 the vectors both. Rounding only: 1e-12 of tr(Σ) (~20).
  for (int64_t dim : {4, 5, 10}) {
    const FeatureStats s = feature_stats(features(rows, dim)), twin = feature_stats(features(mirrored(rows), dim));
    CAPTURE(dim);
    CHECK(std::abs(frechet_distance(s, s)) < 2e-11);
    CHECK(std::abs(frechet_distance(s, twin)) < 2e-11);
    CHECK(std::abs(frechet_distance(twin, s)) < 2e-11);
  }
}

TEST_CASE("frechet: Gaussians with diagonal covariances give |μa - μb|² + Σ (σa - σb)²") {
  const std::vector<double> mu_a = {0.5, -1, 2}, c_a = {1, 2, 0.5};
  const std::vector<double> mu_b = {1.5, 0, 1}, c_b = {3, 0.25, 1};
  // 6 vectors each: variances 2c² / 5.
  double expected = 0;
  for (size_t j = 0; j < 3; ++j) {
    const double sigma_a = std::sqrt(2.0 / 5.0) * c_a[j], sigma_b = std::sqrt(2.0 / 5.0) * c_b[j];
    expected += (mu_a[j] - mu_b[j]) * (mu_a[j] - mu_b[j]) + (sigma_a - sigma_b) * (sigma_a - sigma_b);
  }
  const auto a_rows = axis_pairs(mu_a, c_a), b_rows = axis_pairs(mu_b, c_b);
  for (int64_t dim : {3, 6, 10}) {  // both LDLT factors; the vectors against LDLT's; the vectors both
    const FeatureStats a = feature_stats(features(a_rows, dim));
    const FeatureStats b = feature_stats(features(dim == 6 ? mirrored(b_rows) : b_rows, dim));
    CAPTURE(dim);
    CHECK(frechet_distance(a, b) == doctest::Approx(expected).epsilon(1e-12));
    CHECK(frechet_distance(b, a) == doctest::Approx(expected).epsilon(1e-12));
  }
}

TEST_CASE("frechet: full-rank covariances give what pytorch-fid's formula with scipy's sqrtm gives") {
  // Computed with scipy 1.17.1 and numpy in float64, as pytorch-fid does:
  //   s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
  //   d = |mu1 - mu2|² + tr(s1) + tr(s2) - 2 tr(scipy.linalg.sqrtm(s1 @ s2).real)
  const double scipy_answer = 2.8868287313958376;
  const std::vector<std::vector<double>> a = {{1, 2, 0},  {3, -1, 2}, {0, 0, 1}, {2, 5, -3},
                                              {-1, 1, 1}, {4, 0, 2},  {1, -2, 0}};
  const std::vector<std::vector<double>> b = {{0, 1, 1},  {2, 2, -1}, {1, 0, 3}, {-2, 1, 0}, {3, 3, 3},
                                              {0, -1, 2}, {1, 4, 1},  {2, 0, 0}, {-1, -1, 1}};
  // dim 3: both covariances; 8: a's factor (7 vectors) with b's covariance (9); 10: both factors.
  for (int64_t dim : {3, 8, 10}) {
    CAPTURE(dim);
    CHECK(frechet_distance(feature_stats(features(a, dim)), feature_stats(features(b, dim))) ==
          doctest::Approx(scipy_answer).epsilon(1e-12));
  }
}

TEST_CASE("frechet: statistics that do not fit together are refused") {
  const FeatureStats a = feature_stats(features({{1, 2}, {3, 4}, {0, 1}}, 2));
  const FeatureStats b = feature_stats(features({{1, 2, 0}, {3, 4, 1}}, 3));
  CHECK(ef::testing::error_of([&] { frechet_distance(a, b); }).find("feature dims differ (2 and 3)") !=
        std::string::npos);
  FeatureStats broken = a;
  broken.factor.pop_back();
  CHECK(ef::testing::error_of([&] { frechet_distance(a, broken); }).find("a factor [rows, dim] (3 values)") !=
        std::string::npos);
  CHECK(ef::testing::error_of([&] {
          feature_stats(features({{1, 2}}, 2));
        }).find("expected features [N >= 2, dim]") != std::string::npos);
}
