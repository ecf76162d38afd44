//! The PromQL that the recorded-series API answers: a vector selector
//! (`metric{label="value"}`, `{__name__=~"kiln_.*"}`), optionally summed
//! (`sum(...)`, `sum by (l1, l2) (...)`, `sum(...) by (l)`), and scalar
//! arithmetic on numbers (`1+1`, which Grafana sends to test a data
//! source). Anything else is refused by name, never half-evaluated.

use kiln_engine::model::{MatchOp, Matcher};

use crate::query::selector::parse_selector;

/// A parsed query.
#[derive(Debug, Clone, PartialEq)]
pub enum PromQuery {
    /// A number.
    Scalar(f64),
    /// Recorded series, as selected or summed.
    Vector {
        /// The selector's matchers, the metric name as `__name__`.
        matchers: Vec<Matcher>,
        /// `None`: the series as they are; `Some(labels)`: summed by
        /// those labels (none: into one series).
        sum_by: Option<Vec<String>>,
    },
}

/// Parses `text`; the error says what is not supported.
pub fn parse_promql(text: &str) -> Result<PromQuery, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("the query is empty".to_owned());
    }
    if let Some(value) = scalar(text) {
        return Ok(PromQuery::Scalar(value));
    }
    if let Some(rest) = text.strip_prefix("sum") {
        let rest = rest.trim_start();
        if rest.starts_with('(') || rest.starts_with("by") {
            return parse_sum(rest);
        }
    }
    Ok(PromQuery::Vector {
        matchers: vector_selector(text)?,
        sum_by: None,
    })
}

/// `by (a, b) (selector)` or `(selector) [by (a, b)]`.
fn parse_sum(rest: &str) -> Result<PromQuery, String> {
    let (leading, rest) = match rest.strip_prefix("by") {
        Some(after) => {
            let (labels, after) = parenthesized(after.trim_start())?;
            (Some(label_list(labels)?), after.trim_start())
        }
        None => (None, rest),
    };
    let (inner, after) = parenthesized(rest)?;
    let after = after.trim();
    let trailing = match after.strip_prefix("by") {
        Some(labels) => {
            let (labels, end) = parenthesized(labels.trim_start())?;
            if !end.trim().is_empty() {
                return Err(format!("unexpected {:?} after the aggregation", end.trim()));
            }
            Some(label_list(labels)?)
        }
        None if after.is_empty() => None,
        None => {
            return Err(format!(
                "unsupported: {after:?} after sum(...); only `by (...)` is"
            ));
        }
    };
    if leading.is_some() && trailing.is_some() {
        return Err("`by` is given twice".to_owned());
    }
    Ok(PromQuery::Vector {
        matchers: vector_selector(inner)?,
        sum_by: Some(leading.or(trailing).unwrap_or_default()),
    })
}

/// The text inside the parentheses `text` starts with, and what follows.
fn parenthesized(text: &str) -> Result<(&str, &str), String> {
    let Some(body) = text.strip_prefix('(') else {
        return Err(format!(
            "expected `(` at {:?}",
            text.chars().take(32).collect::<String>()
        ));
    };
    let mut depth = 1usize;
    let mut quoted: Option<char> = None;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        if let Some(quote) = quoted {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == quote {
                quoted = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quoted = Some(c),
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Ok((&body[..i], &body[i + 1..]));
                }
            }
            _ => {}
        }
    }
    Err("unbalanced parentheses".to_owned())
}

fn label_list(text: &str) -> Result<Vec<String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            if kiln_engine::recording::is_label_name(name) {
                Ok(name.to_owned())
            } else {
                Err(format!("{name:?} is not a label name"))
            }
        })
        .collect()
}

/// `metric{...}`, `metric` or `{...}` as matchers with `__name__`.
fn vector_selector(text: &str) -> Result<Vec<Matcher>, String> {
    let text = text.trim();
    let name_end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    let (name, rest) = text.split_at(name_end);
    let rest = rest.trim();
    if !rest.is_empty() && !rest.starts_with('{') {
        return Err(format!(
            "unsupported: {:?}; only a selector, optionally in sum or sum by, is answered",
            text.chars().take(64).collect::<String>()
        ));
    }
    let mut matchers = if rest.is_empty() {
        Vec::new()
    } else {
        let parsed = parse_selector(rest).map_err(|e| e.to_string())?;
        parsed.matchers
    };
    if !name.is_empty() {
        if !kiln_engine::recording::is_metric_name(name) {
            return Err(format!("{name:?} is not a metric name"));
        }
        matchers.push(Matcher {
            name: kiln_engine::recording::METRIC_NAME_LABEL.to_owned(),
            op: MatchOp::Equal,
            value: name.to_owned(),
        });
    }
    let names_a_metric = matchers
        .iter()
        .any(|m| m.name == kiln_engine::recording::METRIC_NAME_LABEL);
    if !names_a_metric {
        return Err("a selector must name a metric (`metric{...}` or `{__name__=...}`)".to_owned());
    }
    Ok(matchers)
}

/// Arithmetic on numbers: `+ - * /` and parentheses.
fn scalar(text: &str) -> Option<f64> {
    if !text
        .chars()
        .all(|c| c.is_ascii_digit() || " .+-*/()eE".contains(c))
    {
        return None;
    }
    let mut parser = Arithmetic {
        bytes: text.as_bytes(),
        at: 0,
    };
    let value = parser.sum()?;
    parser.spaces();
    (parser.at == parser.bytes.len()).then_some(value)
}

struct Arithmetic<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Arithmetic<'_> {
    fn spaces(&mut self) {
        while self.bytes.get(self.at) == Some(&b' ') {
            self.at += 1;
        }
    }

    fn sum(&mut self) -> Option<f64> {
        let mut value = self.product()?;
        loop {
            self.spaces();
            match self.bytes.get(self.at) {
                Some(b'+') => {
                    self.at += 1;
                    value += self.product()?;
                }
                Some(b'-') => {
                    self.at += 1;
                    value -= self.product()?;
                }
                _ => return Some(value),
            }
        }
    }

    fn product(&mut self) -> Option<f64> {
        let mut value = self.factor()?;
        loop {
            self.spaces();
            match self.bytes.get(self.at) {
                Some(b'*') => {
                    self.at += 1;
                    value *= self.factor()?;
                }
                Some(b'/') => {
                    self.at += 1;
                    value /= self.factor()?;
                }
                _ => return Some(value),
            }
        }
    }

    fn factor(&mut self) -> Option<f64> {
        self.spaces();
        match self.bytes.get(self.at) {
            Some(b'(') => {
                self.at += 1;
                let value = self.sum()?;
                self.spaces();
                (self.bytes.get(self.at) == Some(&b')')).then(|| {
                    self.at += 1;
                    value
                })
            }
            Some(b'-') => {
                self.at += 1;
                self.factor().map(|v| -v)
            }
            _ => {
                let start = self.at;
                while self
                    .bytes
                    .get(self.at)
                    .is_some_and(|b| b.is_ascii_digit() || *b == b'.' || *b == b'e' || *b == b'E')
                {
                    self.at += 1;
                }
                std::str::from_utf8(&self.bytes[start..self.at])
                    .ok()?
                    .parse()
                    .ok()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(matchers: &[Matcher]) -> Option<&str> {
        matchers
            .iter()
            .find(|m| m.name == "__name__")
            .map(|m| m.value.as_str())
    }

    #[test]
    fn selectors_and_sums_parse() {
        let PromQuery::Vector { matchers, sum_by } =
            parse_promql("kiln_cpu_total{service_name=\"shop\", pod=~\"a.*\"}").unwrap()
        else {
            panic!("a vector")
        };
        assert_eq!(name(&matchers), Some("kiln_cpu_total"));
        assert_eq!(matchers.len(), 3);
        assert_eq!(sum_by, None);
        for text in [
            "sum by (service_name) (kiln:cpu)",
            "sum(kiln:cpu) by (service_name)",
            "sum by(service_name)(kiln:cpu{})",
        ] {
            let PromQuery::Vector { matchers, sum_by } = parse_promql(text).unwrap() else {
                panic!("{text}")
            };
            assert_eq!(name(&matchers), Some("kiln:cpu"), "{text}");
            assert_eq!(sum_by, Some(vec!["service_name".to_owned()]), "{text}");
        }
        let PromQuery::Vector { sum_by, .. } = parse_promql("sum({__name__=\"m\"})").unwrap()
        else {
            panic!("a vector")
        };
        assert_eq!(sum_by, Some(Vec::new()));
        assert_eq!(parse_promql("1+1").unwrap(), PromQuery::Scalar(2.0));
        assert_eq!(parse_promql("2*(3-1)/4").unwrap(), PromQuery::Scalar(1.0));
    }

    #[test]
    fn what_is_not_answered_is_refused() {
        for text in [
            "",
            "rate(m[5m])",
            "m[5m]",
            "{pod=\"a\"}",
            "sum without (pod) (m)",
            "avg(m)",
            "sum(m) by (a) by (b)",
            "sum by (a) (m) by (b)",
            "sum(m",
            "m + 1",
            "1 +",
        ] {
            assert!(parse_promql(text).is_err(), "{text:?} was accepted");
        }
    }
}
