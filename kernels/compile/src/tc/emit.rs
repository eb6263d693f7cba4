//! What both emitters (`cpu.rs`, `cuda.rs`) generate alike from a checked
//! definition: expressions, index arithmetic, each statement's access checks
//! and one element's update.
//!
//! Each statement becomes a loop nest: its output indices outside, split
//! into chunks over dlbridge's threads (CPU) or one GPU thread per output
//! element (CUDA); its reduction indices inside, accumulating into a local
//! (f32 for f16/bf16 tensors) that the compiler vectorises (`omp simd`
//! reduction) over the innermost one. A `!` statement starts from the
//! reduction's identity, the others from the output's value. Tensors are read
//! and written through their strides, so views need no copy. Before a
//! statement runs, every access it makes is checked against the tensor's
//! sizes over the index ranges of this call (a few integer operations): a
//! range that reaches past a tensor is an error, never a read out of bounds.
//!
//! User names are prefixed (`v_` indices, `s_` sizes, `t_` tensors), so no
//! name of the definition can clash with C++ or the runtime.

use super::check::{Affine, Checked, Name, Statement, TensorRef, Ty};
use super::parse::{Bin, Expr, Op, Un};
use crate::codegen::{Src, c_string};
use dlbridge_core::DTypeCode;

/// How a backend spells things.
pub(crate) struct Flavour {
    /// Before helper functions (`inline`, `__device__ __forceinline__`).
    pub(crate) qualifier: &'static str,
    pub(crate) cuda: bool,
}

pub(crate) const CPU: Flavour = Flavour { qualifier: "inline", cuda: false };
pub(crate) const CUDA: Flavour = Flavour { qualifier: "__device__ __forceinline__", cuda: true };

/// Helpers every definition's code uses: floor division and min/max of
/// sizes, identities, the out-of-bounds error, `sigmoid`.
pub(crate) fn helpers(src: &mut Src, f: &Flavour, acc: &str) {
    let q = f.qualifier;
    src.line(&format!("typedef {acc} dlbridge_tc_acc;"));
    src.line(&format!("{q} int64_t dlbridge_tc_fdiv(int64_t a, int64_t b) {{ return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }}"));
    src.line(&format!("{q} int64_t dlbridge_tc_min(int64_t a, int64_t b) {{ return a < b ? a : b; }}"));
    src.line(&format!("{q} int64_t dlbridge_tc_max(int64_t a, int64_t b) {{ return a > b ? a : b; }}"));
    if f.cuda {
        // NVRTC has no <limits>.
        src.line("#ifndef INT64_C");
        src.line("#define INT64_C(c) c##LL");
        src.line("#endif");
        src.line("#define DLBRIDGE_TC_SIMD(op, acc)");
        src.line("template <typename A> __device__ __forceinline__ A dlbridge_tc_lowest();");
        src.line("template <typename A> __device__ __forceinline__ A dlbridge_tc_highest();");
        for (ty, lo, hi) in [
            ("float", "-CUDART_INF_F", "CUDART_INF_F"),
            ("double", "-CUDART_INF", "CUDART_INF"),
            ("bool", "false", "true"),
            ("int8_t", "-128", "127"),
            ("int16_t", "-32768", "32767"),
            ("int32_t", "(-2147483647 - 1)", "2147483647"),
            ("int64_t", "(-9223372036854775807LL - 1)", "9223372036854775807LL"),
            ("uint8_t", "0", "255"),
            ("uint16_t", "0", "65535"),
            ("uint32_t", "0u", "4294967295u"),
            ("uint64_t", "0ull", "18446744073709551615ull"),
        ] {
            src.line(&format!("template <> __device__ __forceinline__ {ty} dlbridge_tc_lowest<{ty}>() {{ return {lo}; }}"));
            src.line(&format!("template <> __device__ __forceinline__ {ty} dlbridge_tc_highest<{ty}>() {{ return {hi}; }}"));
        }
        // A gradient's scatter adds from many threads: atomically (f32 and f64
        // natively; a 16-bit type by compare-and-swap of its 32-bit word).
        src.line("__device__ __forceinline__ void dlbridge_tc_atomic_add(float* p, float v) { atomicAdd(p, v); }");
        src.line("__device__ __forceinline__ void dlbridge_tc_atomic_add(double* p, double v) { atomicAdd(p, v); }");
        src.line("template <typename H>");
        src.line("__device__ __forceinline__ void dlbridge_tc_atomic_add(H* p, float v) {");
        src.line("  static_assert(sizeof(H) == 2, \"atomic adds of 2-, 4- and 8-byte floats only\");");
        src.line("  unsigned int* const word = reinterpret_cast<unsigned int*>(reinterpret_cast<size_t>(p) & ~static_cast<size_t>(3));");
        src.line("  const unsigned int shift = (reinterpret_cast<size_t>(p) & 2) ? 16u : 0u;");
        src.line("  unsigned int old = *word, assumed;");
        src.line("  do {");
        src.line("    assumed = old;");
        src.line("    const unsigned short bits = static_cast<unsigned short>(assumed >> shift);");
        src.line("    H h;");
        src.line("    memcpy(&h, &bits, 2);");
        src.line("    const H sum = static_cast<H>(static_cast<float>(h) + v);");
        src.line("    unsigned short out;");
        src.line("    memcpy(&out, &sum, 2);");
        src.line("    const unsigned int next = (assumed & ~(0xffffu << shift)) | (static_cast<unsigned int>(out) << shift);");
        src.line("    old = atomicCAS(word, assumed, next);");
        src.line("  } while (old != assumed);");
        src.line("}");
    } else {
        src.line("template <typename A>");
        src.line(&format!("{q} A dlbridge_tc_lowest() {{ return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::lowest(); }}"));
        src.line("template <typename A>");
        src.line(&format!("{q} A dlbridge_tc_highest() {{ return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max(); }}"));
    }
    src.line("template <typename A>");
    src.line(&format!("{q} A dlbridge_tc_sigmoid(A x) {{ return A(1) / (A(1) + exp(-x)); }}"));
    // `/` and `%` in the operands' common type. An integer MIN / -1 wraps to
    // MIN (and MIN % -1 is 0), as NumPy gives them, instead of
    // trapping. A zero divisor is an error on the CPU (the division guard);
    // on CUDA, where a kernel cannot stop, x / 0 and x % 0 are 0, as NumPy
    // gives them. `%` of floats is C's fmod.
    let zero = if f.cuda { " if (b == R(0)) return R(0);" } else { "" };
    src.line("template <typename R>");
    src.line(&format!(
        "{q} R dlbridge_tc_div_of(R a, R b) {{ if (R(-1) < R(0) && b == R(-1)) return static_cast<R>(0ull - static_cast<unsigned long long>(a));{zero} return a / b; }}"
    ));
    src.line("template <typename R>");
    src.line(&format!("{q} R dlbridge_tc_rem_of(R a, R b) {{ if (R(-1) < R(0) && b == R(-1)) return R(0);{zero} return a % b; }}"));
    for ty in ["float", "double"] {
        let fmod = if ty == "float" { "fmodf" } else { "fmod" };
        src.line(&format!("{q} {ty} dlbridge_tc_div_of({ty} a, {ty} b) {{ return a / b; }}"));
        src.line(&format!("{q} {ty} dlbridge_tc_rem_of({ty} a, {ty} b) {{ return {fmod}(a, b); }}"));
    }
    for op in ["div", "rem"] {
        src.line("template <typename A, typename B>");
        src.line(&format!(
            "{q} auto dlbridge_tc_{op}(A a, B b) -> decltype(a / b) {{ typedef decltype(a / b) R; return dlbridge_tc_{op}_of(static_cast<R>(a), static_cast<R>(b)); }}"
        ));
    }
}

/// Everything a statement's code refers to, by name.
pub(crate) struct Names<'c> {
    pub(crate) c: &'c Checked,
}

impl Names<'_> {
    pub(crate) fn tensor(&self, t: TensorRef) -> String {
        format!("t_{}", self.c.tensor_name(t))
    }
    pub(crate) fn stride(&self, t: TensorRef, d: usize) -> String {
        format!("st{d}_{}", self.c.tensor_name(t))
    }
    pub(crate) fn shape(&self, t: TensorRef, d: usize) -> String {
        format!("sh{d}_{}", self.c.tensor_name(t))
    }
    fn classify(&self, n: &str) -> Name {
        if let Some(i) = self.c.params.iter().position(|p| p.name == n) {
            return Name::Tensor(TensorRef::Param(i));
        }
        if let Some(i) = self.c.outputs.iter().position(|o| o.name == n) {
            return Name::Tensor(TensorRef::Output(i));
        }
        if self.c.symbols.iter().any(|(s, ..)| s == n) { Name::Size } else { Name::Index }
    }

    /// The element offset of an access.
    pub(crate) fn offset(&self, t: TensorRef, index: &[Affine]) -> String {
        if index.is_empty() {
            return "0".to_owned();
        }
        let parts: Vec<String> = index.iter().enumerate().map(|(d, a)| format!("({}) * {}", affine_cpp(a), self.stride(t, d))).collect();
        parts.join(" + ")
    }

    /// A read of tensor `t` at `index`, in the compute type when floating.
    fn load(&self, t: TensorRef, index: &[Affine]) -> String {
        let at = format!("{}[{}]", self.tensor(t), self.offset(t, index));
        if self.c.is_float(t) { format!("static_cast<dlbridge_tc_acc>({at})") } else { at }
    }

    /// The type of expression `e` (see the checker's).
    fn ty(&self, e: &Expr) -> Ty {
        let tensor_ty = |t: TensorRef| match t {
            TensorRef::Param(i) => self.c.params[i].ty.into(),
            TensorRef::Output(i) => self.c.outputs[i].ty.into(),
        };
        super::check::expr_type(e, &tensor_ty, &|n| self.classify(n))
    }

    /// The C++ type integer arithmetic `e` computes in; None where it is floating.
    fn int_ctype(&self, e: &Expr) -> Option<&'static str> {
        match self.ty(e) {
            Ty::Fixed(d) | Ty::Weak(d) => crate::params::cpu_ctype(d).ok(),
            Ty::Float => None,
        }
    }

    /// `parts` (the C++ of `e`'s operands) joined by `join`, in `e`'s own
    /// type where it is integer: C computes narrow integers as `int`, with
    /// 64-bit literals, and signed with unsigned as unsigned; torch and
    /// NumPy in the operands' common type, wrapping there (`int8 (127 +
    /// 127) / 2` is -1). Floating arithmetic is left as it is.
    fn in_own_type(&self, e: &Expr, parts: &[String], join: &dyn Fn(&[String]) -> String) -> String {
        match self.int_ctype(e) {
            Some(ct) => {
                let cast: Vec<String> = parts.iter().map(|p| format!("static_cast<{ct}>({p})")).collect();
                format!("static_cast<{ct}>({})", join(&cast))
            }
            None => join(parts),
        }
    }

    /// A comparison of `a` and `b`, exact for integers of any signedness (C
    /// compares a signed with an unsigned of 32 or 64 bits as unsigned:
    /// `-1 < 1u` is false).
    fn compare(&self, op: Bin, a: &Expr, b: &Expr) -> String {
        let (x, y) = (self.expr(a), self.expr(b));
        let plain = format!("({x} {} {y})", op_text(op));
        let int = |t: Ty| match t {
            Ty::Fixed(d) | Ty::Weak(d) if d.code() == DTypeCode::Int => Some((true, d.bits())),
            Ty::Fixed(d) | Ty::Weak(d) => Some((false, d.bits())),
            Ty::Float => None,
        };
        let (Some((sa, ba)), Some((sb, bb))) = (int(self.ty(a)), int(self.ty(b))) else { return plain };
        // Inexact in C only where the unsigned one is at least as wide as
        // `int` and as the signed one.
        let (signed_left, unsigned_bits, signed_bits) = match (sa, sb) {
            (true, false) => (true, bb, ba),
            (false, true) => (false, ba, bb),
            _ => return plain,
        };
        if unsigned_bits < 32 || signed_bits > unsigned_bits {
            return plain;
        }
        // A negative signed operand is below every unsigned value.
        let negative_true = if signed_left { matches!(op, Bin::Lt | Bin::Le | Bin::Ne) } else { matches!(op, Bin::Gt | Bin::Ge | Bin::Ne) };
        let s = if signed_left { &x } else { &y };
        format!("(({s}) < 0 ? {negative_true} : (static_cast<uint64_t>({x}) {} static_cast<uint64_t>({y})))", op_text(op))
    }

    /// The expression as C++.
    pub(crate) fn expr(&self, e: &Expr) -> String {
        match e {
            Expr::Num { value, int: true } => format!("INT64_C({})", *value as i64),
            Expr::Num { value, .. } => format!("static_cast<dlbridge_tc_acc>({value:?})"),
            Expr::Name(n, _) => match self.classify(n) {
                Name::Index => format!("v_{n}"),
                Name::Size => format!("s_{n}"),
                Name::Tensor(t) => self.load(t, &[]),
            },
            Expr::Call(f, args, _) => match self.classify(f) {
                Name::Tensor(t) => {
                    let index: Vec<Affine> = args.iter().map(|a| to_affine(self, a)).collect();
                    self.load(t, &index)
                }
                // `max`/`min` keep their operands' type; every other builtin
                // computes in the compute type (the checker types it so),
                // integer operands too (`sigmoid(0)` is 0.5).
                _ if f == "max" || f == "min" => {
                    let a: Vec<String> = args.iter().map(|a| self.expr(a)).collect();
                    self.in_own_type(e, &a, &|p| format!("{f}({})", p.join(", ")))
                }
                _ => {
                    let a: Vec<String> = args.iter().map(|a| format!("static_cast<dlbridge_tc_acc>({})", self.expr(a))).collect();
                    let f = if f == "sigmoid" { "dlbridge_tc_sigmoid" } else { f.as_str() };
                    format!("{f}({})", a.join(", "))
                }
            },
            Expr::Unary(Un::Neg, a) => self.in_own_type(e, &[self.expr(a)], &|p| format!("(-{})", p[0])),
            Expr::Unary(Un::Not, a) => format!("(!{})", self.expr(a)),
            Expr::Binary(Bin::Div, a, b) => {
                self.in_own_type(e, &[self.expr(a), self.expr(b)], &|p| format!("dlbridge_tc_div({}, {})", p[0], p[1]))
            }
            Expr::Binary(Bin::Rem, a, b) => {
                self.in_own_type(e, &[self.expr(a), self.expr(b)], &|p| format!("dlbridge_tc_rem({}, {})", p[0], p[1]))
            }
            Expr::Binary(op @ (Bin::Lt | Bin::Le | Bin::Gt | Bin::Ge | Bin::Eq | Bin::Ne), a, b) => self.compare(*op, a, b),
            Expr::Binary(op, a, b) if op.is_comparison() => format!("({} {} {})", self.expr(a), op_text(*op), self.expr(b)),
            Expr::Binary(op, a, b) => {
                self.in_own_type(e, &[self.expr(a), self.expr(b)], &|p| format!("({} {} {})", p[0], op_text(*op), p[1]))
            }
            Expr::Select(c, a, b) => {
                let c = self.expr(c);
                self.in_own_type(e, &[self.expr(a), self.expr(b)], &|p| format!("({c} ? {} : {})", p[0], p[1]))
            }
        }
    }
}

pub(super) fn op_text(op: Bin) -> &'static str {
    op.text()
}

/// An index expression the checker accepted, again as an [`Affine`].
pub(super) fn to_affine(n: &Names<'_>, e: &Expr) -> Affine {
    super::check::affine_of(e, &|x| n.classify(x)).unwrap_or(Affine { vars: Default::default(), konst: Default::default() })
}

/// An affine index as C++.
pub(crate) fn affine_cpp(a: &Affine) -> String {
    let mut parts: Vec<String> = a.vars.iter().map(|(v, k)| if *k == 1 { format!("v_{v}") } else { format!("{k} * v_{v}") }).collect();
    let k = a.konst.cpp(&|s| format!("s_{s}"));
    if k != "0" || parts.is_empty() {
        parts.push(k);
    }
    parts.join(" + ")
}

/// The smallest and largest value of `a` over the ranges `lo_<v>`/`hi_<v>`.
pub(super) fn affine_bounds(a: &Affine) -> (String, String) {
    let k = a.konst.cpp(&|s| format!("s_{s}"));
    let (mut mn, mut mx) = (vec![k.clone()], vec![k]);
    for (v, c) in &a.vars {
        let (lo, last) = (format!("lo_{v}"), format!("(hi_{v} - 1)"));
        let (small, large) = if *c > 0 { (lo, last) } else { (last, lo) };
        mn.push(format!("{c} * {small}"));
        mx.push(format!("{c} * {large}"));
    }
    (mn.join(" + "), mx.join(" + "))
}

/// The reduction's C++: its identity and how a value joins the accumulator.
pub(super) fn reduction(op: Op, acc_ty: &str) -> (String, &'static str) {
    match op {
        Op::Add | Op::Assign => (format!("{acc_ty}(0)"), "+"),
        Op::Mul => (format!("{acc_ty}(1)"), "*"),
        Op::Max => (format!("dlbridge_tc_lowest<{acc_ty}>()"), "max"),
        Op::Min => (format!("dlbridge_tc_highest<{acc_ty}>()"), "min"),
    }
}

pub(super) fn combine(op: Op, acc: &str, value: &str) -> String {
    match op {
        Op::Add | Op::Assign => format!("{acc} + {value}"),
        Op::Mul => format!("{acc} * {value}"),
        Op::Max => format!("max({acc}, {value})"),
        Op::Min => format!("min({acc}, {value})"),
    }
}

/// The type a statement accumulates in.
pub(super) fn acc_type(n: &Names<'_>, s: &Statement, ctypes: &[String]) -> String {
    let out = TensorRef::Output(s.out);
    if n.c.is_float(out) { "dlbridge_tc_acc".to_owned() } else { ctypes[n.c.params.len() + s.out].clone() }
}

/// The ranges of a statement's indices (`lo_v`, `hi_v`) and the checks of
/// its accesses, as C++ lines, inside the statement's block; `live_out`
/// says whether every output index range is non-empty, `live_all` whether
/// every range is.
pub(super) fn statement_prologue(src: &mut Src, n: &Names<'_>, s: &Statement) {
    range_lines(src, s, "    ");
    statement_checks(src, n, s);
}

/// `live_out`, `live_all` and the access checks of a statement whose ranges
/// are declared.
pub(super) fn statement_checks(src: &mut Src, n: &Names<'_>, s: &Statement) {
    let live = |vars: &mut dyn Iterator<Item = &String>| {
        let parts: Vec<String> = vars.map(|v| format!("hi_{v} > lo_{v}")).collect();
        if parts.is_empty() { "true".to_owned() } else { parts.join(" && ") }
    };
    src.line(&format!("    const bool live_out = {};", live(&mut s.lhs.iter())));
    src.line(&format!("    const bool live_all = live_out && {};", live(&mut s.reduced.iter())));
    let stmt_lit = c_string(&s.text);
    for (ai, a) in s.accesses.iter().enumerate() {
        let is_lhs = ai + 1 == s.accesses.len() && s.scatter.is_none();
        let live = if is_lhs { "live_out" } else { "live_all" };
        for (d, ix) in a.index.iter().enumerate() {
            let (mn, mx) = affine_bounds(ix);
            src.line(&format!(
                "    if ({live}) dlbridge_tc_check(kKernel, {stmt_lit}, {}, {d}, {mn}, {mx}, {});",
                c_string(&a.text),
                n.shape(a.tensor, d)
            ));
        }
    }
}

/// `lo_v` and `hi_v` of every index of a statement.
pub(super) fn range_lines(src: &mut Src, s: &Statement, indent: &str) {
    for v in s.lhs.iter().chain(&s.reduced) {
        let (lo, hi) = &s.ranges[v];
        let sym = |x: &str| format!("s_{x}");
        src.line(&format!("{indent}const int64_t lo_{v} = {}, hi_{v} = {};", lo.cpp(&sym), hi.cpp(&sym)));
        src.line(&format!("{indent}(void)lo_{v}; (void)hi_{v};"));
    }
}

/// `v_x` of every index `x` of `indices` (the last the fastest), each in its
/// range `lo_x..hi_x`, decoded from the flat index `q` of type `int_ty`.
pub(super) fn unflatten(src: &mut Src, indices: &[String], int_ty: &str, indent: &str) {
    src.line(&format!("{indent}{int_ty} r = q;"));
    for v in indices.iter().rev() {
        src.line(&format!("{indent}const int64_t v_{v} = lo_{v} + r % (hi_{v} - lo_{v});"));
        src.line(&format!("{indent}r /= (hi_{v} - lo_{v});"));
    }
    src.line(&format!("{indent}(void)r;"));
}

/// The body of one output element: the accumulation over the reduction
/// indices (innermost last) and the store.
/// With `parallel_scatter`, a gradient's scatter is one iteration, whose
/// indices the caller set, added atomically (CUDA); else its own loops.
pub(super) fn element(src: &mut Src, n: &Names<'_>, s: &Statement, ctypes: &[String], indent: &str, parallel_scatter: bool) {
    let out = TensorRef::Output(s.out);
    let out_ct = &ctypes[n.c.params.len() + s.out];
    let lhs_index: Vec<Affine> =
        s.lhs.iter().map(|v| Affine { vars: std::collections::BTreeMap::from([(v.clone(), 1)]), konst: Default::default() }).collect();
    let value = n.expr(&s.rhs);
    if let Some(index) = &s.scatter {
        // A gradient's scatter: every iteration adds to the element it names.
        let place = format!("{}[{}]", n.tensor(out), n.offset(out, index));
        let acc_ty = acc_type(n, s, ctypes);
        if parallel_scatter {
            // A thread per iteration (its indices set by the caller): an atomic add.
            src.line(&format!("{indent}dlbridge_tc_atomic_add(&{place}, static_cast<{acc_ty}>({value}));"));
            return;
        }
        let mut ind = indent.to_owned();
        for v in &s.reduced {
            src.line(&format!("{ind}for (int64_t v_{v} = lo_{v}; v_{v} < hi_{v}; ++v_{v}) {{"));
            ind.push_str("  ");
        }
        src.line(&format!("{ind}{place} = static_cast<{out_ct}>(static_cast<{acc_ty}>({place}) + static_cast<{acc_ty}>({value}));"));
        for _ in &s.reduced {
            ind.truncate(ind.len() - 2);
            src.line(&format!("{ind}}}"));
        }
        return;
    }
    let place = format!("{}[{}]", n.tensor(out), n.offset(out, &lhs_index));
    if s.op == Op::Assign {
        src.line(&format!("{indent}{place} = static_cast<{out_ct}>({value});"));
        return;
    }
    let acc_ty = acc_type(n, s, ctypes);
    let (identity, red) = reduction(s.op, &acc_ty);
    let start = if s.init { identity } else { format!("static_cast<{acc_ty}>({place})") };
    src.line(&format!("{indent}{acc_ty} acc = {start};"));
    let mut ind = indent.to_owned();
    for (i, v) in s.reduced.iter().enumerate() {
        if i + 1 == s.reduced.len() && (red == "+" || red == "*" || red == "max" || red == "min") {
            src.line(&format!("{ind}DLBRIDGE_TC_SIMD({red}, acc)"));
        }
        src.line(&format!("{ind}for (int64_t v_{v} = lo_{v}; v_{v} < hi_{v}; ++v_{v}) {{"));
        ind.push_str("  ");
    }
    src.line(&format!("{ind}acc = {};", combine(s.op, "acc", &format!("static_cast<{acc_ty}>({value})"))));
    for _ in &s.reduced {
        ind.truncate(ind.len() - 2);
        src.line(&format!("{ind}}}"));
    }
    src.line(&format!("{indent}{place} = static_cast<{out_ct}>(acc);"));
}

/// Reads every tensor's data pointer, shape and strides (elements; row-major
/// when the tensor has none) and every size symbol, at the top of the entry.
pub(crate) fn tensor_locals(src: &mut Src, n: &Names<'_>, ctypes: &[String], indent: &str) {
    let c = n.c;
    let n_params = c.params.len();
    for (t, ct) in ctypes.iter().enumerate() {
        let r = if t < n_params { TensorRef::Param(t) } else { TensorRef::Output(t - n_params) };
        let rank = c.rank(r);
        let qual = if t < n_params { "const " } else { "" };
        src.line(&format!("{indent}{qual}{ct}* const {} = static_cast<{qual}{ct}*>(dlbridge::detail::base_of(_t[{t}]));", n.tensor(r)));
        if rank > 0 {
            src.line(&format!("{indent}int64_t st_{}[{rank}];", c.tensor_name(r)));
            src.line(&format!("{indent}dlbridge_tc_strides(_t[{t}], st_{});", c.tensor_name(r)));
        }
        for d in 0..rank {
            src.line(&format!("{indent}const int64_t {} = st_{}[{d}];", n.stride(r, d), c.tensor_name(r)));
            src.line(&format!("{indent}const int64_t {} = _t[{t}]->shape[{d}];", n.shape(r, d)));
            src.line(&format!("{indent}(void){}; (void){};", n.stride(r, d), n.shape(r, d)));
        }
    }
    for (s, p, d) in &c.symbols {
        src.line(&format!("{indent}const int64_t s_{s} = _t[{p}]->shape[{d}];"));
        src.line(&format!("{indent}(void)s_{s};"));
    }
}

/// Per statement: whether its output is zeroed first (its first statement
/// may leave some elements unwritten: an index range that may not start at
/// 0, or may end before the output's size, as a `where` clause on an output
/// of declared sizes does).
pub(super) fn zero_before(c: &Checked) -> Vec<bool> {
    let mut written = vec![false; c.outputs.len()];
    c.stmts
        .iter()
        .map(|s| {
            let dims = &c.outputs[s.out].dims;
            let z = !written[s.out] && s.lhs.iter().zip(dims).any(|(v, dim)| s.ranges[v].0.as_const() != Some(0) || &s.ranges[v].1 != dim);
            written[s.out] = true;
            z
        })
        .collect()
}

/// A statement's text as one line of a C++ `//` comment: on one line, and no
/// backslash (one at the end would continue the comment into the next line
/// of generated code).
pub(super) fn comment_text(text: &str) -> String {
    text.chars().map(|c| if c == '\n' || c == '\r' || c == '\\' { ' ' } else { c }).collect::<String>().trim_end().to_owned()
}
