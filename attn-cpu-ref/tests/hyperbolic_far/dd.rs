//! Double-double arithmetic (an f64 pair `hi + lo`, about 106 significant bits) for the hyperbolic
//! oracle: `x0 = √(1/c + ‖x‖²)` and `⟨q,k⟩_L = −q0 k0 + q·k` formed without losing the digits that
//! cancel when q and k are close far from the origin (Dekker's and Knuth's error-free transformations,
//! the product's error by `mul_add`).

/// `hi + lo` with `|lo| ≤ ulp(hi)/2`.
#[derive(Clone, Copy, Debug)]
pub struct Dd(pub f64, pub f64);

fn two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    let bb = s - a;
    Dd(s, (a - (s - bb)) + (b - bb))
}

fn quick_two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    Dd(s, b - (s - a))
}

fn two_prod(a: f64, b: f64) -> Dd {
    let p = a * b;
    Dd(p, a.mul_add(b, -p))
}

impl Dd {
    pub fn from(x: f64) -> Dd {
        Dd(x, 0.0)
    }
    pub fn add(self, o: Dd) -> Dd {
        let s = two_sum(self.0, o.0);
        let t = two_sum(self.1, o.1);
        let s = quick_two_sum(s.0, s.1 + t.0);
        quick_two_sum(s.0, s.1 + t.1)
    }
    pub fn neg(self) -> Dd {
        Dd(-self.0, -self.1)
    }
    pub fn sub(self, o: Dd) -> Dd {
        self.add(o.neg())
    }
    pub fn mul(self, o: Dd) -> Dd {
        let p = two_prod(self.0, o.0);
        quick_two_sum(p.0, p.1 + (self.0 * o.1 + self.1 * o.0))
    }
    pub fn scale(self, x: f64) -> Dd {
        self.mul(Dd::from(x))
    }
    pub fn sqrt(self) -> Dd {
        let s = self.0.sqrt();
        let p = two_prod(s, s);
        quick_two_sum(s, (self.0 - p.0 - p.1 + self.1) / (2.0 * s))
    }
    /// `1/c` for an f64 `c`.
    pub fn recip(c: f64) -> Dd {
        let r = 1.0 / c;
        quick_two_sum(r, -c.mul_add(r, -1.0) / c)
    }
    pub fn to_f64(self) -> f64 {
        self.0 + self.1
    }
}

/// `Σ a_i b_i`, every product and sum error-free up to the double-double's precision.
pub fn dot(a: &[f64], b: &[f64]) -> Dd {
    a.iter()
        .zip(b)
        .fold(Dd::from(0.0), |acc, (x, y)| acc.add(two_prod(*x, *y)))
}

/// `d²_L = 2 (q0 k0 − q·k) − 2/c` in double-double, rounded once to f64.
pub fn lorentz_sq_dist(c: f64, q: &[f64], k: &[f64]) -> f64 {
    let inv_c = Dd::recip(c);
    let q0 = inv_c.add(dot(q, q)).sqrt();
    let k0 = inv_c.add(dot(k, k)).sqrt();
    q0.mul(k0).sub(dot(q, k)).sub(inv_c).scale(2.0).to_f64()
}
