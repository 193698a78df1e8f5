//! Building rewards from config: [`RewardSpec`] + a name-to-constructor [`Registry`].
//!
//! A spec is `{kind, params}`; `params` is checked by the kind's own typed
//! config (`deny_unknown_fields`), so typos fail at startup with serde's
//! "unknown field `x`, expected one of ..." message.
//!
//! JSON:
//!
//! ```json
//! {"kind": "combined", "params": {"components": [
//!     {"weight": 1.0, "reward": {"kind": "math", "params": {"extract": "boxed"}}},
//!     {"weight": 0.1, "reward": {"kind": "format"}}]}}
//! ```
//!
//! TOML:
//!
//! ```toml
//! [reward]
//! kind = "router"
//! [reward.params]
//! builtin_routes = true            # verl's gsm8k/MATH/countdown/Search-R1 names
//! [[reward.params.routes]]
//! data_sources = ["my_countdown"]
//! prefixes = ["cd_"]
//! reward = { kind = "countdown", params = { format_score = 0.0 } }
//! [reward.params.default]
//! kind = "remote"
//! params = { url = "http://127.0.0.1:8000/score", timeout_s = 30 }
//! ```
//!
//! Built-in kinds: `countdown`, `math`, `qa`, `qa_em`, `qa_f1`, `qa_subem`, `qa_retrieved`,
//! `format`, `length`, `remote`, `python`, `combined`, `router`. Other crates add kinds
//! (e.g. a reward-model scorer holding an engine handle) with
//! [`Registry::register`].

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    CountdownConfig, CountdownReward, FormatConfig, FormatReward, LengthConfig, LengthReward,
    MathConfig, MathReward, PythonConfig, PythonReward, QaConfig, QaMetric, QaReward, RemoteConfig, RemoteReward, RewardError,
    RewardFn, Router, WeightedSum,
};

/// A reward chosen by name, with that kind's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSpec {
    /// Registered kind, e.g. `"math"`.
    pub kind: String,
    /// The kind's config object; omitted or `null` means all defaults.
    #[serde(default)]
    pub params: Value,
}

impl RewardSpec {
    /// A spec with default params.
    pub fn new(kind: impl Into<String>) -> Self {
        RewardSpec {
            kind: kind.into(),
            params: Value::Null,
        }
    }

    /// A spec with the given params.
    pub fn with_params(kind: impl Into<String>, params: Value) -> Self {
        RewardSpec {
            kind: kind.into(),
            params,
        }
    }
}

/// Params of `kind = "combined"`: a weighted sum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CombinedParams {
    /// The parts, summed as `Σ weight * score`.
    pub components: Vec<WeightedSpec>,
}

/// One part of a weighted sum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedSpec {
    /// Multiplier (default 1.0).
    #[serde(default = "one")]
    pub weight: f64,
    /// The part.
    pub reward: RewardSpec,
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

/// Params of `kind = "router"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterParams {
    /// Start from [`Router::with_builtin_routes`]; routes below override them.
    #[serde(default = "yes")]
    pub builtin_routes: bool,
    /// Explicit routes.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    /// Reward for data sources nothing else matches; none means such samples are an error.
    #[serde(default)]
    pub default: Option<RewardSpec>,
}

/// Data sources (exact names and/or prefixes) sharing one reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Exact data_source names.
    #[serde(default)]
    pub data_sources: Vec<String>,
    /// data_source prefixes (longest match wins).
    #[serde(default)]
    pub prefixes: Vec<String>,
    /// The reward for them.
    pub reward: RewardSpec,
}

/// Builds a reward from its params; gets the registry to build nested specs.
pub type Constructor =
    Arc<dyn Fn(&Value, &Registry) -> Result<Box<dyn RewardFn>, RewardError> + Send + Sync>;

/// Name-to-constructor table behind [`build`].
#[derive(Clone)]
pub struct Registry {
    ctors: BTreeMap<String, Constructor>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

/// Decodes a kind's params; `null` counts as `{}` so `params` can be omitted.
pub fn parse_params<T: DeserializeOwned>(kind: &str, params: &Value) -> Result<T, RewardError> {
    let v = if params.is_null() {
        Value::Object(Default::default())
    } else {
        params.clone()
    };
    serde_json::from_value(v).map_err(|e| RewardError::config(kind, e.to_string()))
}

fn boxed<R: RewardFn + 'static>(
    r: Result<R, RewardError>,
) -> Result<Box<dyn RewardFn>, RewardError> {
    r.map(|r| Box::new(r) as Box<dyn RewardFn>)
}

/// Builds a QA reward whose metric is fixed by its kind name.
fn qa_with_metric(
    kind: &str,
    params: &Value,
    metric: QaMetric,
) -> Result<Box<dyn RewardFn>, RewardError> {
    let cfg: QaConfig = parse_params(kind, params)?;
    if params.get("metric").is_some() && cfg.metric != metric {
        return Err(RewardError::config(
            kind,
            "this kind fixes `metric`; use kind = \"qa\" to choose it",
        ));
    }
    boxed(QaReward::new(QaConfig { metric, ..cfg }))
}

impl Registry {
    /// A registry with no kinds.
    pub fn empty() -> Self {
        Registry {
            ctors: BTreeMap::new(),
        }
    }

    /// All built-in kinds (see the module docs).
    pub fn builtin() -> Self {
        let mut r = Registry::empty();
        r.register("countdown", |p, _| {
            boxed(CountdownReward::new(parse_params::<CountdownConfig>(
                "countdown",
                p,
            )?))
        });
        r.register("math", |p, _| {
            boxed(MathReward::new(parse_params::<MathConfig>("math", p)?))
        });
        r.register("qa", |p, _| {
            boxed(QaReward::new(parse_params::<QaConfig>("qa", p)?))
        });
        r.register("qa_em", |p, _| qa_with_metric("qa_em", p, QaMetric::Em));
        r.register("qa_f1", |p, _| qa_with_metric("qa_f1", p, QaMetric::F1));
        r.register("qa_subem", |p, _| {
            qa_with_metric("qa_subem", p, QaMetric::Subem)
        });
        r.register("qa_retrieved", |p, _| qa_with_metric("qa_retrieved", p, QaMetric::Retrieved));
        r.register("format", |p, _| {
            boxed(FormatReward::new(parse_params::<FormatConfig>(
                "format", p,
            )?))
        });
        r.register("length", |p, _| {
            boxed(LengthReward::new(parse_params::<LengthConfig>(
                "length", p,
            )?))
        });
        r.register("python", |p, _| {
            boxed(PythonReward::new(parse_params::<PythonConfig>("python", p)?))
        });
        r.register("remote", |p, _| {
            boxed(RemoteReward::new(parse_params::<RemoteConfig>(
                "remote", p,
            )?))
        });
        r.register("combined", |p, reg| {
            let cp: CombinedParams = parse_params("combined", p)?;
            let parts = cp
                .components
                .iter()
                .map(|c| Ok((c.weight, reg.build(&c.reward)?)))
                .collect::<Result<Vec<_>, RewardError>>()?;
            boxed(WeightedSum::new(parts))
        });
        r.register("router", |p, reg| {
            let rp: RouterParams = parse_params("router", p)?;
            let mut router = if rp.builtin_routes {
                Router::with_builtin_routes()
            } else {
                Router::new()
            };
            for (i, route) in rp.routes.iter().enumerate() {
                if route.data_sources.is_empty() && route.prefixes.is_empty() {
                    return Err(RewardError::config(
                        "router",
                        format!("route {i} needs `data_sources` or `prefixes`"),
                    ));
                }
                let reward: Arc<dyn RewardFn> = Arc::from(reg.build(&route.reward)?);
                for ds in &route.data_sources {
                    router = router.route(ds.clone(), reward.clone());
                }
                for p in &route.prefixes {
                    router = router.route_prefix(p.clone(), reward.clone());
                }
            }
            if let Some(d) = &rp.default {
                router = router.default_route(Arc::from(reg.build(d)?));
            }
            boxed(Ok(router))
        });
        r
    }

    /// Adds or replaces a kind.
    pub fn register<F>(&mut self, kind: impl Into<String>, ctor: F)
    where
        F: Fn(&Value, &Registry) -> Result<Box<dyn RewardFn>, RewardError> + Send + Sync + 'static,
    {
        self.ctors.insert(kind.into(), Arc::new(ctor));
    }

    /// Registered kind names, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.ctors.keys().cloned().collect()
    }

    /// Builds the reward a spec describes; unknown kinds list the valid ones.
    pub fn build(&self, spec: &RewardSpec) -> Result<Box<dyn RewardFn>, RewardError> {
        let ctor = self
            .ctors
            .get(&spec.kind)
            .ok_or_else(|| RewardError::UnknownKind {
                name: spec.kind.clone(),
                valid: self.kinds(),
            })?;
        ctor(&spec.params, self)
    }
}

/// Builds a reward with the built-in kinds.
pub fn build(spec: &RewardSpec) -> Result<Box<dyn RewardFn>, RewardError> {
    Registry::builtin().build(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::tests::{fast_cfg, serve, Reply};
    use crate::{RewardInput, RewardOutput};
    use serde_json::json;

    fn spec(v: Value) -> RewardSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn every_builtin_kind_builds_with_defaults() {
        let reg = Registry::builtin();
        for kind in reg.kinds() {
            let params = match kind.as_str() {
                "length" => json!({"target": 100}),
                "remote" => json!({"url": "http://127.0.0.1:9/score"}),
                "python" => json!({"path": "pkg://math", "function": "fsum"}),
                "combined" => json!({"components": [{"reward": {"kind": "format"}}]}),
                _ => Value::Null,
            };
            let r = reg
                .build(&RewardSpec::with_params(&kind, params))
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert!(!r.name().is_empty());
        }
        assert_eq!(
            reg.kinds(),
            [
                "combined",
                "countdown",
                "format",
                "length",
                "math",
                "python",
                "qa",
                "qa_em",
                "qa_f1",
                "qa_retrieved",
                "qa_subem",
                "remote",
                "router"
            ]
        );
    }

    #[test]
    fn unknown_kind_lists_valid_ones() {
        let err = build(&RewardSpec::new("gsm8k_reward"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("`gsm8k_reward`") && err.contains("countdown") && err.contains("router"),
            "{err}"
        );
    }

    #[test]
    fn unknown_fields_are_rejected_everywhere() {
        assert!(
            serde_json::from_value::<RewardSpec>(json!({"kind": "math", "param": {}})).is_err()
        );
        let err = build(&spec(
            json!({"kind": "math", "params": {"extrct": "boxed"}}),
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("math") && err.contains("extrct") && err.contains("extract"),
            "{err}"
        );
        assert!(build(&spec(json!({"kind": "combined", "params": {"components": [{"wieght": 1, "reward": {"kind": "format"}}]}}))).is_err());
        assert!(build(&spec(json!({"kind": "router", "params": {"route": []}}))).is_err());
        assert!(build(&spec(
            json!({"kind": "router", "params": {"routes": [{"reward": {"kind": "math"}}]}})
        ))
        .is_err());
        assert!(build(&spec(json!({"kind": "math", "params": [1]}))).is_err());
        // Nested unknown kinds surface too.
        let err = build(&spec(
            json!({"kind": "combined", "params": {"components": [{"reward": {"kind": "nope"}}]}}),
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("`nope`"), "{err}");
    }

    #[test]
    fn qa_kinds_fix_metric() {
        let f1 = build(&spec(
            json!({"kind": "qa_f1", "params": {"format_score": 0.1}}),
        ))
        .unwrap();
        assert_eq!(f1.name(), "qa_f1");
        assert!(build(&spec(json!({"kind": "qa_em", "params": {"metric": "f1"}}))).is_err());
        assert!(build(&spec(json!({"kind": "qa_em", "params": {"metric": "em"}}))).is_ok());
        assert_eq!(
            build(&spec(json!({"kind": "qa", "params": {"metric": "subem"}})))
                .unwrap()
                .name(),
            "qa_subem"
        );
    }

    #[test]
    fn combined_from_json() {
        let r = build(&spec(json!({"kind": "combined", "params": {"components": [
            {"weight": 1.0, "reward": {"kind": "math", "params": {"extract": {"tag": "answer"}}}},
            {"weight": 0.1, "reward": {"kind": "format"}}
        ]}})))
        .unwrap();
        let out = r
            .score(&RewardInput::new(
                "x",
                "<think>t</think> <answer>\\boxed{4}</answer>",
                json!(4),
            ))
            .unwrap();
        assert!((out.score - 1.1).abs() < 1e-12, "{out:?}");
    }

    #[derive(Deserialize)]
    struct TrainerConfig {
        reward: RewardSpec,
    }

    #[test]
    fn router_from_toml_with_remote_default() {
        let srv = serve(vec![Reply::Json(200, r#"{"scores": [0.7, 0.9]}"#.into())]);
        let toml_src = format!(
            r#"
[reward]
kind = "router"
[reward.params]
builtin_routes = true
[[reward.params.routes]]
data_sources = ["my_countdown"]
prefixes = ["cd_"]
reward = {{ kind = "countdown", params = {{ format_score = 0.0 }} }}
[reward.params.default]
kind = "remote"
params = {{ url = "{}", timeout_s = 5, backoff_ms = 10 }}
"#,
            srv.url
        );
        let cfg: TrainerConfig = toml::from_str(&toml_src).unwrap();
        let r = build(&cfg.reward).unwrap();
        let cd = json!({"target": 3, "numbers": [1, 2]});
        let batch = vec![
            RewardInput::new("my_countdown", "<answer>1*2</answer>", cd.clone()),
            RewardInput::new("code_x", "print(1)", json!(null)),
            RewardInput::new("cd_v2", "<answer>1+2</answer>", cd.clone()),
            RewardInput::new("countdown", "<answer>1*2</answer>", cd),
            RewardInput::new("openai/gsm8k", "#### 5", json!("5")),
            RewardInput::new("other", "x", json!(null)),
        ];
        let scores: Vec<f64> = r
            .score_batch(&batch)
            .unwrap()
            .iter()
            .map(|o: &RewardOutput| o.score)
            .collect();
        // User route (format_score 0), remote, user prefix, builtin countdown (format_score 0.1), builtin math, remote.
        assert_eq!(scores, vec![0.0, 0.7, 1.0, 0.1, 1.0, 0.9]);
        // The two unrouted samples went to the remote in one request.
        let reqs = srv.requests.lock().unwrap();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0]["items"][1]["data_source"], "other");
    }

    #[test]
    fn router_without_builtins_or_default() {
        let r = build(&spec(
            json!({"kind": "router", "params": {"builtin_routes": false,
            "routes": [{"data_sources": ["a"], "reward": {"kind": "format"}}]}}),
        ))
        .unwrap();
        let err = r
            .score(&RewardInput::new("openai/gsm8k", "", json!(1)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`openai/gsm8k`") && err.contains("known data sources: a"),
            "{err}"
        );
    }

    #[test]
    fn custom_kind_can_be_registered() {
        /// Stands in for an engine-backed reward model.
        struct Constant(f64);
        impl RewardFn for Constant {
            fn name(&self) -> &str {
                "constant"
            }
            fn score(&self, _: &RewardInput) -> Result<RewardOutput, RewardError> {
                Ok(RewardOutput::new(self.0))
            }
        }
        let mut reg = Registry::builtin();
        let captured = 0.25;
        reg.register("reward_model", move |p, _| {
            let scale = p.get("scale").and_then(Value::as_f64).unwrap_or(1.0);
            Ok(Box::new(Constant(captured * scale)))
        });
        let r = reg
            .build(&spec(json!({"kind": "combined", "params": {"components": [
                {"weight": 2.0, "reward": {"kind": "reward_model", "params": {"scale": 2.0}}}]}})))
            .unwrap();
        assert_eq!(r.score(&RewardInput::default()).unwrap().score, 1.0);
    }

    #[test]
    fn remote_spec_error_is_one_line() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/score");
        let cfg = serde_json::to_value(RemoteConfig {
            max_tries: 1,
            ..fast_cfg(&url)
        })
        .unwrap();
        let r = build(&RewardSpec::with_params("remote", cfg)).unwrap();
        let msg = r.score(&RewardInput::default()).unwrap_err().to_string();
        assert!(
            msg.contains("unreachable after 1 try:") && !msg.contains('\n'),
            "{msg}"
        );
    }
}
