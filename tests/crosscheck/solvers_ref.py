"""Independent numpy reference of Wan2.1's two multistep samplers (issue 24, section 2).

Written from the published formulas, not from Reel's C and not copied from
upstream code:
  UniPC         Zhao, Bai, Rao, Zhou, Lu, "UniPC: A Unified Predictor-Corrector
                Framework for Fast Sampling of Diffusion Models", NeurIPS 2023,
                arXiv:2302.04867: the corrector UniC-p (coefficients a_p from
                R_p(h) a_p = g_p(h)/B(h)), the predictor UniP-p, their
                data-prediction (x0) form, with B(h) = e^h - 1 ("bh2").
  DPM-Solver++  Lu, Zhou, Bao, Chen, Li, Zhu, "DPM-Solver++: Fast Solver for
                Guided Sampling of Diffusion Probabilistic Models", 2022,
                arXiv:2211.01095: the first-order data-prediction update and
                Algorithm 2, DPM-Solver++(2M).
What Wan does around them (the schedules, dtypes, orders at the start and end,
when the corrector runs) was learned by reading the public Wan2.1 sources
(wan/text2video.py, wan/utils/fm_solvers_unipc.py, wan/utils/fm_solvers.py,
wan/modules/model.py); the facts are listed next to the code that uses them.

Flow-matching notation (rectified flow, what Wan trains):
  x_sigma = alpha*x0 + sigma*eps,  alpha = 1 - sigma,
  the network predicts the velocity v = eps - x0, so the data prediction is
  x0_hat = x - sigma*v  and  lambda(sigma) = log(alpha) - log(sigma)
  (the half log-SNR the papers integrate in); lambda(1) = -inf, lambda(0) = +inf.

Public API
  unipc_schedule(steps, shift) -> (sigmas float32 [N+1], timesteps int64 [N])
  dpmpp_schedule(steps, shift) -> (sigmas float32 [N+1], timesteps int64 [N])
  unipc_orders(steps) / dpmpp_orders(steps) -> per-step orders (documentation, tests)
  unipc_loop(velocity_fn, x, sigmas, timesteps, ...) -> final sample
  dpmpp_loop(velocity_fn, x, sigmas, timesteps, ...) -> final sample
  dit_velocity_fn(w, context, uncond, cfg) -> velocity_fn for tinydit_ref
  generate(w, latent, context, uncond, steps, shift, cfg, solver) -> final latent
  first_timestep_repeats(timesteps) -> bool (upstream's index quirk, see below)

velocity_fn(x, t, sigma) returns the model's velocity at sample x; t is the
int64 timestep Wan hands the transformer and sigma the float32 sigma of that
step (tinydit uses t; the analytic fields of the self-test use sigma).

The index quirk.  Upstream's schedulers find their step index once, on the
first step, by looking the first timestep up in the timestep list and taking
the SECOND match when there are two (diffusers' index_for_timestep, meant for
img2img).  When the int timesteps t_0 == t_1 (UniPC with a large shift and
many steps: shift 5 from 251 steps on, see first_timestep_repeats and the
self-test) the upstream loop therefore starts at index 1 and fails on its
last step (lower_order_final gives order 0 / sigma index N+1), so upstream has
no output for those settings.  This reference always uses step index = loop
index (as if begin_index were 0), which is what upstream does whenever it
runs at all; Reel may do the same or refuse those settings, but it must not
imitate the skipped sigma.  DPM++ does not repeat t_0 in practice: its t_0
is 1000 and t_1 reaches 1000 only if sigma_1 rounds to 1.0 (N ~ 1e16).
"""

import numpy as np

NUM_TRAIN_TIMESTEPS = 1000


# ---------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------
def _shift(u, shift):
    """Wan's time shift, evaluated as upstream writes it, in float64:
    shift*u / (1 + (shift - 1)*u)."""
    S = float(shift)
    return S * u / (1 + (S - 1) * u)


def unipc_sigma_max():
    """The first sigma of the scheduler's 1000-entry training table.

    The table is alphas = linspace(1, 1/1000, 1000) reversed, sigmas = 1 - alphas
    in float64, stored as float32 (shift 1 at construction: identity).  Its
    first entry is float32(1 - 0.001) = 0.9990000128746033 (read back as a
    double) and its last 1 - 1 = 0.  set_timesteps(N) spaces the N steps
    between those two values, so UniPC's first sigma is NOT 1."""
    return float(np.float32(1.0 - 1.0 / NUM_TRAIN_TIMESTEPS))


def _finish(sig64):
    """Common tail of both set_timesteps: timesteps = sigma*1000 in float64,
    truncated toward zero to int64 (torch .to(int64)); the solver's sigmas
    are the same float64 sigmas plus a final 0 ("final_sigmas_type zero"),
    stored as float32."""
    timesteps = (sig64 * NUM_TRAIN_TIMESTEPS).astype(np.int64)
    sigmas = np.concatenate([sig64, [0.0]]).astype(np.float32)
    return sigmas, timesteps


def unipc_schedule(steps, shift):
    """Wan's FlowUniPCMultistepScheduler(shift=1).set_timesteps(N, shift=S).

    u = linspace(sigma_max, 0, N+1)[:-1]   (numpy: u_i = sigma_max + i*(-sigma_max/N))
    sigma_i = S*u_i / (1 + (S-1)*u_i)       (float64)
    t_i = int64(trunc(1000*sigma_i)), sigmas = float32([sigma_0..sigma_{N-1}, 0]).
    """
    N = int(steps)
    if N < 1:
        raise ValueError("steps must be >= 1")
    u = np.linspace(unipc_sigma_max(), 0.0, N + 1)[:-1]
    return _finish(_shift(u, shift))


def dpmpp_schedule(steps, shift):
    """Wan's dpm++ branch: get_sampling_sigmas(N, S) then
    retrieve_timesteps(FlowDPMSolverMultistepScheduler(shift=1), sigmas=...).

    get_sampling_sigmas: u = linspace(1, 0, N+1)[:N], sigma = S*u/(1+(S-1)*u)
    (float64; u_0 = 1 so sigma_0 = 1 exactly).  set_timesteps(sigmas=...) then
    applies the scheduler's own shift, which is the constructor's 1: the
    identity 1*s/(1 + 0*s) = s, so the shift is NOT applied twice.  Then the
    same tail as UniPC: t_i = trunc(1000*sigma_i) (t_0 = 1000), float32 sigmas
    with a final 0.
    """
    N = int(steps)
    if N < 1:
        raise ValueError("steps must be >= 1")
    u = np.linspace(1.0, 0.0, N + 1)[:N]
    sig = _shift(u, shift)
    sig = _shift(sig, 1.0)          # the scheduler's shift (config.shift = 1): identity
    return _finish(sig)


def first_timestep_repeats(timesteps):
    """True when upstream's first-step index lookup would pick index 1 (t_0 == t_1)."""
    t = np.asarray(timesteps)
    return t.size > 1 and int(t[0]) == int(t[1])


def unipc_orders(steps):
    """(predictor order, corrector order or 0) of each step.

    Predictor: order 2 with "lower_order_final" and a one-step warm-up:
      p_i = min(2, N - i, i + 1)   (so the last step is order 1, the first too).
    Corrector: from the second step on, UniC with the previous predictor's
    order, p_{i-1} (none on step 0; none after the last predictor, whose
    result is the output)."""
    N = int(steps)
    pred = [min(2, N - i, i + 1) for i in range(N)]
    corr = [0] + pred[:-1]
    return pred, corr


def dpmpp_orders(steps):
    """Order of each DPM-Solver++(2M) step: 1 on the first (no history) and on
    the last (final sigma 0: "final_sigmas_type zero" forces a first-order
    final step for any N), 2 in between."""
    N = int(steps)
    return [1 if (i == 0 or i == N - 1) else 2 for i in range(N)]


# ---------------------------------------------------------------------------
# Scalars
# ---------------------------------------------------------------------------
def _lam(sigma, cd):
    """lambda = log(alpha) - log(sigma) in dtype cd, with the limits
    lambda(1) = -inf and lambda(0) = +inf (the schedules hit both ends)."""
    s = cd(sigma)
    one = cd(1.0)
    if s == one:
        return cd(-np.inf)
    if s == cd(0.0):
        return cd(np.inf)
    return cd(np.log(one - s) - np.log(s))


def _ratio_and_data_coeff(sig_s, sig_t, cd):
    """The first-order data-prediction update from sigma_s to sigma_t
    (DPM-Solver++ first-order update, = UniPC's UniP-1 / DDIM):

        x_t = (sigma_t/sigma_s) x_s - alpha_t (e^{-h} - 1) x0_hat,   h = lambda_t - lambda_s

    Returns (sigma_t/sigma_s, -alpha_t*expm1(-h)).  Limits: sigma_t = 0 gives
    h = +inf, e^{-h} = 0, so (0, 1): x_t = x0_hat exactly; sigma_s = 1 gives
    lambda_s = -inf, again e^{-h} = 0, so (sigma_t, alpha_t).  In flow terms
    this step is exactly Euler, x_t = x_s + (sigma_t - sigma_s) v."""
    s_s, s_t = cd(sig_s), cd(sig_t)
    a_t = cd(1.0) - s_t
    h = _lam(s_t, cd) - _lam(s_s, cd)
    em = cd(-1.0) if np.isinf(h) else cd(np.expm1(-h))
    return cd(s_t / s_s), cd(-a_t * em), h


def _h_phi(hh, cd):
    """hh*phi_k(hh) for k = 1, 2, 3 (UniPC's phi functions):
    phi_1(x) = (e^x - 1)/x, phi_{k+1}(x) = (phi_k(x) - 1/k!)/x, so
    hh*phi_1 = expm1(hh), hh*phi_2 = hh*phi_1/hh - 1, hh*phi_3 = hh*phi_2/hh - 1/2."""
    p1 = cd(np.expm1(hh))
    p2 = cd(p1 / hh - cd(1.0))
    p3 = cd(p2 / hh - cd(0.5))
    return p1, p2, p3


# ---------------------------------------------------------------------------
# UniPC (data prediction, B(h) = expm1, order 2, UniC after every step but the last)
# ---------------------------------------------------------------------------
def _unipc_update(x_s, m_hist, lam_hist, sig_s, sig_t, p, m_new, cd, dtype, fixed_half=True):
    """One UniP-p (m_new None) or UniC-p (m_new = x0_hat at the new point) update
    from sigma_s to sigma_t, in the data-prediction form with hh = -h:

      x_t = (sigma_t/sigma_s) x_s - alpha_t (e^{hh} - 1) m_0
            - alpha_t B(hh) [ sum_{k<p} a_k D_k  (+ a_p D_p for UniC) ]

    with h = lambda_t - lambda_s, m_0 = x0_hat at sigma_s, the history
    m_{-k} at lambda_{-k}, r_k = (lambda_{-k} - lambda_s)/h,
    D_k = (m_{-k} - m_0)/r_k, and for UniC D_p = m_new - m_0 (r_p = 1).
    Coefficients: UniC-p solves R_p a = g/B(hh), R_p[i][k] = r_k^i (i = 0..p-1),
    g_i = (i+1)! hh phi_{i+2}(hh); B(hh) = e^{hh} - 1 ("bh2").  For the
    lowest orders Wan (as diffusers, which it adapts) uses a fixed a = 1/2
    instead of the solve: UniP-2's single a_1 and UniC-1's single a_1.  Both
    differ from the solve's value hh*phi_2(hh)/B(hh) = 1/2 + O(h), so the
    order is unchanged; we follow Wan, since a solve would differ at 1e-3.
    m_hist[-1] is m_0, m_hist[-2] the one before (lam_hist likewise).
    fixed_half=False solves for those too (a deliberate deviation, only for
    the self-test's negative control).
    """
    c_x, c_m, h = _ratio_and_data_coeff(sig_s, sig_t, cd)
    m0 = m_hist[-1]
    x_t = np.asarray(c_x, dtype) * x_s + np.asarray(c_m, dtype) * m0
    if m_new is None and p == 1:
        return x_t                                  # UniP-1: the first-order update
    # From here h is finite: UniP-2 / UniC never run on the step into sigma = 0.
    alpha_t = cd(cd(1.0) - cd(sig_t))
    hh = cd(-h)
    p1, p2, p3 = _h_phi(hh, cd)
    B = p1                                          # bh2: B(hh) = expm1(hh)
    terms = []                                      # (coefficient a_k, D_k)
    if p == 2:
        r1 = cd((lam_hist[-2] - lam_hist[-1]) / h)
        D1 = (m_hist[-2] - m0) / np.asarray(r1, dtype)
    b1 = cd(p2 / B)                                 # 1! hh phi_2 / B
    b2 = cd(cd(2.0) * p3 / B)                       # 2! hh phi_3 / B
    if m_new is None:                               # UniP-2 (R_1 a = b_1 would give a = b1)
        terms.append((cd(0.5) if fixed_half else b1, D1))
    elif p == 1:                                    # UniC-1 (likewise)
        terms.append((cd(0.5) if fixed_half else b1, m_new - m0))
    else:                                           # UniC-2: solve the 2x2 system
        # [[1, 1], [r1, 1]] [a1, a2]^T = [b1, b2]^T  (rows r^0, r^1; r_2 = 1)
        a1 = cd((b1 - b2) / (cd(1.0) - r1))
        a2 = cd(b1 - a1)
        terms.append((a1, D1))
        terms.append((a2, m_new - m0))
    res = sum(np.asarray(a, dtype) * D for a, D in terms)
    return x_t - np.asarray(cd(alpha_t * B), dtype) * res


def unipc_loop(velocity_fn, x, sigmas, timesteps, dtype=np.float64, coef_dtype=np.float64,
               corrector=True, fixed_half=True, trace=None):
    """Wan's UniPC sampling loop (order 2, bh2, predict_x0, lower order final).

    Step i (0-based, N steps), sample x_i at sigma_i:
      m_i = x_i - sigma_i * v(x_i, t_i)                  (x0 prediction)
      i > 0: x_i <- UniC-p_{i-1}(x_{i-1}, m_{i-1}, [m_{i-2}], m_i)
             (the corrector reuses the model output taken at the predicted
              point; m_i itself is NOT re-evaluated: "UniC adds no model call")
      x_{i+1} = UniP-p_i(x_i, m_i, [m_{i-1}])            p_i = min(2, N-i, i+1)
    On the last step p = 1 and sigma_N = 0, so x_N = m_{N-1} exactly (the
    published limit of the first-order update); the sample corrected on that
    step is multiplied by sigma_N/sigma_{N-1} = 0, so with N = 2 UniC has
    no effect on the result.  sigmas are the float32
    sigmas (their values are what Wan computes with); coefficients are
    evaluated in coef_dtype (float64 by default; np.float32 mimics upstream's
    float32 scalar tensors), samples in dtype.  corrector=False,
    fixed_half=False (see _unipc_update) and trace (called as
    trace(i, x_next)) are for the self-tests.
    """
    cd = np.dtype(coef_dtype).type
    N = len(timesteps)
    if len(sigmas) != N + 1:
        raise ValueError("need N+1 sigmas for N timesteps")
    pred, corr = unipc_orders(N)
    lam = [_lam(s, cd) for s in sigmas]
    x = np.asarray(x, dtype=dtype)
    ms, x_prev = [], None
    for i in range(N):
        v = np.asarray(velocity_fn(x, int(timesteps[i]), float(sigmas[i])), dtype=dtype)
        m = x - np.asarray(sigmas[i], dtype) * v
        if i > 0 and corrector:
            x = _unipc_update(x_prev, ms, lam[:i], sigmas[i - 1], sigmas[i], corr[i], m, cd, dtype,
                              fixed_half)
        ms.append(m)
        x_prev = x
        x = _unipc_update(x, ms, lam[:i + 1], sigmas[i], sigmas[i + 1], pred[i], None, cd, dtype,
                          fixed_half)
        if trace:
            trace(i, x)
        if len(ms) > 2:
            ms.pop(0)       # keep m_{i-1}, m_i (lam is indexed by step, ms by recency)
    return x


# ---------------------------------------------------------------------------
# DPM-Solver++(2M) (data prediction, midpoint form, lower order first and final)
# ---------------------------------------------------------------------------
def dpmpp_loop(velocity_fn, x, sigmas, timesteps, dtype=np.float64, coef_dtype=np.float64, trace=None):
    """Wan's DPM++ loop: DPM-Solver++(2M), Algorithm 2 of Lu et al. 2022.

    Step i, sample x_i at sigma_i, m_i = x_i - sigma_i v(x_i, t_i), h_i = lambda_{i+1} - lambda_i:
      order 1 (i = 0, i = N-1):  D = m_i
      order 2:  r_i = h_{i-1}/h_i,  D = (1 + 1/(2 r_i)) m_i - 1/(2 r_i) m_{i-1}
      x_{i+1} = (sigma_{i+1}/sigma_i) x_i - alpha_{i+1} (e^{-h_i} - 1) D
    Limits: sigma_0 = 1 exactly (dpmpp_schedule), so lambda_0 = -inf and on
    step 1 h_0 = +inf, r_1 = +inf and the correction 1/(2 r_1) = 0: step 1
    is first order in effect (upstream evaluates the same limit: (1/inf)*(m1-m0)
    = 0).  The last step goes to sigma_N = 0: x_N = m_{N-1}.
    """
    cd = np.dtype(coef_dtype).type
    N = len(timesteps)
    if len(sigmas) != N + 1:
        raise ValueError("need N+1 sigmas for N timesteps")
    orders = dpmpp_orders(N)
    lam = [_lam(s, cd) for s in sigmas]
    x = np.asarray(x, dtype=dtype)
    m_prev = None
    for i in range(N):
        v = np.asarray(velocity_fn(x, int(timesteps[i]), float(sigmas[i])), dtype=dtype)
        m = x - np.asarray(sigmas[i], dtype) * v
        c_x, c_m, h = _ratio_and_data_coeff(sigmas[i], sigmas[i + 1], cd)
        D = m
        if orders[i] == 2 and not np.isinf(lam[i - 1]):
            r = cd((lam[i] - lam[i - 1]) / h)
            D = m + np.asarray(cd(cd(0.5) / r), dtype) * (m - m_prev)
        x = np.asarray(c_x, dtype) * x + np.asarray(c_m, dtype) * D
        m_prev = m
        if trace:
            trace(i, x)
    return x


# ---------------------------------------------------------------------------
# tinydit glue
# ---------------------------------------------------------------------------
SOLVERS = {"unipc": (unipc_schedule, unipc_loop), "dpm++": (dpmpp_schedule, dpmpp_loop)}


def dit_velocity_fn(w, context, uncond, cfg, dtype=np.float64):
    """velocity_fn for tinydit_ref: the transformer at the int timestep t
    (Wan's model takes t as int64 and builds the sinusoid from float64(t)),
    with CFG v = v_u + g (v_c - v_u) when uncond is given (Wan always guides;
    Reel without --uncond uses v_c)."""
    import tinydit_ref as ref

    def fn(x, t, sigma):
        return ref.velocity(w, x, context, uncond, sigma, cfg, dtype, timestep=t)
    return fn


def generate(w, latent, context, uncond, steps, shift, cfg, solver, dtype=np.float64,
             coef_dtype=np.float64):
    """The whole loop for `reelctl run --solver SOLVER`."""
    sched, loop = SOLVERS[solver]
    sigmas, timesteps = sched(steps, shift)
    return loop(dit_velocity_fn(w, context, uncond, cfg, dtype), latent, sigmas, timesteps,
                dtype=dtype, coef_dtype=coef_dtype)


def smallest_repeating_steps(shift, limit=100000):
    """Smallest N for which UniPC's t_0 == t_1 (None below limit); binary
    search on the monotone condition sigma_1 >= trunc(1000 sigma_0)/1000."""
    def rep(N):
        return first_timestep_repeats(unipc_schedule(N, shift)[1][:2]) if N > 1 else False
    lo, hi = 2, limit
    if not rep(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if rep(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


if __name__ == "__main__":
    for S in (1.0, 3.0, 5.0):
        for name, (sched, _) in SOLVERS.items():
            sg, ts = sched(4, S)
            print("%-5s N=4 shift=%g sigmas(f32)=%s t=%s" % (name, S, [float(v) for v in sg], list(ts)))
    print("UniPC: t_0 == t_1 from N =", {S: smallest_repeating_steps(S) for S in (1.0, 3.0, 5.0, 8.0)})
