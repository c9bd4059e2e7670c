//! Estimated cost from token usage. Prices are list prices per million tokens, matched on the
//! model name's prefix; unknown models (local ones, say) have no cost.

use super::Usage;

/// (model prefix, input $/Mtok, output $/Mtok). Longer prefixes first.
const PRICES: &[(&str, f64, f64)] = &[
    ("claude-opus-4-5", 5.0, 25.0),
    ("claude-opus-4-6", 5.0, 25.0),
    ("claude-opus-4", 15.0, 75.0),
    ("claude-sonnet-4", 3.0, 15.0),
    ("claude-3-7-sonnet", 3.0, 15.0),
    ("claude-3-5-sonnet", 3.0, 15.0),
    ("claude-haiku-4", 1.0, 5.0),
    ("claude-3-5-haiku", 0.8, 4.0),
    ("gpt-4.1-nano", 0.1, 0.4),
    ("gpt-4.1-mini", 0.4, 1.6),
    ("gpt-4.1", 2.0, 8.0),
    ("gpt-4o-mini", 0.15, 0.6),
    ("gpt-4o", 2.5, 10.0),
    ("gpt-5-nano", 0.05, 0.4),
    ("gpt-5-mini", 0.25, 2.0),
    ("gpt-5", 1.25, 10.0),
];

/// Dollars, or `None` when the model's price is unknown.
pub fn estimate_cost(model: &str, usage: &Usage) -> Option<f64> {
    let (_, input, output) = PRICES.iter().find(|(prefix, _, _)| model.starts_with(prefix))?;
    let m = 1_000_000.0;
    Some(
        usage.input_tokens as f64 * input / m
            + usage.cache_write_tokens as f64 * input * 1.25 / m
            + usage.cache_read_tokens as f64 * input * 0.1 / m
            + usage.output_tokens as f64 * output / m,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_by_prefix_with_cache_rates() {
        let u = Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            cache_read_tokens: 1_000_000,
            cache_write_tokens: 0,
        };
        let c = estimate_cost("claude-sonnet-4-5-20250929", &u).unwrap();
        assert!((c - (3.0 + 1.5 + 0.3)).abs() < 1e-9, "{c}");
        assert!(
            estimate_cost("claude-opus-4-5", &u).unwrap() < estimate_cost("claude-opus-4-1", &u).unwrap()
        );
        assert_eq!(estimate_cost("qwen2.5-coder-1.5b", &u), None);
    }
}
