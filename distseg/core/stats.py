"""Small statistics shared by training and the report (plain Python).

``t_quantile``: Student's t quantile for a confidence interval over few values, used
by the gradient noise scale's interval (``distseg.training.progress.noise``) and by the
cross-validation report's intervals over folds (``analysis.cv``).
"""

from __future__ import annotations

#: The normal quantile of a two-sided 95 % interval.
Z_95 = 1.959964


def t_quantile(z: float, dof: float) -> float:
    """Student's t quantile at ``dof`` (>= 2) degrees of freedom of the normal quantile
    ``z``, by Cornish-Fisher's expansion to three terms (for 1.6449: 2.885 at 2, where
    the exact is 2.920; 1.812 at 10, exact; for 1.96: 2.769 at 4, exact 2.776)."""
    return (z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3))
