//! The shape of a recurrent Taylor decode (docs/math.md §3, "Decode"), shared by every backend.
//!
//! A decode state holds, per (batch entry, kv head), running sums `S[f] = Σ_j φ_f(k̂_j) ṽ_j` over the
//! keys folded so far, `ṽ_j = [v_j, 1]`: `m = Dv + 1` columns ([`DecodeShape::width`]) and as many
//! feature rows `f` as the backend stores (`1 + D` for order 1, `+ D(D+1)/2` for order 2, padded to
//! its tiles on the GPU). [`DecodeShape`] is what such a state was built for: the family with its
//! parameters, the dtype and the batch and head shapes. Each backend wraps one in its state type and
//! keeps its own row count and storage.
//!
//! A step's spec describes only the new tokens: a dense batch of `t` tokens per entry with
//! `seq_q = seq_k = t` and a causal mask, and the state's family, dtype, batch and head shapes.
//! [`DecodeShape::check_step`] is that check, once for every backend.

use crate::{AttnError, AttnSpec, Causal, DType, FamilySpec, Op, Pass, Result, SeqLengths, TaylorOrder};

/// What a Taylor decode state was built for; every step's spec must match it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeShape {
    /// The checked Taylor family with its parameters.
    pub family: FamilySpec,
    /// Storage dtype of the steps' q, k, v and o.
    pub dtype: DType,
    /// Batch entries (B).
    pub batch: usize,
    /// Query heads (Hq).
    pub heads_q: usize,
    /// Key/value heads (Hkv); the state holds one set of sums per (batch entry, kv head).
    pub heads_kv: usize,
    /// Head dim of q and k (D).
    pub head_dim: usize,
    /// Head dim of v and o (Dv).
    pub head_dim_v: usize,
}

impl DecodeShape {
    /// The shape of a Taylor spec; `InvalidArgument { arg: "family" }` for any other family (the op
    /// is `spec`'s family in `pass`).
    pub fn of(spec: &AttnSpec, pass: Pass) -> Result<Self> {
        if !matches!(spec.family(), FamilySpec::Taylor { .. }) {
            return Err(not_taylor(spec.op(pass)));
        }
        Ok(DecodeShape {
            family: *spec.family(),
            dtype: spec.dtype(),
            batch: spec.batch(),
            heads_q: spec.heads_q(),
            heads_kv: spec.heads_kv(),
            head_dim: spec.head_dim(),
            head_dim_v: spec.head_dim_v(),
        })
    }

    /// The checks of a step's spec (op: `taylor decode`), in this order:
    /// - the first field where `spec` differs from this shape: `InvalidArgument { arg: "state" }`,
    ///   e.g. "the state was built for heads_kv = 2, the spec has heads_kv = 1" (a spec of another
    ///   family: `InvalidArgument { arg: "family" }`, as [`DecodeShape::of`]);
    /// - key padding or packed varlen: `InvalidArgument { arg: "lengths" }`;
    /// - `seq_k ≠ seq_q`: `ShapeMismatch { what: "seq_k" }`;
    /// - no causal mask: `InvalidArgument { arg: "causal" }`.
    pub fn check_step(&self, spec: &AttnSpec) -> Result<()> {
        let op = spec.op(Pass::Decode);
        let other = DecodeShape::of(spec, Pass::Decode)?;
        // Steps run once per generated token: the strings naming a differing field are built only
        // when some field differs.
        if *self != other {
            let fields: [(&str, String, String); 7] = [
                (
                    "family",
                    format!("{:?}", self.family),
                    format!("{:?}", other.family),
                ),
                ("dtype", self.dtype.to_string(), other.dtype.to_string()),
                ("batch", self.batch.to_string(), other.batch.to_string()),
                ("heads_q", self.heads_q.to_string(), other.heads_q.to_string()),
                ("heads_kv", self.heads_kv.to_string(), other.heads_kv.to_string()),
                ("head_dim", self.head_dim.to_string(), other.head_dim.to_string()),
                (
                    "head_dim_v",
                    self.head_dim_v.to_string(),
                    other.head_dim_v.to_string(),
                ),
            ];
            if let Some((what, s, o)) = fields.iter().find(|(_, s, o)| s != o) {
                return Err(AttnError::InvalidArgument {
                    op,
                    arg: "state",
                    reason: format!("the state was built for {what} = {s}, the spec has {what} = {o}"),
                });
            }
        }
        if !matches!(spec.lengths(), SeqLengths::Dense) {
            return Err(AttnError::InvalidArgument {
                op,
                arg: "lengths",
                reason: "a decode step appends the same number of tokens to every batch entry (no key padding or packed varlen)"
                    .into(),
            });
        }
        if spec.seq_q() != spec.seq_k() {
            return Err(AttnError::ShapeMismatch {
                op,
                what: "seq_k".into(),
                expected: format!("one key per new query (seq_k = seq_q = {})", spec.seq_q()),
                got: format!("seq_k = {}", spec.seq_k()),
            });
        }
        if spec.causal() == Causal::None {
            return Err(AttnError::InvalidArgument {
                op,
                arg: "causal",
                reason:
                    "a decode step is causal: each new token sees the keys before it (TopLeft or BottomRight)"
                        .into(),
            });
        }
        Ok(())
    }

    /// `(order, [a0, a1, a2], scale, qk_l2norm, eps)` of the family. A shape from
    /// [`DecodeShape::of`] always holds a Taylor family; the fields are public, so one set to another
    /// family gets the error of `of` (op: that family's decode).
    pub fn taylor(&self) -> Result<(TaylorOrder, [f32; 3], f32, bool, f32)> {
        match self.family {
            FamilySpec::Taylor {
                order,
                a,
                scale,
                qk_l2norm,
                eps,
            } => Ok((order, a, scale, qk_l2norm, eps)),
            other => Err(not_taylor(Op::new(other.kind(), Pass::Decode))),
        }
    }

    /// Columns of the sums: `m = Dv + 1` (the values and the denominator).
    pub fn width(&self) -> usize {
        self.head_dim_v + 1
    }
}

/// The error of a decode asked of a family other than Taylor.
fn not_taylor(op: Op) -> AttnError {
    AttnError::InvalidArgument {
        op,
        arg: "family",
        reason: format!(
            "recurrent decode exists for Taylor linear attention only, not {}",
            op.family.name()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttnProblem, Family};

    /// Taylor order 2, f32, B = 2, Hq = 4, Hkv = 2, one new token, D = Dv = 8, top-left causal.
    fn step() -> AttnProblem {
        AttnProblem::new(Family::taylor(2), DType::F32, 2, 4, 2, 1, 1, 8).with_causal(Causal::TopLeft)
    }

    fn shape() -> DecodeShape {
        DecodeShape::of(&step().validate().expect("valid"), Pass::Decode).expect("a Taylor spec")
    }

    /// The message of `r`'s error, after checking that it is `InvalidArgument { arg }` of a
    /// `taylor decode` op.
    fn invalid<T: std::fmt::Debug>(r: Result<T>, arg: &str) -> String {
        match r {
            Err(e @ AttnError::InvalidArgument { arg: a, .. }) if a == arg => {
                assert_eq!(e.op().pass, Pass::Decode, "{e}");
                e.to_string()
            }
            other => panic!("expected an invalid `{arg}`, got {other:?}"),
        }
    }

    #[test]
    fn of_a_taylor_spec_holds_its_family_dtype_and_shapes() {
        let spec = step().validate().expect("valid");
        let s = DecodeShape::of(&spec, Pass::Decode).expect("a Taylor spec");
        assert_eq!(s.family, *spec.family());
        assert_eq!(s.dtype, DType::F32);
        assert_eq!(
            (s.batch, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v),
            (2, 4, 2, 8, 8)
        );
        assert_eq!(s.width(), 9);
        let (order, a, _, _, _) = s.taylor().expect("Taylor parameters");
        assert_eq!(order, TaylorOrder::Two);
        assert_eq!(a[2], 0.5, "the default order-2 coefficients are 1, 1, 1/2");
    }

    #[test]
    fn of_another_family_names_the_family() {
        let softmax = AttnProblem {
            family: Family::softmax(),
            ..step()
        }
        .validate()
        .expect("valid");
        let msg = invalid(DecodeShape::of(&softmax, Pass::Decode), "family");
        assert_eq!(
            msg,
            "softmax decode: invalid `family`: recurrent decode exists for Taylor linear attention only, not softmax"
        );
        let not_taylor = DecodeShape {
            family: *softmax.family(),
            ..shape()
        };
        assert_eq!(
            invalid(not_taylor.taylor(), "family"),
            msg,
            "taylor() of a softmax shape"
        );
    }

    #[test]
    fn check_step_accepts_the_state_own_step_spec() {
        shape()
            .check_step(&step().validate().expect("valid"))
            .expect("the state's own spec");
        let four_tokens = AttnProblem {
            seq_q: 4,
            seq_k: 4,
            ..step()
        }
        .with_causal(Causal::BottomRight)
        .validate()
        .expect("valid");
        shape()
            .check_step(&four_tokens)
            .expect("t = 4 tokens, bottom-right");
    }

    #[test]
    fn check_step_names_the_first_field_that_differs() {
        // heads_kv and head_dim_v differ (head_dim would change the default scale, so the family).
        let other = AttnProblem {
            heads_kv: 1,
            head_dim_v: 4,
            ..step()
        }
        .validate()
        .expect("valid");
        let msg = invalid(shape().check_step(&other), "state");
        assert_eq!(
            msg,
            "taylor decode: invalid `state`: the state was built for heads_kv = 2, the spec has heads_kv = 1"
        );
    }

    #[test]
    fn check_step_rejects_a_spec_of_another_family() {
        let cosine = AttnProblem {
            family: Family::cosine_sim(),
            ..step()
        }
        .validate()
        .expect("valid");
        let msg = invalid(shape().check_step(&cosine), "family");
        assert!(msg.starts_with("cosine_sim decode: invalid `family`:"), "{msg}");
    }

    #[test]
    fn check_step_rejects_padded_or_packed_lengths() {
        let varlen = step()
            .with_varlen(vec![0, 1, 2], vec![0, 1, 2])
            .validate()
            .expect("valid");
        let msg = invalid(shape().check_step(&varlen), "lengths");
        assert_eq!(
            msg,
            "taylor decode: invalid `lengths`: a decode step appends the same number of tokens to every batch entry (no key padding or packed varlen)"
        );
    }

    #[test]
    fn check_step_wants_one_key_per_new_query() {
        let long = AttnProblem { seq_k: 2, ..step() }.validate().expect("valid");
        let e = shape().check_step(&long).expect_err("seq_k = 2 ≠ seq_q = 1");
        assert!(
            matches!(&e, AttnError::ShapeMismatch { what, .. } if what == "seq_k"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "taylor decode: `seq_k` has the wrong shape: expected one key per new query (seq_k = seq_q = 1), got seq_k = 2"
        );
    }

    #[test]
    fn check_step_wants_a_causal_mask() {
        let open = step().with_causal(Causal::None).validate().expect("valid");
        let msg = invalid(shape().check_step(&open), "causal");
        assert_eq!(
            msg,
            "taylor decode: invalid `causal`: a decode step is causal: each new token sees the keys before it (TopLeft or BottomRight)"
        );
    }
}
