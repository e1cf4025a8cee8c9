"""The pretraining losses (pure functions of tensors; the LightningModule weighs them)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def listwise_loss(logp: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the policy's log-probabilities [B, C] against listwise targets [B, C]."""
    return -(target * logp.masked_fill(~valid, 0.0)).sum(-1).mean()


def failure_loss(logp_failed: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """-log(1 - p) for every failed config: pushes their probability to zero (strong negatives)."""
    if not valid.any():
        return logp_failed.new_zeros(())
    # -log(1 - p) computed from log p without cancelling; p = 1 exactly is kept just below
    return -torch.log(-torch.expm1(logp_failed.clamp(max=-1e-6)))[valid].mean()


def imitation_loss(logp_demo: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of demonstrated configs [B, D] under the policy's masked distribution.

    Demonstrations are imported winners without timings, so each one is a target of its own
    (several per problem where engines or Triton versions differ) rather than a listwise target.
    """
    return -logp_demo[valid].mean()


def ranking_loss(pred: torch.Tensor, log_tflops: torch.Tensor, valid: torch.Tensor,
                 weights: torch.Tensor | None = None) -> torch.Tensor:
    """Pairwise logistic loss over the pairs of one problem whose measured order is strict; a
    pair weighs the product of its rows' weights [B, C] (None: 1)."""
    diff_true = log_tflops[:, :, None] - log_tflops[:, None, :]
    pairs = (diff_true > 1e-3) & valid[:, :, None] & valid[:, None, :]
    if not pairs.any():
        return pred.new_zeros(())
    diff_pred = pred[:, :, None] - pred[:, None, :]
    if weights is None:
        return F.softplus(-diff_pred)[pairs].mean()
    w = (weights[:, :, None] * weights[:, None, :])[pairs]
    return (F.softplus(-diff_pred)[pairs] * w).sum() / w.sum()


def regression_loss(pred: torch.Tensor, log_tflops: torch.Tensor, valid: torch.Tensor,
                    weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error on log TFLOP/s, weighted per row (None: 1)."""
    if weights is None:
        return F.mse_loss(pred[valid], log_tflops[valid])
    w = weights[valid]
    return ((pred[valid] - log_tflops[valid]) ** 2 * w).sum() / w.sum()


def top1_fraction(scores: torch.Tensor, log_tflops: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Geomean over problems of (measured TFLOP/s of the top-scored measured config) / best measured."""
    pick = scores.masked_fill(~valid, float("-inf")).argmax(-1, keepdim=True)
    best = log_tflops.masked_fill(~valid, float("-inf")).max(-1).values
    return (log_tflops.gather(-1, pick).squeeze(-1) - best).mean().exp()
