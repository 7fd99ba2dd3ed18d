#!/usr/bin/env python3
"""The statistics every study page states its claims with (issue 45): one place, so that
each page calls a difference or a trend by the same rule and prints the statistic beside
the claim. Plain Python (no scipy), checked in tests/python/test_study_stats.py against values
worked out by hand and textbook table values.

- welch(a, b): the difference of means b - a of two independent samples (seeds), its
  standard error sqrt(s_a^2/n_a + s_b^2/n_b), Welch's t and its Welch-Satterthwaite
  degrees of freedom, the two-sided p-value, and whether it is significant at 5%.
- contrast(terms): a signed sum of independent samples' means, sum_i c_i mean_i (the
  change of a gap between two budgets: (lns2 - pre2) - (lns1 - pre1)), its standard
  error sqrt(sum_i c_i^2 s_i^2 / n_i) and t with the Welch-Satterthwaite degrees of
  freedom (sum v_i)^2 / sum v_i^2 / (n_i - 1); welch(a, b) is contrast([(-1, a), (1, b)]).
- paired(d): the mean of per-seed differences, its standard error s/sqrt(n), t with
  n - 1 degrees of freedom (the same initial weights and batches on both sides).
- trend(points): the slope of a quantity on log2(depth) by weighted least squares, each
  depth weighted by 1/se^2 of its value; its standard error is the weighted fit's,
  scaled up by sqrt(chi^2 / (k - 2)) when the points scatter about the line more than
  their errors say (never down); the slope per doubling of the depth, t = slope / se,
  and significance at 5% against a t with k - 2 degrees of freedom (normal for k = 2:
  no residual to scale by).

A claim is "significant" only at p < 0.05 two-sided; otherwise the page says the data
do not resolve it. Nothing here knows about runs or pages.
"""
import math

ALPHA = 0.05  # two-sided level of every "significant" on the study pages


def mean(xs):
    return sum(xs) / len(xs)


def var(xs):
    """Sample variance (n - 1); None for fewer than 2 values."""
    if len(xs) < 2:
        return None
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


# ---- Student's t distribution -----------------------------------------------------------

def _betacf(a, b, x):
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lnfront = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lnfront) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lnfront) * _betacf(b, a, 1.0 - x) / b


def t_sf2(t, df):
    """Two-sided tail P(|T| >= |t|) of Student's t with df degrees of freedom (df may be
    fractional, as Welch's is); df = inf: the normal."""
    if math.isinf(df):
        return math.erfc(abs(t) / math.sqrt(2.0))
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_crit(df, alpha=ALPHA):
    """The two-sided critical value: P(|T| >= t_crit) = alpha (bisection on t_sf2)."""
    lo, hi = 0.0, 1.0
    while t_sf2(hi, df) > alpha:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_sf2(mid, df) > alpha:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# ---- tests ------------------------------------------------------------------------------

def welch(a, b):
    """b - a of two independent samples. None when a side has fewer than 2 values (no
    spread to test against)."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = var(a) / len(a), var(b) / len(b)
    diff = mean(b) - mean(a)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return dict(diff=diff, se=0.0, t=math.inf if diff else 0.0, df=float(len(a) + len(b) - 2),
                    p=0.0 if diff else 1.0, significant=bool(diff), n_a=len(a), n_b=len(b))
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    t = diff / se
    p = t_sf2(t, df)
    return dict(diff=diff, se=se, t=t, df=df, p=p, significant=p < ALPHA, n_a=len(a), n_b=len(b))


def contrast(terms):
    """terms: [(coefficient, values)] of independent samples. None when a sample has fewer
    than 2 values."""
    if any(len(v) < 2 for _, v in terms):
        return None
    parts = [c * c * var(v) / len(v) for c, v in terms]
    diff = sum(c * mean(v) for c, v in terms)
    se = math.sqrt(sum(parts))
    if se == 0.0:
        return dict(diff=diff, se=0.0, t=math.inf if diff else 0.0, df=float(sum(len(v) - 1 for _, v in terms)),
                    p=0.0 if diff else 1.0, significant=bool(diff))
    df = sum(parts) ** 2 / sum(p * p / (len(v) - 1) for p, (_, v) in zip(parts, terms))
    t = diff / se
    p = t_sf2(t, df)
    return dict(diff=diff, se=se, t=t, df=df, p=p, significant=p < ALPHA)


def paired(d):
    """Mean of per-seed differences, its standard error and t with n - 1 degrees of freedom."""
    if len(d) < 2:
        return None
    se = math.sqrt(var(d) / len(d))
    m = mean(d)
    if se == 0.0:
        return dict(mean=m, se=0.0, t=math.inf if m else 0.0, df=len(d) - 1, p=0.0 if m else 1.0,
                    significant=bool(m), n=len(d))
    t = m / se
    p = t_sf2(t, len(d) - 1)
    return dict(mean=m, se=se, t=t, df=len(d) - 1, p=p, significant=p < ALPHA, n=len(d))


def trend(points):
    """points: [(depth, value, se)] with se > 0. The slope of value on log2(depth) per
    doubling, weighted by 1/se^2, with its standard error (scaled by the scatter when that
    exceeds the errors). None for fewer than 2 depths."""
    pts = [(math.log2(L), y, s) for L, y, s in points]
    if len(pts) < 2 or len({p[0] for p in pts}) < 2:
        return None
    if any(not s or s <= 0 for _, _, s in pts):
        raise ValueError("trend: every point needs a standard error > 0")
    w = [1.0 / s ** 2 for _, _, s in pts]
    sw = sum(w)
    xm = sum(wi * x for wi, (x, _, _) in zip(w, pts)) / sw
    ym = sum(wi * y for wi, (_, y, _) in zip(w, pts)) / sw
    sxx = sum(wi * (x - xm) ** 2 for wi, (x, _, _) in zip(w, pts))
    slope = sum(wi * (x - xm) * (y - ym) for wi, (x, y, _) in zip(w, pts)) / sxx
    se = math.sqrt(1.0 / sxx)
    k = len(pts)
    chi2 = sum(wi * (y - ym - slope * (x - xm)) ** 2 for wi, (x, y, _) in zip(w, pts))
    scale = math.sqrt(chi2 / (k - 2)) if k > 2 else 1.0
    se *= max(1.0, scale)
    df = float(k - 2) if k > 2 else math.inf
    t = slope / se
    p = t_sf2(t, df)
    return dict(slope=slope, se=se, t=t, df=df, p=p, significant=p < ALPHA, k=k, chi2=chi2,
                intercept=ym - slope * xm, x_mean=xm)


# ---- how a page prints them ---------------------------------------------------------------

def fmt_welch(w, digits=4):
    """'-0.0686 ± 0.0127 (Welch t = -5.40, df 3.2, p = 0.011)'"""
    if w is None:
        return "one seed a side: no test"
    f = "%%+.%df ± %%.%df" % (digits, digits)
    return (f % (w["diff"], w["se"])) + " (Welch t = %s, df %.1f, p = %s)" % (fmt_t(w["t"]), w["df"], fmt_p(w["p"]))


def fmt_paired(p, digits=4):
    if p is None:
        return "—"
    f = "%%+.%df ± %%.%df" % (digits, digits)
    return (f % (p["mean"], p["se"])) + " (paired t = %s, df %d, p = %s)" % (fmt_t(p["t"]), p["df"], fmt_p(p["p"]))


def fmt_trend(tr, digits=4, unit="per doubling of the depth"):
    """'-0.0450 ± 0.0120 per doubling of the depth (t = -3.75, df 2, p = 0.064; 4 depths)'"""
    if tr is None:
        return "fewer than 2 depths with a spread: no trend"
    f = "%%+.%df ± %%.%df" % (digits, digits)
    df = "normal" if math.isinf(tr["df"]) else "df %d" % tr["df"]
    return (f % (tr["slope"], tr["se"])) + " %s (t = %s, %s, p = %s; %d depths)" % (
        unit, fmt_t(tr["t"]), df, fmt_p(tr["p"]), tr["k"])


def fmt_t(t):
    return "inf" if math.isinf(t) else "%.2f" % t


def fmt_p(p):
    return "%.2g" % p if p >= 0.001 else "<0.001"


def verdict(test):
    """The word a table prints for a difference: significant or not, at 5%."""
    if test is None:
        return "one seed: no test"
    return "**significant** (p = %s)" % fmt_p(test["p"]) if test["significant"] else "not significant (p = %s)" % \
        fmt_p(test["p"])
