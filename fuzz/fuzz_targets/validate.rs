//! `AttnProblem::validate` (and `AttnProblem::from_shapes`) on arbitrary shapes, strides, lengths,
//! `cu_seqlens`, windows, masks, biases and family parameters. Every input either is a typed error
//! (whose message formats) or validates into a spec whose buffers fit: each length at most
//! `isize::MAX` bytes, and every element the spec's index functions address below its buffer's
//! length. `RingProblem::validate` likewise, with the ring plan's invariants. A panic, an overflow
//! (overflow checks are on) or a failed assertion is a crash.

#![no_main]

use arbitrary::Arbitrary;
use attn_core::{
    Aggregation, AttnProblem, AttnSpec, BiasShape, Block, Causal, CosineParams, DType, DecodeShape, Family,
    HypScore, HyperbolicParams, InputStrides, Layout, Pass, RingProblem, SeqLengths, SoftmaxParams, Strides,
    TaylorParams, Window,
};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// A size, an offset or a stride: mostly small, sometimes at the edges validation guards.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Size {
    Small(u8),
    Edge(Edge),
    Any(usize),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Edge {
    I32Max,
    I32MaxPlus1,
    HalfI32Max,
    IsizeMax,
    UsizeMax,
    /// `2^k`, `k` taken mod 64.
    Pow2(u8),
    /// `2^k − 1`.
    Pow2Minus1(u8),
}

impl Size {
    fn get(self) -> usize {
        match self {
            Size::Small(n) => n as usize,
            Size::Any(n) => n,
            Size::Edge(e) => match e {
                Edge::I32Max => i32::MAX as usize,
                Edge::I32MaxPlus1 => i32::MAX as usize + 1,
                Edge::HalfI32Max => i32::MAX as usize / 2,
                Edge::IsizeMax => isize::MAX as usize,
                Edge::UsizeMax => usize::MAX,
                Edge::Pow2(k) => 1usize << (k % 64),
                Edge::Pow2Minus1(k) => (1usize << (k % 64)) - 1,
            },
        }
    }
}

#[derive(Arbitrary, Debug)]
enum FamilyIn {
    Softmax {
        scale: Option<f32>,
        softcap: Option<f32>,
    },
    Cosine {
        scale: f32,
        qk_l2norm: bool,
        eps: f32,
    },
    Taylor {
        order: u8,
        a: [f32; 3],
        scale: Option<f32>,
        qk_l2norm: bool,
    },
    Hyperbolic {
        geodesic: bool,
        midpoint: bool,
        curvature: f32,
        beta: f32,
    },
}

impl FamilyIn {
    fn family(&self) -> Family {
        match *self {
            FamilyIn::Softmax { scale, softcap } => Family::Softmax(SoftmaxParams { scale, softcap }),
            FamilyIn::Cosine {
                scale,
                qk_l2norm,
                eps,
            } => Family::CosineSim(CosineParams {
                scale,
                qk_l2norm,
                eps,
            }),
            FamilyIn::Taylor {
                order,
                a,
                scale,
                qk_l2norm,
            } => Family::Taylor(TaylorParams {
                order,
                a,
                scale,
                qk_l2norm,
            }),
            FamilyIn::Hyperbolic {
                geodesic,
                midpoint,
                curvature,
                beta,
            } => Family::Hyperbolic(HyperbolicParams {
                score: if geodesic {
                    HypScore::Geodesic
                } else {
                    HypScore::SquaredLorentz
                },
                curvature,
                beta,
                aggregation: if midpoint {
                    Aggregation::EinsteinMidpoint
                } else {
                    Aggregation::Euclidean
                },
            }),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum LengthsIn {
    Dense,
    KeyPadding(Vec<Size>),
    /// Offsets as given.
    VarlenRaw(Vec<Size>, Vec<Size>),
    /// Offsets as prefix sums of the given lengths (saturating), starting at 0: mostly well formed.
    VarlenLens(Vec<Size>, Vec<Size>),
}

fn prefix_sums(lens: &[Size]) -> Vec<usize> {
    let mut cu = vec![0usize];
    for l in lens {
        let last = cu[cu.len() - 1];
        cu.push(last.saturating_add(l.get()));
    }
    cu
}

impl LengthsIn {
    fn lengths(&self) -> SeqLengths {
        let raw = |v: &[Size]| v.iter().map(|s| s.get()).collect::<Vec<_>>();
        match self {
            LengthsIn::Dense => SeqLengths::Dense,
            LengthsIn::KeyPadding(l) => SeqLengths::KeyPadding(raw(l)),
            LengthsIn::VarlenRaw(q, k) => SeqLengths::Varlen {
                cu_seqlens_q: raw(q),
                cu_seqlens_k: raw(k),
            },
            LengthsIn::VarlenLens(q, k) => SeqLengths::Varlen {
                cu_seqlens_q: prefix_sums(q),
                cu_seqlens_k: prefix_sums(k),
            },
        }
    }
}

#[derive(Arbitrary, Debug)]
struct ProblemIn {
    family: FamilyIn,
    dtype: u8,
    batch: Size,
    heads_q: Size,
    heads_kv: Size,
    seq_q: Size,
    seq_k: Size,
    head_dim: Size,
    head_dim_v: Size,
    bhnd: bool,
    /// `[batch, seq, head, dim]` strides of q, k and v.
    strides: Option<[[Size; 4]; 3]>,
    causal: u8,
    window: Option<(Option<Size>, Option<Size>)>,
    lengths: LengthsIn,
    bias: Option<(Size, Size)>,
    deterministic: bool,
}

#[derive(Arbitrary, Debug)]
enum Input {
    Fields(Box<ProblemIn>),
    /// `from_shapes` with arbitrary ranks and dims, then masks on top.
    Shapes {
        family: FamilyIn,
        bhnd: bool,
        q: Vec<Size>,
        k: Vec<Size>,
        v: Vec<Size>,
        causal: u8,
        window: Option<(Option<Size>, Option<Size>)>,
        lengths: LengthsIn,
    },
    /// A context-parallel call (`RingProblem::validate`).
    Ring {
        family: FamilyIn,
        dtype: u8,
        sizes: [Size; 6],
        causal: bool,
        world: Size,
    },
}

fn dtype(x: u8) -> DType {
    DType::ALL[x as usize % 3]
}

fn causal(x: u8) -> Causal {
    [Causal::None, Causal::TopLeft, Causal::BottomRight][x as usize % 3]
}

fn layout(bhnd: bool) -> Layout {
    if bhnd {
        Layout::Bhnd
    } else {
        Layout::Bnhd
    }
}

fn window(w: Option<(Option<Size>, Option<Size>)>) -> Option<Window> {
    w.map(|(l, r)| Window {
        left: l.map(Size::get),
        right: r.map(Size::get),
    })
}

fn strides(s: [Size; 4]) -> Strides {
    Strides {
        batch: s[0].get(),
        seq: s[1].get(),
        head: s[2].get(),
        dim: s[3].get(),
    }
}

impl ProblemIn {
    fn problem(&self) -> AttnProblem {
        AttnProblem {
            family: self.family.family(),
            dtype: dtype(self.dtype),
            batch: self.batch.get(),
            heads_q: self.heads_q.get(),
            heads_kv: self.heads_kv.get(),
            seq_q: self.seq_q.get(),
            seq_k: self.seq_k.get(),
            head_dim: self.head_dim.get(),
            head_dim_v: self.head_dim_v.get(),
            layout: layout(self.bhnd),
            strides: self.strides.map(|[q, k, v]| InputStrides {
                q: strides(q),
                k: strides(k),
                v: strides(v),
            }),
            causal: causal(self.causal),
            window: window(self.window),
            lengths: self.lengths.lengths(),
            bias: self.bias.map(|(batch, heads)| BiasShape {
                batch: batch.get(),
                heads: heads.get(),
            }),
            deterministic: self.deterministic,
        }
    }
}

/// Assert `last < len` for a buffer, naming it.
fn fits(what: &str, last: usize, len: usize, spec: &AttnSpec) {
    assert!(last < len, "{what}: index {last} ≥ length {len} for {spec:?}");
}

/// Everything a validated spec promises about its buffers.
fn check_spec(p: &AttnProblem, spec: &AttnSpec) {
    let elem = spec.dtype().size();
    let lens = [
        ("q", spec.q_len(), elem),
        ("k", spec.k_len(), elem),
        ("v", spec.v_len(), elem),
        ("o", spec.o_len(), elem),
        ("dq", spec.dq_len(), elem),
        ("dk", spec.dk_len(), elem),
        ("dv", spec.dv_len(), elem),
        ("stats", spec.stats_len(), 4),
        ("bias", spec.bias_len(), elem),
    ];
    for (what, len, e) in lens {
        assert!(
            len.checked_mul(e).is_some_and(|b| b <= isize::MAX as usize),
            "{what}: {len} elements of {e} bytes pass isize::MAX bytes"
        );
    }
    assert_eq!(
        (spec.batch(), spec.heads_q(), spec.heads_kv()),
        (p.batch, p.heads_q, p.heads_kv)
    );
    assert_eq!(spec.heads_q() % spec.heads_kv(), 0);
    let (hq, hkv, d, dv) = (
        spec.heads_q(),
        spec.heads_kv(),
        spec.head_dim(),
        spec.head_dim_v(),
    );
    assert!(d >= 1 && dv >= 1);

    // Offsets are sums of non-negative index·stride terms, so each batch entry's largest index is
    // at its last row and head. A dense batch has the same lengths in every entry (check the last);
    // key padding and varlen carry one length per entry in a vector the input spelled out.
    let entries: Vec<usize> = match spec.lengths() {
        SeqLengths::Dense => spec.batch().checked_sub(1).into_iter().collect(),
        _ => (0..spec.batch()).collect(),
    };
    let (mut sum_q, mut sum_k) = (0usize, 0usize);
    for &b in &entries {
        let l = spec.seq_lens(b);
        assert!(
            l.q <= spec.seq_q() && l.k <= spec.seq_k(),
            "entry {b}: lengths {l:?} pass the maxima"
        );
        sum_q += l.q;
        sum_k += l.k;
        if l.q > 0 {
            let (i, h) = (l.q - 1, hq - 1);
            fits("q", spec.q_offset(b, i, h) + d - 1, spec.q_len(), spec);
            fits("o", spec.o_offset(b, i, h) + dv - 1, spec.o_len(), spec);
            fits("dq", spec.dq_offset(b, i, h) + d - 1, spec.dq_len(), spec);
            fits("stats", spec.stats_index(b, h, i), spec.stats_len(), spec);
            for i in [0, i / 2, i] {
                let r = spec.key_range(b, i);
                assert!(
                    r.start <= r.end && r.end <= l.k,
                    "key_range({b}, {i}) = {r:?}, {l:?}"
                );
            }
        }
        if l.k > 0 {
            let (j, h) = (l.k - 1, hkv - 1);
            fits("k", spec.k_offset(b, j, h) + d - 1, spec.k_len(), spec);
            fits("v", spec.v_offset(b, j, h) + dv - 1, spec.v_len(), spec);
            fits("dk", spec.dk_offset(b, j, h) + d - 1, spec.dk_len(), spec);
            fits("dv", spec.dv_offset(b, j, h) + dv - 1, spec.dv_len(), spec);
        }
    }
    if spec.is_varlen() {
        assert_eq!((sum_q, sum_k), (spec.total_q(), spec.total_k()));
    }
    if let Some(bias) = spec.bias() {
        assert!(bias.batch == 1 || bias.batch == spec.batch());
        assert!(bias.heads == 1 || bias.heads == hq);
        // The bias buffer is `[B|1, Hq|1, Nq, Nk]`: a broadcast batch (or head) dimension keeps its
        // one entry over an empty batch, so only an empty sequence makes the buffer empty. An empty
        // call has no bias element to address.
        let (b, nq, nk) = (spec.batch(), spec.seq_q(), spec.seq_k());
        let expected = bias.batch * bias.heads * nq * nk;
        assert_eq!(spec.bias_len(), expected, "bias length of {:?}", bias);
        if b > 0 && nq > 0 && nk > 0 {
            let last = spec.bias_index(b - 1, hq - 1, nq - 1, nk - 1);
            fits(
                "bias",
                last.expect("a spec with a bias has bias indices"),
                spec.bias_len(),
                spec,
            );
        }
    }
    if let Ok(shape) = DecodeShape::of(spec, Pass::Decode) {
        let _ = shape.check_step(spec).map_err(|e| e.to_string());
    }
    let _ = (spec.q_shape(), spec.k_shape(), spec.v_shape(), spec.o_shape());
}

/// `ATTN_FUZZ_VERBOSE=1`: print each input's outcome (to see what a corpus reaches).
fn verbose() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var_os("ATTN_FUZZ_VERBOSE").is_some())
}

fn run(p: &AttnProblem) {
    match p.validate() {
        Ok(spec) => {
            check_spec(p, &spec);
            if verbose() {
                eprintln!(
                    "ok: {}, q {:?}, lengths {:?}",
                    spec.family().label(),
                    spec.q_shape(),
                    spec.lengths()
                );
            }
        }
        Err(e) => {
            let message = e.to_string();
            if verbose() {
                eprintln!("error: {message}");
            }
        }
    }
}

/// A ring plan's invariants: the chunks tile the sequence, every rank's rows are tokens of it, the
/// schedule's sources are ranks, and every block that is not skipped has a `C × C` spec.
fn run_ring(p: &RingProblem) {
    let Ok(s) = p.validate() else { return };
    let (w, c) = (s.world(), s.chunk());
    assert_eq!(c * 2 * w, p.seq, "chunks of {p:?}");
    assert_eq!(s.local().seq_q(), 2 * c);
    assert_eq!(s.global().seq_q(), p.seq);
    for r in [0, w / 2, w - 1] {
        let [a, b] = s.chunks(r);
        assert!(a < 2 * w && b < 2 * w && a != b);
        if c > 0 {
            for i in [0, c - 1, c, 2 * c - 1] {
                assert!(s.global_row(r, i) < p.seq);
            }
        }
        for t in [0, w - 1] {
            assert!(s.source(r, t) < w);
        }
        let block = s.block(a, b);
        assert_eq!(s.block_spec(block).is_none(), block == Block::Skip);
        if let Some(bs) = s.block_spec(block) {
            assert_eq!((bs.seq_q(), bs.seq_k()), (c, c));
        }
    }
}

fuzz_target!(|input: Input| {
    match input {
        Input::Fields(p) => run(&p.problem()),
        Input::Ring {
            family,
            dtype: d,
            sizes,
            causal,
            world,
        } => {
            let [b, hq, hkv, n, dk, dv] = sizes.map(|x| x.get());
            let p = RingProblem::new(family.family(), dtype(d), b, hq, hkv, n, dk, world.get())
                .with_head_dim_v(dv)
                .with_causal(causal);
            run_ring(&p);
        }
        Input::Shapes {
            family,
            bhnd,
            q,
            k,
            v,
            causal: c,
            window: w,
            lengths,
        } => {
            let dims = |s: &[Size]| s.iter().map(|x| x.get()).collect::<Vec<_>>();
            let family = family.family();
            match AttnProblem::from_shapes(family, DType::BF16, layout(bhnd), &dims(&q), &dims(&k), &dims(&v))
            {
                Ok(mut p) => {
                    p.causal = causal(c);
                    p.window = window(w);
                    p.lengths = lengths.lengths();
                    run(&p);
                }
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        }
    }
});
