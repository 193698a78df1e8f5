//! Runner for `rl-algorithms-testvectors` files: reference inputs and outputs of verl's RL
//! numerics (see `shared/testvectors/README.md` for the format).
//!
//! The runner is library code so the CLI can offer it as a self-check. It loads any file in
//! the format, dispatches each case on its `function`, reads params defensively with verl's
//! defaults, and compares every expected output with the file's own tolerance. A case never
//! aborts the run: unknown functions, undecodable inputs and wrong answers are failures with
//! a reason.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use thiserror::Error;

use crate::advantage::{
    compute_gae_advantage_return, compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage, compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage, AdvantageOutput, GroupId,
};
use crate::error::AlgoError;
use crate::kl::{
    apply_kl_penalty, kl_penalty, KlController, KlControllerConfig, KlControllerKind, KlPenalty,
};
use crate::loss::{
    agg_loss, compute_policy_loss, compute_value_loss, entropy_from_logits, logprobs_from_logits,
    AggOptions, LossAggMode, PolicyLossConfig, ValueLossConfig,
};
use crate::mat::{Labels, Logits, Mat};
use crate::stats::{masked_mean, masked_sum, masked_value, masked_var, masked_whiten, COUNT_EPS};

/// The `format` string a test-vector file must declare.
pub const VECTOR_FORMAT: &str = "rl-algorithms-testvectors";

/// Why a whole file could not be run (individual cases never produce these).
#[derive(Debug, Error)]
pub enum VectorError {
    /// The file could not be read.
    #[error("cannot read test-vector file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid JSON.
    #[error("test-vector file is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The JSON is not a test-vector file.
    #[error("not an `{VECTOR_FORMAT}` file: {0}")]
    Format(String),
}

/// Comparison rule `|actual - expected| <= atol + rtol * |expected|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
}

impl Default for Tolerance {
    /// The tolerance of the published file, used when a file gives none.
    fn default() -> Self {
        Self {
            rtol: 1e-6,
            atol: 1e-8,
        }
    }
}

impl Tolerance {
    /// Whether `actual` matches `expected`: NaN matches only NaN, an infinity only the same
    /// infinity, finite values within `atol + rtol * |expected|`.
    pub fn matches(&self, actual: f64, expected: f64) -> bool {
        if expected.is_nan() || actual.is_nan() {
            return expected.is_nan() && actual.is_nan();
        }
        if expected.is_infinite() || actual.is_infinite() {
            return actual == expected;
        }
        (actual - expected).abs() <= self.atol + self.rtol * expected.abs()
    }
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseReport {
    /// The case id (e.g. `grpo-03`).
    pub id: String,
    /// The function the case exercises.
    pub function: String,
    /// Whether the case passed.
    pub passed: bool,
    /// Why it failed, or a short note on what passed (e.g. the error raised as expected).
    pub detail: String,
}

/// The outcome of a whole file.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorReport {
    /// The file's `version` field, if any.
    pub version: Option<i64>,
    /// The file's `split` field (`public`, ...), if any.
    pub split: Option<String>,
    /// The tolerance the cases were compared with.
    pub tolerance: Tolerance,
    /// Number of cases that passed.
    pub passed: usize,
    /// Number of cases that failed.
    pub failed: usize,
    /// Every case, in file order.
    pub cases: Vec<CaseReport>,
}

impl VectorReport {
    /// True when every case passed (and there was at least one).
    pub fn all_passed(&self) -> bool {
        self.failed == 0 && self.passed > 0
    }

    /// The failed cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases.iter().filter(|c| !c.passed)
    }
}

impl fmt::Display for VectorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} passed, {} failed ({} cases; rtol {}, atol {})",
            self.passed,
            self.failed,
            self.cases.len(),
            self.tolerance.rtol,
            self.tolerance.atol
        )?;
        for c in self.failures() {
            writeln!(f, "FAIL {} ({}): {}", c.id, c.function, c.detail)?;
        }
        Ok(())
    }
}

/// Loads and runs every case of a test-vector file.
pub fn run_vector_file(path: &Path) -> Result<VectorReport, VectorError> {
    let text = std::fs::read_to_string(path).map_err(|source| VectorError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    run_vector_str(&text)
}

/// Runs every case of a test-vector document given as JSON text.
pub fn run_vector_str(text: &str) -> Result<VectorReport, VectorError> {
    let doc: Value = serde_json::from_str(text)?;
    run_vectors(&doc)
}

/// Runs every case of a parsed test-vector document.
pub fn run_vectors(doc: &Value) -> Result<VectorReport, VectorError> {
    let obj = doc
        .as_object()
        .ok_or_else(|| VectorError::Format("the top level is not a JSON object".into()))?;
    match obj.get("format").and_then(Value::as_str) {
        Some(VECTOR_FORMAT) => {}
        Some(other) => {
            return Err(VectorError::Format(format!(
                "`format` is `{other}`, expected `{VECTOR_FORMAT}`"
            )))
        }
        None => return Err(VectorError::Format("missing `format` field".into())),
    }
    let tolerance = match obj.get("tolerance") {
        None | Some(Value::Null) => Tolerance::default(),
        Some(t) => {
            let get = |k: &str, d: f64| match t.get(k) {
                None | Some(Value::Null) => Ok(d),
                Some(v) => num(v).map_err(|e| VectorError::Format(format!("tolerance.{k}: {e}"))),
            };
            let def = Tolerance::default();
            Tolerance {
                rtol: get("rtol", def.rtol)?,
                atol: get("atol", def.atol)?,
            }
        }
    };
    let cases = obj
        .get("cases")
        .and_then(Value::as_array)
        .ok_or_else(|| VectorError::Format("missing `cases` array".into()))?;
    let reports: Vec<CaseReport> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| run_case(c, i, tolerance))
        .collect();
    let passed = reports.iter().filter(|r| r.passed).count();
    Ok(VectorReport {
        version: obj.get("version").and_then(Value::as_i64),
        split: obj.get("split").and_then(Value::as_str).map(str::to_string),
        tolerance,
        passed,
        failed: reports.len() - passed,
        cases: reports,
    })
}

/// Why running a case did not produce outputs.
enum CaseError {
    /// The `function` is not one we implement.
    UnknownFunction(String),
    /// Inputs or params could not be decoded (verl would raise on them too).
    Decode(String),
    /// The function itself returned an error.
    Algo(AlgoError),
}

impl From<AlgoError> for CaseError {
    fn from(e: AlgoError) -> Self {
        Self::Algo(e)
    }
}

impl fmt::Display for CaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownFunction(name) => write!(f, "unknown function `{name}`"),
            Self::Decode(msg) => write!(f, "bad case data: {msg}"),
            Self::Algo(e) => write!(f, "{e}"),
        }
    }
}

/// Runs one case; never panics on malformed data.
pub fn run_case(case: &Value, position: usize, tol: Tolerance) -> CaseReport {
    let id = case
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("<case #{position}>"));
    let function = case
        .get("function")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let report = |passed: bool, detail: String| CaseReport {
        id: id.clone(),
        function: function.clone(),
        passed,
        detail,
    };
    let expect_error = match case.get("expect_error") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    let empty = Map::new();
    let inputs = case
        .get("inputs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let params = case
        .get("params")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let result = dispatch(&function, &Args { inputs, params });

    match (expect_error, result) {
        (_, Err(e @ CaseError::UnknownFunction(_))) => report(false, e.to_string()),
        (Some(kind), Err(e)) => report(true, format!("raised as expected ({kind}): {e}")),
        (Some(kind), Ok(_)) => report(
            false,
            format!("expected an error ({kind}) but the function returned normally"),
        ),
        (None, Err(e)) => report(false, format!("unexpected error: {e}")),
        (None, Ok(outputs)) => {
            let expected = case.get("expected").and_then(Value::as_object);
            let expected = match expected {
                Some(e) => e,
                None => return report(false, "case has no `expected` object".into()),
            };
            let mut problems = Vec::new();
            for (name, want) in expected {
                match outputs.iter().find(|(n, _)| n == name) {
                    None => problems.push(format!("output `{name}` is not produced")),
                    Some((_, got)) => {
                        if let Err(msg) = compare(want, got, tol) {
                            problems.push(format!("`{name}`: {msg}"));
                        }
                    }
                }
            }
            if problems.is_empty() {
                report(true, format!("{} output(s) match", expected.len()))
            } else {
                report(false, problems.join("; "))
            }
        }
    }
}

/// An n-dimensional f64 array decoded from nested JSON lists (shape `[]` for a scalar).
#[derive(Debug, Clone, PartialEq)]
struct Nd {
    shape: Vec<usize>,
    data: Vec<f64>,
}

impl Nd {
    fn scalar(x: f64) -> Self {
        Self {
            shape: vec![],
            data: vec![x],
        }
    }

    fn with_shape(shape: &[usize], data: Vec<f64>) -> Self {
        Self {
            shape: shape.to_vec(),
            data,
        }
    }

    /// Views the array as `(rows, T)`: the last axis is the token axis, the others are folded
    /// into rows (a 1-D array is one row, a scalar is 1×1).
    fn to_mat(&self) -> Result<Mat, CaseError> {
        let cols = self.shape.last().copied().unwrap_or(1);
        let rows = self.shape[..self.shape.len().saturating_sub(1)]
            .iter()
            .product::<usize>();
        Mat::new(rows, cols, self.data.clone()).map_err(CaseError::from)
    }

    /// Requires a `(B, T)` array.
    fn to_mat_2d(&self, name: &str) -> Result<Mat, CaseError> {
        if self.shape.len() != 2 {
            return Err(CaseError::Algo(AlgoError::shape(
                "test vector",
                format!("`{name}` must be 2-D (B, T), got shape {:?}", self.shape),
            )));
        }
        self.to_mat()
    }
}

/// Decodes one number: JSON numbers, booleans (masks), and the non-finite string encodings.
fn num(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| format!("unrepresentable number {n}")),
        Value::Bool(b) => Ok(if *b { 1.0 } else { 0.0 }),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "nan" | "+nan" | "-nan" => Ok(f64::NAN),
            "infinity" | "+infinity" | "inf" | "+inf" => Ok(f64::INFINITY),
            "-infinity" | "-inf" => Ok(f64::NEG_INFINITY),
            other => other
                .parse::<f64>()
                .map_err(|_| format!("`{s}` is not a number")),
        },
        other => Err(format!("expected a number, got {other}")),
    }
}

fn decode_nd(v: &Value) -> Result<Nd, String> {
    match v {
        Value::Array(items) => {
            if items.is_empty() {
                return Ok(Nd::with_shape(&[0], vec![]));
            }
            let children: Vec<Nd> = items.iter().map(decode_nd).collect::<Result<_, _>>()?;
            let inner = children[0].shape.clone();
            if let Some(bad) = children.iter().position(|c| c.shape != inner) {
                return Err(format!(
                    "ragged nested list: element {bad} has shape {:?}, element 0 has {:?}",
                    children[bad].shape, inner
                ));
            }
            let mut shape = vec![items.len()];
            shape.extend(inner);
            let data = children.into_iter().flat_map(|c| c.data).collect();
            Ok(Nd { shape, data })
        }
        other => num(other).map(Nd::scalar),
    }
}

/// Compares an expected JSON value with an actual array.
fn compare(expected: &Value, actual: &Nd, tol: Tolerance) -> Result<(), String> {
    let want = decode_nd(expected).map_err(|e| format!("cannot decode expected value: {e}"))?;
    let scalar_like = |s: &[usize]| s.iter().product::<usize>() == 1 && s.len() <= 1;
    let shapes_ok =
        want.shape == actual.shape || (scalar_like(&want.shape) && scalar_like(&actual.shape));
    if !shapes_ok {
        return Err(format!(
            "shape {:?} but expected {:?}",
            actual.shape, want.shape
        ));
    }
    let mut bad = 0;
    let mut first = None;
    for (i, (&a, &e)) in actual.data.iter().zip(&want.data).enumerate() {
        if !tol.matches(a, e) {
            bad += 1;
            first.get_or_insert((i, a, e));
        }
    }
    match first {
        None => Ok(()),
        Some((i, a, e)) => Err(format!(
            "{bad} of {} element(s) differ; first at flat index {i}: got {a:e}, expected {e:e} \
             (|diff| = {:e})",
            want.data.len(),
            (a - e).abs()
        )),
    }
}

/// A case's inputs and params with defensive accessors.
struct Args<'a> {
    inputs: &'a Map<String, Value>,
    params: &'a Map<String, Value>,
}

type Outputs = Vec<(String, Nd)>;

impl Args<'_> {
    fn input_opt(&self, names: &[&str]) -> Result<Option<(String, Nd)>, CaseError> {
        for &n in names {
            match self.inputs.get(n) {
                None | Some(Value::Null) => continue,
                Some(v) => {
                    let nd =
                        decode_nd(v).map_err(|e| CaseError::Decode(format!("input `{n}`: {e}")))?;
                    return Ok(Some((n.to_string(), nd)));
                }
            }
        }
        Ok(None)
    }

    fn input(&self, names: &[&str]) -> Result<Nd, CaseError> {
        self.input_opt(names)?
            .map(|(_, nd)| nd)
            .ok_or_else(|| CaseError::Decode(format!("missing input `{}`", names[0])))
    }

    fn mat(&self, names: &[&str]) -> Result<(Nd, Mat), CaseError> {
        let nd = self.input(names)?;
        let m = nd.to_mat()?;
        Ok((nd, m))
    }

    fn mat2(&self, names: &[&str]) -> Result<Mat, CaseError> {
        self.input(names)?.to_mat_2d(names[0])
    }

    /// A param, looked up at the top level and then inside a nested `config` object (verl
    /// passes actor settings as a config).
    fn param(&self, names: &[&str]) -> Option<&Value> {
        let nested = self.params.get("config").and_then(Value::as_object);
        for &n in names {
            for map in std::iter::once(self.params).chain(nested) {
                match map.get(n) {
                    None | Some(Value::Null) => {}
                    Some(v) => return Some(v),
                }
            }
        }
        None
    }

    fn f64_opt(&self, names: &[&str]) -> Result<Option<f64>, CaseError> {
        self.param(names)
            .map(|v| num(v).map_err(|e| CaseError::Decode(format!("param `{}`: {e}", names[0]))))
            .transpose()
    }

    fn f64_or(&self, names: &[&str], default: f64) -> Result<f64, CaseError> {
        Ok(self.f64_opt(names)?.unwrap_or(default))
    }

    fn bool_or(&self, name: &str, default: bool) -> Result<bool, CaseError> {
        match self.param(&[name]) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
            Some(v) => num(v)
                .map(|x| x != 0.0)
                .map_err(|e| CaseError::Decode(format!("param `{name}`: {e}"))),
        }
    }

    fn str_or<'s>(&'s self, names: &[&str], default: &'s str) -> Result<&'s str, CaseError> {
        match self.param(names) {
            None => Ok(default),
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(CaseError::Decode(format!(
                "param `{}` must be a string, got {v}",
                names[0]
            ))),
        }
    }

    fn loss_agg_mode(&self) -> Result<LossAggMode, CaseError> {
        Ok(self.str_or(&["loss_agg_mode"], "token-mean")?.parse()?)
    }

    /// `agg_loss` normalisation: top-level params, overridden by a `global_batch_info` object.
    fn agg_options(&self) -> Result<AggOptions, CaseError> {
        let info = self
            .params
            .get("global_batch_info")
            .and_then(Value::as_object);
        let get = |name: &str| -> Result<Option<f64>, CaseError> {
            let v = info
                .and_then(|m| m.get(name))
                .filter(|v| !v.is_null())
                .or_else(|| self.param(&[name]));
            v.map(|v| num(v).map_err(|e| CaseError::Decode(format!("param `{name}`: {e}"))))
                .transpose()
        };
        let dp_size = match get("dp_size")? {
            None => 1,
            Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= u32::MAX as f64 => x as usize,
            Some(x) => {
                return Err(CaseError::Decode(format!(
                    "param `dp_size` must be a non-negative integer, got {x}"
                )))
            }
        };
        Ok(AggOptions {
            dp_size,
            batch_num_tokens: get("batch_num_tokens")?,
            global_batch_size: get("global_batch_size")?,
            loss_scale_factor: get("loss_scale_factor")?,
            global_rows: None,
        })
    }

    fn index(&self, rows: usize) -> Result<Vec<GroupId>, CaseError> {
        let v = self
            .inputs
            .get("index")
            .or_else(|| self.inputs.get("uid"))
            .ok_or_else(|| CaseError::Decode("missing input `index`".into()))?;
        let items = v
            .as_array()
            .ok_or_else(|| CaseError::Decode("input `index` must be a list".into()))?;
        let ids = items
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(GroupId::Str(s.clone())),
                Value::Bool(b) => Ok(GroupId::Int(i64::from(*b))),
                Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                    (Some(i), _) => Ok(GroupId::Int(i)),
                    // Python groups 1.0 with 1; other floats get a key no string can collide with.
                    (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                        Ok(GroupId::Int(f as i64))
                    }
                    (None, Some(f)) => Ok(GroupId::Str(format!("\u{0}float:{f}"))),
                    _ => Err(CaseError::Decode(format!("bad group id {n}"))),
                },
                other => Err(CaseError::Decode(format!(
                    "group ids must be strings or integers, got {other}"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if ids.len() != rows {
            return Err(CaseError::Algo(AlgoError::shape(
                "test vector",
                format!(
                    "`index` has {} entries but the batch has {rows} rows",
                    ids.len()
                ),
            )));
        }
        Ok(ids)
    }
}

fn out_mat(name: &str, shape: &[usize], m: Mat) -> (String, Nd) {
    (name.to_string(), Nd::with_shape(shape, m.into_data()))
}

fn out_scalar(name: &str, x: f64) -> (String, Nd) {
    (name.to_string(), Nd::scalar(x))
}

fn adv_outputs(shape: &[usize], o: AdvantageOutput) -> Outputs {
    vec![
        out_mat("advantages", shape, o.advantages),
        out_mat("returns", shape, o.returns),
    ]
}

fn mat_shape(m: &Mat) -> [usize; 2] {
    [m.rows(), m.cols()]
}

const RESPONSE_MASK: &[&str] = &["response_mask", "eos_mask", "mask"];

fn dispatch(function: &str, a: &Args<'_>) -> Result<Outputs, CaseError> {
    match function {
        "masked_mean" | "masked_sum" => {
            let (vn, v) = a.mat(&["values"])?;
            let (mn, m) = a.mat(&["mask"])?;
            let mean = function == "masked_mean";
            let name = if mean { "mean" } else { "sum" };
            match a.param(&["axis", "dim"]) {
                None => {
                    let x = if mean {
                        masked_mean(&v, &m)?
                    } else {
                        masked_sum(&v, &m)?
                    };
                    Ok(vec![out_scalar(name, x)])
                }
                Some(axis) => Ok(vec![(name.to_string(), reduce_axis(&vn, &mn, axis, mean)?)]),
            }
        }
        "masked_var" => {
            let (_, v) = a.mat(&["values"])?;
            let (_, m) = a.mat(&["mask"])?;
            let unbiased = a.bool_or("unbiased", true)?;
            Ok(vec![out_scalar("var", masked_var(&v, &m, unbiased)?)])
        }
        "masked_whiten" => {
            let (nd, v) = a.mat(&["values"])?;
            let (_, m) = a.mat(&["mask"])?;
            let shift = a.bool_or("shift_mean", true)?;
            Ok(vec![out_mat(
                "whitened",
                &nd.shape,
                masked_whiten(&v, &m, shift)?,
            )])
        }
        "compute_gae_advantage_return" => {
            let r = a.mat2(&["token_level_rewards"])?;
            let v = a.mat2(&["values"])?;
            let m = a.mat2(RESPONSE_MASK)?;
            let gamma = a.f64_or(&["gamma"], 1.0)?;
            let lam = a.f64_or(&["lam", "lambda"], 1.0)?;
            let o = compute_gae_advantage_return(&r, &v, &m, gamma, lam)?;
            Ok(adv_outputs(&mat_shape(&r), o))
        }
        "compute_grpo_outcome_advantage" => {
            let r = a.mat2(&["token_level_rewards"])?;
            let m = a.mat2(RESPONSE_MASK)?;
            let idx = a.index(r.rows())?;
            let eps = a.f64_or(&["epsilon"], 1e-6)?;
            let norm = a.bool_or("norm_adv_by_std_in_grpo", true)?;
            let o = compute_grpo_outcome_advantage(&r, &m, &idx, eps, norm)?;
            Ok(adv_outputs(&mat_shape(&r), o))
        }
        "compute_rloo_outcome_advantage" => {
            let r = a.mat2(&["token_level_rewards"])?;
            let m = a.mat2(RESPONSE_MASK)?;
            let idx = a.index(r.rows())?;
            let o = compute_rloo_outcome_advantage(&r, &m, &idx)?;
            Ok(adv_outputs(&mat_shape(&r), o))
        }
        "compute_reinforce_plus_plus_outcome_advantage" => {
            let r = a.mat2(&["token_level_rewards"])?;
            let m = a.mat2(RESPONSE_MASK)?;
            let gamma = a.f64_or(&["gamma"], 1.0)?;
            let o = compute_reinforce_plus_plus_outcome_advantage(&r, &m, gamma)?;
            Ok(adv_outputs(&mat_shape(&r), o))
        }
        "compute_reinforce_plus_plus_baseline_outcome_advantage" => {
            let r = a.mat2(&["token_level_rewards"])?;
            let m = a.mat2(RESPONSE_MASK)?;
            let idx = a.index(r.rows())?;
            let o = compute_reinforce_plus_plus_baseline_outcome_advantage(&r, &m, &idx)?;
            Ok(adv_outputs(&mat_shape(&r), o))
        }
        "compute_remax_outcome_advantage" => {
            let r = a.mat2(&["token_level_rewards"])?;
            let m = a.mat2(RESPONSE_MASK)?;
            let b = a.input(&["reward_baselines"])?;
            let o = compute_remax_outcome_advantage(&r, &b.data, &m)?;
            Ok(adv_outputs(&mat_shape(&r), o))
        }
        "kl_penalty" => {
            let (nd, lp) = a.mat(&["logprob", "log_prob", "old_log_prob", "old_log_probs"])?;
            let (_, rf) = a.mat(&["ref_logprob", "ref_log_prob", "ref_log_probs"])?;
            let penalty: KlPenalty = a.str_or(&["kl_penalty", "kl_type"], "kl")?.parse()?;
            Ok(vec![out_mat(
                "kl",
                &nd.shape,
                kl_penalty(&lp, &rf, penalty)?,
            )])
        }
        "agg_loss" => {
            let (_, l) = a.mat(&["loss_mat"])?;
            let (_, m) = a.mat(&["loss_mask", "response_mask", "mask"])?;
            let mode = a.loss_agg_mode()?;
            let opts = a.agg_options()?;
            Ok(vec![out_scalar("loss", agg_loss(&l, &m, mode, &opts)?)])
        }
        "compute_policy_loss" | "compute_policy_loss_vanilla" => {
            let (nd, old) = a.mat(&["old_log_prob", "old_log_probs"])?;
            let (_, lp) = a.mat(&["log_prob", "log_probs"])?;
            let (_, adv) = a.mat(&["advantages"])?;
            let (_, m) = a.mat(RESPONSE_MASK)?;
            let w = a
                .input_opt(&["rollout_is_weights"])?
                .map(|(_, nd)| nd.to_mat())
                .transpose()?;
            let clip_ratio = a.f64_or(&["clip_ratio", "cliprange"], 0.2)?;
            let cfg = PolicyLossConfig {
                clip_ratio,
                clip_ratio_low: a.f64_opt(&["clip_ratio_low", "cliprange_low"])?,
                clip_ratio_high: a.f64_opt(&["clip_ratio_high", "cliprange_high"])?,
                clip_ratio_c: a.f64_or(&["clip_ratio_c"], 3.0)?,
                loss_agg_mode: a.loss_agg_mode()?,
                agg: a.agg_options()?,
                ..PolicyLossConfig::default()
            };
            let o = compute_policy_loss(&old, &lp, &adv, &m, w.as_ref(), &cfg)?;
            Ok(vec![
                out_scalar("pg_loss", o.pg_loss),
                out_scalar("pg_clipfrac", o.pg_clipfrac),
                out_scalar("ppo_kl", o.ppo_kl),
                out_scalar("pg_clipfrac_lower", o.pg_clipfrac_lower),
                out_mat("pg_losses", &nd.shape, o.pg_losses),
            ])
        }
        "compute_value_loss" => {
            let (_, vp) = a.mat(&["vpreds"])?;
            let (_, ret) = a.mat(&["returns"])?;
            let (_, old) = a.mat(&["values"])?;
            let (_, m) = a.mat(RESPONSE_MASK)?;
            let cfg = ValueLossConfig {
                cliprange_value: a.f64_or(&["cliprange_value"], 0.5)?,
                loss_agg_mode: a.loss_agg_mode()?,
                agg: a.agg_options()?,
            };
            let o = compute_value_loss(&vp, &ret, &old, &m, &cfg)?;
            Ok(vec![
                out_scalar("vf_loss", o.vf_loss),
                out_scalar("vf_clipfrac", o.vf_clipfrac),
            ])
        }
        "entropy_from_logits" => {
            let nd = a.input(&["logits"])?;
            let (logits, out_shape) = logits_of(&nd)?;
            Ok(vec![out_mat(
                "entropy",
                &out_shape,
                entropy_from_logits(&logits),
            )])
        }
        "logprobs_from_logits" => {
            let nd = a.input(&["logits"])?;
            let (logits, out_shape) = logits_of(&nd)?;
            let labels = a.input(&["labels"])?;
            if labels.shape != out_shape {
                return Err(CaseError::Algo(AlgoError::shape(
                    "logprobs_from_logits",
                    format!(
                        "labels have shape {:?} but logits need {:?}",
                        labels.shape, out_shape
                    ),
                )));
            }
            let ids = labels
                .data
                .iter()
                .map(|&x| {
                    if x.fract() == 0.0 && x.abs() < 9.0e15 {
                        Ok(x as i64)
                    } else {
                        Err(CaseError::Decode(format!("label {x} is not an integer")))
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            let (b, t, _) = logits.shape();
            let labels = Labels::new(b, t, ids)?;
            Ok(vec![out_mat(
                "logprobs",
                &out_shape,
                logprobs_from_logits(&logits, &labels)?,
            )])
        }
        "AdaptiveKLController" => {
            let mut ctrl = KlController::adaptive(
                a.f64_or(&["init_kl_coef", "kl_coef"], 0.001)?,
                a.f64_or(&["target_kl", "target"], 0.1)?,
                a.f64_or(&["horizon"], 10000.0)?,
            );
            Ok(vec![controller_run(a, &mut ctrl)?])
        }
        "FixedKLController" => {
            let mut ctrl = KlController::fixed(a.f64_or(&["kl_coef", "init_kl_coef"], 0.001)?);
            Ok(vec![controller_run(a, &mut ctrl)?])
        }
        "apply_kl_penalty" => {
            let s = a.mat2(&["token_level_scores"])?;
            let old = a.mat2(&["old_log_probs", "old_log_prob"])?;
            let rf = a.mat2(&["ref_log_prob", "ref_log_probs"])?;
            let m = a.mat2(RESPONSE_MASK)?;
            let penalty: KlPenalty = a.str_or(&["kl_penalty"], "kl")?.parse()?;
            let mut ctrl = KlController::from_config(&kl_ctrl_config(a)?)?;
            let o = apply_kl_penalty(&s, &old, &rf, &m, penalty, &mut ctrl)?;
            Ok(vec![
                out_mat("token_level_rewards", &mat_shape(&s), o.token_level_rewards),
                out_scalar("current_kl", o.current_kl),
                out_scalar("beta", o.beta),
                out_scalar("kl_coef_after_update", o.kl_coef_after_update),
            ])
        }
        other => Err(CaseError::UnknownFunction(other.to_string())),
    }
}

/// verl's `masked_sum` / `masked_mean` along one axis (`axis` may be negative), including the
/// `+1e-8` in the mean's count.
fn reduce_axis(values: &Nd, mask: &Nd, axis: &Value, mean: bool) -> Result<Nd, CaseError> {
    if values.shape != mask.shape {
        return Err(CaseError::Algo(AlgoError::shape(
            "masked_mean",
            format!("values are {:?} but mask is {:?}", values.shape, mask.shape),
        )));
    }
    let rank = values.shape.len() as i64;
    let ax = axis
        .as_i64()
        .map(|x| if x < 0 { x + rank } else { x })
        .filter(|x| (0..rank).contains(x))
        .ok_or_else(|| {
            CaseError::Algo(AlgoError::invalid(
                "masked_mean",
                format!("axis {axis} is out of range for a {rank}-D tensor"),
            ))
        })? as usize;
    let shape = &values.shape;
    let outer: usize = shape[..ax].iter().product();
    let n = shape[ax];
    let inner: usize = shape[ax + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let (mut s, mut count) = (0.0, 0.0);
            for j in 0..n {
                let k = (o * n + j) * inner + i;
                s += masked_value(values.data[k], mask.data[k]);
                count += mask.data[k];
            }
            out.push(if mean { s / (count + COUNT_EPS) } else { s });
        }
    }
    let mut out_shape = shape.clone();
    out_shape.remove(ax);
    Ok(Nd::with_shape(&out_shape, out))
}

/// Logits as `(B, T, V)` plus the output shape: `(B, T)` for 3-D input, `(N,)` for 2-D.
fn logits_of(nd: &Nd) -> Result<(Logits, Vec<usize>), CaseError> {
    match nd.shape.as_slice() {
        &[b, t, v] => Ok((Logits::new(b, t, v, nd.data.clone())?, vec![b, t])),
        &[n, v] => Ok((Logits::new(1, n, v, nd.data.clone())?, vec![n])),
        other => Err(CaseError::Algo(AlgoError::shape(
            "test vector",
            format!("`logits` must be (B, T, V) or (N, V), got shape {other:?}"),
        ))),
    }
}

/// Applies `inputs.updates` (pairs `[current_kl, n_steps]` or objects) in order, recording the
/// coefficient after each.
fn controller_run(a: &Args<'_>, ctrl: &mut KlController) -> Result<(String, Nd), CaseError> {
    let updates = match a.inputs.get("updates") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(u)) => u.as_slice(),
        Some(_) => return Err(CaseError::Decode("input `updates` must be a list".into())),
    };
    let mut values = Vec::with_capacity(updates.len());
    for (i, u) in updates.iter().enumerate() {
        let bad = |e: String| CaseError::Decode(format!("updates[{i}]: {e}"));
        let (kl, n) = match u {
            Value::Array(p) if p.len() == 2 => (num(&p[0]).map_err(bad)?, num(&p[1]).map_err(bad)?),
            Value::Object(o) => {
                let field = |k: &str| {
                    o.get(k)
                        .ok_or_else(|| bad(format!("missing `{k}`")))
                        .and_then(|v| num(v).map_err(bad))
                };
                (field("current_kl")?, field("n_steps")?)
            }
            other => return Err(bad(format!("expected [current_kl, n_steps], got {other}"))),
        };
        ctrl.update(kl, n);
        values.push(ctrl.value());
    }
    let n = values.len();
    Ok(("values".to_string(), Nd::with_shape(&[n], values)))
}

/// `params.kl_ctrl` with verl's defaults for missing fields.
fn kl_ctrl_config(a: &Args<'_>) -> Result<KlControllerConfig, CaseError> {
    let mut cfg = KlControllerConfig::default();
    let Some(obj) = a.param(&["kl_ctrl"]) else {
        return Ok(cfg);
    };
    let obj = obj
        .as_object()
        .ok_or_else(|| CaseError::Decode("param `kl_ctrl` must be an object".into()))?;
    let field = |k: &str| -> Result<Option<f64>, CaseError> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => num(v)
                .map(Some)
                .map_err(|e| CaseError::Decode(format!("kl_ctrl.{k}: {e}"))),
        }
    };
    if let Some(t) = obj.get("type").filter(|v| !v.is_null()) {
        let t = t
            .as_str()
            .ok_or_else(|| CaseError::Decode("kl_ctrl.type must be a string".into()))?;
        cfg.kind = t.parse::<KlControllerKind>()?;
    }
    if let Some(x) = field("kl_coef")? {
        cfg.kl_coef = x;
    }
    if let Some(x) = field("target_kl")? {
        cfg.target_kl = x;
    }
    if let Some(x) = field("horizon")? {
        cfg.horizon = x;
    }
    Ok(cfg)
}
