/// @file
/// Losses, built from engine ops only, so every one is differentiable to any order (a gradient
/// penalty differentiates through them) and runs on any device, inside DataParallelCriterion too.
/// Semantics follow torch.nn.functional where a PyTorch counterpart exists; differences are stated.
///
/// Note [Losses across devices]
/// A loss that is a mean is a sum divided by a weight: cross_entropy's by Σ weight[target] over the
/// non-ignored elements, focal_loss's by their count, mse_loss's by the element count, a per-image
/// loss's (Dice, Lovász-softmax, OHEM) by the number of images. Split a batch into chunks and the
/// chunks' means, weighted by their sizes, are no longer the batch's mean once the weight is not
/// the sample count (a chunk of mostly ignored pixels, class weights); the sums and the weights,
/// though, add up. So every mean loss also comes as its parts (LossParts: the sum, differentiable,
/// and the weight, a constant), through the loss objects below (CrossEntropyLoss{...}.parts(x, t)),
/// and DataParallelCriterion adds the parts of every chunk on every device and process, then
/// divides once: the whole batch's loss at any split, device or process count, to any order. A loss
/// of several terms (ce + dice) is the sum of their parts, each divided by its own weight. The
/// Wasserstein losses and the gradient penalties are means over samples given the same random draws
/// (eps, noise; and DRAGAN's real_std, a whole-batch statistic): chunk-size weighting, what the
/// criterion does for a loss given as a plain tensor, is exact for them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "evenflow/engine/ops.h"

namespace evenflow::losses {

/// How a loss reduces its per-element (or per-sample, per-image) values: None returns them as
/// they are, Mean their mean (a loss may define its own divisor; over zero elements: 0), Sum their
/// sum.
enum class Reduction { None, Mean, Sum };

/// A loss as the parts of one or more weighted means (Note [Losses across devices]): its value is
/// Σ sum / weight over its terms, a term of weight 0 counting 0. Parts of chunks add term by term.
struct LossParts {
  /// One weighted mean.
  struct Term {
    Tensor sum;  ///< 0-d, differentiable
    /// 0-d, the sum's dtype and device, a constant (no gradient); undefined where host_weight holds
    /// the weight.
    Tensor weight;
    /// The weight where the host knows it (a count of samples or elements): adding the chunks'
    /// weights and dividing by them then costs no device work (kernels of a recorded step).
    std::optional<double> host_weight;

    /// sum / weight, a weight of 0 counting 0 (its sum is 0 too); sum·(1 / weight) for a host
    /// weight, as PyTorch divides by a number (and as mean() divides a sum by its count).
    Tensor value() const;
  };
  std::vector<Term> terms;  ///< one per mean the loss adds

  LossParts() = default;
  /// One term. ef::Error unless both are defined one-element tensors of one dtype and device.
  LossParts(const Tensor& sum, const Tensor& weight);
  /// One term whose weight the host knows. ef::Error unless `sum` is a defined one-element tensor
  /// and `weight` is finite and not negative.
  LossParts(const Tensor& sum, double weight);
  /// The terms of both, this loss's first: the parts of the sum of the two losses.
  LossParts operator+(const LossParts& other) const;
  /// Every term's sum scaled by `factor`: the parts of the loss times `factor`.
  LossParts operator*(double factor) const;
  /// Σ sum / weight over the terms (Term::value): the loss.
  Tensor value() const;
};

/// An ignore_index that ignores no target (INT64_MIN, which no class index equals).
inline constexpr int64_t kNoIgnore = INT64_MIN;

// --- Classification / segmentation (logits [N, C] or [N, C, d1, ...], int64 target [N] or
// [N, d1, ...] with values in [0, C) or ignore_index) ------------------------------------------------

/// Options of cross_entropy and nll_loss.
struct CrossEntropyOptions {
  int64_t ignore_index = -100;            ///< targets equal to it contribute nothing (kNoIgnore: none ignored)
  Tensor weight = {};                     ///< class weights [C] (optional)
  double label_smoothing = 0.0;           ///< in [0, 1]: target (1-ε)·one_hot + ε/C, as torch
  Reduction reduction = Reduction::Mean;  ///< Mean (default), Sum or None: see cross_entropy
};
/// torch.nn.functional.cross_entropy. Mean divides by Σ weight[target] over non-ignored elements, as
/// torch; when every element is ignored the mean is 0 with zero gradient (torch gives NaN).
/// Reduction::None returns the per-element losses, shaped like target (0 where ignored).
///
/// Throws ef::Error for logits that are not float32/float64 or have fewer than 2 dims, a target
/// that is not int64, not shaped like logits without dim 1 or not on logits' device, a target class
/// outside [0, C) other than ignore_index, a weight that is not [C] with logits' dtype and device,
/// or a label_smoothing outside [0, 1].
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o = {});

/// torch.nn.functional.nll_loss on log-probabilities, same conventions (label_smoothing unused).
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const CrossEntropyOptions& o = {});

/// Σ weight[target] over non-ignored elements: the divisor of cross_entropy's mean (the weight of
/// CrossEntropyLoss::parts). A 0-d float64 tensor on target's device. `target` is int64; `weight`, when
/// given, a 1-D float tensor [C] on target's device, and then every non-ignored class must be in
/// [0, C) (ef::Error otherwise).
Tensor valid_weight(const Tensor& target, int64_t ignore_index = -100, const Tensor& weight = {});

/// Options of focal_loss.
struct FocalOptions {
  double gamma = 2.0;                     ///< focusing parameter γ ≥ 0 (0: no (1 - p_t) factor)
  Tensor alpha = {};                      ///< per-class weights [C] (optional)
  int64_t ignore_index = -100;            ///< targets equal to it contribute nothing (kNoIgnore: none)
  Reduction reduction = Reduction::Mean;  ///< mean over non-ignored elements (0 if none)
};
/// Multi-class focal loss (Lin et al.): -α_t (1 - p_t)^γ log p_t with p_t = softmax(logits)[target].
/// Logits and target as for cross_entropy (same ef::Error checks, alpha for weight); a negative
/// gamma is an ef::Error.
Tensor focal_loss(const Tensor& logits, const Tensor& target, const FocalOptions& o = {});

/// Options of dice_loss.
struct DiceOptions {
  double smooth = 1.0;                    ///< added to each class's numerator and denominator; ≥ 0
  int64_t ignore_index = -100;            ///< ignored pixels count neither in predictions nor targets
  Reduction reduction = Reduction::Mean;  ///< over images; None: one value per image [N]
};
/// Soft multi-class Dice loss per image: 1 - mean over classes c of
/// (2 Σ p_c·t_c + smooth) / (Σ p_c + Σ t_c + smooth), p = softmax(logits) over C, t = one-hot target,
/// sums over the image's non-ignored pixels. Needs spatial dims (logits [N, C, d1, ...]). An image
/// with no valid pixel gives 0. Logits and target are checked as for cross_entropy (ef::Error), and
/// a negative smooth is an ef::Error.
Tensor dice_loss(const Tensor& logits, const Tensor& target, const DiceOptions& o = {});

/// Options of lovasz_softmax.
struct LovaszOptions {
  int64_t ignore_index = -100;            ///< pixels whose target equals it are left out (kNoIgnore: none)
  bool only_present = true;               ///< average over classes present in the image's target (as the paper's code)
  Reduction reduction = Reduction::Mean;  ///< over images; None: one value per image [N]
};
/// Lovász-softmax (Berman et al.), per image: for each class, the Lovász extension of the Jaccard
/// loss applied to the sorted errors |t_c - p_c| of the image's non-ignored pixels. The sort gives a
/// permutation (not differentiated), the rest is engine ops. An image with no valid pixel gives 0.
/// Logits and target as for cross_entropy (same ef::Error checks). Reads the errors and the target
/// back to the host (a device synchronization).
Tensor lovasz_softmax(const Tensor& logits, const Tensor& target, const LovaszOptions& o = {});

/// Options of ohem_cross_entropy.
struct OhemOptions {
  double threshold = 0.7;       ///< keep pixels whose target probability is at most this...
  int64_t min_kept = 256;       ///< ...raised to keep at least this many (the hardest) per image, when available
  int64_t ignore_index = -100;  ///< pixels whose target equals it are never kept (kNoIgnore: none)
  Reduction reduction = Reduction::Mean;  ///< over images; None: one value per image [N]
};
/// Online hard example mining cross-entropy (OhemCrossEntropy2d of PSPNet/OCNet, per image): the
/// mean cross-entropy of the kept pixels. The selection is made on the host and not differentiated:
/// with q the target probability at the image's V valid pixels, all are kept if V ≤ min_kept, else
/// those with q ≤ max(threshold, the min_kept-th smallest q). An image with no kept pixel gives 0.
/// Logits and target as for cross_entropy (same ef::Error checks); a negative min_kept is an
/// ef::Error. Reads the losses and the target back to the host (a device synchronization).
Tensor ohem_cross_entropy(const Tensor& logits, const Tensor& target, const OhemOptions& o = {});

// --- Regression / binary -------------------------------------------------------------------------------

/// torch.nn.functional.mse_loss: (input - target)² per element, reduced. input and target must
/// have the same float dtype, device and shape (no broadcasting; ef::Error otherwise).
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
/// torch.nn.functional.l1_loss: |input - target| per element, reduced; arguments as for mse_loss.
/// The gradient at input = target is 0 (abs's subgradient).
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
/// torch.nn.functional.smooth_l1_loss: 0.5 d²/β where |d| < β, else |d| - 0.5 β.
/// d = input - target; arguments as for mse_loss, and β ≥ 0 (β = 0 is l1_loss).
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, double beta = 1.0,
                      Reduction reduction = Reduction::Mean);

/// Options of binary_cross_entropy_with_logits.
struct BceOptions {
  Tensor weight = {};                     ///< broadcast to the input (optional)
  Tensor pos_weight = {};                 ///< weight of positive examples, broadcast along the last dim (optional)
  Reduction reduction = Reduction::Mean;  ///< Mean (default), Sum or None (per element)
};
/// torch.nn.functional.binary_cross_entropy_with_logits, computed stably (log-sum-exp form).
/// target must have logits' float dtype, device and shape; weight and pos_weight logits' dtype and
/// device, and shapes that broadcast to logits (ef::Error otherwise).
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, const BceOptions& o = {});

// --- GANs ------------------------------------------------------------------------------------------------

/// @name Wasserstein losses
/// Wasserstein critic loss mean D(fake) - mean D(real), and generator loss -mean D(fake).
/// @{

/// The critic's loss mean D(fake) - mean D(real). The scores are non-empty float tensors of any
/// shape, with one dtype and device (ef::Error otherwise).
Tensor wasserstein_critic_loss(const Tensor& d_real, const Tensor& d_fake);
/// The generator's loss -mean D(fake); d_fake is a non-empty float tensor (ef::Error otherwise).
Tensor wasserstein_generator_loss(const Tensor& d_fake);
/// @}

/// A critic as a function of a batch: its output [N] or [N, 1].
using Critic = std::function<Tensor(const Tensor& x)>;

/// @name Gradient penalties
/// Gradient penalties. Each returns a 0-d tensor, a mean over the batch's samples (so chunk-size
/// weighting across devices is exact), built with grad(..., create_graph=true) so that it trains the
/// critic (its gradient is a second derivative). The random draws come from the batch's device's
/// generator unless given. Each scales as its paper defines it, with the paper's name for the
/// coefficient, in its options struct:
///
///     penalty           returns                          coefficient (default)   paper
///     wgan_gp_penalty   λ · mean (|∇D(x̂)|₂ - 1)²          lambda (10)             Gulrajani et al. 2017
///     dragan_penalty    λ · mean (|∇D(x̂)|₂ - 1)²          lambda (10)             Kodali et al. 2017
///     r1_penalty        γ/2 · mean |∇D(real)|₂²           gamma (10)              Mescheder et al. 2018
///
/// So R1 with gamma = 10 weighs its squared norm by 5: the 1/2 is part of R1's definition (and of
/// its reference code), not a difference in how the two are computed.
///
/// Each throws ef::Error for an empty critic, a `real` that is not a non-empty float batch
/// [N, ...], a given tensor (fake, eps, noise) of another dtype, device or shape than expected, or
/// a critic output that is not [N] or [N, 1] or does not require grad (grad mode off).
/// @{

/// Options of wgan_gp_penalty.
struct WganGpOptions {
  double lambda = 10.0;  ///< λ, the penalty's coefficient
  /// [N, 1, ...] interpolation weights in [0, 1] (optional; otherwise drawn uniform per sample, with
  /// batch_rand, so that N devices draw what one device draws).
  Tensor eps = {};
};
/// WGAN-GP (Gulrajani et al.): λ·mean (|∇D(x̂)|₂ - 1)², x̂ = eps·real + (1-eps)·fake. x̂ is a new
/// leaf (no gradient reaches real or fake, as in the paper's code). Where ∇D(x̂) = 0 the norm takes
/// the subgradient 0, as torch's norm does.
Tensor wgan_gp_penalty(const Critic& critic, const Tensor& real, const Tensor& fake, const WganGpOptions& o = {});

/// Options of dragan_penalty.
struct DraganOptions {
  double lambda = 10.0;  ///< λ, the penalty's coefficient
  double c = 0.5;        ///< perturbation scale: x̂ = real + c·std(real)·u, u ~ U(0, 1) per element
  Tensor noise = {};     ///< u (optional; otherwise drawn per sample, with batch_rand)
  /// std(real) of the whole batch (optional; otherwise the unbiased std of all elements of `real`,
  /// as torch's real.std()). std is not a mean over samples: pass the whole batch's std when `real`
  /// is one device's chunk, so that every chunk is perturbed as the whole batch would be.
  std::optional<double> real_std = std::nullopt;
};
/// DRAGAN (Kodali et al.): λ·mean (|∇D(x̂)|₂ - 1)² around perturbed real samples. x̂ is a new leaf,
/// as in wgan_gp_penalty. Without real_std, `real` needs at least 2 elements (ef::Error).
Tensor dragan_penalty(const Critic& critic, const Tensor& real, const DraganOptions& o = {});

/// Options of r1_penalty.
struct R1Options {
  double gamma = 10.0;  ///< γ: the penalty is γ/2 · mean |∇D(real)|₂²
};
/// R1 (Mescheder et al.): γ/2 · mean |∇D(real)|₂², at real detached as a new leaf.
Tensor r1_penalty(const Critic& critic, const Tensor& real, const R1Options& o = {});
/// @}

/// The reduction of per-element (or per-sample) losses; Mean over zero elements is 0.
Tensor reduce(const Tensor& losses, Reduction reduction);

/// @name Loss objects
/// Each mean loss with its options as one value, as torch.nn's loss modules are: called on
/// (output, target) it gives the function of the same name; parts() gives its sum and the weight
/// its mean divides by (the options' reduction does not apply), what DataParallelCriterion adds
/// over the chunks before it divides (Note [Losses across devices]). So
/// `DataParallelCriterion criterion(model, losses::CrossEntropyLoss{{.ignore_index = 255}})` gives
/// the whole batch's loss on any number of devices. An object's tensors (class weights) follow the
/// output to its device (differentiably), so one object serves every device. Errors as the
/// functions'.
/// @{

/// cross_entropy with its options.
struct CrossEntropyLoss {
  CrossEntropyOptions options = {};                                     ///< as cross_entropy's
  Tensor operator()(const Tensor& logits, const Tensor& target) const;  ///< cross_entropy
  LossParts parts(const Tensor& logits, const Tensor& target) const;    ///< Σ losses, Σ weight[target]
};
/// nll_loss with its options (label_smoothing unused).
struct NllLoss {
  CrossEntropyOptions options = {};                                        ///< as nll_loss's
  Tensor operator()(const Tensor& log_probs, const Tensor& target) const;  ///< nll_loss
  LossParts parts(const Tensor& log_probs, const Tensor& target) const;    ///< Σ losses, Σ weight[target]
};
/// focal_loss with its options.
struct FocalLoss {
  FocalOptions options = {};                                            ///< as focal_loss's
  Tensor operator()(const Tensor& logits, const Tensor& target) const;  ///< focal_loss
  LossParts parts(const Tensor& logits, const Tensor& target) const;    ///< Σ losses, the valid count
};
/// dice_loss with its options.
struct DiceLoss {
  DiceOptions options = {};                                             ///< as dice_loss's
  Tensor operator()(const Tensor& logits, const Tensor& target) const;  ///< dice_loss
  LossParts parts(const Tensor& logits, const Tensor& target) const;    ///< Σ over images, the image count
};
/// lovasz_softmax with its options.
struct LovaszSoftmaxLoss {
  LovaszOptions options = {};                                           ///< as lovasz_softmax's
  Tensor operator()(const Tensor& logits, const Tensor& target) const;  ///< lovasz_softmax
  LossParts parts(const Tensor& logits, const Tensor& target) const;    ///< Σ over images, the image count
};
/// ohem_cross_entropy with its options.
struct OhemCrossEntropyLoss {
  OhemOptions options = {};                                             ///< as ohem_cross_entropy's
  Tensor operator()(const Tensor& logits, const Tensor& target) const;  ///< ohem_cross_entropy
  LossParts parts(const Tensor& logits, const Tensor& target) const;    ///< Σ over images, the image count
};
/// mse_loss with its reduction.
struct MseLoss {
  Reduction reduction = Reduction::Mean;                               ///< as mse_loss's
  Tensor operator()(const Tensor& input, const Tensor& target) const;  ///< mse_loss
  LossParts parts(const Tensor& input, const Tensor& target) const;    ///< Σ losses, the element count
};
/// l1_loss with its reduction.
struct L1Loss {
  Reduction reduction = Reduction::Mean;                               ///< as l1_loss's
  Tensor operator()(const Tensor& input, const Tensor& target) const;  ///< l1_loss
  LossParts parts(const Tensor& input, const Tensor& target) const;    ///< Σ losses, the element count
};
/// smooth_l1_loss with its β and reduction.
struct SmoothL1Loss {
  double beta = 1.0;                                                   ///< as smooth_l1_loss's
  Reduction reduction = Reduction::Mean;                               ///< as smooth_l1_loss's
  Tensor operator()(const Tensor& input, const Tensor& target) const;  ///< smooth_l1_loss
  LossParts parts(const Tensor& input, const Tensor& target) const;    ///< Σ losses, the element count
};
/// binary_cross_entropy_with_logits with its options.
struct BceWithLogitsLoss {
  BceOptions options = {};                                              ///< as binary_cross_entropy_with_logits's
  Tensor operator()(const Tensor& logits, const Tensor& target) const;  ///< binary_cross_entropy_with_logits
  LossParts parts(const Tensor& logits, const Tensor& target) const;    ///< Σ losses, the element count
};
/// @}

}  // namespace evenflow::losses
