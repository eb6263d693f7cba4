//! Sizes: expressions of a definition's size symbols (`H - KH + 1`,
//! `(H - 2) / 2 + 1`, `min(N, M)`), kept in a canonical affine form where they
//! are affine, so that equal ranges compare equal and `min`/`max` of ranges
//! that differ by a constant fold away.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The largest coefficient or constant a definition's index arithmetic may
/// use (the checker refuses others): sizes times these stay far inside
/// `i64` in the generated code. Arithmetic here saturates, never wraps.
pub const MAX_COEFFICIENT: i64 = 1 << 20;

/// `c + Σ coeff·symbol`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Lin {
    pub terms: BTreeMap<String, i64>,
    pub c: i64,
}

impl Lin {
    pub fn constant(c: i64) -> Lin {
        Lin { terms: BTreeMap::new(), c }
    }
    pub fn symbol(s: &str) -> Lin {
        Lin { terms: BTreeMap::from([(s.to_owned(), 1)]), c: 0 }
    }
    pub fn as_const(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.c)
    }
    /// Whether every coefficient and the constant are within [`MAX_COEFFICIENT`].
    pub fn small(&self) -> bool {
        self.c.abs() <= MAX_COEFFICIENT && self.terms.values().all(|k| k.abs() <= MAX_COEFFICIENT)
    }
    pub fn add(&self, o: &Lin) -> Lin {
        let mut r = self.clone();
        for (s, k) in &o.terms {
            let t = r.terms.entry(s.clone()).or_insert(0);
            *t = t.saturating_add(*k);
        }
        r.terms.retain(|_, k| *k != 0);
        r.c = r.c.saturating_add(o.c);
        r
    }
    pub fn scale(&self, k: i64) -> Lin {
        if k == 0 {
            return Lin::constant(0);
        }
        Lin { terms: self.terms.iter().map(|(s, v)| (s.clone(), v.saturating_mul(k))).collect(), c: self.c.saturating_mul(k) }
    }
}

/// A size.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Size {
    Lin(Lin),
    /// `a + b` where one is not affine.
    Add(Box<Size>, Box<Size>),
    /// `k · a` where `a` is not affine.
    Scale(Box<Size>, i64),
    /// `a / k`, rounding down, `k > 0`.
    Div(Box<Size>, i64),
    Min(Box<Size>, Box<Size>),
    Max(Box<Size>, Box<Size>),
}

impl Default for Size {
    /// Zero.
    fn default() -> Size {
        Size::c(0)
    }
}

impl Size {
    pub fn c(c: i64) -> Size {
        Size::Lin(Lin::constant(c))
    }
    pub fn sym(s: &str) -> Size {
        Size::Lin(Lin::symbol(s))
    }
    pub fn as_const(&self) -> Option<i64> {
        match self {
            Size::Lin(l) => l.as_const(),
            _ => None,
        }
    }
    pub fn add(&self, o: &Size) -> Size {
        // A canonical sum: its affine part, plus each other term once with
        // its coefficient, so that `N - N / 2 + N / 2` folds to `N`.
        let (mut terms, mut lin) = self.terms();
        let (more, l) = o.terms();
        lin = lin.add(&l);
        for (t, k) in more {
            match terms.iter_mut().find(|(u, _)| *u == t) {
                Some((_, j)) => *j = j.saturating_add(k),
                None => terms.push((t, k)),
            }
        }
        terms.retain(|(_, k)| *k != 0);
        // Positive terms first, the affine part first where it has symbols
        // (`N + 1 - N / 2`), last where it is a constant (`N / 2 + 1`).
        terms.sort_by_key(|(_, k)| *k < 0);
        let mut sum = (!lin.terms.is_empty()).then(|| Size::Lin(lin.clone()));
        for (t, k) in terms {
            let term = if k == 1 { t } else { Size::Scale(Box::new(t), k) };
            sum = Some(match sum {
                None => term,
                Some(s) => Size::Add(Box::new(s), Box::new(term)),
            });
        }
        match sum {
            None => Size::Lin(lin),
            Some(s) if lin.terms.is_empty() && lin.c != 0 => Size::Add(Box::new(s), Box::new(Size::c(lin.c))),
            Some(s) => s,
        }
    }
    /// The terms of a sum: the non-affine ones with their coefficients, and
    /// the affine part.
    fn terms(&self) -> (Vec<(Size, i64)>, Lin) {
        match self {
            Size::Lin(l) => (Vec::new(), l.clone()),
            Size::Add(a, b) => {
                let (mut t, l) = a.terms();
                let (u, m) = b.terms();
                t.extend(u);
                (t, l.add(&m))
            }
            Size::Scale(a, k) => (vec![((**a).clone(), *k)], Lin::default()),
            a => (vec![(a.clone(), 1)], Lin::default()),
        }
    }
    pub fn add_c(&self, c: i64) -> Size {
        self.add(&Size::c(c))
    }
    pub fn sub(&self, o: &Size) -> Size {
        self.add(&o.scale(-1))
    }
    pub fn scale(&self, k: i64) -> Size {
        match self {
            Size::Lin(a) => Size::Lin(a.scale(k)),
            _ if k == 1 => self.clone(),
            _ if k == 0 => Size::c(0),
            Size::Scale(a, j) => a.scale(k.saturating_mul(*j)),
            Size::Add(a, b) => a.scale(k).add(&b.scale(k)),
            a => Size::Scale(Box::new(a.clone()), k),
        }
    }
    /// `self / k` rounding down (`k > 0`).
    pub fn div_floor(&self, k: i64) -> Size {
        debug_assert!(k > 0);
        if k == 1 {
            return self.clone();
        }
        match self {
            Size::Lin(l) if l.terms.values().all(|v| v % k == 0) => {
                Size::Lin(Lin { terms: l.terms.iter().map(|(s, v)| (s.clone(), v / k)).collect(), c: l.c.div_euclid(k) })
            }
            a => Size::Div(Box::new(a.clone()), k),
        }
    }
    /// `self / k` rounding up (`k > 0`).
    pub fn div_ceil(&self, k: i64) -> Size {
        self.scale(-1).div_floor(k).scale(-1)
    }
    /// The constant `self - o`, when there is one.
    fn diff(&self, o: &Size) -> Option<i64> {
        self.sub(o).as_const()
    }
    pub fn smin(&self, o: &Size) -> Size {
        if self == o {
            return self.clone();
        }
        match self.diff(o) {
            Some(d) if d <= 0 => self.clone(),
            Some(_) => o.clone(),
            None => Size::Min(Box::new(self.clone()), Box::new(o.clone())),
        }
    }
    pub fn smax(&self, o: &Size) -> Size {
        if self == o {
            return self.clone();
        }
        match self.diff(o) {
            Some(d) if d >= 0 => self.clone(),
            Some(_) => o.clone(),
            None => Size::Max(Box::new(self.clone()), Box::new(o.clone())),
        }
    }

    /// Whether every number in it is within [`MAX_COEFFICIENT`].
    pub fn small(&self) -> bool {
        match self {
            Size::Lin(l) => l.small(),
            Size::Add(a, b) | Size::Min(a, b) | Size::Max(a, b) => a.small() && b.small(),
            Size::Scale(a, k) | Size::Div(a, k) => k.abs() <= MAX_COEFFICIENT && a.small(),
        }
    }

    /// Its value with `sym` giving each symbol's.
    pub fn eval(&self, sym: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        match self {
            Size::Lin(l) => {
                let mut v = l.c;
                for (s, k) in &l.terms {
                    v = v.checked_add(sym(s)?.checked_mul(*k)?)?;
                }
                Some(v)
            }
            Size::Add(a, b) => a.eval(sym)?.checked_add(b.eval(sym)?),
            Size::Scale(a, k) => a.eval(sym)?.checked_mul(*k),
            Size::Div(a, k) => Some(a.eval(sym)?.div_euclid(*k)),
            Size::Min(a, b) => Some(a.eval(sym)?.min(b.eval(sym)?)),
            Size::Max(a, b) => Some(a.eval(sym)?.max(b.eval(sym)?)),
        }
    }

    /// As text: the signature's dim-expression language (`/` rounds down)
    /// with `sym` naming each symbol.
    pub fn text(&self, sym: &dyn Fn(&str) -> String) -> String {
        self.render(sym, false).0
    }

    /// As C++ (`int64_t` arithmetic), with `sym` naming each symbol's variable.
    pub fn cpp(&self, sym: &dyn Fn(&str) -> String) -> String {
        self.render(sym, true).0
    }

    /// The text and its precedence: 3 an atom, 2 a product, 1 a sum.
    fn render(&self, sym: &dyn Fn(&str) -> String, cpp: bool) -> (String, u8) {
        let paren = |(s, p): (String, u8), min: u8| if p < min { format!("({s})") } else { s };
        match self {
            Size::Lin(l) => {
                let mut s = String::new();
                let mut prec = 3;
                // Positive terms first: `W - KW + 1`, not `0 - KW + W + 1`.
                let mut terms: Vec<(&String, &i64)> = l.terms.iter().collect();
                terms.sort_by_key(|(_, k)| **k < 0);
                for (name, k) in terms {
                    let (neg, k) = (*k < 0, k.abs());
                    let term = if k == 1 { sym(name) } else { format!("{k} * {}", sym(name)) };
                    if k != 1 {
                        prec = prec.min(2);
                    }
                    if s.is_empty() {
                        s = if neg { format!("0 - {term}") } else { term };
                        if neg {
                            prec = 1;
                        }
                    } else {
                        let _ = write!(s, " {} {term}", if neg { "-" } else { "+" });
                        prec = 1;
                    }
                }
                if s.is_empty() {
                    return if l.c < 0 { (format!("0 - {}", -l.c), 1) } else { (l.c.to_string(), 3) };
                }
                if l.c != 0 {
                    let _ = write!(s, " {} {}", if l.c < 0 { "-" } else { "+" }, l.c.abs());
                    prec = 1;
                }
                (s, prec)
            }
            Size::Add(a, b) => {
                let a = paren(a.render(sym, cpp), 1);
                // `a - 2 * x`, `a - x`, `a - 3`: a negative term is subtracted.
                let (b, neg) = match &**b {
                    Size::Scale(x, k) if *k < 0 => (x.scale(-k), true),
                    Size::Lin(l) if l.terms.is_empty() && l.c < 0 => (Size::c(-l.c), true),
                    b => (b.clone(), false),
                };
                (format!("{a} {} {}", if neg { "-" } else { "+" }, paren(b.render(sym, cpp), 2)), 1)
            }
            Size::Scale(a, k) if *k < 0 => (format!("0 - {}", paren(a.scale(-k).render(sym, cpp), 2)), 1),
            Size::Scale(a, k) => (format!("{k} * {}", paren(a.render(sym, cpp), 3)), 2),
            Size::Div(a, k) if cpp => (format!("dlbridge_tc_fdiv({}, {k})", a.render(sym, cpp).0), 3),
            Size::Div(a, k) => (format!("{} / {k}", paren(a.render(sym, cpp), 3)), 2),
            Size::Min(a, b) | Size::Max(a, b) => {
                let f = if matches!(self, Size::Min(..)) { "min" } else { "max" };
                let (a, b) = (a.render(sym, cpp).0, b.render(sym, cpp).0);
                if cpp { (format!("dlbridge_tc_{f}({a}, {b})"), 3) } else { (format!("{f}({a}, {b})"), 3) }
            }
        }
    }

    /// As a signature dim: a symbol or number as it is, anything else in
    /// parentheses (or a `min(...)`/`max(...)`).
    pub fn dim_text(&self, sym: &dyn Fn(&str) -> String) -> String {
        match self.render(sym, false) {
            (s, 3) if !s.starts_with('-') => s,
            (s, _) => format!("({s})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &Size) -> String {
        s.text(&|n| n.to_owned())
    }

    #[test]
    fn affine_sizes_fold_and_compare() {
        let h = Size::sym("H");
        let kh = Size::sym("KH");
        let hi = h.sub(&kh).add_c(1);
        assert_eq!(t(&hi), "H - KH + 1");
        assert_eq!(hi.dim_text(&|n| n.to_owned()), "(H - KH + 1)");
        assert_eq!(h.dim_text(&|n| n.to_owned()), "H");
        assert_eq!(hi.smin(&h.sub(&kh).add_c(3)), hi);
        assert_eq!(hi.smax(&h.sub(&kh).add_c(3)), h.sub(&kh).add_c(3));
        assert_eq!(t(&h.scale(4).div_floor(2)), "2 * H");
        assert_eq!(t(&h.add_c(-2).div_floor(2).add_c(1)), "(H - 2) / 2 + 1");
        assert_eq!(h.add_c(-2).div_floor(2).add_c(1).eval(&|_| Some(7)), Some(3));
        assert_eq!(Size::c(-3).div_ceil(2).as_const(), Some(-1));
        assert_eq!(Size::c(5).div_ceil(2).as_const(), Some(3));
        assert_eq!(t(&h.smin(&kh)), "min(H, KH)");
        assert_eq!(t(&Size::c(0).sub(&h)), "0 - H");
        assert_eq!(h.add_c(-2).div_floor(2).cpp(&|n| format!("s_{n}")), "dlbridge_tc_fdiv(s_H - 2, 2)");
    }

    #[test]
    fn sums_with_divided_sizes_fold_and_render_as_signature_text() {
        let n = Size::sym("N");
        let half = n.div_floor(2);
        // `N - 1 - (N / 2 - 1) + 1`: a window's count of positions.
        let hi = n.add_c(-1).sub(&half.add_c(-1)).add_c(1);
        assert_eq!(t(&hi), "N + 1 - N / 2");
        assert_eq!(hi.eval(&|_| Some(7)), Some(5));
        assert_eq!(hi.add(&half), n.add_c(1));
        assert_eq!(t(&half.scale(-1)), "0 - N / 2");
        assert_eq!(t(&half.scale(-2).add_c(3)), "0 - 2 * (N / 2) + 3");
        assert_eq!(half.scale(-2).add_c(3).eval(&|_| Some(7)), Some(-3));
        assert_eq!(t(&half.add_c(1)), "N / 2 + 1");
        assert_eq!(t(&half.add_c(-1)), "N / 2 - 1");
        assert_eq!(half.sub(&half), Size::c(0));
        assert_eq!(hi.dim_text(&|n| n.to_owned()), "(N + 1 - N / 2)");
    }
}
