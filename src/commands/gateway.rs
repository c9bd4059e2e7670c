//! `--model-gateway` for `shell`, `exec` and `mcp`: the flags resolved into the gateway's
//! settings (the keys read from the host's environment here, and only here), the gateway
//! started before the sandbox (its sockets are mounted into it), and what it did said at the
//! end.

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::cli::GatewayArgs;
use crate::config::UsageError;
use crate::gateway::secrets::{Binding, SecretRecord, Secrets};
use crate::gateway::{Gateway, Provider, Record, Settings, Upstream};
use crate::output::escaped;
use crate::sandbox::{ExecMode, Forward, Sandbox};

/// How long the gateway waits for an upstream's whole answer (a long streamed reply included).
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// A session's model gateway and secrets' endpoints, and what they have done; dropping it
/// closes them.
pub struct ModelGateway {
    gateway: Option<Gateway>,
    secrets: Option<Secrets>,
    records: Arc<Mutex<Vec<Record>>>,
    secret_records: Arc<Mutex<Vec<SecretRecord>>>,
    budget: Option<u64>,
    budget_usd: Option<f64>,
}

fn provider_named(name: &str) -> Option<Provider> {
    match name.trim().to_ascii_lowercase().as_str() {
        "anthropic" => Some(Provider::Anthropic),
        "openai" => Some(Provider::Openai),
        _ => None,
    }
}

/// `PROVIDER=VALUE` or `VALUE`.
fn split_provider<'a>(flag: &str, value: &'a str) -> Result<(Option<Provider>, &'a str), UsageError> {
    match value.split_once('=') {
        Some((p, v)) if !p.contains(['/', ':']) => match provider_named(p) {
            Some(p) => Ok((Some(p), v)),
            None => Err(UsageError(format!(
                "{flag} {value}: {p:?} is not a provider (anthropic, openai)"
            ))),
        },
        _ => Ok((None, value)),
    }
}

/// The value of `flag` for `provider`: its own (`PROVIDER=`), else one without a provider,
/// which is only clear when one provider is on.
fn for_provider(
    flag: &str,
    values: &[String],
    provider: Provider,
    providers: &[Provider],
) -> Result<Option<String>, UsageError> {
    let mut general = None;
    for value in values {
        match split_provider(flag, value)? {
            (Some(p), v) if p == provider => return Ok(Some(v.to_string())),
            (Some(_), _) => {}
            (None, v) => general = Some(v.to_string()),
        }
    }
    if general.is_some() && providers.len() > 1 {
        return Err(UsageError(format!(
            "{flag}: both providers are on; say which one the value is for (anthropic=... or openai=...)"
        )));
    }
    Ok(general)
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn default_key_var(p: Provider) -> &'static str {
    match p {
        Provider::Anthropic => "ANTHROPIC_API_KEY",
        Provider::Openai => "OPENAI_API_KEY",
    }
}

fn default_upstream(p: Provider) -> String {
    match p {
        Provider::Anthropic => env_nonempty("ANTHROPIC_BASE_URL")
            .unwrap_or_else(|| crate::model::anthropic::DEFAULT_BASE_URL.into()),
        Provider::Openai => {
            env_nonempty("OPENAI_BASE_URL").unwrap_or_else(|| crate::model::openai::DEFAULT_BASE_URL.into())
        }
    }
}

/// The providers `--model-gateway[=PROVIDERS]` turns on.
fn providers(args: &GatewayArgs, value: &str) -> Result<Vec<Provider>, UsageError> {
    let mut out = Vec::new();
    if value == "auto" {
        for p in [Provider::Anthropic, Provider::Openai] {
            let named = args
                .gateway_upstream
                .iter()
                .chain(&args.gateway_key_env)
                .any(|v| matches!(split_provider("", v), Ok((Some(q), _)) if q == p));
            if named || env_nonempty(default_key_var(p)).is_some() {
                out.push(p);
            }
        }
        if out.is_empty() {
            return Err(UsageError(
                "--model-gateway: no provider's key is set (ANTHROPIC_API_KEY, OPENAI_API_KEY); name one with --model-gateway=openai and --gateway-key-env NAME"
                    .into(),
            ));
        }
        return Ok(out);
    }
    for name in value.split(',') {
        let p = provider_named(name).ok_or_else(|| {
            UsageError(format!(
                "--model-gateway={value}: {name:?} is not a provider (anthropic, openai)"
            ))
        })?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

/// The gateway's settings from the flags and the host's environment.
pub fn settings(args: &GatewayArgs) -> Result<Option<Settings>, UsageError> {
    let Some(value) = &args.model_gateway else {
        return Ok(None);
    };
    let providers = providers(args, value)?;
    let mut upstreams = Vec::new();
    for &p in &providers {
        let url = for_provider("--gateway-upstream", &args.gateway_upstream, p, &providers)?
            .unwrap_or_else(|| default_upstream(p));
        let base_url = crate::gateway::parse_upstream(&url)
            .map_err(|e| UsageError(format!("--model-gateway ({}): upstream {e}", p.name())))?;
        let var = for_provider("--gateway-key-env", &args.gateway_key_env, p, &providers)?
            .unwrap_or_else(|| default_key_var(p).to_string());
        let key = env_nonempty(&var);
        let loopback = base_url.scheme() == "http";
        if key.is_none() && !loopback {
            return Err(UsageError(format!(
                "--model-gateway ({}): no key in {var} (the host's environment); set it, or name another variable with --gateway-key-env",
                p.name()
            )));
        }
        upstreams.push(Upstream {
            provider: p,
            base_url,
            key,
        });
    }
    let known = [
        "web_search",
        "web_fetch",
        "code_execution",
        "mcp",
        "file_search",
        "code_interpreter",
        "image_generation",
        crate::gateway::check::URL_SOURCE,
    ];
    for tool in &args.gateway_allow_tool {
        if !known.contains(&tool.as_str()) && !tool.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(UsageError(format!(
                "--gateway-allow-tool {tool:?}: a tool type's name, such as {}",
                known.join(", ")
            )));
        }
    }
    Ok(Some(Settings {
        upstreams,
        models: args.gateway_model.clone(),
        allow_tools: args.gateway_allow_tool.clone(),
        budget_tokens: args.gateway_budget,
        budget_usd: args.gateway_budget_usd,
        max_body: crate::gateway::MAX_BODY,
        max_concurrent: crate::gateway::MAX_CONCURRENT,
        request_timeout: REQUEST_TIMEOUT,
    }))
}

/// An estimate in dollars, with the digits a small one needs.
fn dollars(c: f64) -> String {
    if c >= 0.01 {
        format!("${c:.2}")
    } else {
        format!("${c:.6}")
    }
}

/// One record as a line for the user.
fn describe(r: &Record) -> String {
    let model = r.model.as_deref().unwrap_or("-");
    match &r.refused {
        Some(why) => format!(
            "{} {} {} -> {} refused: {}",
            r.provider.name(),
            r.method,
            r.path,
            r.status,
            why
        ),
        None => format!(
            "{} {} {} model {} -> {}, {} in / {} out tokens{}, {} ms",
            r.provider.name(),
            r.method,
            r.path,
            model,
            r.status,
            r.input_tokens.map_or("?".into(), |n| n.to_string()),
            r.output_tokens.map_or("?".into(), |n| n.to_string()),
            r.cost_usd.map_or(String::new(), |c| format!(", ~{}", dollars(c))),
            r.latency_ms
        ),
    }
}

fn describe_secret(r: &SecretRecord) -> String {
    format!(
        "{} {} {} -> {}{}{}",
        r.name,
        r.method,
        r.path,
        r.status,
        if r.substituted { ", value put in" } else { "" },
        r.error.as_deref().map_or(String::new(), |e| format!(": {e}"))
    )
}

/// Each `--secret` with its value from the host's environment.
fn secret_bindings(specs: &[String], files: &[String]) -> Result<Vec<Binding>, UsageError> {
    let mut from_file: Vec<(&str, &str)> = Vec::new();
    for f in files {
        let Some((name, path)) = f.split_once('=').filter(|(n, p)| !n.is_empty() && !p.is_empty()) else {
            return Err(UsageError(format!("--secret-file {f}: the form is NAME=FILE")));
        };
        if !specs
            .iter()
            .any(|s| s.split_once('@').is_some_and(|(n, _)| n == name))
        {
            return Err(UsageError(format!(
                "--secret-file {name}: no --secret {name}@... names where it goes"
            )));
        }
        from_file.push((name, path));
    }
    let mut out: Vec<Binding> = Vec::new();
    for spec in specs {
        let spec = crate::gateway::secrets::parse_secret(spec).map_err(|e| UsageError(e.to_string()))?;
        if out.iter().any(|b| b.spec.name == spec.name) {
            return Err(UsageError(format!("--secret {}: named twice", spec.name)));
        }
        let value = match from_file.iter().find(|(n, _)| *n == spec.name) {
            Some((_, path)) => secret_from_file(&spec.name, path)?,
            None => env_nonempty(&spec.name).ok_or_else(|| {
                UsageError(format!(
                    "--secret {}: the host's environment has no {} (or give --secret-file {}=FILE)",
                    spec.name, spec.name, spec.name
                ))
            })?,
        };
        out.push(Binding { spec, value });
    }
    Ok(out)
}

/// A secret's value from a file: at most 64 KiB, one trailing newline dropped, not empty, and
/// a valid header value (no other line break).
fn secret_from_file(name: &str, path: &str) -> Result<String, UsageError> {
    use std::io::Read;
    let bad = |why: String| UsageError(format!("--secret-file {name}={path}: {why}"));
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(64 * 1024 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(e.to_string()))?;
    if bytes.len() > 64 * 1024 {
        return Err(bad("larger than 64 KiB: not a secret's value".into()));
    }
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".into()))?;
    let value = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if value.is_empty() || value.contains(['\r', '\n']) {
        return Err(bad("empty, or more than one line".into()));
    }
    Ok(value.to_string())
}

impl ModelGateway {
    /// Start the gateway if `--model-gateway` was given, and the secrets' endpoints. `live`:
    /// say each request on stderr as it ends (`mcp`, whose stderr is a log; a shell's terminal
    /// is the sandbox's).
    pub fn start(args: &GatewayArgs, live: bool) -> Result<Option<ModelGateway>, UsageError> {
        let bindings = secret_bindings(&args.secret, &args.secret_file)?;
        let settings = settings(args)?;
        if settings.is_none() && bindings.is_empty() {
            return Ok(None);
        }
        let budget = settings.as_ref().and_then(|s| s.budget_tokens);
        let budget_usd = settings.as_ref().and_then(|s| s.budget_usd);
        let log = match &args.gateway_log {
            Some(path) => {
                Some(Mutex::new(std::fs::File::create(path).map_err(|e| {
                    UsageError(format!("--gateway-log {}: {e}", path.display()))
                })?))
            }
            None => None,
        };
        let records: Arc<Mutex<Vec<Record>>> = Arc::default();
        let kept = records.clone();
        let observer = Arc::new(move |r: &Record| {
            tracing::info!(
                provider = r.provider.name(),
                method = %r.method,
                path = %r.path.escape_debug(),
                model = ?r.model,
                status = r.status,
                input_tokens = ?r.input_tokens,
                output_tokens = ?r.output_tokens,
                latency_ms = r.latency_ms,
                refused = ?r.refused,
                "model gateway request"
            );
            if live {
                errln!("agentbox: model gateway: {}", escaped(describe(r)));
            }
            if let Some(log) = &log
                && let Ok(line) = serde_json::to_string(r)
                && let Ok(mut f) = log.lock()
            {
                let _ = writeln!(f, "{line}");
            }
            if let Ok(mut all) = kept.lock() {
                all.push(r.clone());
            }
        });
        let gateway = match settings {
            Some(settings) => Some(
                Gateway::start(settings, observer)
                    .map_err(|e| UsageError(format!("--model-gateway: {e}")))?,
            ),
            None => None,
        };
        let secret_records: Arc<Mutex<Vec<SecretRecord>>> = Arc::default();
        let kept = secret_records.clone();
        let secrets = if bindings.is_empty() {
            None
        } else {
            let observer = Arc::new(move |r: &SecretRecord| {
                tracing::info!(
                    secret = %r.name,
                    method = %r.method,
                    path = %r.path.escape_debug(),
                    status = r.status,
                    substituted = r.substituted,
                    latency_ms = r.latency_ms,
                    error = ?r.error,
                    "secret endpoint request"
                );
                if live {
                    errln!("agentbox: secret: {}", escaped(describe_secret(r)));
                }
                if let Ok(mut all) = kept.lock() {
                    all.push(r.clone());
                }
            });
            Some(Secrets::start(bindings, observer).map_err(|e| UsageError(format!("--secret: {e}")))?)
        };
        Ok(Some(ModelGateway {
            gateway,
            secrets,
            records,
            secret_records,
            budget,
            budget_usd,
        }))
    }

    pub fn forwards(&self) -> Vec<Forward> {
        let mut out: Vec<Forward> = self.gateway.iter().flat_map(Gateway::forwards).collect();
        out.extend(self.secrets.iter().flat_map(Secrets::forwards));
        out
    }

    pub fn sandbox_env(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self.gateway.iter().flat_map(Gateway::sandbox_env).collect();
        out.extend(self.secrets.iter().flat_map(Secrets::sandbox_env));
        out
    }

    /// Refuse a sandbox without the command runner that forwards; otherwise say where the
    /// endpoints are.
    pub fn announce(&self, sandbox: &dyn Sandbox) -> Result<(), UsageError> {
        if sandbox.info().exec_mode != ExecMode::Persistent {
            return Err(UsageError(
                "--model-gateway and --secret need the sandbox's command runner, which forwards the endpoints: an image with python3, without --per-call-exec"
                    .into(),
            ));
        }
        for (name, url) in self.secrets.iter().flat_map(Secrets::endpoints) {
            errln!(
                "agentbox: secret {}: {} in the sandbox (AGENTBOX_SECRET_{}_URL); ${} there is a sentinel",
                escaped(&name),
                escaped(url),
                escaped(&name),
                escaped(&name)
            );
        }
        let Some(gateway) = &self.gateway else {
            return Ok(());
        };
        let endpoints: Vec<String> = gateway
            .providers()
            .iter()
            .map(|p| {
                let env = p.sandbox_env("");
                env.first().map(|(k, v)| format!("{k}={v}")).unwrap_or_default()
            })
            .collect();
        errln!(
            "agentbox: model gateway: {} (the key inside is a sentinel for this run{})",
            escaped(endpoints.join(" ")),
            escaped(
                [
                    self.budget.map(|b| format!("; budget {b} tokens")),
                    self.budget_usd.map(|d| format!("; budget ${d}")),
                ]
                .into_iter()
                .flatten()
                .collect::<String>()
            )
        );
        Ok(())
    }

    /// The lines said at the end: the refusals, then one summary.
    pub fn summary(&self) {
        if self.secrets.is_some()
            && let Ok(records) = self.secret_records.lock()
        {
            let substituted = records.iter().filter(|r| r.substituted).count();
            let failed = records.iter().filter(|r| r.error.is_some()).count();
            errln!(
                "agentbox: secrets: {} request{} ({} with the value put in, {} failed)",
                records.len(),
                if records.len() == 1 { "" } else { "s" },
                substituted,
                failed
            );
        }
        if self.gateway.is_none() {
            return;
        }
        let Ok(records) = self.records.lock() else {
            return;
        };
        let refused: Vec<&Record> = records.iter().filter(|r| r.refused.is_some()).collect();
        for r in refused.iter().take(10) {
            errln!("agentbox: model gateway: {}", escaped(describe(r)));
        }
        if refused.len() > 10 {
            errln!("agentbox: model gateway: ... {} more refused", refused.len() - 10);
        }
        let forwarded = records.len() - refused.len();
        let tokens_in: u64 = records.iter().filter_map(|r| r.input_tokens).sum();
        let tokens_out: u64 = records.iter().filter_map(|r| r.output_tokens).sum();
        let costs: Vec<f64> = records.iter().filter_map(|r| r.cost_usd).collect();
        let cost = if costs.is_empty() {
            String::new()
        } else {
            format!(", ~{}", dollars(costs.iter().sum::<f64>()))
        };
        errln!(
            "agentbox: model gateway: {} request{} forwarded, {} refused; {} in / {} out tokens{}",
            forwarded,
            if forwarded == 1 { "" } else { "s" },
            refused.len(),
            tokens_in,
            tokens_out,
            escaped(cost)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(gateway: &str, upstream: &[&str], key_env: &[&str]) -> GatewayArgs {
        GatewayArgs {
            model_gateway: Some(gateway.into()),
            gateway_upstream: upstream.iter().map(|s| s.to_string()).collect(),
            gateway_key_env: key_env.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn values_name_their_provider_when_both_are_on() {
        let a = args("anthropic,openai", &["http://127.0.0.1:1"], &[]);
        assert!(settings(&a).unwrap_err().0.contains("say which one"));
        let a = args(
            "anthropic,openai",
            &["anthropic=http://127.0.0.1:1", "openai=http://127.0.0.1:2/v1"],
            &[],
        );
        let s = settings(&a).unwrap().unwrap();
        assert_eq!(s.upstreams.len(), 2);
        assert_eq!(s.upstreams[1].base_url.as_str(), "http://127.0.0.1:2/v1");
        let a = args("openai", &["http://127.0.0.1:2/v1"], &[]);
        assert_eq!(settings(&a).unwrap().unwrap().upstreams.len(), 1);
        assert!(settings(&args("gemini", &[], &[])).is_err());
        assert!(settings(&args("openai", &["http://10.1.1.1/v1"], &[])).is_err());
        assert!(settings(&args("openai", &["bogus=http://127.0.0.1:1"], &[])).is_err());
    }

    #[test]
    fn a_secret_from_a_file_is_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let spec = ["TOKEN@https://example.invalid:Authorization".to_string()];
        let one = write("one", "abc\n");
        let b = secret_bindings(&spec, &[format!("TOKEN={one}")]).unwrap();
        assert_eq!(b[0].value, "abc");
        for bad in [
            write("two", "a\nb\n"),
            write("empty", "\n"),
            dir.path().join("none").display().to_string(),
        ] {
            let e = secret_bindings(&spec, &[format!("TOKEN={bad}")]).unwrap_err();
            assert!(e.0.starts_with("--secret-file TOKEN="), "{}", e.0);
        }
        let e = secret_bindings(&spec, &[format!("OTHER={one}")]).unwrap_err();
        assert!(e.0.contains("no --secret OTHER@"), "{}", e.0);
        assert!(secret_bindings(&spec, &["TOKEN".to_string()]).is_err());
    }
}
