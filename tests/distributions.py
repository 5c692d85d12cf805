"""Two-sample tests shared by the distribution tests (fastload's draws against torchvision's own)."""
import numpy as np
import scipy.stats as st


def chi2_same(a, b, bins=12):
    """p-value of a two-sample chi-square test on pooled-quantile bins (equal samples: same distribution). The
    statistics may be discrete (integer boxes): pass both as float64, or equal values could fall on both sides of
    an edge."""
    edges = np.unique(np.quantile(np.concatenate([a, b]), np.linspace(0, 1, bins + 1)))
    edges[-1] = np.inf
    ca, _ = np.histogram(a, edges)
    cb, _ = np.histogram(b, edges)
    keep = (ca + cb) > 0
    return st.chi2_contingency(np.stack([ca[keep], cb[keep]])).pvalue
