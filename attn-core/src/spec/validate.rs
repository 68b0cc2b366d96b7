//! [`AttnProblem::validate`]: the one place user input is checked and turned into an [`AttnSpec`].
//! Every size, stride, extent and buffer length is computed here once, with checked arithmetic.

use super::*;

impl AttnProblem {
    /// Check everything and resolve defaults. The only way to obtain an [`AttnSpec`].
    ///
    /// `batch`, `seq_q` and `seq_k` may be 0 (an empty call, as with empty tensors in candle and
    /// PyTorch): the buffers of the empty side have length 0 and, for `seq_k = 0`, every row's
    /// `key_range` is empty, so backends return empty outputs, or zeros with the no-key statistic,
    /// and zero gradients (docs/nan.md, "Empty calls"). Heads and head dims must be at least 1.
    pub fn validate(&self) -> Result<AttnSpec> {
        let op = Op::new(self.family.kind(), Pass::Spec);
        let invalid = |arg: &'static str, reason: String| AttnError::InvalidArgument { op, arg, reason };
        let too_large = |arg: &'static str, reason: String| AttnError::TooLarge {
            op,
            arg,
            shapes: self.sizes_str(),
            reason,
        };
        let family = resolve_family(op, &self.family, self.head_dim)?;

        // Sizes. A batch or a sequence may be empty (as in candle and PyTorch): every buffer the call
        // writes is then empty, or, for queries without keys (seq_k = 0), rows of zeros with the
        // no-key statistic. Heads and head dims are at least 1.
        for (arg, n) in [
            ("batch", self.batch),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("seq_q", self.seq_q),
            ("seq_k", self.seq_k),
        ] {
            if n == 0 && (arg == "heads_q" || arg == "heads_kv") {
                return Err(invalid(arg, "must be at least 1".into()));
            }
            if n > MAX_INDEX {
                return Err(too_large(
                    arg,
                    format!("{n} exceeds {MAX_INDEX}, the kernels' 32-bit sizes"),
                ));
            }
        }
        if self.heads_q % self.heads_kv != 0 {
            return Err(invalid(
                "heads_kv",
                format!(
                    "heads_q ({}) is not a multiple of heads_kv ({})",
                    self.heads_q, self.heads_kv
                ),
            ));
        }
        for (arg, d) in [("head_dim", self.head_dim), ("head_dim_v", self.head_dim_v)] {
            if d == 0 || d > MAX_HEAD_DIM {
                return Err(invalid(arg, format!("{d} is outside 1..={MAX_HEAD_DIM}")));
            }
        }

        // Lengths.
        // Rows over the whole batch: the kernels index them (and the packed offsets) in 32 bits.
        let rows = |arg: &'static str, total: Option<usize>, what: String| match total {
            Some(t) if t <= MAX_INDEX => Ok(t),
            _ => Err(too_large(
                arg,
                format!("{what} rows exceed {MAX_INDEX}, the kernels' 32-bit row index"),
            )),
        };
        let dense_rows = || -> Result<(usize, usize)> {
            let (b, nq, nk) = (self.batch, self.seq_q, self.seq_k);
            Ok((
                rows(
                    "seq_q",
                    b.checked_mul(nq),
                    format!("batch·seq_q = {b}·{nq} query"),
                )?,
                rows("seq_k", b.checked_mul(nk), format!("batch·seq_k = {b}·{nk} key"))?,
            ))
        };
        let (total_q, total_k) = match &self.lengths {
            SeqLengths::Dense => dense_rows()?,
            SeqLengths::KeyPadding(lens) => {
                if lens.len() != self.batch {
                    return Err(AttnError::ShapeMismatch {
                        op,
                        what: "key_lens".into(),
                        expected: shape_str(&[self.batch]),
                        got: shape_str(&[lens.len()]),
                    });
                }
                if let Some((b, &l)) = lens.iter().enumerate().find(|(_, &l)| l > self.seq_k) {
                    return Err(invalid(
                        "key_lens",
                        format!("key_lens[{b}] = {l} exceeds seq_k = {}", self.seq_k),
                    ));
                }
                dense_rows()?
            }
            SeqLengths::Varlen {
                cu_seqlens_q,
                cu_seqlens_k,
            } => {
                let tq = check_cu(op, "cu_seqlens_q", cu_seqlens_q, self.batch, self.seq_q)?;
                let tk = check_cu(op, "cu_seqlens_k", cu_seqlens_k, self.batch, self.seq_k)?;
                (
                    rows("cu_seqlens_q", Some(tq), format!("{tq} packed query"))?,
                    rows("cu_seqlens_k", Some(tk), format!("{tk} packed key"))?,
                )
            }
        };
        let varlen = matches!(self.lengths, SeqLengths::Varlen { .. });

        // Strides.
        let contiguous = |n: usize, h: usize, d: usize| {
            let mut s = Strides::contiguous(self.layout, n, h, d);
            if varlen {
                s.batch = 0;
            }
            s
        };
        let (nq, nk) = if varlen {
            (total_q, total_k)
        } else {
            (self.seq_q, self.seq_k)
        };
        // Every buffer length, computed once and checked: no product, extent or byte count may
        // overflow or pass isize::MAX bytes (the most a slice or an allocation can address). Each
        // contiguous stride divides its buffer's length, so `contiguous` cannot overflow after this.
        let (hq, hkv, d, dv) = (self.heads_q, self.heads_kv, self.head_dim, self.head_dim_v);
        let nb = if varlen { 1 } else { self.batch };
        let elem = self.dtype.size();
        let buffer = |arg: &'static str, len: Option<usize>, elem: usize| match len {
            Some(l) if l <= isize::MAX as usize / elem => Ok(l),
            Some(l) => Err(too_large(
                arg,
                format!("{l} elements of {elem} bytes pass isize::MAX bytes"),
            )),
            None => Err(too_large(arg, "its element count overflows usize".into())),
        };
        let packed = |n: usize, h: usize, d: usize| nb.checked_mul(n)?.checked_mul(h)?.checked_mul(d);
        let mut lens = Lens {
            o: buffer("o", packed(nq, hq, dv), elem)?,
            dq: buffer("dq", packed(nq, hq, d), elem)?,
            dk: buffer("dk", packed(nk, hkv, d), elem)?,
            dv: buffer("dv", packed(nk, hkv, dv), elem)?,
            stats: buffer("stats", total_q.checked_mul(hq), 4)?,
            ..Lens::default()
        };
        let inputs = match self.strides {
            Some(s) => {
                for (what, st) in [("q", s.q), ("k", s.k), ("v", s.v)] {
                    if st.dim != 1 {
                        return Err(invalid(
                            "strides",
                            format!("{what} has last-dim stride {} (must be contiguous, 1)", st.dim),
                        ));
                    }
                    let widest = st.batch.max(st.seq).max(st.head);
                    if widest > isize::MAX as usize {
                        return Err(too_large(
                            "strides",
                            format!("{what} has stride {widest}, past isize::MAX (64-bit kernel strides)"),
                        ));
                    }
                }
                lens.q = buffer("q", extent(s.q, nb, nq, hq, d), elem)?;
                lens.k = buffer("k", extent(s.k, nb, nk, hkv, d), elem)?;
                lens.v = buffer("v", extent(s.v, nb, nk, hkv, dv), elem)?;
                s
            }
            None => {
                (lens.q, lens.k, lens.v) = (lens.dq, lens.dk, lens.dv);
                InputStrides {
                    q: contiguous(nq, hq, d),
                    k: contiguous(nk, hkv, d),
                    v: contiguous(nk, hkv, dv),
                }
            }
        };

        // Masks and bias.
        if let (Some(_), FamilySpec::Taylor { .. }) = (self.window, family) {
            return Err(invalid(
                "window",
                "Taylor linear attention factors through prefix states; only causal masks apply".into(),
            ));
        }
        if let Some(bias) = self.bias {
            if !family.is_softmax_like() {
                return Err(invalid(
                    "bias",
                    "Taylor linear attention has no per-pair score term to add a bias to".into(),
                ));
            }
            if varlen {
                return Err(AttnError::Unsupported {
                    op,
                    backend: "attn",
                    what: "an additive bias with a packed variable-length batch".into(),
                });
            }
            let ok_b = bias.batch == 1 || bias.batch == self.batch;
            let ok_h = bias.heads == 1 || bias.heads == self.heads_q;
            if !ok_b || !ok_h {
                return Err(AttnError::ShapeMismatch {
                    op,
                    what: "bias".into(),
                    expected: format!(
                        "[{}|1, {}|1, {}, {}]",
                        self.batch, self.heads_q, self.seq_q, self.seq_k
                    ),
                    got: shape_str(&[bias.batch, bias.heads, self.seq_q, self.seq_k]),
                });
            }
            let len = bias
                .batch
                .checked_mul(bias.heads)
                .and_then(|n| n.checked_mul(self.seq_q));
            lens.bias = buffer("bias", len.and_then(|n| n.checked_mul(self.seq_k)), elem)?;
        }
        // A window side wider than both sequences together allows every key (see `key_range`), so it
        // is clamped here, once: the CPU reference and the kernels then see the same window, and the
        // kernels' 32-bit key bounds (i + diag ± window, below 2·(Nq + Nk) + 1) cannot overflow.
        let window = match self.window {
            None => None,
            Some(w) => {
                let cap = self.seq_q + self.seq_k;
                if cap > (MAX_INDEX - 1) / 2 {
                    return Err(too_large(
                        "window",
                        format!("a window needs 2·(seq_q + seq_k) + 1 ≤ {MAX_INDEX} (32-bit key bounds)"),
                    ));
                }
                Some(Window {
                    left: w.left.map(|l| l.min(cap)),
                    right: w.right.map(|r| r.min(cap)),
                })
            }
        };

        Ok(AttnSpec {
            family,
            dtype: self.dtype,
            batch: self.batch,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            seq_q: self.seq_q,
            seq_k: self.seq_k,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
            layout: self.layout,
            total_q,
            total_k,
            q: inputs.q,
            k: inputs.k,
            v: inputs.v,
            o: contiguous(nq, hq, dv),
            dq: contiguous(nq, hq, d),
            dk: contiguous(nk, hkv, d),
            dv: contiguous(nk, hkv, dv),
            lens,
            causal: self.causal,
            window,
            lengths: self.lengths.clone(),
            bias: self.bias,
            deterministic: self.deterministic,
        })
    }
}

impl AttnProblem {
    /// The call's sizes for messages: `batch 2, heads 8/2, seq 128/256, head dims 64/64`.
    fn sizes_str(&self) -> String {
        format!(
            "batch {}, heads {}/{}, seq {}/{}, head dims {}/{}",
            self.batch, self.heads_q, self.heads_kv, self.seq_q, self.seq_k, self.head_dim, self.head_dim_v
        )
    }
}

fn check_cu(op: Op, arg: &'static str, cu: &[usize], batch: usize, max_len: usize) -> Result<usize> {
    if Some(cu.len()) != batch.checked_add(1) {
        return Err(AttnError::ShapeMismatch {
            op,
            what: arg.into(),
            expected: format!("[{batch} + 1]"),
            got: shape_str(&[cu.len()]),
        });
    }
    if cu[0] != 0 {
        return Err(AttnError::InvalidArgument {
            op,
            arg,
            reason: format!("must start at 0, starts at {}", cu[0]),
        });
    }
    for b in 0..batch {
        let (s, e) = (cu[b], cu[b + 1]);
        if e < s {
            return Err(AttnError::InvalidArgument {
                op,
                arg,
                reason: format!("decreases at {b}: {s} then {e}"),
            });
        }
        if e - s > max_len {
            return Err(AttnError::InvalidArgument {
                op,
                arg,
                reason: format!("sequence {b} has length {} beyond the maximum {max_len}", e - s),
            });
        }
    }
    Ok(cu[batch])
}

fn positive(op: Op, arg: &'static str, x: f32) -> Result<f32> {
    if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(AttnError::InvalidArgument {
            op,
            arg,
            reason: format!("{x} must be finite and > 0"),
        })
    }
}

fn resolve_family(op: Op, family: &Family, head_dim: usize) -> Result<FamilySpec> {
    let default_scale = 1.0 / (head_dim.max(1) as f32).sqrt();
    Ok(match *family {
        Family::Softmax(p) => FamilySpec::Softmax {
            scale: positive(op, "scale", p.scale.unwrap_or(default_scale))?,
            softcap: p.softcap.map(|c| positive(op, "softcap", c)).transpose()?,
        },
        Family::CosineSim(p) => FamilySpec::CosineSim {
            scale: positive(op, "scale", p.scale)?,
            qk_l2norm: p.qk_l2norm,
            eps: positive(op, "eps", p.eps)?,
        },
        Family::Taylor(p) => {
            let order = match p.order {
                1 => TaylorOrder::One,
                2 => TaylorOrder::Two,
                o => {
                    return Err(AttnError::InvalidArgument {
                        op,
                        arg: "order",
                        reason: format!("Taylor order {o} (supported: 1, 2)"),
                    })
                }
            };
            let [a0, a1, a2] = p.a;
            if !(a0.is_finite() && a1.is_finite() && a2.is_finite()) {
                return Err(AttnError::InvalidArgument {
                    op,
                    arg: "a",
                    reason: format!("coefficients {:?} must be finite", p.a),
                });
            }
            // Order 1: f(s) = a0 + a1·s with a0 = a1 = 0 weighs every key 0, so o = 0/0 (NaN).
            if order == TaylorOrder::One && a0 == 0.0 && a1 == 0.0 {
                return Err(AttnError::InvalidArgument {
                    op,
                    arg: "a",
                    reason: format!(
                        "order 1 with a0 = a1 = 0 gives every key the weight 0 (o = 0/0); got {:?}. \
                         Keep f(s) = a0 + a1·s one sign over the scores so Σ_j f(s_ij) cannot \
                         vanish: a0 > 0 and |a1|·max|s| < a0 (with qk_l2norm, |s| ≤ scale); \
                         a1 may be negative",
                        p.a
                    ),
                });
            }
            // Order 2: f(s) = a0 + a1 s + a2 s² must stay > 0 so the denominator cannot vanish:
            // a2 > 0 and its minimum a0 − a1²/(4 a2) > 0.
            if order == TaylorOrder::Two && !(a2 > 0.0 && a0 - a1 * a1 / (4.0 * a2) > 0.0) {
                return Err(AttnError::InvalidArgument {
                    op,
                    arg: "a",
                    reason: format!(
                        "order 2 needs a2 > 0 and a0 − a1²/(4·a2) > 0 so f(s) > 0; got {:?}",
                        p.a
                    ),
                });
            }
            FamilySpec::Taylor {
                order,
                a: [a0, a1, if order == TaylorOrder::Two { a2 } else { 0.0 }],
                scale: positive(op, "scale", p.scale.unwrap_or(default_scale))?,
                qk_l2norm: p.qk_l2norm,
                eps: DEFAULT_L2_EPS,
            }
        }
        Family::Hyperbolic(p) => {
            let curvature = positive(op, "curvature", p.curvature)?;
            let beta = positive(op, "beta", p.beta)?;
            if p.score == HypScore::SquaredLorentz {
                sq_lorentz_range(op, curvature, beta)?;
            }
            FamilySpec::Hyperbolic {
                score: p.score,
                curvature,
                beta,
                aggregation: p.aggregation,
            }
        }
    })
}

/// The squared Lorentz score's constants in f32: `c` in [`SQ_LORENTZ_CURVATURE`] (so `1/c` is a
/// normal f32), then `2β/c` (the statistic's constant `2β/c` of `s = 2β/c + 2β⟨q,k⟩_L`) and
/// `2β·log2 e` (the kernels' exponent factor) finite. Both products are formed in f64, so the
/// check itself cannot overflow.
fn sq_lorentz_range(op: Op, c: f32, beta: f32) -> Result<()> {
    let (lo, hi) = SQ_LORENTZ_CURVATURE;
    if !(lo..=hi).contains(&c) {
        return Err(AttnError::InvalidArgument {
            op,
            arg: "curvature",
            reason: format!(
                "{c:e} outside [{lo:e}, {hi:e}], the squared Lorentz score's range (1/c and 2β/c are f32)"
            ),
        });
    }
    let (c64, b64) = (c as f64, beta as f64);
    let constant = 2.0 * b64 / c64;
    let factor = 2.0 * b64 * std::f64::consts::LOG2_E;
    if constant > f32::MAX as f64 || factor > f32::MAX as f64 {
        return Err(AttnError::InvalidArgument {
            op,
            arg: "beta",
            reason: format!(
                "{beta:e} with curvature {c:e}: 2β/c = {constant:e} and 2β·log2 e = {factor:e} must be \
                 finite in f32 (≤ {:e})",
                f32::MAX
            ),
        });
    }
    Ok(())
}
