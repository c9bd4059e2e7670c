//! What an eval's pages say about the run that wrote them: when (UTC), with which model and
//! provider, by which agentbox. A table of results read a week later, or beside another
//! model's, means nothing without it.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::cli::Provider;
use crate::config::ModelConfig;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// `2026-12-05 02:40 UTC`.
    pub written: String,
    /// The model and its provider, or which scripts a scripted run replayed.
    pub model: String,
    /// agentbox's version.
    pub version: String,
}

impl Stamp {
    /// For pages written now by this agentbox, of a run with `model`.
    pub fn now(model: &ModelConfig) -> Stamp {
        Stamp {
            written: utc_minute(SystemTime::now()),
            model: describe(model),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// The line the Markdown summary and the HTML report carry under their title.
    pub fn line(&self) -> String {
        format!(
            "written {} by agentbox {} · model: {}",
            self.written, self.version, self.model
        )
    }
}

#[cfg(test)]
impl Stamp {
    /// A fixed stamp, for pages compared with expected text.
    pub(crate) fn for_test() -> Stamp {
        Stamp {
            written: "2026-12-05 02:40 UTC".into(),
            model: "m (openai)".into(),
            version: "0.1.0".into(),
        }
    }
}

/// The model as the pages name it: `claude-sonnet-4-5 (anthropic)`, `qwen2.5-coder-1.5b-instruct
/// (openai at http://127.0.0.1:8080)` when not the provider's own endpoint, and for the scripted
/// provider the script given, or each task's own `script.json`.
pub fn describe(model: &ModelConfig) -> String {
    let provider = match model.provider {
        Provider::Anthropic => "anthropic",
        Provider::Openai => "openai",
        Provider::Scripted => {
            return match &model.script {
                Some(script) => format!(
                    "scripted replay of {}",
                    script.file_name().unwrap_or(script.as_os_str()).to_string_lossy()
                ),
                None => "scripted replay of each task's own script.json".to_string(),
            };
        }
    };
    let default = match model.provider {
        Provider::Anthropic => crate::model::anthropic::DEFAULT_BASE_URL,
        _ => crate::model::openai::DEFAULT_BASE_URL,
    };
    match endpoint(&model.base_url) {
        Some(at) if model.base_url.trim_end_matches('/') != default.trim_end_matches('/') => {
            format!("{} ({provider} at {at})", model.model)
        }
        _ => format!("{} ({provider})", model.model),
    }
}

/// The scheme, host and port of `url`: never its path, query or credentials.
fn endpoint(url: &str) -> Option<String> {
    let parsed = reqwest::Url::parse(url).ok()?;
    let host = parsed.host_str()?;
    Some(match parsed.port() {
        Some(port) => format!("{}://{host}:{port}", parsed.scheme()),
        None => format!("{}://{host}", parsed.scheme()),
    })
}

/// `t` as `YYYY-MM-DD HH:MM UTC` (the proleptic Gregorian calendar, from the days since 1970).
pub fn utc_minute(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, for days after the epoch.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_are_utc_calendar_dates() {
        let at = |s: u64| utc_minute(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01 00:00 UTC");
        // 2000-02-29 (a leap day of a century year) 23:59.
        assert_eq!(at(951_868_740), "2000-02-29 23:59 UTC");
        assert_eq!(at(1_796_437_200), "2026-12-05 02:20 UTC");
    }

    fn config(provider: Provider, model: &str, base_url: &str, script: Option<&str>) -> ModelConfig {
        ModelConfig {
            provider,
            model: model.into(),
            base_url: base_url.into(),
            api_key: None,
            script: script.map(Into::into),
            tool_choice: Default::default(),
            tool_protocol: Default::default(),
            temperature: None,
            max_tokens: 1,
            request_timeout: Duration::from_secs(1),
            max_retries: 0,
        }
    }

    #[test]
    fn the_model_is_named_with_its_provider_and_scripts_for_what_they_are() {
        let per_task = config(Provider::Scripted, "scripted", "", None);
        assert_eq!(
            describe(&per_task),
            "scripted replay of each task's own script.json"
        );
        let one = config(Provider::Scripted, "scripted", "", Some("/tmp/x/run.json"));
        assert_eq!(describe(&one), "scripted replay of run.json");
        let local = config(
            Provider::Openai,
            "qwen2.5-coder-1.5b-instruct",
            "http://user:pw@127.0.0.1:8080/v1?k=1",
            None,
        );
        assert_eq!(
            describe(&local),
            "qwen2.5-coder-1.5b-instruct (openai at http://127.0.0.1:8080)"
        );
        let hosted = config(
            Provider::Anthropic,
            "claude-sonnet-4-5",
            crate::model::anthropic::DEFAULT_BASE_URL,
            None,
        );
        assert_eq!(describe(&hosted), "claude-sonnet-4-5 (anthropic)");
    }
}
